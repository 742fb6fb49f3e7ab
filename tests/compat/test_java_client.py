"""Kafka's reference client (org.apache.kafka:kafka-clients 4.4, the Java `KafkaProducer` and
`KafkaConsumer`) through Kiln, driven by Kafka's own VerifiableProducer and
VerifiableConsumer tools (tests/compat/java.py).

- The idempotent producer (acks=all, five requests in flight, small batches) with every
  codec: each record acknowledged at the offset it holds, read back once, in send order and
  intact, both through Kiln and from the hardened Kafka topic.
- A consumer group of two members, one joining late and one leaving, while a producer keeps
  producing: every record consumed once, none below a committed offset, partitions
  rebalanced between the members; with the classic protocol, and with KIP-848's
  (`group.protocol=consumer`: server-side assignment, incremental rebalances).

One Kiln serves the whole module (topics and groups are the tests' own).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from tests.compat.clients import (
    CODEC_IDS,
    create_topic_confluent,
    hardened_codecs,
    read_hardened,
)
from tests.compat.java import (
    CONSUMER_GROUPS,
    Assigned,
    Committed,
    ConsumerEvent,
    RecordRead,
    Revoked,
    VerifiableConsumerProcess,
    committed_offsets,
    run_tool,
    run_verifiable_producer,
)
from tests.kiln_harness import RunningKiln

pytestmark = pytest.mark.usefixtures("kafka_tools")

N_RECORDS = 1000
PARTITIONS = 2


def _now_ms() -> int:
    return int(time.time() * 1000)


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_idempotent_producer_every_record_once_in_order_with_every_codec(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str, tmp_path: Path,
        compression: str) -> None:
    # Given a 2-partition topic created through Kiln
    create_topic_confluent(module_kiln.bootstrap, unique_topic, PARTITIONS)
    before_ms = _now_ms()
    # When the Java producer sends 1000 records, idempotent and acks=all, in batches of a
    # few dozen records with up to five requests in flight (so sequences span batches)
    produced = run_verifiable_producer(module_kiln.bootstrap, unique_topic, N_RECORDS, {
        "enable.idempotence": "true", "compression.type": compression,
        # VerifiableProducer sets retries=0, which the idempotent producer refuses.
        "retries": 2147483647, "max.in.flight.requests.per.connection": 5,
        "batch.size": 1024, "linger.ms": 5, "request.timeout.ms": 15_000,
        "delivery.timeout.ms": 30_000,
    }, tmp_path)
    after_ms = _now_ms()

    # Then every record was acknowledged, at offsets 0..n-1 of its partition in send order
    assert produced.errors == [], produced.errors[:3]
    assert (produced.sent, produced.acked_count, len(produced.acked)) == (N_RECORDS,) * 3
    assert sorted(int(a.value) for a in produced.acked) == list(range(N_RECORDS))
    expected: dict[int, list[tuple[int, bytes, bytes]]] = {p: [] for p in range(PARTITIONS)}
    for acked in sorted(produced.acked, key=lambda a: int(a.value)):  # values count sends
        expected[acked.partition].append((acked.offset, acked.key.encode(),
                                          acked.value.encode()))
    for partition, records in expected.items():
        assert records, f"the partitioner left partition {partition} empty"
        assert [offset for offset, _, _ in records] == list(range(len(records)))
    # and both tiers hold each exactly once at that offset, key and value intact, with the
    # producer's timestamps, and Kafka's batches carry the producer's codec
    assert module_kiln.flush()
    hardened = read_hardened(kafka_bootstrap, unique_topic, PARTITIONS)
    through_kiln = read_hardened(module_kiln.bootstrap, unique_topic, PARTITIONS)
    for partition in range(PARTITIONS):
        from_kafka = [(h.kiln_offset, h.key, h.value) for h in hardened[partition]]
        from_kiln = [(h.kiln_offset, h.key, h.value) for h in through_kiln[partition]]
        assert from_kafka == expected[partition], f"Kafka, partition {partition}"
        assert from_kiln == expected[partition], f"Kiln, partition {partition}"
        assert all(h.client_headers == () for h in hardened[partition])
        timestamps = [h.timestamp_ms for h in hardened[partition]]
        assert [h.timestamp_ms for h in through_kiln[partition]] == timestamps
        assert all(before_ms <= ts <= after_ms for ts in timestamps), (before_ms, after_ms)
        codecs = hardened_codecs(kafka_bootstrap, unique_topic, partition)
        assert codecs and set(codecs) <= {0, CODEC_IDS[compression]}, codecs
        if compression != "none":
            assert CODEC_IDS[compression] in codecs, codecs


# --- consumer group ------------------------------------------------------------------------

GROUP_PARTITIONS = 4
ALL_PARTITIONS = frozenset(range(GROUP_PARTITIONS))
CONSUMER_CONFIG = {
    # Rebalances noticed within a heartbeat, small polls so commits are frequent and
    # members are caught between two of them.
    "heartbeat.interval.ms": 300, "max.poll.records": 40, "fetch.max.wait.ms": 100,
}


@dataclass(frozen=True, slots=True)
class Sent:
    partition: int
    offset: int
    key: str
    value: str


class KeepProducing:
    """A producer through Kiln (zstd, acks=1) sending a record every few milliseconds, round
    robin over the partitions, until stopped."""

    def __init__(self, bootstrap: str, topic: str, first: int) -> None:
        self._producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=5,
                                       compression_type="zstd")
        self._topic = topic
        self._next = first
        self._futures: list[tuple[bytes, bytes, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="keep-producing", daemon=True)

    def send(self, count: int) -> None:
        for _ in range(count):
            key, value = b"k-%d" % self._next, b"v-%d" % self._next
            future = self._producer.send(self._topic, key=key, value=value,
                                         partition=self._next % GROUP_PARTITIONS)
            self._futures.append((key, value, future))
            self._next += 1

    def flush(self) -> None:
        self._producer.flush(30)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.send(1)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[Sent]:
        """Every record sent so far, where it landed."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self._producer.flush(30)
        sent = []
        for key, value, future in self._futures:
            placed = future.get(timeout=30)
            sent.append(Sent(placed.partition, placed.offset, key.decode(), value.decode()))
        return sent

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self._producer.close(5)


def consumed_below_a_commit(members: Sequence[Sequence[ConsumerEvent]]) -> list[str]:
    """Reads that started below an offset already committed for their partition when the
    reader was assigned it. A commit event is stamped after commitSync returned and an
    assignment event in the rebalance callback, before the consumer fetches its positions, so
    a commit stamped earlier than the assignment must bound the first read."""
    commits = [e for events in members for e in events if isinstance(e, Committed)]
    problems = []
    for number, events in enumerate(members):
        assigned_at: int | None = None
        first_read: set[int] = set()
        for event in events:
            if isinstance(event, Assigned):
                assigned_at, first_read = event.timestamp_ms, set()
            elif isinstance(event, RecordRead) and event.partition not in first_read:
                first_read.add(event.partition)
                assert assigned_at is not None, f"member {number} read before any assignment"
                floor = max((c.offsets[event.partition] for c in commits
                             if c.success and event.partition in c.offsets
                             and c.timestamp_ms < assigned_at), default=0)
                if event.offset < floor:
                    problems.append(f"member {number} started partition {event.partition} at "
                                    f"{event.offset}, below the commit {floor}")
    return problems


def hardened_then_live(kiln: RunningKiln, topic: str, producer: KeepProducing) -> None:
    """The topic with its first 200 records hardened to Kafka (read through Kiln from there)
    and `producer` producing on (read from Redis)."""
    create_topic_confluent(kiln.bootstrap, topic, GROUP_PARTITIONS)
    producer.send(200)
    producer.flush()
    assert kiln.flush()
    producer.start()


def assert_read_once_intact(read: Sequence[RecordRead], sent: Sequence[Sent]) -> None:
    duplicates = [k for k, n in Counter((r.partition, r.offset) for r in read).items() if n > 1]
    assert duplicates == []
    assert len(read) == len(sent)
    by_position = {(s.partition, s.offset): (s.key, s.value) for s in sent}
    assert all(by_position[(r.partition, r.offset)] == (r.key, r.value) for r in read)


def assert_commits_reach_the_end(events: Sequence[ConsumerEvent], sent: Sequence[Sent],
                                 bootstrap: str, group: str, topic: str) -> None:
    """Every commit succeeded, and the group's last ones are each partition's end."""
    commits = [e for e in events if isinstance(e, Committed)]
    assert [c.error for c in commits if not c.success] == []
    ends = Counter(s.partition for s in sent)
    assert committed_offsets(bootstrap, group) == {(topic, p): end for p, end in ends.items()}


def read_since_last_assignment(member: VerifiableConsumerProcess,
                               partitions: frozenset[int]) -> int:
    """Records of `partitions` the member read since it was last assigned every partition
    (0 while it is not)."""
    count, counting = 0, False
    for event in member.events:
        if isinstance(event, Assigned):
            count, counting = 0, event.partitions == ALL_PARTITIONS
        elif counting and isinstance(event, RecordRead) and event.partition in partitions:
            count += 1
    return count


def membership(events: Sequence[ConsumerEvent]) -> list[tuple[str, frozenset[int]]]:
    return [("assigned" if isinstance(e, Assigned) else "revoked", e.partitions)
            for e in events if isinstance(e, Assigned | Revoked)]


def reads_out_of_order(events: Sequence[ConsumerEvent]) -> list[str]:
    """Within each assignment, one member's reads of a partition must be consecutive."""
    problems = []
    last: dict[int, int] = {}
    for event in events:
        if isinstance(event, Assigned):
            last = {}
        elif isinstance(event, RecordRead):
            previous = last.get(event.partition)
            if previous is not None and event.offset != previous + 1:
                problems.append(f"partition {event.partition}: {event.offset} after {previous}")
            last[event.partition] = event.offset
    return problems


@pytest.fixture
def members() -> Iterator[list[VerifiableConsumerProcess]]:
    """The consumers a test starts, killed in the end if they still run."""
    started: list[VerifiableConsumerProcess] = []
    yield started
    for member in started:
        member.close()


@pytest.fixture
def producer(module_kiln: RunningKiln, unique_topic: str) -> Iterator[KeepProducing]:
    """A producer to the test's topic that is stopped in the end whatever happened (it would
    otherwise keep producing into the next test's Kiln)."""
    running = KeepProducing(module_kiln.bootstrap, unique_topic, 0)
    yield running
    running.close()


def test_consumer_group_rebalances_as_members_join_and_leave_and_reads_every_record_once(
        module_kiln: RunningKiln, unique_topic: str, tmp_path: Path,
        members: list[VerifiableConsumerProcess], producer: KeepProducing) -> None:
    # Given a 4-partition topic whose first 200 records were hardened to Kafka (so they are
    # read through Kiln from there) and a producer that keeps producing (read from Redis)
    hardened_then_live(module_kiln, unique_topic, producer)
    group = f"java-{uuid.uuid4().hex[:8]}"

    def join(name: str) -> VerifiableConsumerProcess:
        member = VerifiableConsumerProcess(module_kiln.bootstrap, unique_topic, group,
                                           CONSUMER_CONFIG, tmp_path, name)
        members.append(member)
        return member

    def split_between(a: VerifiableConsumerProcess, b: VerifiableConsumerProcess) -> bool:
        mine, theirs = a.assignments(), b.assignments()
        return (len(mine) >= 2 and len(theirs) >= 1 and bool(mine[-1].partitions)
                and bool(theirs[-1].partitions)
                and mine[-1].partitions | theirs[-1].partitions == ALL_PARTITIONS
                and not mine[-1].partitions & theirs[-1].partitions
                and len(b.records()) >= 10)

    # When member A reads alone, B joins, A leaves, and B reads on to the end
    first = join("member-a")
    first.wait_for("every partition assigned and the hardened records read", lambda: (
        [a.partitions for a in first.assignments()] == [ALL_PARTITIONS]
        and len(first.records()) >= 200))
    second = join("member-b")
    second.wait_for("the partitions split between A and B", lambda: split_between(first, second))
    split = (first.assignments()[-1].partitions, second.assignments()[-1].partitions)
    first_exit = first.stop()
    second.wait_for("every partition assigned to B, and records of A's share read by B",
                    lambda: read_since_last_assignment(second, split[0]) >= 20)
    sent = producer.stop()
    wanted = {(s.partition, s.offset) for s in sent}
    second.wait_for("every record read", lambda: wanted <= {
        (r.partition, r.offset) for r in first.records() + second.records()})
    second.stop()

    # Then A had every partition, then shared them with B (each revoked before reassigned:
    # the classic eager protocol), and B had them all once A left
    a_events, b_events = first.events, second.events
    a_share, b_share = split
    assert a_share and b_share and a_share | b_share == ALL_PARTITIONS, split
    assert membership(a_events)[:3] == [("assigned", ALL_PARTITIONS),
                                        ("revoked", ALL_PARTITIONS), ("assigned", a_share)]
    assert membership(b_events)[:3] == [("assigned", b_share), ("revoked", b_share),
                                        ("assigned", ALL_PARTITIONS)]
    assert first_exit in (0, 143), first.stderr()  # 143: exited on the SIGTERM, as asked
    # and every record was read exactly once, intact, in order within each assignment
    assert_read_once_intact(first.records() + second.records(), sent)
    assert reads_out_of_order(a_events) == []
    assert reads_out_of_order(b_events) == []
    # and every commit succeeded, none was read past, and the last ones are the log's end
    assert_commits_reach_the_end(a_events + b_events, sent, module_kiln.bootstrap, group,
                                 unique_topic)
    assert consumed_below_a_commit([a_events, b_events]) == []


def owned(member: VerifiableConsumerProcess) -> frozenset[int]:
    """What the member owns now, from its incremental (KIP-848) assignment events."""
    partitions: frozenset[int] = frozenset()
    for event in member.events:
        if isinstance(event, Assigned):
            partitions |= event.partitions
        elif isinstance(event, Revoked):
            partitions -= event.partitions
    return partitions


def test_kip848_group_rebalances_incrementally_and_reads_every_record_once(
        module_kiln: RunningKiln, unique_topic: str, tmp_path: Path,
        members: list[VerifiableConsumerProcess], producer: KeepProducing) -> None:
    # Given a 4-partition topic whose first 200 records were hardened to Kafka and a producer
    # that keeps producing
    hardened_then_live(module_kiln, unique_topic, producer)
    group = f"java848-{uuid.uuid4().hex[:8]}"

    def join(name: str) -> VerifiableConsumerProcess:
        member = VerifiableConsumerProcess(module_kiln.bootstrap, unique_topic, group,
                                           {"max.poll.records": 40, "fetch.max.wait.ms": 100},
                                           tmp_path, name, group_protocol="consumer")
        members.append(member)
        return member

    # When member A reads alone with the KIP-848 protocol, B joins, A leaves, B reads on
    first = join("member-a")
    first.wait_for("every partition assigned and the hardened records read",
                   lambda: owned(first) == ALL_PARTITIONS and len(first.records()) >= 200)
    second = join("member-b")
    second.wait_for("the partitions split between A and B", lambda: (
        bool(owned(first)) and bool(owned(second)) and not owned(first) & owned(second)
        and owned(first) | owned(second) == ALL_PARTITIONS and len(second.records()) >= 10))
    split = (owned(first), owned(second))
    described = run_tool(CONSUMER_GROUPS, "--bootstrap-server", module_kiln.bootstrap,
                         "--describe", "--group", group, "--members")
    first_exit = first.stop()
    second.wait_for("every partition owned by B, and records of A's share read by B", lambda: (
        owned(second) == ALL_PARTITIONS
        and sum(r.partition in split[0] for r in second.records()) >= 20))
    sent = producer.stop()
    wanted = {(s.partition, s.offset) for s in sent}
    second.wait_for("every record read", lambda: wanted <= {
        (r.partition, r.offset) for r in first.records() + second.records()})
    second.stop()

    # Then the group was rebalanced incrementally: A gave up only B's share (keeping its own
    # without a pause), B got its share, then A's once A left
    a_share, b_share = split
    assert a_share and b_share and a_share | b_share == ALL_PARTITIONS, split
    # (the consumer calls its listener with nothing assigned while its share is released)
    changes = [[m for m in membership(member.events) if m[1]] for member in (first, second)]
    assert changes[0][:2] == [("assigned", ALL_PARTITIONS), ("revoked", b_share)]
    assert changes[1][:2] == [("assigned", b_share), ("assigned", a_share)]
    assert first_exit in (0, 143), first.stderr()
    # and Kafka's own tool described both members of the consumer group (ConsumerGroupDescribe)
    assert described.returncode == 0, described
    rows = [line.split() for line in described.lines if line.startswith(group)]
    assert sorted(int(row[4]) for row in rows) == sorted([len(a_share), len(b_share)]), described
    # and every record was read exactly once, intact, in order within each assignment
    assert_read_once_intact(first.records() + second.records(), sent)
    # and every commit succeeded (OffsetCommit v9, under the member epoch), the last ones at
    # the log's end
    assert_commits_reach_the_end(first.events + second.events, sent, module_kiln.bootstrap,
                                 group, unique_topic)
