"""kafkajs 2.2.4 (Node.js) through Kiln, driven by tests/compat/node/kafkajs_driver.js (one
`node` process per client run) from the packages scripts/clients/kafkajs.sh installs.

What each test checks through another client or straight at Kafka:

- Producer: every codec (none, gzip, snappy and lz4 from kafkajs's codec plugins, zstd over
  zstd-napi) at acks=1; acks 0, all, and all with idempotence; records placed by kafkajs's
  partitioner on a topic kafkajs created. Every acknowledged record is hardened exactly
  once, in send order, at the partition and offset kafkajs was told, intact (key, value,
  headers, timestamp); the hardened batches carry the client's codec.
- Consumer: a group of two members reads every record once, in offset order per partition,
  on disjoint assignments, and its commits are the ends of the partitions as kafka-python's
  admin sees them; a consumer seeking to an offset reads on from there across hardened and
  hot records and commits nothing.
- Admin: createTopics, createPartitions, deleteTopics, fetchTopicMetadata, listTopics,
  describeConfigs, alterConfigs, describeCluster, fetchTopicOffsets,
  fetchTopicOffsetsByTimestamp, deleteTopicRecords, listGroups, describeGroups,
  deleteGroups, fetchOffsets, setOffsets, resetOffsets.

Every test also checks that Kiln closed no connection and failed no request unexpectedly
(`kiln_answering_all`). kafkajs has no assign(): it reads a partition from an offset by
seeking within a group, which is what the seek test does.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka.admin import KafkaAdminClient
from kafka.partitioner.default import murmur2

from tests.compat.clients import (
    Delivered,
    ProducerCase,
    Record,
    assert_hardened_with_codec,
    create_topic_confluent,
    kafka_partition_count,
    make_records,
    produce_confluent,
    read_hardened,
)
from tests.compat.java import commit_offsets, committed_offsets
from tests.compat.test_kafka_tools import (
    Line,
    create_topic_with_configs,
    kafka_topic_config,
    kiln_partition_count,
    kiln_policy,
    watermarks,
)
from tests.compat.test_kafka_tools import produce as produce_lines
from tests.compat.test_producers import assert_hardened_as_sent, harden_and_read
from tests.conftest import _unavailable
from tests.kiln_harness import RunningKiln, eventually

ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = ROOT / ".clients" / "node" / "node_modules"
DRIVER = Path(__file__).resolve().parent / "node" / "kafkajs_driver.js"

N_RECORDS = 200
CHUNK = 50  # records per send: several Produce requests per run
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
BASE_TIMESTAMP_MS = 1_700_000_000_000
DYNAMIC_TOPIC_CONFIG = 1  # DescribeConfigs' config source


@pytest.fixture(scope="module", autouse=True)
def kafkajs_installed() -> None:
    require_kafkajs()


def require_kafkajs() -> None:
    """Fail (never skip in CI) when node or kafkajs is missing."""
    if shutil.which("node") is None:
        _unavailable("kafkajs", "node is not on PATH (scripts/setup.sh installs it)")
    if not (NODE_MODULES / "kafkajs").is_dir():
        _unavailable("kafkajs", f"{NODE_MODULES} has no kafkajs (run scripts/setup.sh)")


# --- the driver ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DriverRun:
    command: str
    returncode: int
    events: list[dict[str, Any]]
    stderr: str

    def of(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event]

    def __str__(self) -> str:
        # What an assertion message shows: enough to see why kafkajs failed.
        shown = "\n".join(json.dumps(e)[:300] for e in self.events[-20:])
        return (f"kafkajs {self.command}: exit code {self.returncode}\n--- events ---\n"
                f"{shown}\n--- stderr ---\n{self.stderr[-3000:]}")


def run_kafkajs(command: str, spec: Mapping[str, Any], timeout_s: float = 60, *,
                driver: Path = DRIVER) -> DriverRun:
    """`node DRIVER COMMAND` with `spec` on stdin (node/kafkajs_transactions.js is the
    other driver), kafkajs found on NODE_PATH."""
    env = {**os.environ, "NODE_PATH": str(NODE_MODULES),
           "KAFKAJS_NO_PARTITIONER_WARNING": "1"}
    try:
        done = subprocess.run(["node", str(driver), command], input=json.dumps(spec),
                              capture_output=True, text=True, timeout=timeout_s, env=env,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        # subprocess.run has killed node; a client that hangs is a failure.
        raise AssertionError(f"kafkajs {command} did not finish within {timeout_s} s:\n"
                             f"{exc.stdout!r}\n{exc.stderr!r}") from exc
    # The driver prints nothing but JSON on stdout: a line that is not fails the test.
    events = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return DriverRun(command, done.returncode, events, done.stderr)


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def as_json(record: Record) -> dict[str, Any]:
    return {"key": b64(record.key), "value": b64(record.value),
            "headers": [[name, b64(value)] for name, value in record.headers],
            "timestamp": record.timestamp_ms}


def produce_kafkajs(bootstrap: str, topic: str, records: Sequence[Record],
                    case: ProducerCase, partition: int | None) -> list[Delivered]:
    run = run_kafkajs("produce", {
        "brokers": [bootstrap], "topic": topic, "records": [as_json(r) for r in records],
        "partition": partition, "acks": -1 if case.acks == "all" else case.acks,
        "compression": case.compression, "idempotent": case.idempotence, "chunk": CHUNK})
    assert run.returncode == 0, run
    acks = run.of("ack")
    assert [a["index"] for a in acks] == list(range(len(records))), run
    return [Delivered(a["partition"], a["offset"]) for a in acks]


def admin(bootstrap: str, *ops: tuple[str, list[Any]]) -> list[dict[str, Any]]:
    """Run kafkajs admin operations in order on one admin client; each answer is
    {op, ms, result} or {op, ms, error}."""
    run = run_kafkajs("admin", {"brokers": [bootstrap],
                                "ops": [{"op": op, "args": args} for op, args in ops]})
    answers = [e for e in run.events if "op" in e]
    assert [a["op"] for a in answers] == [op for op, _ in ops], run
    return answers


def result(answer: dict[str, Any]) -> Any:
    assert "error" not in answer, answer
    return answer["result"]


def new_group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


# --- producer ----------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", CODECS)
def test_every_codec_is_hardened_intact(kiln_answering_all: RunningKiln, kafka_bootstrap: str,
                                        unique_topic: str, compression: str) -> None:
    kiln = kiln_answering_all
    # Given records with null and empty values, null keys, repeated binary headers and
    # timestamps that step back
    records = make_records(N_RECORDS)
    case = ProducerCase(compression=compression, acks=1, idempotence=False)
    # When kafkajs sends them to partition 0 with the codec, 50 per send
    delivered = produce_kafkajs(kiln.bootstrap, unique_topic, records, case, 0)
    # Then Kafka holds each once, as sent, at the offset kafkajs was told, in batches of the
    # codec kafkajs used (Kiln hardens a client's batches with their codec)
    hardened = harden_and_read(kiln, kafka_bootstrap, unique_topic, 1, N_RECORDS)
    assert_hardened_as_sent(records, delivered, hardened, 1, acks_zero=False)
    assert_hardened_with_codec(kafka_bootstrap, unique_topic, compression)


@pytest.mark.parametrize(("acks", "idempotence"), [(0, False), ("all", False), ("all", True)],
                         ids=["acks0", "acks-all", "acks-all-idempotent"])
def test_acks_and_idempotence(kiln_answering_all: RunningKiln, kafka_bootstrap: str,
                              unique_topic: str, acks: int | str, idempotence: bool) -> None:
    # acks=1 is the codec tests' case; kafkajs refuses idempotence without acks=all.
    kiln = kiln_answering_all
    records = make_records(N_RECORDS)
    case = ProducerCase(compression="gzip", acks=acks, idempotence=idempotence)

    delivered = produce_kafkajs(kiln.bootstrap, unique_topic, records, case, 0)

    hardened = harden_and_read(kiln, kafka_bootstrap, unique_topic, 1, N_RECORDS)
    assert_hardened_as_sent(records, delivered, hardened, 1, acks_zero=acks == 0)


def test_records_placed_by_kafkajs_partitioner_on_a_topic_it_created(
        kiln_answering_all: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    kiln = kiln_answering_all
    # Given a 3-partition topic created with kafkajs's admin through Kiln
    [created] = admin(kiln.bootstrap, ("createTopics", [{"topics": [
        {"topic": unique_topic, "numPartitions": 3}]}]))
    assert result(created) is True
    records = [r for r in make_records(N_RECORDS) if r.key is not None]
    case = ProducerCase(compression="lz4", acks=1, idempotence=False)
    # When kafkajs sends keyed records without naming a partition
    delivered = produce_kafkajs(kiln.bootstrap, unique_topic, records, case, None)
    # Then Kafka has the topic with 3 partitions, each holding its records in order, at the
    # offsets kafkajs was told, and each key went where Java's partitioner puts it
    assert kafka_partition_count(kafka_bootstrap, unique_topic) == 3
    hardened = harden_and_read(kiln, kafka_bootstrap, unique_topic, 3, len(records))
    assert_hardened_as_sent(records, delivered, hardened, 3, acks_zero=False)
    assert [d.partition for d in delivered] == [
        (murmur2(r.key) & 0x7FFFFFFF) % 3 for r in records if r.key is not None]
    assert {d.partition for d in delivered} == {0, 1, 2}


# --- consumer ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Read:
    member: int
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int


def records_read(run: DriverRun) -> list[Read]:
    return [Read(e["member"], e["partition"], e["offset"], unb64(e["key"]), unb64(e["value"]),
                 tuple((name, unb64(value)) for name, value in e["headers"]), e["timestamp"])
            for e in run.of("record")]


def test_a_group_of_two_reads_every_record_once_and_commits_the_ends(
        kiln_answering_all: RunningKiln, unique_topic: str) -> None:
    kiln = kiln_answering_all
    # Given 120 records spread by key over a 3-partition topic
    create_topic_confluent(kiln.bootstrap, unique_topic, 3)
    records = make_records(120)
    delivered = produce_confluent(kiln.bootstrap, unique_topic, records,
                                  ProducerCase("none", 1, False), None)
    sent = {(d.partition, d.offset): r for r, d in zip(records, delivered, strict=True)}
    ends = {p: sum(1 for d in delivered if d.partition == p) for p in range(3)}
    group = new_group()
    # When two kafkajs consumers of one group read them, committing as they go
    run = run_kafkajs("consume", {"brokers": [kiln.bootstrap], "topic": unique_topic,
                                  "groupId": group, "count": len(records), "members": 2,
                                  "timeoutMs": 40_000}, timeout_s=60)
    # Then every record was read once, as sent, each partition in offset order, by members
    # whose last assignments split the partitions between them
    assert run.returncode == 0, run
    assert run.of("end") == [{"event": "end", "reason": "count", "read": len(records)}], run
    read = records_read(run)
    assert sorted((r.partition, r.offset) for r in read) == sorted(sent)
    for r in read:
        want = sent[(r.partition, r.offset)]
        assert (r.key, r.value, r.headers, r.timestamp_ms) == (
            want.key, want.value, want.headers, want.timestamp_ms), r
    for partition in range(3):
        offsets = [r.offset for r in read if r.partition == partition]
        assert offsets == list(range(ends[partition])), f"partition {partition}"
    last = {e["member"]: set(e["partitions"]) for e in run.of("assigned")}
    assert set(last) == {0, 1}, run
    assert last[0] | last[1] == {0, 1, 2} and not last[0] & last[1], last
    # and the group's commits, read through Kiln by kafka-python, are the partitions' ends
    assert run.of("committed"), run
    assert committed_offsets(kiln.bootstrap, group) == {
        (unique_topic, p): end for p, end in ends.items()}


def test_a_consumer_seeking_to_an_offset_reads_on_across_hardened_and_hot_records(
        kiln_answering_all: RunningKiln, unique_topic: str) -> None:
    kiln = kiln_answering_all
    # Given ten records, the first six hardened to Kafka, the last four only in Kiln
    produce_lines(kiln.bootstrap, unique_topic,
                  [Line(0, b"k%d" % i, b"v%d" % i) for i in range(6)])
    assert kiln.flush()
    produce_lines(kiln.bootstrap, unique_topic,
                  [Line(0, b"k%d" % i, b"v%d" % i) for i in range(6, 10)])
    group = new_group()
    # When kafkajs seeks partition 0 to offset 3 and reads without committing
    run = run_kafkajs("consume", {"brokers": [kiln.bootstrap], "topic": unique_topic,
                                  "groupId": group, "count": 7, "seek": {"0": 3},
                                  "autoCommit": False, "timeoutMs": 30_000})
    # Then it read offsets 3 to 9, as produced, and the group holds no offset
    assert run.returncode == 0, run
    read = records_read(run)
    assert [(r.partition, r.offset, r.key, r.value) for r in read] == [
        (0, i, b"k%d" % i, b"v%d" % i) for i in range(3, 10)]
    assert run.of("committed") == []
    assert committed_offsets(kiln.bootstrap, group) == {}


# --- admin: topics ---------------------------------------------------------------------------


def test_create_topics_makes_the_topic_in_kiln_and_kafka_and_reports_a_second_create(
        kiln_answering_all: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    kiln = kiln_answering_all
    spec = {"topics": [{"topic": unique_topic, "numPartitions": 3, "configEntries": [
        {"name": "retention.ms", "value": "86400000"}]}]}
    # When kafkajs creates a 3-partition topic with a retention config, then creates it again
    first, again = admin(kiln.bootstrap, ("createTopics", [spec]), ("createTopics", [spec]))
    # Then the first creates it in Kiln and in Kafka, with the config, and the second is
    # answered TOPIC_ALREADY_EXISTS (kafkajs: false)
    assert result(first) is True
    assert result(again) is False
    assert kiln_partition_count(kiln.bootstrap, unique_topic) == 3
    assert kafka_partition_count(kafka_bootstrap, unique_topic) == 3
    assert kafka_topic_config(kafka_bootstrap, unique_topic, "retention.ms") == "86400000"


def test_create_partitions_grows_the_topic_and_refuses_to_shrink_it(
        kiln_answering_all: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    kiln = kiln_answering_all
    # Given a 2-partition topic
    create_topic_confluent(kiln.bootstrap, unique_topic, 2)
    # When kafkajs grows it to 4 partitions, then asks for 3
    grown, shrunk = admin(
        kiln.bootstrap,
        ("createPartitions", [{"topicPartitions": [{"topic": unique_topic, "count": 4}]}]),
        ("createPartitions", [{"topicPartitions": [{"topic": unique_topic, "count": 3}]}]))
    # Then Kiln and Kafka have 4 partitions, and the second is refused with INVALID_PARTITIONS
    result(grown)
    assert shrunk["error"]["type"] == "INVALID_PARTITIONS", shrunk
    assert shrunk["error"]["code"] == 37, shrunk
    assert kiln_partition_count(kiln.bootstrap, unique_topic) == 4
    assert kafka_partition_count(kafka_bootstrap, unique_topic) == 4


def test_delete_topics_removes_the_topic_from_kiln_and_kafka(
        kiln_answering_all: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    kiln = kiln_answering_all
    # Given a topic with a record hardened to Kafka
    produce_lines(kiln.bootstrap, unique_topic, [Line(0, None, b"hardened")])
    assert kiln.flush()
    assert kafka_partition_count(kafka_bootstrap, unique_topic) == 1
    # When kafkajs deletes it
    [deleted] = admin(kiln.bootstrap, ("deleteTopics", [{"topics": [unique_topic]}]))
    # Then neither Kiln nor Kafka has it
    result(deleted)
    assert kiln_partition_count(kiln.bootstrap, unique_topic) is None
    assert eventually(lambda: unique_topic not in kafka_topics(kafka_bootstrap))


def kafka_topics(kafka_bootstrap: str) -> list[str]:
    with KafkaAdminClient(bootstrap_servers=kafka_bootstrap) as admin_client:
        return list(admin_client.list_topics())


def test_topic_metadata_and_the_topic_list_show_kilns_node_leading_every_partition(
        kiln_answering_all: RunningKiln, unique_topic: str) -> None:
    kiln = kiln_answering_all
    # Given a 2-partition topic created through Kiln by librdkafka
    create_topic_confluent(kiln.bootstrap, unique_topic, 2)
    # When kafkajs fetches its metadata and lists the topics
    metadata, listed = admin(kiln.bootstrap,
                             ("fetchTopicMetadata", [{"topics": [unique_topic]}]),
                             ("listTopics", []))
    # Then the topic has its 2 partitions, each led by Kiln's node, its only replica
    node = kiln.settings.node_id
    [topic] = result(metadata)["topics"]
    assert topic["name"] == unique_topic
    assert [(p["partitionId"], p["partitionErrorCode"], p["leader"], p["replicas"], p["isr"])
            for p in topic["partitions"]] == [(i, 0, node, [node], [node]) for i in range(2)]
    assert unique_topic in result(listed)


def test_describe_cluster_names_kiln_as_the_only_broker_and_controller(
        kiln_answering_all: RunningKiln) -> None:
    kiln = kiln_answering_all
    # When kafkajs describes the cluster
    [described] = admin(kiln.bootstrap, ("describeCluster", []))
    # Then Kiln's node, at the address clients reach, is its broker and its controller
    node = kiln.settings.node_id
    assert result(described) == {
        "brokers": [{"nodeId": node, "host": "127.0.0.1", "port": kiln.app.port}],
        "controller": node, "clusterId": kiln.app.context.settings.cluster_id}


# --- admin: configs --------------------------------------------------------------------------


def test_describe_configs_shows_kafkas_and_kilns_topic_configs(
        kiln_answering_all: RunningKiln, unique_topic: str) -> None:
    kiln = kiln_answering_all
    # Given a topic created with one of Kafka's configs and one of Kiln's
    create_topic_with_configs(kiln.bootstrap, unique_topic, 1,
                              {"retention.ms": "86400000", "kiln.reliability": "express"})
    # When kafkajs describes those two configs
    [described] = admin(kiln.bootstrap, ("describeConfigs", [{"resources": [
        {"type": "TOPIC", "name": unique_topic,
         "configNames": ["retention.ms", "kiln.reliability"]}]}]))
    # Then both are there with their values, set on the topic
    [resource] = result(described)["resources"]
    assert (resource["errorCode"], resource["resourceName"]) == (0, unique_topic)
    assert {(e["configName"], e["configValue"], e["configSource"], e["isDefault"])
            for e in resource["configEntries"]} == {
        ("retention.ms", "86400000", DYNAMIC_TOPIC_CONFIG, False),
        ("kiln.reliability", "express", DYNAMIC_TOPIC_CONFIG, False)}


def test_alter_configs_replaces_the_topics_configs_in_kafka_and_kiln(
        kiln_answering_all: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    kiln = kiln_answering_all
    # Given a topic created with max.message.bytes and kiln.reliability set
    create_topic_with_configs(kiln.bootstrap, unique_topic, 1,
                              {"max.message.bytes": "2000000", "kiln.reliability": "express"})
    # When kafkajs alters its configs (AlterConfigs: the given set replaces the topic's)
    [altered] = admin(kiln.bootstrap, ("alterConfigs", [{"resources": [
        {"type": "TOPIC", "name": unique_topic, "configEntries": [
            {"name": "retention.ms", "value": "1000"},
            {"name": "kiln.harden", "value": "all"}]}]}]))
    # Then Kafka's topic has the retention and its max.message.bytes back at the default,
    # and Kiln the harden policy with the reliability back at Kiln's default
    assert [(r["errorCode"], r["resourceName"]) for r in result(altered)["resources"]] == [
        (0, unique_topic)]
    assert eventually(lambda: kafka_topic_config(kafka_bootstrap, unique_topic,
                                                 "retention.ms") == "1000")
    assert kafka_topic_config(kafka_bootstrap, unique_topic, "max.message.bytes") != "2000000"
    policy = kiln_policy(kiln, unique_topic)
    assert (policy["kiln.harden"], policy["kiln.reliability"]) == ("all", "reliable_persistent")


# --- admin: offsets and records ----------------------------------------------------------------


def test_topic_offsets_and_offsets_by_timestamp(kiln_answering_all: RunningKiln,
                                                unique_topic: str) -> None:
    kiln = kiln_answering_all
    # Given five records one second apart, the first two hardened
    lines = [Line(0, None, b"v%d" % i) for i in range(5)]
    timestamps = [BASE_TIMESTAMP_MS + i * 1000 for i in range(5)]
    produce_lines(kiln.bootstrap, unique_topic, lines[:2], timestamps[:2])
    assert kiln.flush()
    produce_lines(kiln.bootstrap, unique_topic, lines[2:], timestamps[2:])
    # When kafkajs asks for the partition's offsets, and for those of three times
    offsets, *by_time = admin(
        kiln.bootstrap, ("fetchTopicOffsets", [unique_topic]),
        *(("fetchTopicOffsetsByTimestamp", [unique_topic, ts])
          for ts in (BASE_TIMESTAMP_MS - 1, BASE_TIMESTAMP_MS + 2500, BASE_TIMESTAMP_MS + 9000)))
    # Then the log runs from 0 to 5, and each time maps to the first record at or after it
    # (none after the last: the end)
    assert result(offsets) == [{"partition": 0, "offset": "5", "high": "5", "low": "0"}]
    assert [result(answer) for answer in by_time] == [
        [{"partition": 0, "offset": offset}] for offset in ("0", "3", "5")]


def test_delete_topic_records_moves_the_log_start_in_kiln_and_kafka(
        kiln_answering_all: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    kiln = kiln_answering_all
    # Given six records hardened to Kafka
    produce_lines(kiln.bootstrap, unique_topic, [Line(0, None, b"v%d" % i) for i in range(6)])
    assert kiln.flush()
    # When kafkajs deletes the records below offset 4 (its admin finds the leader in the
    # metadata it holds, and loads none for this: it fails with "Topic metadata not loaded"
    # at Kafka too, so the metadata is fetched first)
    _, deleted = admin(kiln.bootstrap, ("fetchTopicMetadata", [{"topics": [unique_topic]}]),
                       ("deleteTopicRecords", [{"topic": unique_topic,
                                                "partitions": [{"partition": 0, "offset": "4"}]}]))
    # Then Kiln's partition starts at 4, as librdkafka sees it, and Kafka holds 4 and 5 only
    result(deleted)
    assert watermarks(kiln.bootstrap, unique_topic) == (4, 6)
    assert [r.kiln_offset for r in read_hardened(kafka_bootstrap, unique_topic, 1)[0]] == [4, 5]


# --- admin: groups -----------------------------------------------------------------------------


def test_list_describe_and_delete_groups(kiln_answering_all: RunningKiln,
                                         unique_topic: str) -> None:
    kiln = kiln_answering_all
    # Given two groups without members that committed offsets through kafka-python
    create_topic_confluent(kiln.bootstrap, unique_topic, 1)
    doomed, kept = new_group(), new_group()
    for group in (doomed, kept):
        commit_offsets(kiln.bootstrap, group, unique_topic, {0: 0})
    # When kafkajs lists them, describes them, deletes the first and lists again
    listed, described, deleted, listed_after = admin(
        kiln.bootstrap, ("listGroups", []), ("describeGroups", [[doomed, kept]]),
        ("deleteGroups", [[doomed]]), ("listGroups", []))
    # Then both were listed, without a protocol type (as at Kafka: no member ever joined),
    # and described as empty; the first is gone from the list and its offsets are gone as
    # kafka-python sees them, the other kept
    groups = {g["groupId"]: g["protocolType"] for g in result(listed)["groups"]}
    assert (groups.get(doomed), groups.get(kept)) == ("", ""), groups
    assert [(g["groupId"], g["errorCode"], g["state"], g["members"])
            for g in result(described)["groups"]] == [
        (doomed, 0, "Empty", []), (kept, 0, "Empty", [])]
    assert result(deleted) == [{"groupId": doomed, "errorCode": 0}]
    remaining = {g["groupId"] for g in result(listed_after)["groups"]}
    assert doomed not in remaining and kept in remaining
    assert committed_offsets(kiln.bootstrap, doomed) == {}
    assert committed_offsets(kiln.bootstrap, kept) == {(unique_topic, 0): 0}


def test_fetch_and_set_offsets_of_a_group(kiln_answering_all: RunningKiln,
                                          unique_topic: str) -> None:
    kiln = kiln_answering_all
    # Given a group without members that committed 3 and 2 on a 2-partition topic
    create_topic_confluent(kiln.bootstrap, unique_topic, 2)
    produce_lines(kiln.bootstrap, unique_topic,
                  [Line(p, b"k", b"v") for p, n in enumerate([3, 2]) for _ in range(n)])
    group = new_group()
    commit_offsets(kiln.bootstrap, group, unique_topic, {0: 3, 1: 2})
    # When kafkajs fetches the offsets, then sets partition 0's to 1 (kafkajs joins the
    # group with a consumer of its own to commit)
    fetched, was_set = admin(
        kiln.bootstrap, ("fetchOffsets", [{"groupId": group, "topics": [unique_topic]}]),
        ("setOffsets", [{"groupId": group, "topic": unique_topic,
                         "partitions": [{"partition": 0, "offset": "1"}]}]))
    # Then it fetched what was committed (kafkajs shows empty metadata as null, at Kafka
    # too), and kafka-python sees the offset it set
    assert result(fetched) == [{"topic": unique_topic, "partitions": [
        {"partition": 0, "offset": "3", "metadata": None},
        {"partition": 1, "offset": "2", "metadata": None}]}]
    result(was_set)
    assert committed_offsets(kiln.bootstrap, group) == {
        (unique_topic, 0): 1, (unique_topic, 1): 2}


def test_reset_offsets_to_earliest_commits_the_earliest_marker(
        kiln_answering_all: RunningKiln, unique_topic: str) -> None:
    kiln = kiln_answering_all
    # Given a group without members that committed 3 and 2 on a 2-partition topic
    create_topic_confluent(kiln.bootstrap, unique_topic, 2)
    group = new_group()
    commit_offsets(kiln.bootstrap, group, unique_topic, {0: 3, 1: 2})
    # When kafkajs resets its offsets to the earliest
    [reset] = admin(kiln.bootstrap, ("resetOffsets", [
        {"groupId": group, "topic": unique_topic, "earliest": True}]))
    # Then every partition's commit is -2, kafkajs's marker for "the earliest" (Kafka stores
    # it as it is too), as kafka-python sees them
    result(reset)
    assert committed_offsets(kiln.bootstrap, group) == {
        (unique_topic, 0): -2, (unique_topic, 1): -2}
