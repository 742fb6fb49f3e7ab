"""Ordinary Kafka clients against three Kiln nodes, used as users will use them: each client
knows one node only (the producer one, the group consumer another), and finds the rest the
way it finds Kafka's brokers: partitions' leaders from Metadata, the group's coordinator
from FindCoordinator.

- The Java client (Kafka's VerifiableProducer and VerifiableConsumer), kafka-python,
  aiokafka, franz-go and kafkajs: records produced to every partition of a 12-partition
  topic (every node leads some), read back through a consumer group coordinated by a node
  the consumer was not given, every record once and in order per partition, the group's
  commits the partitions' ends; once the nodes harden, Kafka holds every record once.
- Kafka's admin tools given one node: kafka-topics --describe shows every partition led by
  the node Metadata names, all three nodes leading some; kafka-consumer-groups --list finds
  a group coordinated elsewhere, --describe shows its offsets, lag and member.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from kafka import KafkaConsumer

from storage.leadership import partition_placement_key, place
from storage.model import TopicPartition
from tests.cluster.test_routing import by_id, find_coordinators, leaders
from tests.compat.clients import (
    Delivered,
    ProducerCase,
    Record,
    as_read,
    as_sent,
    create_topic_confluent,
    make_records,
    produce_aiokafka,
    produce_kafka_python,
    read_hardened,
)
from tests.compat.conftest import kafka_tools  # noqa: F401 (a fixture of tests/compat)
from tests.compat.java import (
    CONSUMER_GROUPS,
    TOPICS,
    Committed,
    RecordRead,
    VerifiableConsumerProcess,
    committed_offsets,
    run_tool,
    run_verifiable_producer,
    table,
)
from tests.compat.test_franz_go import franz_go, franz_go_binary  # noqa: F401 (a fixture)
from tests.compat.test_franz_go import produce as produce_franz_go
from tests.compat.test_kafkajs import NODE_MODULES, produce_kafkajs, run_kafkajs
from tests.conftest import _unavailable
from tests.kiln_harness import RunningKiln

PARTITIONS = 12
PER_PARTITION = 50  # records per partition, on average
N_RECORDS = PARTITIONS * PER_PARTITION
NODES = {0, 1, 2}
PRODUCER_NODE, CONSUMER_NODE, ADMIN_NODE = 0, 2, 1

# (partition, offset, key, value, headers, timestamp): a record as a consumer read it
Read = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]


def spread_records(n: int) -> list[Record]:
    """make_records' variety (null and empty values, repeated binary headers, timestamps
    that step back), each with a key of its own, so that the clients' key partitioners
    send records to every one of the 12 partitions."""
    return [dataclasses.replace(r, key=b"spread-%05d" % i) for i, r in enumerate(make_records(n))]


@pytest.fixture
def topic(unique_topic: str) -> str:
    """A new topic name whose 12 partitions the three nodes' placement spreads over all of
    them (for about one name in 45 a node would lead none)."""
    for attempt in range(100):
        name = f"{unique_topic}-{attempt}"
        if {place(partition_placement_key(TopicPartition(name, p)), tuple(sorted(NODES)))
                for p in range(PARTITIONS)} == NODES:
            return name
    raise AssertionError("no name found")  # (2/3)^12 * 3 per name: never


def topic_led_by_every_node(nodes: list[RunningKiln], topic: str) -> dict[int, int]:
    """A 12-partition topic created through node 0; its leaders, as every node tells them,
    each of the three leading some."""
    create_topic_confluent(nodes[PRODUCER_NODE].bootstrap, topic, PARTITIONS)
    told = [leaders(k.bootstrap, topic) for k in nodes]
    assert told[0] == told[1] == told[2]
    assert sorted(told[0]) == list(range(PARTITIONS))
    assert set(told[0].values()) == NODES, told[0]
    return told[0]


def group_coordinated_elsewhere(nodes: list[RunningKiln], *not_by: int) -> tuple[str, int]:
    """A new group name whose coordinator is none of the nodes `not_by` (the ones the test's
    clients are given), so that finding it takes FindCoordinator to another node."""
    names = [f"g-{uuid.uuid4().hex[:8]}" for _ in range(20)]
    coordinators = find_coordinators(nodes[0].bootstrap, names)
    group, (code, node, address) = next((g, c) for g, c in coordinators.items()
                                        if c[1] not in not_by)
    assert code == 0 and address == by_id(nodes)[node].bootstrap
    return group, node


# --- group consumers: every record read, in the order read, and the group committed ----------


def read_kafka_python(bootstrap: str, topic: str, group: str, count: int) -> list[Read]:
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                             client_id="kafka-python-member", auto_offset_reset="earliest",
                             enable_auto_commit=False, fetch_max_wait_ms=200)
    read: list[Read] = []
    try:
        deadline = time.monotonic() + 40
        while len(read) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                read += [(r.partition, r.offset, r.key, r.value,
                          tuple((k, v) for k, v in r.headers), r.timestamp) for r in records]
        consumer.commit()
    finally:
        consumer.close()
    return read


def read_aiokafka(bootstrap: str, topic: str, group: str, count: int) -> list[Read]:
    async def run() -> list[Read]:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    fetch_max_wait_ms=200)
        await consumer.start()
        read: list[Read] = []
        try:
            deadline = time.monotonic() + 40
            while len(read) < count and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    read += [(r.partition, r.offset, r.key, r.value, tuple(r.headers),
                              r.timestamp) for r in records]
            await consumer.commit()
        finally:
            await consumer.stop()
        return read

    return asyncio.run(run())


def read_franz_go(bootstrap: str, topic: str, group: str, count: int) -> list[Read]:
    # A classic group member committing after every poll; it leaves the group at the end.
    run = franz_go("group", "--brokers", bootstrap, "--topics", topic, "--group", group,
                   "--records", str(count), "--timeout-ms", "40000", timeout_s=55)
    assert [e["error"] for e in run.of("committed")] == [None] * len(run.of("committed")), run
    return [(e["partition"], e["offset"], unb64(e["key"]), unb64(e["value"]),
             tuple((k, unb64(v)) for k, v in e["headers"]), e["timestamp_ms"])
            for e in run.of("record")]


def read_kafkajs(bootstrap: str, topic: str, group: str, count: int) -> list[Read]:
    # One member, committing as it reads (kafkajs's autoCommit) and on disconnect.
    run = run_kafkajs("consume", {"brokers": [bootstrap], "topic": topic, "groupId": group,
                                  "count": count, "timeoutMs": 40_000}, timeout_s=55)
    assert run.returncode == 0, run
    assert run.of("end") == [{"event": "end", "reason": "count", "read": count}], run
    return [(e["partition"], e["offset"], unb64(e["key"]), unb64(e["value"]),
             tuple((k, unb64(v)) for k, v in e["headers"]), e["timestamp"])
            for e in run.of("record")]


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


ProduceFn = Callable[[str, str, Sequence[Record], ProducerCase, int | None], list[Delivered]]
ReadFn = Callable[[str, str, str, int], list[Read]]

CLIENTS: dict[str, tuple[ProduceFn, ReadFn, tuple[str, ...]]] = {
    "kafka-python": (produce_kafka_python, read_kafka_python, ()),
    "aiokafka": (produce_aiokafka, read_aiokafka, ()),
    "franz-go": (produce_franz_go, read_franz_go, ("franz_go_binary",)),
    "kafkajs": (produce_kafkajs, read_kafkajs, ("kafkajs_installed",)),
}


@pytest.fixture
def kafkajs_installed() -> None:
    """kafkajs's packages (tests/compat/test_kafkajs.py's module fixture, which would apply
    to every test here if imported)."""
    if shutil.which("node") is None or not (NODE_MODULES / "kafkajs").is_dir():
        _unavailable("kafkajs", f"node, or kafkajs in {NODE_MODULES}, is missing "
                                "(run scripts/setup.sh)")


@pytest.mark.parametrize("client", list(CLIENTS))
def test_a_client_given_one_node_produces_to_every_partition_and_its_group_reads_each_once(
        kiln_cluster: list[RunningKiln], kafka_bootstrap: str, topic: str,
        request: pytest.FixtureRequest, client: str) -> None:
    for fixture in CLIENTS[client][2]:  # the Go binary or the Node packages, where missing
        request.getfixturevalue(fixture)
    produce_to_every_node_and_read_through_a_group(kiln_cluster, kafka_bootstrap, topic,
                                                   client)


def produce_to_every_node_and_read_through_a_group(kiln_cluster: list[RunningKiln],
                                                   kafka_bootstrap: str, topic: str,
                                                   client: str) -> None:
    """The client test's body (tests/cluster/test_redis_cluster.py runs it too)."""
    produce, read, _ = CLIENTS[client]
    # Given a 12-partition topic whose partitions all three nodes lead, and a group that
    # neither node the clients are given coordinates
    placement = topic_led_by_every_node(kiln_cluster, topic)
    group, _coordinator = group_coordinated_elsewhere(kiln_cluster, PRODUCER_NODE,
                                                      CONSUMER_NODE)
    records = spread_records(N_RECORDS)

    # When the client, given node 0 only, produces the records (idempotent, acks=all), its
    # partitioner placing them by key
    delivered = produce(kiln_cluster[PRODUCER_NODE].bootstrap, topic, records,
                        ProducerCase("lz4", "all", True), None)
    # and a member of the group, given node 2 only, reads them and commits
    got = read(kiln_cluster[CONSUMER_NODE].bootstrap, topic, group, N_RECORDS)

    # Then every partition (so every node) took records, at offsets 0.. in send order
    sent: dict[int, list[tuple[Any, ...]]] = {p: [] for p in range(PARTITIONS)}
    for record, where in zip(records, delivered, strict=True):
        assert where.offset == len(sent[where.partition]), (where, record)
        sent[where.partition].append(as_sent(record, where.offset))
    assert all(sent.values()), {p: len(s) for p, s in sent.items()}
    assert {placement[p] for p in range(PARTITIONS)} == NODES
    # and the member read each record once, as sent, in offset order per partition
    assert len(got) == N_RECORDS
    for partition in range(PARTITIONS):
        in_partition = [(offset, key, value, headers, ts)
                        for p, offset, key, value, headers, ts in got if p == partition]
        assert in_partition == sent[partition], f"partition {partition}"
    # and the group's commits, asked through the third node, are the partitions' ends
    assert committed_offsets(kiln_cluster[ADMIN_NODE].bootstrap, group) == {
        (topic, p): len(s) for p, s in sent.items()}
    # and once each node hardens the partitions it leads, Kafka holds every record once
    assert all(k.flush() for k in kiln_cluster)
    hardened = read_hardened(kafka_bootstrap, topic, PARTITIONS)
    assert {p: [as_read(h) for h in hs] for p, hs in hardened.items()} == sent


# --- the Java client -------------------------------------------------------------------------


@pytest.mark.usefixtures("kafka_tools")
def test_the_java_client_given_one_node_produces_to_every_partition_and_its_group_reads_each_once(
        kiln_cluster: list[RunningKiln], kafka_bootstrap: str, topic: str,
        tmp_path: Path) -> None:
    # Given a 12-partition topic whose partitions all three nodes lead, and a group that
    # neither node the clients are given coordinates
    placement = topic_led_by_every_node(kiln_cluster, topic)
    group, _coordinator = group_coordinated_elsewhere(kiln_cluster, PRODUCER_NODE,
                                                      CONSUMER_NODE)

    # When the Java producer, given node 0 only, sends records under 240 keys (idempotent,
    # acks=all, small batches, five in flight)
    produced = run_verifiable_producer(kiln_cluster[PRODUCER_NODE].bootstrap, topic,
                                       N_RECORDS, {
                                           "enable.idempotence": "true", "retries": 2147483647,
                                           "max.in.flight.requests.per.connection": 5,
                                           "batch.size": 1024, "linger.ms": 5,
                                           "request.timeout.ms": 15_000,
                                           "delivery.timeout.ms": 30_000},
                                       tmp_path, repeating_keys=240)
    sent: dict[int, list[tuple[int, str, str]]] = {p: [] for p in range(PARTITIONS)}
    for acked in sorted(produced.acked, key=lambda a: int(a.value)):  # values count sends
        sent[acked.partition].append((acked.offset, acked.key, acked.value))
    ends = {p: len(s) for p, s in sent.items()}
    # and a Java consumer in the group, given node 2 only, reads them (committing after
    # every poll) and is stopped once it committed the ends
    consumer = VerifiableConsumerProcess(
        kiln_cluster[CONSUMER_NODE].bootstrap, topic, group,
        {"max.poll.records": 200, "fetch.max.wait.ms": 100}, tmp_path, "java-member")

    def committed_by_consumer() -> dict[int, int]:
        last: dict[int, int] = {}
        for commit in (e for e in consumer.events if isinstance(e, Committed)):
            last.update(commit.offsets)
        return last

    try:
        consumer.wait_for("commits at the partitions' ends",
                          lambda: committed_by_consumer() == ends, timeout_s=40)
        exit_code = consumer.stop()
        events, stderr = consumer.events, consumer.stderr()
    finally:
        consumer.close()

    # Then every record was acknowledged, every partition (so every node) taking some, at
    # offsets 0.. in send order
    assert produced.errors == [], produced.errors[:3]
    assert (produced.sent, produced.acked_count, len(produced.acked)) == (N_RECORDS,) * 3
    assert all(sent.values()), ends
    assert all([o for o, _, _ in s] == list(range(len(s))) for s in sent.values())
    assert {placement[p] for p in range(PARTITIONS)} == NODES
    assert exit_code in (0, 143), stderr  # 143: exited on the SIGTERM, as asked
    # and the consumer read each once, in offset order per partition, as acknowledged
    read = [e for e in events if isinstance(e, RecordRead)]
    assert len(read) == N_RECORDS
    for partition, expected in sent.items():
        assert [(r.offset, r.key, r.value) for r in read if r.partition == partition] == \
            expected, f"partition {partition}"
    # and its commits all succeeded, the last of each partition its end, which is what the
    # group holds, asked through the third node
    commits = [e for e in events if isinstance(e, Committed)]
    assert all(c.success for c in commits), [c for c in commits if not c.success]
    assert committed_offsets(kiln_cluster[ADMIN_NODE].bootstrap, group) == {
        (topic, p): end for p, end in ends.items()}
    # and once each node hardens the partitions it leads, Kafka holds every record once
    assert all(k.flush() for k in kiln_cluster)
    hardened = read_hardened(kafka_bootstrap, topic, PARTITIONS)
    assert {p: [(h.kiln_offset, (h.key or b"").decode(), (h.value or b"").decode())
                for h in hs] for p, hs in hardened.items()} == sent


# --- Kafka's admin tools ---------------------------------------------------------------------


def describe_line(line: str) -> dict[str, str]:
    """One line of kafka-topics --describe: its tab-separated `Name: value` fields (a value
    may be empty: "Configs: ")."""
    return {name.strip(): value.strip()
            for name, value in (field.split(":", 1) for field in line.strip().split("\t"))}


@pytest.mark.usefixtures("kafka_tools")
def test_kafkas_admin_tools_given_one_node_describe_the_cluster_s_leaders_and_groups(
        kiln_cluster: list[RunningKiln], topic: str) -> None:
    # Given a 12-partition topic whose partitions all three nodes lead, with records in
    # every partition (kafka-python through node 0)
    placement = topic_led_by_every_node(kiln_cluster, topic)
    records = spread_records(N_RECORDS)
    delivered = produce_kafka_python(kiln_cluster[PRODUCER_NODE].bootstrap, topic,
                                     records, ProducerCase("none", "all", True), None)
    ends = Counter(d.partition for d in delivered)
    assert sorted(ends) == list(range(PARTITIONS))
    # and a group, not coordinated by the node the tools are given, whose live member (given
    # node 2) read everything and committed
    group, coordinator = group_coordinated_elsewhere(kiln_cluster, ADMIN_NODE)
    member = KafkaConsumer(topic, bootstrap_servers=kiln_cluster[CONSUMER_NODE].bootstrap,
                           group_id=group, client_id="tools-member",
                           auto_offset_reset="earliest", enable_auto_commit=False,
                           fetch_max_wait_ms=200)
    admin = kiln_cluster[ADMIN_NODE].bootstrap
    try:
        read = 0
        deadline = time.monotonic() + 30
        while read < N_RECORDS and time.monotonic() < deadline:
            read += sum(map(len, member.poll(timeout_ms=500).values()))
        assert read == N_RECORDS
        member.commit()

        # When kafka-topics describes the topic, and kafka-consumer-groups lists the groups
        # and describes this one, each given node 1 only
        topics = run_tool(TOPICS, "--bootstrap-server", admin, "--describe",
                          "--topic", topic)
        listed = run_tool(CONSUMER_GROUPS, "--bootstrap-server", admin, "--list")
        described = run_tool(CONSUMER_GROUPS, "--bootstrap-server", admin, "--describe",
                             "--group", group)
    finally:
        member.close()

    # Then kafka-topics shows each partition led by the node Metadata names, its only
    # replica, the three nodes leading some
    assert topics.returncode == 0, topics
    described_topic, *partitions = [describe_line(line) for line in topics.lines]
    assert (described_topic["Topic"], described_topic["PartitionCount"]) == (
        topic, str(PARTITIONS))
    shown = {int(p["Partition"]): (p["Leader"], p["Replicas"], p["Isr"]) for p in partitions}
    assert shown == {p: (str(n),) * 3 for p, n in placement.items()}
    assert {leader for leader, _, _ in shown.values()} == {str(n) for n in NODES}
    # and kafka-consumer-groups lists the group once (asking every node for its groups)
    assert listed.returncode == 0, listed
    assert listed.lines.count(group) == 1, listed
    # and describes it through its coordinator (node `coordinator`): every partition at its
    # end, no lag, owned by the live member
    assert coordinator != ADMIN_NODE
    assert described.returncode == 0, described
    rows = sorted(table(described), key=lambda row: int(row["PARTITION"]))
    assert [(r["GROUP"], r["TOPIC"], r["PARTITION"], r["CURRENT-OFFSET"], r["LOG-END-OFFSET"],
             r["LAG"], r["CLIENT-ID"]) for r in rows] == [
        (group, topic, str(p), str(ends[p]), str(ends[p]), "0", "tools-member")
        for p in range(PARTITIONS)]
    assert len({r["CONSUMER-ID"] for r in rows}) == 1
