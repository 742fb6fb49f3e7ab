"""Kafka transactions through Kiln, driven by librdkafka's transactional producer and
read_committed / read_uncommitted consumers: commit and abort across partitions, the last
stable offset holding readers back, zombie fencing, timeouts, and what Kafka's broker
refuses."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer import OffsetFetchRequest, OffsetFetchResponse
from kafka.protocol.producer import (
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
)

from storage.lane_store import LaneStore
from storage.model import TopicPartition as StorageTopicPartition
from storage.producer_ids import ProducerIds
from storage.transactions.coordinator import CoordinatorSettings, TransactionCoordinator
from storage.transactions.participants import MarkerWritten, TransactionParticipants
from storage.transactions.store import TxnStore
from tests.kiln_harness import RunningKiln, eventually, fresh_kiln, sync_redis
from tests.raw_client import RawClient, record_batch
from tests.txn_readers import read_to_end
from wire.errors import ErrorCode
from wire.txn_markers import build_marker

PARTITIONS = 2
# These tests look at what Kiln serves from Redis: their topics give producers at most
# reliable_persistent, so a commit is answered without waiting for the hardening lane and a
# transaction stays in the log queue for the delay (hardening: test_hardening_lane.py).
IN_REDIS = {"kiln.max.reliability": "reliable_persistent"}


@pytest.fixture
def kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    """Kiln with transactions on; its delay (10 minutes) never expires during a test."""
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=600_000,
                    transactions_enabled=True) as running:
        yield running


@pytest.fixture
def topic(kiln: RunningKiln, unique_topic: str) -> str:
    admin = AdminClient({"bootstrap.servers": kiln.bootstrap})
    admin.create_topics([NewTopic(unique_topic, PARTITIONS, 1, config=IN_REDIS)]
                        )[unique_topic].result(30)
    return unique_topic


def transactional_producer(kiln: RunningKiln, transactional_id: str | None = None,
                           **config: object) -> Producer:
    producer = Producer({"bootstrap.servers": kiln.bootstrap,
                         "transactional.id": transactional_id or f"tx-{uuid.uuid4().hex[:8]}",
                         "linger.ms": 5, **config})
    producer.init_transactions(30)
    return producer


def send(producer: Producer, topic: str, values: list[str]) -> None:
    for i, value in enumerate(values):
        producer.produce(topic, value.encode(), partition=i % PARTITIONS)
    producer.flush(30)


def read_all(kiln: RunningKiln, topic: str, isolation: str, *, expected: int | None = None,
             timeout_s: float = 10) -> list[str]:
    """Every value of both partitions, in partition then offset order, read until each
    partition reported its end (and `expected` values arrived, when given)."""
    read = read_to_end(kiln.bootstrap, topic, PARTITIONS, isolation, expected=expected,
                       timeout_s=timeout_s)
    return [value for p in range(PARTITIONS) for _, value in read[p]]


def watermarks(kiln: RunningKiln, topic: str, partition: int, isolation: str
               ) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": kiln.bootstrap, "group.id": "unused",
                         "isolation.level": isolation})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
        return int(low), int(high)
    finally:
        consumer.close()


def test_committed_transactions_are_read_whole_and_aborted_ones_never(
        kiln: RunningKiln, topic: str) -> None:
    # Given a transactional producer that commits one transaction over both partitions,
    # aborts the next and commits a third
    producer = transactional_producer(kiln)
    outcomes = [("a", True), ("b", False), ("c", True)]
    for name, commit in outcomes:
        producer.begin_transaction()
        send(producer, topic, [f"{name}{i}" for i in range(6)])
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)

    # When it is read with either isolation level
    committed = read_all(kiln, topic, "read_committed", expected=12)
    uncommitted = read_all(kiln, topic, "read_uncommitted", expected=18)

    # Then read_committed sees exactly the committed transactions, read_uncommitted every
    # record (and neither a marker)
    assert committed == [f"{n}{i}" for p in range(PARTITIONS) for n in "ac"
                         for i in range(p, 6, PARTITIONS)]
    assert uncommitted == [f"{n}{i}" for p in range(PARTITIONS) for n in "abc"
                           for i in range(p, 6, PARTITIONS)]
    # (and the coordinator counted them)
    ended = {result: kiln.app.metrics.value("kiln_transactions_ended_total", result=result,
                                            cause="end_txn") for result in ("commit", "abort")}
    assert ended == {"commit": 2, "abort": 1}


def test_an_open_transaction_holds_read_committed_readers_at_its_first_record(
        kiln: RunningKiln, topic: str) -> None:
    # Given a committed record, then a transaction left open
    producer = transactional_producer(kiln)
    producer.begin_transaction()
    send(producer, topic, ["first"])
    producer.commit_transaction(30)
    producer.begin_transaction()
    send(producer, topic, ["open1", "open2", "open3"])

    # When readers ask for the end of partition 0 and read it
    stable = watermarks(kiln, topic, 0, "read_committed")
    high = watermarks(kiln, topic, 0, "read_uncommitted")
    before = read_all(kiln, topic, "read_committed", expected=1)

    # ... and again after the commit
    producer.commit_transaction(30)
    after = read_all(kiln, topic, "read_committed", expected=4)

    # Then the last stable offset is the open transaction's first record (offset 2: the
    # record, then the commit marker), the high watermark past its records
    assert stable == (0, 2)
    assert high == (0, 4)
    assert before == ["first"]
    assert sorted(after) == ["first", "open1", "open2", "open3"]
    assert watermarks(kiln, topic, 0, "read_committed") == (0, 5)


def test_a_second_producer_with_the_same_id_fences_the_first_and_aborts_its_transaction(
        kiln: RunningKiln, topic: str) -> None:
    # Given a producer in the middle of a transaction
    zombie = transactional_producer(kiln, "shared-id")
    zombie.begin_transaction()
    send(zombie, topic, ["zombie0", "zombie1"])

    # When a new instance with the same transactional id starts and commits its own
    successor = transactional_producer(kiln, "shared-id")
    successor.begin_transaction()
    send(successor, topic, ["new0", "new1"])
    successor.commit_transaction(30)

    # Then the old instance can no longer commit, and only the new one's records are read
    with pytest.raises(KafkaException) as refused:
        zombie.commit_transaction(10)
    assert refused.value.args[0].fatal()
    assert sorted(read_all(kiln, topic, "read_committed", expected=2)) == ["new0", "new1"]


def test_a_transaction_open_past_its_timeout_is_aborted_and_its_producer_fenced(
        kiln: RunningKiln, topic: str) -> None:
    # Given a transaction whose producer asked for a 2 s timeout and then went quiet
    producer = transactional_producer(kiln, **{"transaction.timeout.ms": 2000})
    producer.begin_transaction()
    send(producer, topic, ["late0", "late1"])

    # When the timeout passes
    assert eventually(lambda: watermarks(kiln, topic, 0, "read_committed")[1]
                      == watermarks(kiln, topic, 0, "read_uncommitted")[1], timeout_s=10)

    # Then Kiln aborted it (an abort marker after its records; nothing read committed) and
    # the producer cannot commit it any more
    assert watermarks(kiln, topic, 0, "read_committed") == (0, 2)
    assert read_all(kiln, topic, "read_committed") == []
    with pytest.raises(KafkaException):
        producer.commit_transaction(10)
    assert kiln.app.metrics.value("kiln_transactions_ended_total", result="abort",
                                  cause="timeout") == 1


def init_transactional(client: RawClient, transactional_id: str, timeout_ms: int
                       ) -> tuple[int, int, int]:
    answer = client.request(InitProducerIdRequest[4](
        transactional_id=transactional_id, transaction_timeout_ms=timeout_ms,
        producer_id=-1, producer_epoch=-1), 4, InitProducerIdResponse)
    return int(answer.error_code), int(answer.producer_id), int(answer.producer_epoch)


def transactional_batch(values: list[bytes], producer: tuple[int, int, int]) -> bytes:
    return record_batch(values, producer, transactional=True)


def test_the_broker_checks_of_transactional_produce(kiln: RunningKiln, topic: str) -> None:
    with RawClient(kiln.bootstrap) as client:
        # Given a transactional producer id that added no partition to a transaction
        code, pid, epoch = init_transactional(client, "raw-id", 60_000)

        # When it sends a transactional batch, and a transaction timeout Kafka refuses
        unregistered = client.produce(topic, 0, transactional_batch([b"x"], (pid, epoch, 0)),
                                      transactional_id="raw-id")
        no_id = client.produce(topic, 0, transactional_batch([b"x"], (pid, epoch, 0)))
        too_long = init_transactional(client, "raw-id-2", 2_147_483_647)

    # Then the batch is refused as Kafka refuses it, and nothing was stored
    assert (code, epoch) == (0, 0)
    assert unregistered.error_code == ErrorCode.INVALID_TXN_STATE
    assert no_id.error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert too_long[0] == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert watermarks(kiln, topic, 0, "read_uncommitted") == (0, 0)


def test_markers_and_registrations_are_idempotent_per_transaction(
        kiln: RunningKiln, topic: str) -> None:
    participants = TransactionParticipants(kiln.app.queue.redis)
    tp = StorageTopicPartition(topic, 0)
    marker = build_marker(7, 0, commit=True, timestamp_ms=1)

    async def scenario() -> tuple[object, ...]:
        # Given a producer's transaction 1 registered at a partition (twice: a retry)
        first = (await participants.register([tp], 7, 0, 1, "tid"))[0]
        again = (await participants.register([tp], 7, 0, 1, "tid"))[0]
        # When its marker is written twice (a coordinator resuming a half-done end)
        written = (await participants.write_markers([tp], 7, 0, 1, commit=True, marker=marker,
                                                    now_ms=1))[0]
        rewritten = (await participants.write_markers([tp], 7, 0, 1, commit=True,
                                                      marker=marker, now_ms=1))[0]
        # ... and a late registration of that ended transaction, and one at an older epoch
        late = (await participants.register([tp], 7, 0, 1, "tid"))[0]
        await participants.register([tp], 7, 3, 2, "tid")
        older = (await participants.register([tp], 7, 2, 3, "tid"))[0]
        return first, again, written, rewritten, late, older

    first, again, written, rewritten, late, older = kiln.call(scenario())

    # Then the marker is in the log once, and the late and older registrations are refused
    assert (first, again) == (ErrorCode.NONE, ErrorCode.NONE)
    assert written == MarkerWritten(marker_offset=0, first_offset=-1)
    assert rewritten == MarkerWritten()
    assert late == ErrorCode.INVALID_TXN_STATE
    assert older == ErrorCode.INVALID_PRODUCER_EPOCH
    assert watermarks(kiln, topic, 0, "read_uncommitted") == (0, 1)


def add_partition(client: RawClient, transactional_id: str, producer: tuple[int, int],
                  topic: str, partition: int) -> int:
    request = AddPartitionsToTxnRequest[3](
        v3_and_below_transactional_id=transactional_id,
        v3_and_below_producer_id=producer[0], v3_and_below_producer_epoch=producer[1],
        v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(
            name=topic, partitions=[partition])])
    answer = client.request(request, 3, AddPartitionsToTxnResponse)
    return int(answer.results_by_topic_v3_and_below[0].results_by_partition[0]
               .partition_error_code)


def test_a_producer_inside_a_transaction_cannot_write_outside_it(
        kiln: RunningKiln, topic: str) -> None:
    with RawClient(kiln.bootstrap) as client:
        # Given a transactional producer whose transaction holds records at partition 0
        _, pid, epoch = init_transactional(client, "mixed", 60_000)
        added = add_partition(client, "mixed", (pid, epoch), topic, 0)
        unknown = add_partition(client, "mixed", (pid, epoch), "no-such-topic", 0)
        inside = client.produce(topic, 0, transactional_batch([b"in"], (pid, epoch, 0)),
                                transactional_id="mixed")

        # When it sends a non-transactional batch there, and a stale epoch adds a partition
        outside = client.produce(topic, 0, record_batch([b"out"], (pid, epoch, 1)))
        stale = add_partition(client, "mixed", (pid, epoch - 1 if epoch else 5), topic, 1)

    # Then Kafka's answers: only the transaction's record is stored
    assert (added, inside.error_code) == (ErrorCode.NONE, ErrorCode.NONE)
    assert unknown == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert outside.error_code == ErrorCode.INVALID_TXN_STATE
    assert stale == ErrorCode.PRODUCER_FENCED
    assert watermarks(kiln, topic, 0, "read_uncommitted") == (0, 1)
    assert watermarks(kiln, topic, 0, "read_committed") == (0, 0)


def test_a_reader_passes_a_thousand_aborted_records_to_the_end(
        kiln: RunningKiln, topic: str) -> None:
    """librdkafka's test 0129: a read_committed consumer reaches the end of a partition
    whose records all belong to an aborted transaction."""
    # Given a transaction of 1000 records of 1 KB at partition 0, aborted
    producer = transactional_producer(kiln)
    producer.begin_transaction()
    for _ in range(1000):
        producer.produce(topic, b"x" * 1024, partition=0)
    producer.flush(30)
    producer.abort_transaction(30)

    # When a read_committed consumer reads the partition to its end
    consumer = Consumer({"bootstrap.servers": kiln.bootstrap, "group.id": "unused",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False, "fetch.max.bytes": 1 << 20,
                         "max.partition.fetch.bytes": 16384})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got, eof = [], False
    deadline = time.monotonic() + 20
    try:
        while not eof and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                eof = message.error().code() == -191
                continue
            got.append(message.value())
        position = consumer.position([TopicPartition(topic, 0)])[0].offset
    finally:
        consumer.close()

    # Then it read nothing, reached the end, and stands past the abort marker
    assert got == []
    assert eof
    assert position == 1001


def offset_fetch(client: RawClient, group: str, topic: str, *, require_stable: bool
                 ) -> tuple[int, int]:
    """(error code, committed offset) of the group's partition 0, by OffsetFetch v7."""
    wanted = OffsetFetchRequest.OffsetFetchRequestTopic
    answer = client.request(OffsetFetchRequest[7](
        group_id=group, topics=[wanted(name=topic, partition_indexes=[0])],
        require_stable=require_stable), 7, OffsetFetchResponse)
    partition = answer.topics[0].partitions[0]
    return int(partition.error_code), int(partition.committed_offset)


def test_consume_transform_produce_commits_input_offsets_with_the_output(
        kiln: RunningKiln, topic: str, unique_topic: str) -> None:
    # Given ten input records and an application that reads them in a group, writes each
    # transformed in a transaction and commits its input offsets in the same transaction
    source = f"{unique_topic}-in"
    admin = AdminClient({"bootstrap.servers": kiln.bootstrap})
    admin.create_topics([NewTopic(source, 1, 1, config=IN_REDIS)])[source].result(30)
    plain = Producer({"bootstrap.servers": kiln.bootstrap, "acks": 1})
    for i in range(10):
        plain.produce(source, f"r{i}".encode(), partition=0)
    assert plain.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": kiln.bootstrap, "group.id": "ctp",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([source])
    producer = transactional_producer(kiln, "ctp-app")

    def transform(count: int, commit: bool) -> None:
        taken: list[Any] = []
        while len(taken) < count:
            message = consumer.poll(1)
            if message is not None and not message.error():
                taken.append(message)
        producer.begin_transaction()
        for message in taken:
            producer.produce(topic, message.value().upper(), partition=0)
        producer.flush(30)
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), 30)
        if commit:
            producer.commit_transaction(30)
            return
        with RawClient(kiln.bootstrap) as client:
            pending.append(offset_fetch(client, "ctp", source, require_stable=True))
            pending.append(offset_fetch(client, "ctp", source, require_stable=False))
        producer.abort_transaction(30)
        # The application starts over from what its group committed.
        for tp in consumer.committed(consumer.assignment(), 10):
            consumer.seek(TopicPartition(tp.topic, tp.partition,
                                         tp.offset if tp.offset >= 0 else 0))

    pending: list[tuple[int, int]] = []
    try:
        # When it transforms four, then fails before committing three more (aborts), then
        # transforms the last six
        transform(4, commit=True)
        transform(3, commit=False)
        transform(6, commit=True)
        committed = consumer.committed([TopicPartition(source, 0)], 10)[0].offset
    finally:
        consumer.close()

    # Then the output holds each input once, transformed, in order; the group committed all
    # ten; and while the offsets waited in the open transaction a stable read was refused
    assert read_all(kiln, topic, "read_committed", expected=10) == [
        f"R{i}" for i in range(10)]
    assert committed == 10
    assert pending == [(ErrorCode.UNSTABLE_OFFSET_COMMIT, -1), (ErrorCode.NONE, 4)]


def test_a_silent_producer_is_forgotten_with_its_ended_transactions_but_not_an_open_one(
        kiln: RunningKiln, topic: str) -> None:
    queue = kiln.app.queue
    tp = StorageTopicPartition(topic, 0)
    redis = sync_redis(kiln.settings.redis_url)
    with RawClient(kiln.bootstrap) as client:
        # Given two transactional producers that wrote to a partition: one's transaction
        # ended, the other's is still open
        ended, still_open = (init_transactional(client, tid, 60_000)[1:]
                             for tid in ("ends", "stays"))
        for (pid, epoch), tid in ((ended, "ends"), (still_open, "stays")):
            assert add_partition(client, tid, (pid, epoch), topic, 0) == ErrorCode.NONE
            written = client.produce(topic, 0, transactional_batch([b"x"], (pid, epoch, 0)),
                                     transactional_id=tid)
            assert written.error_code == ErrorCode.NONE
        answer = client.request(EndTxnRequest[3](transactional_id="ends", producer_id=ended[0],
                                                 producer_epoch=ended[1], committed=True),
                                3, EndTxnResponse)
        assert answer.error_code == ErrorCode.NONE

    # When producers silent since a moment in the future are forgotten
    forgotten = kiln.call(queue.prune_producers(tp, silent_since_ms=2**62))

    # Then the one whose transaction ended is forgotten, with its registration; the other
    # stays, its transaction still holding the last stable offset
    left = {int(k) for k in redis.hkeys(f"kiln:{{{topic}/0}}:txns")}
    assert forgotten == 1
    assert left == {still_open[0]}
    assert watermarks(kiln, topic, 0, "read_committed") == (0, 1)


def test_a_transaction_ends_after_its_topic_was_deleted_without_bringing_it_back(
        kiln: RunningKiln, topic: str) -> None:
    # Given a transaction with records in a topic
    producer = transactional_producer(kiln)
    producer.begin_transaction()
    send(producer, topic, ["gone0", "gone1"])

    # When the topic is deleted, then the transaction commits
    admin = AdminClient({"bootstrap.servers": kiln.bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    producer.commit_transaction(30)

    # Then the commit is answered, and nothing of the topic is back in Redis
    redis = sync_redis(kiln.settings.redis_url)
    assert [k for k in redis.scan_iter(f"kiln:{{{topic}/*")] == []


def test_a_fenced_producers_late_batch_is_refused_at_the_partition(
        kiln: RunningKiln, topic: str) -> None:
    with RawClient(kiln.bootstrap) as client:
        # Given a transactional producer with records in an open transaction
        _, pid, epoch = init_transactional(client, "zombie", 60_000)
        assert add_partition(client, "zombie", (pid, epoch), topic, 0) == ErrorCode.NONE
        first = client.produce(topic, 0, transactional_batch([b"a"], (pid, epoch, 0)),
                               transactional_id="zombie")

        # When a new instance initialises the same id (Kiln aborts the open transaction at
        # a bumped epoch and answers CONCURRENT_TRANSACTIONS; the retry bumps again) ...
        fenced = init_transactional(client, "zombie", 60_000)
        retried = init_transactional(client, "zombie", 60_000)
        # ... and the old instance's next batch arrives
        late = client.produce(topic, 0, transactional_batch([b"b"], (pid, epoch, 1)),
                              transactional_id="zombie")

    # Then the batch is refused for its fenced epoch, and the first record was aborted
    assert first.error_code == ErrorCode.NONE
    assert fenced[0] == ErrorCode.CONCURRENT_TRANSACTIONS
    assert retried == (ErrorCode.NONE, pid, epoch + 2)
    assert late.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert watermarks(kiln, topic, 0, "read_committed") == (0, 2)
    assert read_all(kiln, topic, "read_committed") == []


def test_an_idle_transactional_id_expires_and_its_next_producer_gets_a_new_id(
        kiln: RunningKiln, topic: str) -> None:
    app = kiln.app
    # A coordinator like the node's own, whose ids expire as soon as they are idle
    eager = TransactionCoordinator(
        TxnStore(app.queue.redis), TransactionParticipants(app.queue.redis),
        app.catalog.starts, app.catalog, ProducerIds(app.queue.redis),
        coordinates=lambda _: True, lane=LaneStore(app.queue.redis),
        settings=CoordinatorSettings(expiration_ms=0))
    with RawClient(kiln.bootstrap) as client:
        # Given an id whose transaction ended, and one with a transaction open
        _, idle_pid, _ = init_transactional(client, "idle", 60_000)
        _, busy_pid, busy_epoch = init_transactional(client, "busy", 60_000)
        assert add_partition(client, "busy", (busy_pid, busy_epoch), topic, 0) == 0

        # When idle ids expire
        expired = kiln.call(eager.expire_idle())
        # ... and both ids initialise again
        again_idle = init_transactional(client, "idle", 60_000)
        listed = kiln.call(app.transactions.coordinated())  # type: ignore[union-attr]

    # Then only the idle one was forgotten: it starts over with a new producer id
    assert expired == 1
    assert again_idle[0] == ErrorCode.NONE and again_idle[1] != idle_pid
    assert again_idle[2] == 0
    assert {s.transactional_id for s in listed} == {"idle", "busy"}


def test_a_lane_settling_in_the_process_wakes_a_waiting_assured_commit_at_once(
        kiln: RunningKiln) -> None:
    # Given the lane's store as a node's coordinator and lane share it, and a commit waiting
    # on it far longer than the test runs
    store = LaneStore(kiln.app.queue.redis)

    async def settle_while_waiting() -> tuple[bool, bool]:
        waiting = asyncio.create_task(store.settled_or_after(600))
        await asyncio.sleep(0)
        before = waiting.done()
        # When the lane settles a transaction
        await store.settle({"7.1"})
        await asyncio.sleep(0)
        after = waiting.done()
        waiting.cancel()
        await store.forget({"7.1"})
        return before, after

    # Then the waiter returns then, not when its wait runs out
    assert kiln.call(settle_while_waiting()) == (False, True)


def test_a_transaction_over_many_partitions_commits(kiln: RunningKiln, unique_topic: str
                                                    ) -> None:
    # Given a topic with more partitions than Kiln has Redis connections for one request
    wide = f"{unique_topic}-wide"
    admin = AdminClient({"bootstrap.servers": kiln.bootstrap})
    admin.create_topics([NewTopic(wide, 200, 1, config=IN_REDIS)])[wide].result(30)
    # When one transaction writes to every partition and commits
    producer = transactional_producer(kiln)
    producer.begin_transaction()
    for p in range(200):
        producer.produce(wide, f"w{p}".encode(), partition=p)
    producer.flush(30)
    producer.commit_transaction(30)
    # Then every record is read committed
    read = read_to_end(kiln.bootstrap, wide, 200, "read_committed", expected=200, timeout_s=30)
    assert sorted(v for values in read.values() for _, v in values) == sorted(
        f"w{p}" for p in range(200))

