"""Real third-party consumers through Kiln, each test run with kafka-python, aiokafka and
confluent-kafka: assign mode in order with seek, auto.offset.reset, offsets for a timestamp,
a group of three members while a producer keeps producing, and a group resuming from its
committed offsets after Kiln restarted (same Redis).

Records are produced through Kiln with acks=1 and read from the log queue: the harden delay
is long enough that nothing is hardened (and so trimmed) during a test.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any

import pytest
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from cli.local_services import free_port
from storage.groups.model import GroupState
from tests.compat.consumers import CONSUMERS, Consumed, Consumer, open_consumer
from tests.kiln_harness import RunningKiln, fresh_kiln, start_kiln, sync_redis

KILN_SETTINGS: dict[str, Any] = {
    "harden_delay_ms": 600_000, "group_initial_rebalance_delay_ms": 100,
    "group_min_session_timeout_ms": 1000,
}
CLIENTS = list(CONSUMERS)
BASE_TIMESTAMP_MS = 1_700_000_000_000


@pytest.fixture
def kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    with fresh_kiln(redis_url, kafka_bootstrap, **KILN_SETTINGS) as running:
        yield running


def producer(bootstrap: str) -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=5)


def produce(bootstrap: str, topic: str, values: list[bytes], partition: int | None = 0
            ) -> list[tuple[int, int]]:
    """(partition, offset) of each value, in send order; keys spread them when no partition
    is named."""
    sender = producer(bootstrap)
    try:
        futures = [sender.send(topic, key=value, value=value, partition=partition)
                   for value in values]
        sender.flush(30)
        placed = [f.get(timeout=30) for f in futures]
    finally:
        sender.close(10)
    return [(m.partition, m.offset) for m in placed]


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    with KafkaAdminClient(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])


def read_until(consumer: Consumer, done: int | Callable[[list[Consumed]], bool],
               timeout_s: float = 30, max_records: int = 500,
               between_polls: Callable[[], None] | None = None) -> list[Consumed]:
    """Poll until `done` records (or `done(records)`); whatever was polled is returned."""
    enough = (lambda got: len(got) >= done) if isinstance(done, int) else done
    got: list[Consumed] = []
    deadline = time.monotonic() + timeout_s
    while not enough(got) and time.monotonic() < deadline:
        if between_polls is not None:
            between_polls()
        got.extend(consumer.poll(0.3, max_records))
    return got


def runs_are_contiguous(offsets: list[int]) -> bool:
    return all(b == a + 1 for a, b in itertools.pairwise(offsets))


# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_assign_mode_reads_in_order_with_offsets_and_seeks_back(
        kiln: RunningKiln, unique_topic: str, client: str) -> None:
    # Given 60 records produced to partition 0 through Kiln
    values = [b"value-%03d" % i for i in range(60)]
    placed = produce(kiln.bootstrap, unique_topic, values)
    with closing(open_consumer(client, kiln.bootstrap)) as consumer:
        consumer.assign(unique_topic, [0])
        # When they are read from the beginning, then again after a seek back to 45
        first = read_until(consumer, 60)
        consumer.seek(unique_topic, 0, 45)
        again = read_until(consumer, 15)

    # Then each read returns the records in order, at the offsets the producer was told
    assert placed == [(0, i) for i in range(60)]
    assert [(r.partition, r.offset, r.key, r.value) for r in first] == [
        (0, i, v, v) for i, v in enumerate(values)]
    assert [(r.offset, r.value) for r in again] == [(i, values[i]) for i in range(45, 60)]


@pytest.mark.parametrize("client", CLIENTS)
def test_auto_offset_reset_earliest_reads_everything_there(
        kiln: RunningKiln, unique_topic: str, client: str) -> None:
    values = [b"old-%d" % i for i in range(10)]
    produce(kiln.bootstrap, unique_topic, values)
    with closing(open_consumer(client, kiln.bootstrap, reset="earliest")) as consumer:
        consumer.assign(unique_topic, [0])
        got = read_until(consumer, 10)

    assert [(r.offset, r.value) for r in got] == list(enumerate(values))


@pytest.mark.parametrize("client", CLIENTS)
def test_auto_offset_reset_latest_reads_only_what_comes_after(
        kiln: RunningKiln, unique_topic: str, client: str) -> None:
    # Given 10 records already there
    produce(kiln.bootstrap, unique_topic, [b"old-%d" % i for i in range(10)])
    sender = producer(kiln.bootstrap)
    sent: list[bytes] = []

    def send_one() -> None:
        value = b"new-%d" % len(sent)
        sender.send(unique_topic, value=value, partition=0).get(timeout=10)
        sent.append(value)

    consumer = open_consumer(client, kiln.bootstrap, reset="latest")
    try:
        consumer.assign(unique_topic, [0])
        # When records keep arriving until the consumer sees one, then three more come
        got = read_until(consumer, 1, between_polls=send_one)
        for _ in range(3):
            send_one()
        got += read_until(consumer, lambda more: any(r.value == sent[-1] for r in more))
    finally:
        consumer.close()
        sender.close(10)

    # Then it read none of the old records: from where the log ended when its position was
    # set, everything in order
    offsets = [r.offset for r in got]
    assert got and offsets[0] >= 10
    assert runs_are_contiguous(offsets)
    assert [r.value for r in got] == sent[offsets[0] - 10:]


@pytest.mark.parametrize("client", CLIENTS)
def test_offsets_for_a_timestamp(kiln: RunningKiln, unique_topic: str, client: str) -> None:
    # Given records one second apart, each in a batch of its own
    sender = producer(kiln.bootstrap)
    for i in range(10):
        sender.send(unique_topic, value=b"t%d" % i, partition=0,
                    timestamp_ms=BASE_TIMESTAMP_MS + i * 1000).get(timeout=10)
    sender.close(10)
    with closing(open_consumer(client, kiln.bootstrap)) as consumer:
        consumer.assign(unique_topic, [0])
        # When offsets are looked up by time and read from
        between = consumer.offset_for_time(unique_topic, 0, BASE_TIMESTAMP_MS + 4500)
        exact = consumer.offset_for_time(unique_topic, 0, BASE_TIMESTAMP_MS)
        after_all = consumer.offset_for_time(unique_topic, 0, BASE_TIMESTAMP_MS + 20_000)
        assert between is not None
        consumer.seek(unique_topic, 0, between)
        got = read_until(consumer, 5)

    # Then the first record at or after each time is found
    assert (between, exact, after_all) == (5, 0, None)
    assert [(r.offset, r.value, r.timestamp_ms) for r in got] == [
        (i, b"t%d" % i, BASE_TIMESTAMP_MS + i * 1000) for i in range(5, 10)]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_group_of_three_consumes_every_record_while_a_producer_keeps_producing(
        kiln: RunningKiln, unique_topic: str, client: str) -> None:
    # Given a 4-partition topic, a producer sending for a few seconds, and three members of
    # one group joining one after another while it does
    create_topic(kiln.bootstrap, unique_topic, 4)
    group = f"group-{uuid.uuid4().hex[:8]}"
    stop = threading.Event()
    consumed: list[tuple[int, int, Consumed]] = []  # (member, assignment epoch, record)
    placed: dict[tuple[int, int], bytes] = {}
    failures: list[BaseException] = []

    def member(index: int) -> None:
        try:
            with closing(open_consumer(client, kiln.bootstrap, group=group,
                                       client_id=f"member-{index}")) as consumer:
                consumer.subscribe(unique_topic)
                while not stop.is_set():
                    records = consumer.poll(0.2, 100)
                    consumed.extend((index, consumer.assignments, r) for r in records)
                    if records:
                        consumer.commit()  # False during a rebalance: re-read, not lost
        except Exception as exc:  # reported by the test's assertions
            failures.append(exc)

    def keep_producing() -> None:
        sender = producer(kiln.bootstrap)
        futures = []
        for i in range(600):
            value = b"record-%04d" % i
            futures.append((value, sender.send(unique_topic, key=value, value=value)))
            time.sleep(0.005)
        sender.flush(30)
        for value, future in futures:
            meta = future.get(timeout=30)
            placed[(meta.partition, meta.offset)] = value
        sender.close(10)

    threads = [threading.Thread(target=member, args=(i,), name=f"member-{i}") for i in range(3)]
    production = threading.Thread(target=keep_producing, name="producer")
    production.start()
    for thread in threads:
        thread.start()
        time.sleep(0.8)

    # When the producer is done and the group has caught up (or time is up)
    production.join(60)
    formed = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        summary = kiln.call(kiln.app.groups.describe(group))
        formed = formed or (summary.state is GroupState.STABLE and len(summary.members) == 3)
        seen = {(r.partition, r.offset) for _, _, r in consumed}
        if formed and placed and set(placed) <= seen:
            break
        time.sleep(0.2)
    stop.set()
    for thread in threads:
        thread.join(30)

    # Then all three were members at once, every record was consumed with the value the
    # producer sent, and each member read each partition in order between rebalances
    assert not failures
    assert formed
    assert len(placed) == 600
    seen_values = {(r.partition, r.offset): r.value for _, _, r in consumed}
    missing = set(placed) - set(seen_values)
    assert not missing, f"{len(missing)} records never consumed"
    assert all(seen_values[where] == value for where, value in placed.items())
    runs: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for index, epoch, record in consumed:
        runs[(index, epoch, record.partition)].append(record.offset)
    assert all(runs_are_contiguous(offsets) for offsets in runs.values())
    assert len({index for index, _, _ in consumed}) >= 2
    # Members kept consuming across rebalances (a member's second assignment or later).
    assert max(epoch for _, epoch, _ in consumed) >= 2


@pytest.mark.parametrize("client", CLIENTS)
def test_a_group_resumes_from_its_committed_offsets_after_kiln_restarts(
        redis_url: str, kafka_bootstrap: str, unique_topic: str, client: str) -> None:
    # Given 10 records in each of 3 partitions, and a group member that read some of them
    # and committed what it read
    sync_redis(redis_url).flushdb()
    group = f"group-{uuid.uuid4().hex[:8]}"
    with start_kiln(redis_url, kafka_bootstrap, **KILN_SETTINGS) as before:
        create_topic(before.bootstrap, unique_topic, 3)
        for partition in range(3):
            produce(before.bootstrap, unique_topic,
                    [b"p%d-%d" % (partition, i) for i in range(10)], partition)
        with closing(open_consumer(client, before.bootstrap, group=group)) as first:
            first.subscribe(unique_topic)
            read = read_until(first, 12, max_records=4)
            assert first.commit()
            committed_before = first.committed(unique_topic, [0, 1, 2])

    # When Kiln restarts on the same Redis and a member of the same group starts
    with (start_kiln(redis_url, kafka_bootstrap, **KILN_SETTINGS) as after,
          closing(open_consumer(client, after.bootstrap, group=group)) as second):
        committed_after = second.committed(unique_topic, [0, 1, 2])
        second.subscribe(unique_topic)
        start = {p: committed_before[p] or 0 for p in range(3)}
        remaining = sum(10 - s for s in start.values())
        resumed = read_until(second, remaining)

    # Then it starts exactly at the committed offsets and reads the rest once, in order
    last_read: dict[int, int] = {}
    for record in read:
        last_read[record.partition] = record.offset
    assert len(read) >= 12
    for partition in range(3):
        assert (committed_before[partition] or 0) == last_read.get(partition, -1) + 1
    assert committed_after == committed_before
    by_partition: dict[int, list[Consumed]] = defaultdict(list)
    for record in resumed:
        by_partition[record.partition].append(record)
    for partition in range(3):
        assert [(r.offset, r.value) for r in by_partition[partition]] == [
            (o, b"p%d-%d" % (partition, o)) for o in range(start[partition], 10)]
    assert len(resumed) == remaining



@pytest.mark.parametrize("client", CLIENTS)
def test_a_live_member_carries_on_across_a_kiln_restart_without_rejoining(
        redis_url: str, kafka_bootstrap: str, unique_topic: str, client: str) -> None:
    # Given a member of a Stable group that read and committed everything so far
    sync_redis(redis_url).flushdb()
    settings = {**KILN_SETTINGS, "listen": f"127.0.0.1:{free_port()}"}
    group = f"group-{uuid.uuid4().hex[:8]}"
    before = start_kiln(redis_url, kafka_bootstrap, **settings)
    consumer = None
    try:
        create_topic(before.bootstrap, unique_topic, 2)
        produce(before.bootstrap, unique_topic, [b"before-%d" % i for i in range(10)], None)
        consumer = open_consumer(client, before.bootstrap, group=group)
        consumer.subscribe(unique_topic)
        first = read_until(consumer, 10)
        assert consumer.commit()
    finally:
        before.stop()
    assert consumer is not None

    # When Kiln restarts on the same address and Redis, and more records arrive
    with start_kiln(redis_url, kafka_bootstrap, **settings) as after:
        try:
            produce(after.bootstrap, unique_topic, [b"after-%d" % i for i in range(10)], None)
            second = read_until(consumer, 10)
            committed = consumer.commit()
            summary = after.call(after.app.groups.describe(group))
            joins = after.app.metrics.value("kiln_requests_total", api="JoinGroup")
        finally:
            consumer.close()

    # Then the member reads and commits on without joining the group again
    assert sorted(r.value or b"" for r in first) == sorted(b"before-%d" % i for i in range(10))
    assert sorted(r.value or b"" for r in second) == sorted(b"after-%d" % i for i in range(10))
    assert committed
    assert joins == 0
    assert (summary.state, len(summary.members)) == (GroupState.STABLE, 1)
