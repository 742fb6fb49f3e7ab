"""Apache Kafka's command-line tools (4.4, from the same jars as the session's broker)
against Kiln: what Kiln serves works, and what it does not serve yet fails with a clear
message and without hanging.

Works: kafka-topics --create / --list / --describe / --delete / --alter --partitions,
kafka-configs --describe / --alter of topics (Kafka's configs and Kiln's `kiln.*` ones) and
of Kiln's broker node, kafka-console-producer and kafka-console-consumer (keys, headers,
nulls, a consumer group), kafka-consumer-groups --list / --describe (offsets,
lag, owners) / --reset-offsets / --delete / --delete-offsets, kafka-delete-records,
kafka-get-offsets (--time -3, the largest timestamp), kafka-producer-perf-test.

Off by default: transactions (kafka-producer-perf-test --transactional-id) time out looking
for a transaction coordinator while `transactions_enabled` is off (the test of this file that
pins it); with it on, tests/compat/test_transactional_clients.py runs them.

One Kiln serves the whole module; every test uses topics and groups of its own.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient
from kafka.admin import KafkaAdminClient

from storage.topics import kiln_configs
from tests.compat.clients import (
    Hardened,
    create_topic_confluent,
    kafka_partition_count,
    read_hardened,
)
from tests.compat.java import (
    CONFIGS,
    CONSOLE_CONSUMER,
    CONSOLE_PRODUCER,
    CONSUMER_GROUPS,
    GET_OFFSETS,
    PRODUCER_PERF,
    TOPICS,
    commit_offsets,
    committed_offsets,
    run_tool,
    table,
)
from tests.kiln_harness import RunningKiln, eventually

pytestmark = pytest.mark.usefixtures("kafka_tools")

BASE_TIMESTAMP_MS = 1_700_000_000_000
NULL = "<null>"  # the console tools' marker for a null key, value or header value


def new_group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def kiln_partition_count(kiln_bootstrap: str, topic: str) -> int | None:
    """Partitions of `topic` in Kiln's metadata, None when Kiln does not have it. Asked with
    kafka-python, whose admin Metadata requests create nothing (and because Kiln refuses
    librdkafka's request for every topic: see test_librdkafka_metadata.py)."""
    with KafkaAdminClient(bootstrap_servers=kiln_bootstrap) as admin:
        if topic not in admin.list_topics():
            return None
        [found] = admin.describe_topics([topic])
    assert found["error_code"] == 0, found
    return len(found["partitions"])


def kafka_topic_config(kafka_bootstrap: str, topic: str, name: str) -> str | None:
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    resource = confluent_kafka.admin.ConfigResource("topic", topic)  # type: ignore[attr-defined]
    config = admin.describe_configs([resource])[resource].result(15)
    entry = config.get(name)
    return None if entry is None else str(entry.value)


def end_offsets(kiln_bootstrap: str, topic: str, partitions: int) -> list[int]:
    with confluent_kafka.Consumer({"bootstrap.servers": kiln_bootstrap,
                                   "group.id": new_group()}) as consumer:
        return [consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p),
                                               timeout=10)[1] for p in range(partitions)]


@dataclass(frozen=True, slots=True)
class Line:
    """One record to produce from Python: partition, key, value, headers."""

    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


def produce(kiln_bootstrap: str, topic: str, lines: Sequence[Line],
            timestamps: Sequence[int] | None = None) -> None:
    """Each record acknowledged before the next is sent: one batch per record."""
    producer = confluent_kafka.Producer({"bootstrap.servers": kiln_bootstrap, "acks": "all",
                                         "linger.ms": 0})
    failures: list[object] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failures.append(err)

    for i, line in enumerate(lines):
        producer.produce(topic, key=line.key, value=line.value, partition=line.partition,
                         headers=list(line.headers), on_delivery=on_delivery,
                         timestamp=0 if timestamps is None else timestamps[i])  # 0: now
        assert producer.flush(15) == 0
    assert failures == []


# --- kafka-topics ---------------------------------------------------------------------------


def test_kafka_topics_create_makes_the_topic_in_kiln_and_in_kafka_with_its_config(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # When kafka-topics creates a 3-partition topic with a retention config through Kiln
    run = run_tool(TOPICS, "--bootstrap-server", module_kiln.bootstrap, "--create",
                   "--topic", unique_topic, "--partitions", "3",
                   "--config", "retention.ms=86400000")
    # Then it reports success, and Kiln and Kafka both have the topic, Kafka with the config
    assert run.returncode == 0, run
    assert run.lines == [f"Created topic {unique_topic}."], run
    assert kiln_partition_count(module_kiln.bootstrap, unique_topic) == 3
    assert kafka_partition_count(kafka_bootstrap, unique_topic) == 3
    assert kafka_topic_config(kafka_bootstrap, unique_topic, "retention.ms") == "86400000"


def test_kafka_topics_list_names_the_topics_created_through_kiln(
        module_kiln: RunningKiln) -> None:
    # Given two topics created through Kiln
    topics = [f"listed-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    for topic in topics:
        create_topic_confluent(module_kiln.bootstrap, topic, 2)
    # When kafka-topics lists the topics
    run = run_tool(TOPICS, "--bootstrap-server", module_kiln.bootstrap, "--list")
    # Then both are listed, one name per line
    assert run.returncode == 0, run
    assert set(topics) <= set(run.lines), run


def test_kafka_topics_delete_removes_the_topic_and_its_records_from_kiln_and_kafka(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a 2-partition topic with 3 records, one hardened to Kafka
    create_topic_confluent(module_kiln.bootstrap, unique_topic, 2)
    produce(module_kiln.bootstrap, unique_topic, [Line(0, None, b"hardened")])
    assert module_kiln.flush()
    produce(module_kiln.bootstrap, unique_topic, [Line(p, None, b"v") for p in (0, 1)])
    # When kafka-topics deletes it through Kiln
    run = run_tool(TOPICS, "--bootstrap-server", module_kiln.bootstrap, "--delete",
                   "--topic", unique_topic)
    # Then it succeeds silently, as against Kafka, and neither Kiln, Kafka nor Redis has
    # the topic any more
    assert run.returncode == 0, run
    assert run.lines == [], run
    assert kiln_partition_count(module_kiln.bootstrap, unique_topic) is None
    assert unique_topic not in AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(
        timeout=10).topics
    redis = module_kiln.app.queue.redis
    assert module_kiln.call(redis.hget("kiln:topics", unique_topic)) is None
    assert module_kiln.call(redis.exists(*(f"kiln:{{{unique_topic}/{p}}}:{kind}"
                                           for p in (0, 1) for kind in ("log", "meta")))) == 0


def test_kafka_topics_alter_partitions_grows_the_topic_in_kiln_and_kafka(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a 2-partition topic created through Kiln
    create_topic_confluent(module_kiln.bootstrap, unique_topic, 2)
    # When kafka-topics grows it to 4 partitions, then tries to shrink it to 3
    grown = run_tool(TOPICS, "--bootstrap-server", module_kiln.bootstrap, "--alter",
                     "--topic", unique_topic, "--partitions", "4")
    shrunk = run_tool(TOPICS, "--bootstrap-server", module_kiln.bootstrap, "--alter",
                      "--topic", unique_topic, "--partitions", "3")
    # Then the first succeeds in Kiln and Kafka, with the new partitions taking records,
    # and the second fails with Kafka's own message
    assert grown.returncode == 0, grown
    assert kiln_partition_count(module_kiln.bootstrap, unique_topic) == 4
    assert kafka_partition_count(kafka_bootstrap, unique_topic) == 4
    produce(module_kiln.bootstrap, unique_topic, [Line(3, b"k", b"v")])
    assert end_offsets(module_kiln.bootstrap, unique_topic, 4) == [0, 0, 0, 1]
    assert shrunk.returncode == 1, shrunk
    assert (f"The topic {unique_topic} currently has 4 partition(s); 3 would not be an "
            "increase.") in shrunk.output


def create_topic_with_configs(bootstrap: str, topic: str, partitions: int,
                              configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([confluent_kafka.admin.NewTopic(  # type: ignore[attr-defined]
        topic, partitions, config=configs)])
    futures[topic].result(15)


def describe_line(line: str) -> dict[str, str]:
    """One line of kafka-topics --describe: its tab-separated `Name: value` fields."""
    return dict(field.split(": ", 1) for field in line.strip().split("\t"))


def test_kafka_topics_describe_shows_partitions_led_by_kiln_and_kafkas_and_kilns_configs(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a 3-partition topic created through Kiln with a Kafka config and one of Kiln's
    # (kafka-topics --create refuses names Kafka's topic configs do not have)
    create_topic_with_configs(module_kiln.bootstrap, unique_topic, 3,
                              {"retention.ms": "86400000", "kiln.harden": "all"})
    # When kafka-topics describes it through Kiln (and, to compare, at Kafka)
    run = run_tool(TOPICS, "--bootstrap-server", module_kiln.bootstrap, "--describe",
                   "--topic", unique_topic)
    at_kafka = run_tool(TOPICS, "--bootstrap-server", kafka_bootstrap, "--describe",
                        "--topic", unique_topic)
    # Then it shows the topic's 3 partitions, each led by Kiln's node, its only replica, and
    # the configs set on it: Kafka's, as Kafka shows them, and Kiln's
    assert run.returncode == 0, run
    topic, *partitions = [describe_line(line) for line in run.lines]
    node = str(module_kiln.settings.node_id)
    assert (topic["Topic"], topic["PartitionCount"], topic["ReplicationFactor"]) == (
        unique_topic, "3", "1")
    assert [(p["Partition"], p["Leader"], p["Replicas"], p["Isr"]) for p in partitions] == [
        (str(i), node, node, node) for i in range(3)]
    kafka_configs = describe_line(at_kafka.lines[0])["Configs"]
    assert "retention.ms=86400000" in kafka_configs.split(","), at_kafka
    assert topic["Configs"] == f"{kafka_configs},kiln.harden=all"


# --- kafka-configs --------------------------------------------------------------------------


def kiln_policy(kiln: RunningKiln, topic: str) -> dict[str, str]:
    """Kiln's policies for the topic, as its registry in Redis holds them now."""
    config = kiln.call(kiln.app.catalog.registry.get(topic, fresh=True))
    assert config is not None
    return kiln_configs(config)


def test_kafka_configs_alter_sets_kafkas_config_in_kafka_and_kilns_in_kiln(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic created through Kiln
    create_topic_confluent(module_kiln.bootstrap, unique_topic, 2)
    # When kafka-configs adds retention.ms and kiln.harden to it through Kiln
    run = run_tool(CONFIGS, "--bootstrap-server", module_kiln.bootstrap, "--entity-type",
                   "topics", "--entity-name", unique_topic, "--alter",
                   "--add-config", "retention.ms=1000,kiln.harden=all")
    # Then it reports success, Kafka's topic has the retention and Kiln the policy
    assert run.returncode == 0, run
    assert run.lines == [f"Completed updating config for topic {unique_topic}."], run
    assert eventually(lambda: kafka_topic_config(kafka_bootstrap, unique_topic,
                                                 "retention.ms") == "1000")
    assert kiln_policy(module_kiln, unique_topic)["kiln.harden"] == "all"


def test_kafka_configs_describe_lists_the_topics_own_configs_kafkas_and_kilns(
        module_kiln: RunningKiln, unique_topic: str) -> None:
    # Given a topic created through Kiln with retention.ms and kiln.reliability set
    create_topic_with_configs(module_kiln.bootstrap, unique_topic, 1,
                              {"retention.ms": "86400000", "kiln.reliability": "express"})
    # When kafka-configs describes the topic's configs through Kiln
    run = run_tool(CONFIGS, "--bootstrap-server", module_kiln.bootstrap, "--entity-type",
                   "topics", "--entity-name", unique_topic, "--describe")
    # Then it lists the two set on the topic, each with where its value comes from (Kiln's
    # default being its own)
    assert run.returncode == 0, run
    assert run.lines[0] == f"Dynamic configs for topic {unique_topic} are:", run
    kiln_line, kafka_line = sorted(run.lines[1:])
    assert kiln_line == (
        "  kiln.reliability=express sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:"
        "kiln.reliability=express, DEFAULT_CONFIG:kiln.reliability=reliable_persistent}"), run
    assert kafka_line.startswith("  retention.ms=86400000 sensitive=false synonyms="
                                 "{DYNAMIC_TOPIC_CONFIG:retention.ms=86400000"), run


def test_kafka_configs_refuses_a_bad_kiln_value_and_changes_nothing(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic created through Kiln
    create_topic_confluent(module_kiln.bootstrap, unique_topic, 2)
    # When kafka-configs sets a valid retention.ms and an unknown harden policy
    run = run_tool(CONFIGS, "--bootstrap-server", module_kiln.bootstrap, "--entity-type",
                   "topics", "--entity-name", unique_topic, "--alter",
                   "--add-config", "retention.ms=1000,kiln.harden=sometimes")
    # Then it fails with Kiln's reason as an invalid configuration, and neither Kafka's
    # retention nor Kiln's policy changed
    assert run.returncode == 1, run
    assert ("InvalidConfigurationException: kiln.harden: unknown harden policy 'sometimes'"
            in run.output), run
    assert kafka_topic_config(kafka_bootstrap, unique_topic, "retention.ms") != "1000"
    assert kiln_policy(module_kiln, unique_topic)["kiln.harden"] == "survivors"


def test_kafka_configs_describes_kilns_node_with_its_own_id(module_kiln: RunningKiln) -> None:
    # When kafka-configs describes every config of Kiln's node
    node = module_kiln.settings.node_id
    run = run_tool(CONFIGS, "--bootstrap-server", module_kiln.bootstrap, "--entity-type",
                   "brokers", "--entity-name", str(node), "--describe", "--all")
    # Then the node's id is Kiln's, from Kiln's static configuration, among the configs of
    # the Kafka broker Kiln stands for
    assert run.returncode == 0, run
    assert run.lines[0] == f"All configs for broker {node} are:", run
    assert (f"  node.id={node} sensitive=false synonyms={{STATIC_BROKER_CONFIG:node.id={node}}}"
            in run.lines), run
    assert any(line.startswith("  log.retention.hours=") for line in run.lines), run


# --- console producer and consumer ----------------------------------------------------------


def test_console_producer_records_keep_keys_values_headers_and_nulls(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given lines of "headers<TAB>key<TAB>value", with null keys, values and header values
    lines = [
        ("trace:t-0,dup:first,dup:second", "key-0", "value zero"),
        (NULL, "key-1", NULL),
        ("empty:", NULL, "a value\twith tabs"),
        (f"h:{NULL}", "key-3", "ünïcödé ✓"),
        *((f"n:{i}", f"key-{i % 3}", f"line-{i}") for i in range(4, 30)),
    ]
    stdin = "".join("\t".join(fields) + "\n" for fields in lines)
    # When the console producer sends them (acks=all, idempotent: the Java default, gzip) to
    # a topic Kiln does not have yet
    run = run_tool(CONSOLE_PRODUCER, "--bootstrap-server", module_kiln.bootstrap,
                   "--topic", unique_topic, "--compression-codec", "gzip",
                   "--command-property", "acks=all",
                   "--reader-property", "parse.key=true",
                   "--reader-property", "parse.headers=true",
                   "--reader-property", f"null.marker={NULL}", stdin=stdin)
    # Then Kiln created the topic and holds every line as a record, in order, intact, and so
    # does Kafka once hardened
    assert run.returncode == 0, run
    expected = [(offset, None if key == NULL else key.encode(),
                 None if value == NULL else value.encode(), parse_headers(headers))
                for offset, (headers, key, value) in enumerate(lines)]
    through_kiln = read_hardened(module_kiln.bootstrap, unique_topic, 1)[0]
    assert [as_line(r) for r in through_kiln] == expected
    assert module_kiln.flush()
    assert [as_line(r) for r in read_hardened(kafka_bootstrap, unique_topic, 1)[0]] == expected


def parse_headers(text: str) -> tuple[tuple[str, bytes | None], ...]:
    """What the console producer makes of a headers field."""
    if text == NULL:
        return ()
    pairs = (item.split(":", 1) for item in text.split(","))
    return tuple((key, None if value == NULL else value.encode()) for key, value in pairs)


def as_line(record: Hardened) -> tuple[object, ...]:
    return (record.kiln_offset, record.key, record.value, record.client_headers)


def test_console_consumer_in_a_group_prints_every_record_and_commits(
        module_kiln: RunningKiln, unique_topic: str) -> None:
    # Given 12 records over 3 partitions, with keys, headers, a null value and timestamps
    create_topic_confluent(module_kiln.bootstrap, unique_topic, 3)
    records = [Line(i % 3, b"key-%d" % i, None if i == 7 else b"value-%d" % i,
                    (("trace", b"t-%d" % i),) if i % 2 else ()) for i in range(12)]
    timestamps = [BASE_TIMESTAMP_MS + i * 1000 for i in range(12)]
    produce(module_kiln.bootstrap, unique_topic, records, timestamps)
    group = new_group()
    # When the console consumer reads them in a group from the beginning
    run = run_tool(CONSOLE_CONSUMER, "--bootstrap-server", module_kiln.bootstrap,
                   "--topic", unique_topic, "--group", group, "--from-beginning",
                   "--max-messages", "12", "--timeout-ms", "20000",
                   *(arg for name in ("timestamp", "partition", "offset", "headers", "key")
                     for arg in ("--formatter-property", f"print.{name}=true")),
                   "--formatter-property", f"null.literal={NULL}")
    # Then it printed every record once, each partition in offset order, with what was
    # produced, and committed the end of every partition when it closed
    assert run.returncode == 0, run
    assert "Processed a total of 12 messages" in run.stderr, run
    printed = [line.split("\t") for line in run.lines]
    positions = [(int(fields[1].removeprefix("Partition:")),
                  int(fields[2].removeprefix("Offset:"))) for fields in printed]
    expected = {}
    for i, record in enumerate(records):
        position = (record.partition, i // 3)
        headers = ",".join(f"{k}:{v.decode()}" for k, v in record.headers) or "NO_HEADERS"
        expected[position] = [
            f"CreateTime:{timestamps[i]}", f"Partition:{position[0]}", f"Offset:{position[1]}",
            headers, (record.key or b"").decode(),
            NULL if record.value is None else record.value.decode()]
    assert dict(zip(positions, printed, strict=True)) == expected
    for partition in range(3):
        offsets = [offset for p, offset in positions if p == partition]
        assert offsets == [0, 1, 2, 3], f"partition {partition}: {offsets}"
    assert committed_offsets(module_kiln.bootstrap, group) == {
        (unique_topic, p): 4 for p in range(3)}


# --- kafka-consumer-groups ------------------------------------------------------------------


def test_consumer_groups_list_names_groups_that_committed(
        module_kiln: RunningKiln, unique_topic: str) -> None:
    # Given two groups that committed offsets through Kiln
    create_topic_confluent(module_kiln.bootstrap, unique_topic, 1)
    groups = [new_group(), new_group()]
    for group in groups:
        commit_offsets(module_kiln.bootstrap, group, unique_topic, {0: 0})
    # When kafka-consumer-groups lists the groups
    run = run_tool(CONSUMER_GROUPS, "--bootstrap-server", module_kiln.bootstrap, "--list")
    # Then both are listed
    assert run.returncode == 0, run
    assert set(groups) <= set(run.lines), run


def test_consumer_groups_describe_shows_offsets_lag_and_the_owning_member(
        module_kiln: RunningKiln, unique_topic: str) -> None:
    # Given a 3-partition topic with 5, 3 and 4 records, and a live member of a group that
    # owns every partition and committed offsets 5, 1 and 0
    create_topic_confluent(module_kiln.bootstrap, unique_topic, 3)
    counts = [5, 3, 4]
    produce(module_kiln.bootstrap, unique_topic,
            [Line(p, b"k", b"v") for p, n in enumerate(counts) for _ in range(n)])
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
        member.commit(offsets=[confluent_kafka.TopicPartition(unique_topic, p, o)
                               for p, o in enumerate([5, 1, 0])], asynchronous=False)
        # When kafka-consumer-groups describes the group
        run = run_tool(CONSUMER_GROUPS, "--bootstrap-server", module_kiln.bootstrap,
                       "--describe", "--group", group)
    # Then each partition shows its committed offset, its end, the lag between them, and
    # the member that owns it
    assert run.returncode == 0, run
    rows = sorted(table(run), key=lambda row: int(row["PARTITION"]))
    assert [(r["GROUP"], r["TOPIC"], r["PARTITION"], r["CURRENT-OFFSET"], r["LOG-END-OFFSET"],
             r["LAG"], r["CLIENT-ID"]) for r in rows] == [
        (group, unique_topic, "0", "5", "5", "0", "live-member"),
        (group, unique_topic, "1", "1", "3", "2", "live-member"),
        (group, unique_topic, "2", "0", "4", "4", "live-member")]
    assert len({r["CONSUMER-ID"] for r in rows}) == 1
    assert rows[0]["CONSUMER-ID"].startswith("live-member-"), rows


def test_consumer_groups_reset_offsets_to_earliest_commits_them_in_kiln(
        module_kiln: RunningKiln, unique_topic: str) -> None:
    # Given a group without members that committed offsets 3 and 2 of a 2-partition topic
    create_topic_confluent(module_kiln.bootstrap, unique_topic, 2)
    produce(module_kiln.bootstrap, unique_topic,
            [Line(p, b"k", b"v") for p, n in enumerate([3, 2]) for _ in range(n)])
    group = new_group()
    commit_offsets(module_kiln.bootstrap, group, unique_topic, {0: 3, 1: 2})
    # When kafka-consumer-groups resets its offsets to the earliest
    run = run_tool(CONSUMER_GROUPS, "--bootstrap-server", module_kiln.bootstrap,
                   "--reset-offsets", "--group", group, "--topic", unique_topic,
                   "--to-earliest", "--execute")
    # Then it reports the new offsets, and Kiln holds them
    assert run.returncode == 0, run
    assert sorted((r["PARTITION"], r["NEW-OFFSET"]) for r in table(run)) == [
        ("0", "0"), ("1", "0")]
    assert committed_offsets(module_kiln.bootstrap, group) == {
        (unique_topic, 0): 0, (unique_topic, 1): 0}


def test_consumer_groups_delete_removes_the_group_and_its_offsets_from_kiln(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a group without members that committed offsets on a 2-partition topic, and a
    # second group that stays
    create_topic_confluent(module_kiln.bootstrap, unique_topic, 2)
    group, other = new_group(), new_group()
    commit_offsets(module_kiln.bootstrap, group, unique_topic, {0: 0, 1: 0})
    commit_offsets(module_kiln.bootstrap, other, unique_topic, {0: 0})
    # When kafka-consumer-groups deletes the first group
    run = run_tool(CONSUMER_GROUPS, "--bootstrap-server", module_kiln.bootstrap,
                   "--delete", "--group", group)
    # Then it reports the deletion, Kiln no longer lists the group nor holds its offsets,
    # the other group is untouched, and the topic is as it was in Kiln and in Kafka
    assert run.returncode == 0, run
    assert f"Deletion of requested consumer groups ('{group}') was successful." in run.output
    listed = run_tool(CONSUMER_GROUPS, "--bootstrap-server", module_kiln.bootstrap, "--list")
    assert group not in listed.lines and other in listed.lines, listed
    assert committed_offsets(module_kiln.bootstrap, group) == {}
    assert committed_offsets(module_kiln.bootstrap, other) == {(unique_topic, 0): 0}
    assert kiln_partition_count(module_kiln.bootstrap, unique_topic) == 2
    assert kafka_partition_count(kafka_bootstrap, unique_topic) == 2


def test_consumer_groups_delete_offsets_of_a_topic_removes_them_from_kiln(
        module_kiln: RunningKiln, unique_topic: str) -> None:
    # Given a group without members with offsets on two partitions of one topic and on
    # another topic
    other_topic = f"{unique_topic}-other"
    create_topic_confluent(module_kiln.bootstrap, unique_topic, 2)
    create_topic_confluent(module_kiln.bootstrap, other_topic, 1)
    group = new_group()
    commit_offsets(module_kiln.bootstrap, group, unique_topic, {0: 0, 1: 0})
    commit_offsets(module_kiln.bootstrap, group, other_topic, {0: 0})
    # When kafka-consumer-groups deletes the group's offsets of the first topic
    run = run_tool(CONSUMER_GROUPS, "--bootstrap-server", module_kiln.bootstrap,
                   "--delete-offsets", "--group", group, "--topic", unique_topic)
    # Then each partition is reported deleted, and only the other topic's offset is left
    assert run.returncode == 0, run
    assert sorted((r["PARTITION"], r["STATUS"]) for r in table(run, "TOPIC")) == [
        ("0", "Successful"), ("1", "Successful")], run
    assert committed_offsets(module_kiln.bootstrap, group) == {(other_topic, 0): 0}


# --- kafka-delete-records -------------------------------------------------------------------

DELETE_RECORDS = "org.apache.kafka.tools.DeleteRecordsCommand"


def test_delete_records_moves_the_log_start_in_kiln_and_in_kafka(
        module_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str,
        tmp_path: Path) -> None:
    # Given six records, hardened to Kafka
    produce(module_kiln.bootstrap, unique_topic, [Line(0, None, b"v%d" % i) for i in range(6)])
    assert module_kiln.flush()
    offsets = tmp_path / "offsets.json"
    offsets.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": unique_topic, "partition": 0, "offset": 4}]}))
    # When kafka-delete-records deletes the records below offset 4
    run = run_tool(DELETE_RECORDS, "--bootstrap-server", module_kiln.bootstrap,
                   "--offset-json-file", str(offsets))
    # Then it reports the new low watermark, Kiln's partition starts there, and Kafka holds
    # only the records from there on
    assert run.returncode == 0, run
    assert f"partition: {unique_topic}-0\tlow_watermark: 4" in run.output, run
    assert watermarks(module_kiln.bootstrap, unique_topic) == (4, 6)
    assert [r.kiln_offset for r in read_hardened(kafka_bootstrap, unique_topic, 1)[0]] == [4, 5]


def watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    """(log start, end) of partition 0, as ListOffsets answers them."""
    with confluent_kafka.Consumer({"bootstrap.servers": bootstrap,
                                   "group.id": new_group()}) as consumer:
        low, high = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 0),
                                                   timeout=10, cached=False)
    return int(low), int(high)


# --- kafka-producer-perf-test ---------------------------------------------------------------

PERF_SUMMARY = re.compile(r"^2000 records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), "
                          r"[\d.]+ ms avg latency, [\d.]+ ms max latency")


def test_producer_perf_test_completes_and_every_record_lands(
        module_kiln: RunningKiln, unique_topic: str) -> None:
    # When kafka-producer-perf-test sends 2000 records of 100 bytes (acks=all, lz4)
    run = run_tool(PRODUCER_PERF, "--bootstrap-server", module_kiln.bootstrap,
                   "--topic", unique_topic, "--num-records", "2000", "--record-size", "100",
                   "--throughput", "-1",
                   "--command-property", "acks=all", "compression.type=lz4", "linger.ms=5")
    # Then it reports all of them sent, with their latency, and Kiln's log holds 2000
    assert run.returncode == 0, run
    assert PERF_SUMMARY.match(run.lines[-1]), run
    assert end_offsets(module_kiln.bootstrap, unique_topic, 1) == [2000]


# --- kafka-get-offsets -------------------------------------------------------------------------


def test_get_offset_shell_finds_the_record_with_the_largest_timestamp(
        module_kiln: RunningKiln, unique_topic: str) -> None:
    # Given five records, one batch each, whose largest timestamp is the second's
    produce(module_kiln.bootstrap, unique_topic, [Line(0, None, b"v%d" % i) for i in range(5)],
            [BASE_TIMESTAMP_MS + delta for delta in (0, 4000, 1000, 3000, 2000)])
    # When kafka-get-offsets asks for the offset of the largest timestamp
    run = run_tool(GET_OFFSETS, "--bootstrap-server", module_kiln.bootstrap,
                   "--topic", unique_topic, "--time", "-3")
    # Then it is offset 1
    assert run.returncode == 0, run
    assert run.lines == [f"{unique_topic}:0:1"], run
