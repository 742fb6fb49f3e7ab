"""franz-go (github.com/twmb/franz-go v1.22, kadm v1.20), the Go client, against Kiln: a
small Go program (tests/compat/franz_go, built by scripts/clients/franz_go.sh) driven as a
subprocess, printing one JSON event per line.

Producing: every codec at acks=1, acks 0 / all x idempotence off / on, franz-go's own
partitioner on a topic franz-go created, and a topic created by the producer's Metadata
request (franz-go asks for that only when told to). Every acknowledged record is in the
hardened Kafka topic exactly once, in the partition and at the (Kiln) offset franz-go was
told, intact (tests/compat/test_producers.py's checks).

Consuming: partitions read directly from the start and from an offset; a classic consumer
group that commits after every poll reads every record once, its commits are what
kafka-python reads through Kiln, and a second run of the group resumes from them. KIP-848:
franz-go's `ServerSideBalancer()` speaks the "consumer" group protocol
(ConsumerGroupHeartbeat) and silently falls back to the classic one where the broker does
not offer it, so the tests check which API franz-go really used: against Apache Kafka
directly (the control), and through Kiln.

Admin (kadm): create topics (with configs, with a replica assignment), create partitions,
delete topics, list topics and metadata, describe and alter configs (incremental and
legacy), delete records, list / describe / delete groups, fetch / commit / delete offsets,
describe cluster, list offsets (start, end, max timestamp, by time), ApiVersions. Each
change is checked with another client, through Kiln (kafka-python, librdkafka) or at Kafka.
Bad input gets the error code Kafka itself gives franz-go for the same request.

Against the issue's target, "0 requests from the client matrix answered by a closed
connection": every franz-go run reports the requests whose connection failed under them
(none allowed), and every test checks that Kiln closed no connection for a request it could
not take (its `kiln_malformed_frames` counter, and its "closing ..." warnings).

One Kiln serves the whole module; every test uses topics and groups of its own.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient
from kafka.admin import KafkaAdminClient
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from storage.topics import kiln_configs
from tests.compat.clients import (
    Delivered,
    Hardened,
    ProducerCase,
    Record,
    as_read,
    as_sent,
    assert_hardened_with_codec,
    create_topic_confluent,
    expected_by_partition,
    kafka_partition_count,
    make_records,
    read_hardened,
)
from tests.compat.conftest import answering_all
from tests.compat.java import commit_offsets, committed_offsets
from tests.compat.test_producers import assert_hardened_as_sent, harden_and_read
from tests.conftest import _unavailable
from tests.kiln_harness import RunningKiln, eventually
from tests.raw_client import RawClient

BINARY = Path(__file__).resolve().parents[2] / ".clients" / "franz-go" / "franz-go"
N_RECORDS = 200
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
API_JOIN_GROUP, API_CONSUMER_GROUP_HEARTBEAT = 11, 68

# Kafka's error codes, as franz-go reports them.
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_TOPIC_EXCEPTION = 17
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_CONFIG = 40
GROUP_ID_NOT_FOUND = 69


@pytest.fixture(scope="session")
def franz_go_binary() -> Path:
    if not BINARY.is_file():
        _unavailable("franz-go", f"{BINARY} is missing (scripts/setup.sh builds it with "
                                 "scripts/clients/franz_go.sh)")
    return BINARY


pytestmark = pytest.mark.usefixtures("franz_go_binary")


@pytest.fixture(autouse=True)
def no_connection_closed_by_kiln(module_kiln: RunningKiln,
                                 caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Kiln answers a request it cannot take (malformed, an API or version it does not
    serve) by closing the connection, counting it in `kiln_malformed_frames_total` and logging
    "closing ..." at WARNING; an unexpected failure in a handler is logged at ERROR. Here no
    WARNING of Kiln's is let pass either."""
    with answering_all(module_kiln, caplog, warnings_fail=True):
        yield


# --- the Go program -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FranzGoRun:
    command: tuple[str, ...]
    returncode: int
    events: list[dict[str, Any]]
    stderr: str

    def of(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]

    @property
    def requests_by_api(self) -> dict[int, int]:
        """How many requests franz-go sent, by API key."""
        [summary] = self.of("requests")
        return {int(key): n for key, n in summary["by_api_key"].items()}

    def __str__(self) -> str:
        lines = "\n".join(json.dumps(e) for e in self.events[-20:])
        return (f"{' '.join(self.command[1:])}\nexit code {self.returncode}\n"
                f"--- events (last 20) ---\n{lines}\n--- stderr ---\n{self.stderr[-3000:]}")


def franz_go(*args: str, stdin: str | None = None, timeout_s: float = 60) -> FranzGoRun:
    """Run the program to its end. It must succeed, and no request of its may have lost
    its connection before franz-go was done with it."""
    command = (str(BINARY), *args)
    try:
        done = subprocess.run(command, input=stdin, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"franz-go {' '.join(args)} did not finish within "
                             f"{timeout_s} s:\n{exc.stdout!r}\n{exc.stderr!r}") from exc
    # Every stdout line is an event: one that is not JSON fails the test.
    events = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    run = FranzGoRun(command, done.returncode, events, done.stderr)
    assert run.returncode == 0, run
    [summary] = run.of("requests")
    assert summary["broken"] == [], run
    return run


def admin(bootstrap: str, op: str, *args: str) -> dict[str, Any]:
    """One kadm operation: its "admin" event ("results", and "error_code" for the whole
    request)."""
    [event] = franz_go("admin", op, "--brokers", bootstrap, *args).of("admin")
    return event


def admin_results(bootstrap: str, op: str, *args: str) -> Any:
    event = admin(bootstrap, op, *args)
    assert event["error_code"] == 0, event
    return event["results"]


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def records_json(records: Sequence[Record]) -> str:
    return "".join(json.dumps({"key": b64(r.key), "value": b64(r.value),
                               "headers": [[k, b64(v)] for k, v in r.headers],
                               "timestamp_ms": r.timestamp_ms}) + "\n" for r in records)


def produce(bootstrap: str, topic: str, records: Sequence[Record], case: ProducerCase,
            partition: int | None, *extra: str) -> list[Delivered]:
    """franz-go's delivery report of each record, in send order (tests/compat/clients.py's
    producer drivers' contract)."""
    args = ["produce", "--brokers", bootstrap, "--topic", topic, "--codec", case.compression,
            "--acks", str(case.acks), f"--idempotent={str(case.idempotence).lower()}", *extra]
    if partition is not None:
        args += ["--partition", str(partition)]
    run = franz_go(*args, stdin=records_json(records))
    delivered = sorted(run.of("delivered"), key=lambda d: int(d["index"]))
    assert [d["index"] for d in delivered] == list(range(len(records))), run
    failed = [d for d in delivered if d["error"] is not None]
    assert not failed, f"{len(failed)} records failed, first: {failed[:3]}"
    # acks=0: franz-go is told nothing; its offsets are placeholders.
    return [Delivered(d["partition"], None if case.acks == 0 else d["offset"])
            for d in delivered]


def read_events(run: FranzGoRun) -> list[Hardened]:
    """The records a consume or group run printed, in the order it read them."""
    return [Hardened(e["partition"], e["offset"], unb64(e["key"]), unb64(e["value"]),
                     tuple((k, unb64(v)) for k, v in e["headers"]), e["timestamp_ms"])
            for e in run.of("record")]


def new_group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def produce_spread(bootstrap: str, topic: str, n: int, partitions: int
                   ) -> dict[tuple[int, int], tuple[Any, ...]]:
    """`n` records sent by franz-go to a `partitions`-partition topic it created, all
    acknowledged; by (partition, offset)."""
    admin_results(bootstrap, "create-topics", "--topic", topic,
                  "--partitions", str(partitions))
    records = make_records(n)
    delivered = produce(bootstrap, topic, records, ProducerCase("lz4", "all", True), None)
    return sent_by_position(records, delivered, partitions)


def by_position(records: Sequence[Hardened]) -> dict[tuple[int, int], tuple[Any, ...]]:
    return {(r.partition, r.offset): as_read(r) for r in records}


def sent_by_position(records: Sequence[Record], delivered: Sequence[Delivered],
                     partitions: int) -> dict[tuple[int, int], tuple[Any, ...]]:
    out = {}
    for partition, sent in expected_by_partition(records, delivered, partitions).items():
        for record, offset in sent:
            assert offset is not None
            out[(partition, offset)] = as_sent(record, offset)
    return out


# --- producing --------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", CODECS)
def test_every_codec_is_hardened_intact(module_kiln: RunningKiln, kafka_bootstrap: str,
                                        unique_topic: str, compression: str) -> None:
    # Given a topic created through Kiln with kadm
    admin_results(module_kiln.bootstrap, "create-topics", "--topic", unique_topic)
    records = make_records(N_RECORDS)
    # When franz-go sends the records with the codec, acks=1
    delivered = produce(module_kiln.bootstrap, unique_topic, records,
                        ProducerCase(compression, 1, False), 0)
    # Then each is hardened once at the offset franz-go was told, intact, in batches of
    # the codec
    hardened = harden_and_read(module_kiln, kafka_bootstrap, unique_topic, 1, N_RECORDS)
    assert_hardened_as_sent(records, delivered, hardened, 1, acks_zero=False)
    assert_hardened_with_codec(kafka_bootstrap, unique_topic, compression)


@pytest.mark.parametrize(("acks", "idempotence"), [(0, False), ("all", False), ("all", True)])
def test_acks_and_idempotence(module_kiln: RunningKiln, kafka_bootstrap: str,
                              unique_topic: str, acks: int | str, idempotence: bool) -> None:
    # acks=1 is the codec tests'; franz-go refuses idempotence without acks=all.
    admin_results(module_kiln.bootstrap, "create-topics", "--topic", unique_topic)
    records = make_records(N_RECORDS)

    delivered = produce(module_kiln.bootstrap, unique_topic, records,
                        ProducerCase("zstd", acks, idempotence), 0)

    hardened = harden_and_read(module_kiln, kafka_bootstrap, unique_topic, 1, N_RECORDS)
    assert_hardened_as_sent(records, delivered, hardened, 1, acks_zero=acks == 0)


def test_franz_gos_partitioner_spreads_records_by_key(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a 3-partition topic created through Kiln with kadm
    admin_results(module_kiln.bootstrap, "create-topics", "--topic", unique_topic,
                  "--partitions", "3")
    records = make_records(N_RECORDS)
    # When franz-go places the records itself (idempotent, acks=all: its defaults)
    delivered = produce(module_kiln.bootstrap, unique_topic, records,
                        ProducerCase("gzip", "all", True), None)
    # Then every partition holds its records in order, each key in one partition
    hardened = harden_and_read(module_kiln, kafka_bootstrap, unique_topic, 3, N_RECORDS)
    assert_hardened_as_sent(records, delivered, hardened, 3, acks_zero=False)
    assert len({d.partition for d in delivered}) >= 2, delivered
    by_key: dict[bytes, set[int]] = {}
    for record, where in zip(records, delivered, strict=True):
        if record.key is not None:
            by_key.setdefault(record.key, set()).add(where.partition)
    assert all(len(p) == 1 for p in by_key.values()), by_key


def test_a_topic_is_created_when_the_producer_asks_for_it(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # When franz-go produces to a topic nobody created, allowing its creation in Metadata
    records = make_records(20)
    delivered = produce(module_kiln.bootstrap, unique_topic, records,
                        ProducerCase("snappy", "all", True), 0, "--auto-create")
    # Then Kiln created it (in Kafka too) and hardened every record
    assert kafka_partition_count(kafka_bootstrap, unique_topic) >= 1
    hardened = harden_and_read(module_kiln, kafka_bootstrap, unique_topic, 1, 20)
    assert_hardened_as_sent(records, delivered, hardened, 1, acks_zero=False)


# --- consuming --------------------------------------------------------------------------------


def test_direct_consumer_reads_every_partition_from_the_start_and_from_an_offset(
        module_kiln: RunningKiln, unique_topic: str) -> None:
    # Given records franz-go spread over 3 partitions
    admin_results(module_kiln.bootstrap, "create-topics", "--topic", unique_topic,
                  "--partitions", "3")
    records = make_records(N_RECORDS)
    delivered = produce(module_kiln.bootstrap, unique_topic, records,
                        ProducerCase("lz4", "all", True), None)
    sent = sent_by_position(records, delivered, 3)
    in_partition_0 = sum(1 for d in delivered if d.partition == 0)
    # When franz-go reads the partitions without a group: all from the start, and
    # partition 0 from its offset 5
    whole = franz_go("consume", "--brokers", module_kiln.bootstrap, "--topic", unique_topic,
                     "--partitions", "0,1,2", "--from", "start",
                     "--records", str(N_RECORDS))
    tail = franz_go("consume", "--brokers", module_kiln.bootstrap, "--topic", unique_topic,
                    "--partitions", "0", "--from", "5", "--records", str(in_partition_0 - 5))
    # Then it read every record once, each partition in offset order, as it was sent
    read = read_events(whole)
    assert len(read) == N_RECORDS
    assert by_position(read) == sent
    for partition in range(3):
        offsets = [r.offset for r in read if r.partition == partition]
        assert offsets == sorted(offsets), f"partition {partition}"
    assert by_position(read_events(tail)) == {
        position: record for position, record in sent.items()
        if position[0] == 0 and position[1] >= 5}


def test_classic_group_reads_every_record_once_and_commits_through_kiln(
        module_kiln: RunningKiln, unique_topic: str) -> None:
    # Given 150 records over 3 partitions
    admin_results(module_kiln.bootstrap, "create-topics", "--topic", unique_topic,
                  "--partitions", "3")
    records = make_records(150)
    delivered = produce(module_kiln.bootstrap, unique_topic, records,
                        ProducerCase("gzip", "all", True), None)
    group = new_group()
    # When a franz-go group member (classic protocol) reads them, committing after every
    # poll, and leaves
    first = franz_go("group", "--brokers", module_kiln.bootstrap, "--topics", unique_topic,
                     "--group", group, "--records", "150")
    # Then it read every record once, through JoinGroup, and its commits are the ends of
    # the partitions, as kafka-python reads them through Kiln
    assert first.requests_by_api.get(API_JOIN_GROUP, 0) >= 1, first
    read = read_events(first)
    assert len(read) == 150
    assert by_position(read) == sent_by_position(records, delivered, 3)
    ends = {(unique_topic, p): sum(1 for d in delivered if d.partition == p)
            for p in range(3)}
    assert committed_offsets(module_kiln.bootstrap, group) == {
        tp: end for tp, end in ends.items() if end}
    assert [e["error"] for e in first.of("committed")] == [None] * len(first.of("committed"))
    # And a second run of the group reads only what was sent since
    more = make_records(6)
    produce(module_kiln.bootstrap, unique_topic, more, ProducerCase("none", "all", True), 1)
    second = franz_go("group", "--brokers", module_kiln.bootstrap, "--topics", unique_topic,
                      "--group", group, "--records", "6")
    assert [(r.partition, r.offset, r.value) for r in read_events(second)] == [
        (1, ends[(unique_topic, 1)] + i, record.value) for i, record in enumerate(more)]


def run_kip848_group(bootstrap: str, topic: str) -> None:
    """A franz-go member asking for the "consumer" group protocol reads 60 records of a
    3-partition topic: every record once, over ConsumerGroupHeartbeat, the group listed as
    a "consumer" group, and its commits what kafka-python reads."""
    sent = produce_spread(bootstrap, topic, 60, 3)
    group = new_group()
    run = franz_go("group", "--brokers", bootstrap, "--topics", topic, "--group", group,
                   "--protocol", "consumer", "--records", "60")
    read = read_events(run)
    assert len(read) == 60
    assert by_position(read) == sent
    # franz-go falls back to JoinGroup, silently, where ConsumerGroupHeartbeat is not served.
    used = run.requests_by_api
    assert used.get(API_CONSUMER_GROUP_HEARTBEAT, 0) >= 1, used
    assert API_JOIN_GROUP not in used, used
    listed = {g["group"]: g for g in admin_results(bootstrap, "list-groups")}
    assert listed[group]["group_type"] == "consumer", listed[group]
    ends: dict[tuple[str, int], int] = {}
    for partition, offset in sent:
        ends[(topic, partition)] = max(ends.get((topic, partition), 0), offset + 1)
    assert committed_offsets(bootstrap, group) == ends


def test_kip848_consumer_group_protocol_at_kafka_itself(kafka_bootstrap: str,
                                                        unique_topic: str) -> None:
    # The control for the test below: franz-go's KIP-848 member works against Apache Kafka
    # 4.4 directly, and the checks see it.
    run_kip848_group(kafka_bootstrap, f"{unique_topic}-kafka")


def test_kip848_consumer_group_protocol_through_kiln(module_kiln: RunningKiln,
                                                      unique_topic: str) -> None:
    run_kip848_group(module_kiln.bootstrap, unique_topic)


# --- admin: topics ------------------------------------------------------------------------------


def kiln_topics(kiln_bootstrap: str) -> dict[str, int]:
    """Topic -> partition count, as kafka-python's admin reads them through Kiln."""
    with KafkaAdminClient(bootstrap_servers=kiln_bootstrap) as client:
        return {t["name"]: len(t["partitions"]) for t in client.describe_topics()}


def kafka_config(kafka_bootstrap: str, topic: str, name: str) -> str | None:
    client = AdminClient({"bootstrap.servers": kafka_bootstrap})
    resource = confluent_kafka.admin.ConfigResource("topic", topic)  # type: ignore[attr-defined]
    entry = client.describe_configs([resource])[resource].result(15).get(name)
    return None if entry is None else str(entry.value)


def kafka_node_id(kafka_bootstrap: str) -> int:
    brokers = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(
        timeout=10).brokers
    [node] = brokers
    return int(node)


def test_create_topics_with_configs_makes_the_topic_in_kiln_and_kafka(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # When kadm creates a 3-partition topic with a Kafka config and one of Kiln's
    [created] = admin_results(module_kiln.bootstrap, "create-topics", "--topic", unique_topic,
                              "--partitions", "3", "--config", "retention.ms=86400000",
                              "--config", "kiln.harden=all")
    # Then the answer describes it, and Kiln, Kafka and Kiln's policy have it
    assert (created["error_code"], created["partitions"], created["replication_factor"]) == (
        0, 3, 1), created
    assert created["configs"]["retention.ms"] == "86400000"
    assert created["configs"]["kiln.harden"] == "all"
    assert kiln_topics(module_kiln.bootstrap)[unique_topic] == 3
    assert kafka_partition_count(kafka_bootstrap, unique_topic) == 3
    assert kafka_config(kafka_bootstrap, unique_topic, "retention.ms") == "86400000"
    assert kiln_policy(module_kiln, unique_topic)["kiln.harden"] == "all"


def test_create_topics_with_a_replica_assignment_places_them_in_kafka(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # When kadm's CreateTopics names the replicas of 2 partitions (Kafka's broker ids)
    node = kafka_node_id(kafka_bootstrap)
    [created] = admin_results(module_kiln.bootstrap, "create-topics", "--topic", unique_topic,
                              "--assignment", json.dumps([[node], [node]]))
    # Then the topic has those 2 partitions in Kiln and in Kafka, on those replicas
    assert (created["error_code"], created["partitions"]) == (0, 2), created
    assert kiln_topics(module_kiln.bootstrap)[unique_topic] == 2
    at_kafka = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(
        unique_topic, timeout=10).topics[unique_topic]
    assert {p: list(m.replicas) for p, m in at_kafka.partitions.items()} == {
        0: [node], 1: [node]}


def test_create_partitions_grows_the_topic_in_kiln_and_kafka(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a 2-partition topic
    admin_results(module_kiln.bootstrap, "create-topics", "--topic", unique_topic,
                  "--partitions", "2")
    # When kadm grows it to 4, then adds 1
    [grown] = admin_results(module_kiln.bootstrap, "create-partitions", "--topic",
                            unique_topic, "--set", "4")
    [added] = admin_results(module_kiln.bootstrap, "create-partitions", "--topic",
                            unique_topic, "--add", "1")
    # Then Kiln and Kafka have 5 partitions, the new ones taking records
    assert (grown["error_code"], added["error_code"]) == (0, 0), (grown, added)
    assert kiln_topics(module_kiln.bootstrap)[unique_topic] == 5
    assert kafka_partition_count(kafka_bootstrap, unique_topic) == 5
    [delivered] = produce(module_kiln.bootstrap, unique_topic, make_records(1),
                          ProducerCase("none", "all", True), 4)
    assert delivered == Delivered(4, 0)


def test_delete_topics_removes_them_from_kiln_and_kafka(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given two topics with records, one hardened
    other = f"{unique_topic}-other"
    for topic in (unique_topic, other):
        admin_results(module_kiln.bootstrap, "create-topics", "--topic", topic)
        produce(module_kiln.bootstrap, topic, make_records(3), ProducerCase("none", 1, False), 0)
    assert module_kiln.flush()
    # When kadm deletes the first
    [deleted] = admin_results(module_kiln.bootstrap, "delete-topics", "--topic", unique_topic)
    # Then neither Kiln nor Kafka has it any more, and the other is untouched
    assert (deleted["topic"], deleted["error_code"]) == (unique_topic, 0), deleted
    topics = kiln_topics(module_kiln.bootstrap)
    assert unique_topic not in topics and topics[other] == 1
    assert eventually(lambda: unique_topic not in AdminClient(
        {"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics)
    assert kafka_partition_count(kafka_bootstrap, other) == 1


def test_list_topics_metadata_and_describe_cluster_show_kilns_node(
        module_kiln: RunningKiln, unique_topic: str) -> None:
    # Given a 2-partition topic created with librdkafka through Kiln
    create_topic_confluent(module_kiln.bootstrap, unique_topic, 2)
    # When kadm lists the topics, asks for the topic's metadata, and describes the cluster
    listed = admin_results(module_kiln.bootstrap, "list-topics")
    metadata = admin_results(module_kiln.bootstrap, "metadata", "--topic", unique_topic)
    cluster = admin_results(module_kiln.bootstrap, "describe-cluster")
    # Then the topics are kafka-python's, and Kiln's one node leads every partition
    assert set(listed) == set(kiln_topics(module_kiln.bootstrap))
    node = module_kiln.settings.node_id
    host, _, port = module_kiln.bootstrap.rpartition(":")
    assert metadata["brokers"] == [{"node_id": node, "host": host, "port": int(port)}]
    [topic] = metadata["topics"]
    assert (topic["topic"], topic["error_code"]) == (unique_topic, 0)
    assert [(p["partition"], p["leader"], p["replicas"], p["isr"], p["error_code"])
            for p in topic["partitions"]] == [(p, node, [node], [node], 0) for p in (0, 1)]
    assert cluster["error_code"] == 0, cluster
    assert cluster["brokers"] == [{"node_id": node, "host": host, "port": int(port),
                                   "rack": None}]
    assert (cluster["controller"], cluster["cluster_id"]) == (node, metadata["cluster_id"])


# --- admin: configs -----------------------------------------------------------------------------


def kiln_policy(kiln: RunningKiln, topic: str) -> dict[str, str]:
    """Kiln's policies for the topic, as its registry in Redis holds them now."""
    config = kiln.call(kiln.app.catalog.registry.get(topic, fresh=True))
    assert config is not None
    return kiln_configs(config)


def test_describe_configs_shows_kafkas_and_kilns_configs_with_their_source(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic created through Kiln with retention.ms and kiln.reliability
    admin_results(module_kiln.bootstrap, "create-topics", "--topic", unique_topic,
                  "--config", "retention.ms=86400000", "--config", "kiln.reliability=express")
    # When kadm describes its configs, and Kiln's node's
    [topic] = admin_results(module_kiln.bootstrap, "describe-configs", "--topic", unique_topic)
    [node] = admin_results(module_kiln.bootstrap, "describe-configs",
                           "--broker", str(module_kiln.settings.node_id))
    # Then the topic's are Kafka's own, as Kafka describes them to franz-go, and Kiln's
    [at_kafka] = admin_results(kafka_bootstrap, "describe-configs", "--topic", unique_topic)
    assert topic["error_code"] == 0, topic
    configs = dict(topic["configs"])
    assert configs.pop("kiln.reliability") == {"value": "express", "sensitive": False,
                                               "source": "DYNAMIC_TOPIC_CONFIG"}
    assert configs["kiln.harden"]["source"] == "DEFAULT_CONFIG"
    assert {k: v for k, v in configs.items() if not k.startswith("kiln.")} == \
        at_kafka["configs"]
    assert configs["retention.ms"] == {"value": "86400000", "sensitive": False,
                                       "source": "DYNAMIC_TOPIC_CONFIG"}
    # and the node's carry Kiln's node id
    assert node["error_code"] == 0, node
    assert node["configs"]["node.id"]["value"] == str(module_kiln.settings.node_id)


@pytest.mark.parametrize("legacy", [False, True], ids=["incremental", "legacy"])
def test_alter_configs_sets_kafkas_config_in_kafka_and_kilns_in_kiln(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str,
        legacy: bool) -> None:
    # Given a topic created through Kiln with segment.ms set
    admin_results(module_kiln.bootstrap, "create-topics", "--topic", unique_topic,
                  "--config", "segment.ms=3600000")
    # When kadm sets retention.ms and kiln.harden (IncrementalAlterConfigs, or AlterConfigs,
    # which replaces every config of the topic)
    [altered] = admin_results(module_kiln.bootstrap, "alter-configs", "--topic", unique_topic,
                              "--alter", "set:retention.ms=1000",
                              "--alter", "set:kiln.harden=all",
                              *(["--legacy"] if legacy else []))
    # Then Kafka's topic has the retention, Kiln the policy, and segment.ms is kept only by
    # the incremental form
    assert altered["error_code"] == 0, altered
    assert eventually(lambda: kafka_config(kafka_bootstrap, unique_topic,
                                           "retention.ms") == "1000")
    assert kiln_policy(module_kiln, unique_topic)["kiln.harden"] == "all"
    segment = kafka_config(kafka_bootstrap, unique_topic, "segment.ms")
    assert (segment == "3600000") is not legacy, segment


# --- admin: records and offsets -----------------------------------------------------------------


def watermarks(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    with confluent_kafka.Consumer({"bootstrap.servers": bootstrap,
                                   "group.id": new_group()}) as consumer:
        low, high = consumer.get_watermark_offsets(
            confluent_kafka.TopicPartition(topic, partition), timeout=10, cached=False)
    return int(low), int(high)


def test_delete_records_moves_the_log_start_in_kiln_and_in_kafka(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given 6 records, hardened to Kafka
    admin_results(module_kiln.bootstrap, "create-topics", "--topic", unique_topic)
    produce(module_kiln.bootstrap, unique_topic, make_records(6),
            ProducerCase("none", "all", True), 0)
    assert module_kiln.flush()
    # When kadm deletes the records below offset 4
    [deleted] = admin_results(module_kiln.bootstrap, "delete-records", "--topic",
                              unique_topic, "--offsets", "0:4")
    # Then the new low watermark is 4 in Kiln, as librdkafka reads it, and Kafka holds only
    # the records from there on
    assert (deleted["error_code"], deleted["low_watermark"]) == (0, 4), deleted
    assert watermarks(module_kiln.bootstrap, unique_topic, 0) == (4, 6)
    assert [r.kiln_offset for r in read_hardened(kafka_bootstrap, unique_topic, 1)[0]] == [4, 5]


def test_list_offsets_start_end_max_timestamp_and_by_time(
        module_kiln: RunningKiln, unique_topic: str) -> None:
    # Given 10 records in partition 1 of 2, the largest timestamp the 8th's (offset 7), and
    # the 3 first deleted
    admin_results(module_kiln.bootstrap, "create-topics", "--topic", unique_topic,
                  "--partitions", "2")
    base = 1_700_000_000_000
    stamps = [base + s * 1000 for s in (0, 1, 2, 3, 4, 5, 6, 20, 8, 9)]
    records = [Record(None, b"v%d" % i, (), ts) for i, ts in enumerate(stamps)]
    produce(module_kiln.bootstrap, unique_topic, records, ProducerCase("none", "all", True), 1)
    admin_results(module_kiln.bootstrap, "delete-records", "--topic", unique_topic,
                  "--offsets", "1:3")

    def listed(spec: str) -> list[tuple[int, int, int]]:
        results = admin_results(module_kiln.bootstrap, "list-offsets", "--topic",
                                unique_topic, "--spec", spec)
        assert [r["error_code"] for r in results] == [0, 0], results
        return [(r["partition"], r["offset"], r["timestamp"]) for r in results]

    # When kadm lists the offsets; Then they are what librdkafka sees and the timestamps say
    assert listed("start") == [(0, 0, -1), (1, 3, -1)]
    assert listed("end") == [(0, 0, -1), (1, 10, -1)]
    assert watermarks(module_kiln.bootstrap, unique_topic, 1) == (3, 10)
    assert listed("max-timestamp") == [(0, -1, -1), (1, 7, base + 20_000)]
    # the first record at or after 5.5 s: offset 6 (6 s)
    assert listed(str(base + 5500)) == [(0, 0, -1), (1, 6, base + 6000)]


def test_group_offsets_commit_fetch_and_delete(module_kiln: RunningKiln,
                                               unique_topic: str) -> None:
    # Given a 3-partition topic, and a group that committed offsets with kafka-python
    admin_results(module_kiln.bootstrap, "create-topics", "--topic", unique_topic,
                  "--partitions", "3")
    group = new_group()
    commit_offsets(module_kiln.bootstrap, group, unique_topic, {0: 0, 1: 0})
    # When kadm fetches them, commits others, then deletes partition 1's
    fetched = admin_results(module_kiln.bootstrap, "fetch-offsets", "--group", group)
    committed = admin_results(module_kiln.bootstrap, "commit-offsets", "--group", group,
                              "--topic", unique_topic, "--offsets", "1:5,2:7")
    after_commit = committed_offsets(module_kiln.bootstrap, group)
    deleted = admin_results(module_kiln.bootstrap, "delete-offsets", "--group", group,
                            "--topic", unique_topic, "--partitions-list", "1")
    # Then each step is what kafka-python reads through Kiln
    assert [(o["partition"], o["offset"], o["error_code"]) for o in fetched] == [
        (0, 0, 0), (1, 0, 0)]
    assert [(o["partition"], o["error_code"]) for o in committed] == [(1, 0), (2, 0)]
    assert after_commit == {(unique_topic, 0): 0, (unique_topic, 1): 5, (unique_topic, 2): 7}
    assert [(o["partition"], o["error_code"]) for o in deleted] == [(1, 0)]
    assert committed_offsets(module_kiln.bootstrap, group) == {
        (unique_topic, 0): 0, (unique_topic, 2): 7}
    # and the metadata kadm committed with comes back with its offsets
    refetched = admin_results(module_kiln.bootstrap, "fetch-offsets", "--group", group)
    assert [(o["partition"], o["offset"], o["metadata"]) for o in refetched] == [
        (0, 0, ""), (2, 7, "franz-go")]


# --- admin: groups ------------------------------------------------------------------------------


def test_list_and_describe_groups_show_a_live_librdkafka_member(
        module_kiln: RunningKiln, unique_topic: str) -> None:
    # Given a librdkafka member of a group that owns all 3 partitions of a topic
    create_topic_confluent(module_kiln.bootstrap, unique_topic, 3)
    group = new_group()
    with confluent_kafka.Consumer({
        "bootstrap.servers": module_kiln.bootstrap, "group.id": group,
        "client.id": "live-member", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "session.timeout.ms": 6000}) as member:
        member.subscribe([unique_topic])
        deadline = time.monotonic() + 20
        while len(member.assignment()) < 3 and time.monotonic() < deadline:
            member.poll(0.2)
        assert len(member.assignment()) == 3
        # When kadm lists the groups and describes this one (and one that does not exist)
        listed = admin_results(module_kiln.bootstrap, "list-groups")
        described = admin_results(module_kiln.bootstrap, "describe-groups", "--group", group)
    # Then the group is listed as a stable consumer group, and described with its member
    # and the member's assignment, decoded by franz-go
    [entry] = [g for g in listed if g["group"] == group]
    assert (entry["state"], entry["protocol_type"], entry["coordinator"]) == (
        "Stable", "consumer", module_kiln.settings.node_id), entry
    [found] = described
    assert (found["error_code"], found["state"], found["protocol_type"]) == (
        0, "Stable", "consumer"), found
    [m] = found["members"]
    assert m["client_id"] == "live-member"
    assert m["assigned"] == {unique_topic: [0, 1, 2]}


def test_delete_groups_removes_the_group_and_its_offsets(module_kiln: RunningKiln,
                                                         unique_topic: str) -> None:
    # Given two groups without members that committed offsets, one by reading with franz-go
    produce_spread(module_kiln.bootstrap, unique_topic, 10, 1)
    group, other = new_group(), new_group()
    franz_go("group", "--brokers", module_kiln.bootstrap, "--topics", unique_topic,
             "--group", group, "--records", "10")
    commit_offsets(module_kiln.bootstrap, other, unique_topic, {0: 3})
    [before] = admin_results(module_kiln.bootstrap, "describe-groups", "--group", group)
    # When kadm deletes the first group
    [deleted] = admin_results(module_kiln.bootstrap, "delete-groups", "--group", group)
    # Then it was an empty consumer group, and now kafka-python sees neither it nor its
    # offsets through Kiln; the other group is untouched
    assert (before["state"], before["protocol_type"], before["members"]) == (
        "Empty", "consumer", []), before
    assert deleted["error_code"] == 0, deleted
    with KafkaAdminClient(bootstrap_servers=module_kiln.bootstrap) as client:
        names = {g["group_id"] for g in client.list_groups()}
    assert group not in names and other in names
    assert committed_offsets(module_kiln.bootstrap, group) == {}
    assert committed_offsets(module_kiln.bootstrap, other) == {(unique_topic, 0): 3}


# --- admin: ApiVersions -------------------------------------------------------------------------


def test_api_versions_listing_is_what_kiln_advertises(module_kiln: RunningKiln) -> None:
    # When kadm asks every broker (Kiln's one node) for its API versions
    [listing] = admin_results(module_kiln.bootstrap, "api-versions")
    # Then it is Kiln's ApiVersions answer, as a raw v0 request reads it
    with RawClient(module_kiln.bootstrap) as client:
        raw = client.request(ApiVersionsRequest[0](), 0, ApiVersionsResponse)
    assert raw.error_code == 0
    assert listing["node_id"] == module_kiln.settings.node_id
    assert {int(k): tuple(v) for k, v in listing["api_keys"].items()} == {
        a.api_key: (a.min_version, a.max_version) for a in raw.api_keys}


# --- admin: bad input gets Kafka's error --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BadInput:
    op: str
    args: Callable[[str, str], list[str]]  # (an existing topic, a group) -> op's flags
    expected: int
    records: int = 0  # produced to the topic first


BAD_INPUTS = {
    "create-existing-topic": BadInput(
        "create-topics", lambda t, g: ["--topic", t], TOPIC_ALREADY_EXISTS),
    "create-invalid-name": BadInput(
        "create-topics", lambda t, g: ["--topic", f"{t} bad!"], INVALID_TOPIC_EXCEPTION),
    "create-zero-partitions": BadInput(
        "create-topics", lambda t, g: ["--topic", f"{t}-new", "--partitions", "0"],
        INVALID_PARTITIONS),
    "create-replication-factor-3": BadInput(
        "create-topics", lambda t, g: ["--topic", f"{t}-new", "--replication-factor", "3"],
        INVALID_REPLICATION_FACTOR),
    "create-on-unknown-broker": BadInput(
        "create-topics", lambda t, g: ["--topic", f"{t}-new", "--assignment", "[[7]]"],
        INVALID_REPLICA_ASSIGNMENT),
    "create-bad-config": BadInput(
        "create-topics", lambda t, g: ["--topic", f"{t}-new", "--config", "retention.ms=x"],
        INVALID_CONFIG),
    "metadata-of-invalid-name": BadInput(
        "metadata", lambda t, g: ["--topic", f"{t} bad!"], INVALID_TOPIC_EXCEPTION),
    "delete-unknown-topic": BadInput(
        "delete-topics", lambda t, g: ["--topic", f"{t}-nope"], UNKNOWN_TOPIC_OR_PARTITION),
    "shrink-partitions": BadInput(
        "create-partitions", lambda t, g: ["--topic", t, "--set", "1"], INVALID_PARTITIONS),
    "partitions-of-unknown-topic": BadInput(
        "create-partitions", lambda t, g: ["--topic", f"{t}-nope", "--add", "1"],
        UNKNOWN_TOPIC_OR_PARTITION),
    "alter-bad-value": BadInput(
        "alter-configs", lambda t, g: ["--topic", t, "--alter", "set:retention.ms=x"],
        INVALID_CONFIG),
    "alter-unknown-name": BadInput(
        "alter-configs", lambda t, g: ["--topic", t, "--alter", "set:no.such.config=1"],
        INVALID_CONFIG),
    "alter-unknown-topic": BadInput(
        "alter-configs", lambda t, g: ["--topic", f"{t}-nope", "--alter", "set:retention.ms=1"],
        UNKNOWN_TOPIC_OR_PARTITION),
    "describe-unknown-topic": BadInput(
        "describe-configs", lambda t, g: ["--topic", f"{t}-nope"], UNKNOWN_TOPIC_OR_PARTITION),
    "delete-records-past-the-end": BadInput(
        "delete-records", lambda t, g: ["--topic", t, "--offsets", "0:5"], OFFSET_OUT_OF_RANGE,
        records=2),
    "delete-unknown-group": BadInput(
        "delete-groups", lambda t, g: ["--group", g], GROUP_ID_NOT_FOUND),
    "delete-offsets-of-unknown-group": BadInput(
        "delete-offsets", lambda t, g: ["--group", g, "--topic", t, "--partitions-list", "0"],
        GROUP_ID_NOT_FOUND),
    "commit-to-unknown-topic": BadInput(
        "commit-offsets", lambda t, g: ["--group", g, "--topic", f"{t}-nope", "--offsets", "0:1"],
        UNKNOWN_TOPIC_OR_PARTITION),
}


def bad_input_error(bootstrap: str, topic: str, case: BadInput) -> tuple[int, ...]:
    """The error codes `case` gets at `bootstrap`, after making its 1-partition topic."""
    admin_results(bootstrap, "create-topics", "--topic", topic)
    if case.records:
        produce(bootstrap, topic, make_records(case.records), ProducerCase("none", 1, False), 0)
    event = admin(bootstrap, case.op, *case.args(topic, new_group()))
    results = event["results"]
    if results is None:
        return (event["error_code"],)
    if case.op == "metadata":
        results = results["topics"]
    return tuple(r["error_code"] for r in results)


@pytest.mark.parametrize("case", [pytest.param(case, id=name)
                                  for name, case in BAD_INPUTS.items()])
def test_bad_admin_input_gets_the_error_kafka_gives(module_kiln: RunningKiln,
                                                    kafka_bootstrap: str, unique_topic: str,
                                                    case: BadInput) -> None:
    # When franz-go sends the same bad request through Kiln and to Kafka itself (topics of
    # their own: Kiln's are in Kafka too)
    through_kiln = bad_input_error(module_kiln.bootstrap, f"{unique_topic}-kiln", case)
    at_kafka = bad_input_error(kafka_bootstrap, f"{unique_topic}-kafka", case)
    # Then both answer with the same error, the one expected
    assert through_kiln == at_kafka == (case.expected,)
