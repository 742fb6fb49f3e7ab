"""kcat 1.7.1 (Debian's, on Debian's librdkafka 2.0.2; scripts/clients/kcat.sh) through Kiln.

- `-L`: the metadata of every topic and of one topic: Kiln's node is the only broker, the
  controller, and the leader and only replica of every partition.
- `-P`: lines with keys and headers, with each codec kcat offers (`-z gzip|snappy|lz4|zstd`
  and none), hardened to Kafka in order, intact, in batches of that codec.
- `-C -o beginning -e`: every partition read to its end across hardened and hot records,
  as produced; kcat exits by itself at the end.
- `-G`: a balanced consumer group reads every record once and commits the partitions' ends,
  as kafka-python's admin sees them through Kiln.
- `-Q`: offsets for times, including a time after the last record (the end, -1).

Every test also checks that Kiln closed no connection and failed no request unexpectedly
(`kiln_answering_all`). kcat prints no offsets for what it produces, so the producer tests
check order and contents, not offsets kcat was told.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from typing import Any

import pytest

from tests.compat.clients import (
    CODEC_IDS,
    create_topic_confluent,
    hardened_codecs,
)
from tests.compat.java import ToolRun, committed_offsets
from tests.compat.test_kafka_tools import Line
from tests.compat.test_kafka_tools import produce as produce_lines
from tests.compat.test_producers import harden_and_read
from tests.conftest import _unavailable
from tests.kiln_harness import RunningKiln

BASE_TIMESTAMP_MS = 1_700_000_000_000
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


@pytest.fixture(scope="module", autouse=True)
def kcat_installed() -> None:
    if shutil.which("kcat") is None:
        _unavailable("kcat", "kcat is not on PATH (scripts/setup.sh installs it)")


def kcat(*args: str, stdin: str | None = None, timeout_s: float = 30) -> ToolRun:
    command = ["kcat", *args]
    try:
        done = subprocess.run(command, input=stdin, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        # subprocess.run has killed kcat; a client that hangs is a failure.
        raise AssertionError(f"{' '.join(command)} did not finish within {timeout_s} s:\n"
                             f"{exc.stdout!r}\n{exc.stderr!r}") from exc
    return ToolRun(tuple(command), done.returncode, done.stdout, done.stderr)


def json_lines(run: ToolRun) -> list[dict[str, Any]]:
    """kcat -J prints one JSON object per line on stdout (its notices go to stderr)."""
    return [json.loads(line) for line in run.lines]


# --- -L --------------------------------------------------------------------------------------


def expected_topic(node: int, topic: str, partitions: int) -> dict[str, Any]:
    return {"topic": topic, "partitions": [
        {"partition": p, "leader": node, "replicas": [{"id": node}], "isrs": [{"id": node}]}
        for p in range(partitions)]}


def test_metadata_of_every_topic(kiln_answering_all: RunningKiln, unique_topic: str) -> None:
    kiln = kiln_answering_all
    # Given two topics created through Kiln, of 2 and 3 partitions
    other = f"{unique_topic}-other"
    create_topic_confluent(kiln.bootstrap, unique_topic, 2)
    create_topic_confluent(kiln.bootstrap, other, 3)
    # When kcat lists the metadata of every topic
    run = kcat("-L", "-J", "-b", kiln.bootstrap)
    # Then Kiln's node is the only broker and the controller, and both topics are there,
    # every partition led by Kiln's node, its only replica
    assert run.returncode == 0, run
    [metadata] = json_lines(run)
    node = kiln.settings.node_id
    assert metadata["brokers"] == [{"id": node, "name": kiln.bootstrap}]
    assert metadata["controllerid"] == node
    assert metadata["query"] == {"topic": "*"}
    topics = {t["topic"]: t for t in metadata["topics"]}
    assert topics[unique_topic] == expected_topic(node, unique_topic, 2)
    assert topics[other] == expected_topic(node, other, 3)


def test_metadata_of_one_topic(kiln_answering_all: RunningKiln, unique_topic: str) -> None:
    kiln = kiln_answering_all
    # Given a 2-partition topic and another one, created through Kiln
    create_topic_confluent(kiln.bootstrap, unique_topic, 2)
    create_topic_confluent(kiln.bootstrap, f"{unique_topic}-other", 1)
    # When kcat lists the metadata of the first
    run = kcat("-L", "-J", "-b", kiln.bootstrap, "-t", unique_topic)
    # Then only that topic is listed, with its partitions
    assert run.returncode == 0, run
    [metadata] = json_lines(run)
    assert metadata["query"] == {"topic": unique_topic}
    assert metadata["topics"] == [expected_topic(kiln.settings.node_id, unique_topic, 2)]


# --- -P --------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_produce_with_each_codec_is_hardened_in_order_and_intact(
        kiln_answering_all: RunningKiln, kafka_bootstrap: str, unique_topic: str,
        codec: str) -> None:
    kiln = kiln_answering_all
    # Given 300 lines of "key:value"
    lines = [(f"key-{i % 17}", f"value-{i:04d}-" + "x" * (i % 40)) for i in range(300)]
    stdin = "".join(f"{key}:{value}\n" for key, value in lines)
    # When kcat produces them to partition 0 with two headers each and the codec, in
    # batches of 50 (the linger lets each fill: librdkafka sends a batch that compression
    # would not shrink, such as a first one of a single line, uncompressed, and Kiln
    # hardens merged batches with the codec of the first compressed one)
    run = kcat("-P", "-b", kiln.bootstrap, "-t", unique_topic, "-p", "0", "-K", ":",
               "-H", "trace=kcat", "-H", "codec=" + codec,
               "-X", "batch.num.messages=50", "-X", "linger.ms=200", "-X", "acks=all",
               *(("-z", codec) if codec != "none" else ()), stdin=stdin)
    # Then kcat succeeded, and Kafka holds every line once, in order, as sent, in batches
    # of the codec
    assert run.returncode == 0, run
    hardened = harden_and_read(kiln, kafka_bootstrap, unique_topic, 1, len(lines))[0]
    assert [(h.kiln_offset, h.key, h.value, h.client_headers) for h in hardened] == [
        (offset, key.encode(), value.encode(), (("trace", b"kcat"), ("codec", codec.encode())))
        for offset, (key, value) in enumerate(lines)]
    codecs = hardened_codecs(kafka_bootstrap, unique_topic, 0)
    assert codecs, "no batch fetched"
    assert set(codecs) <= {0, CODEC_IDS[codec]}, codecs
    if codec != "none":
        assert CODEC_IDS[codec] in codecs, codecs


# --- -C and -G -------------------------------------------------------------------------------


def given_hardened_and_hot_records(kiln: RunningKiln, topic: str) -> list[Line]:
    """12 records over 2 partitions with keys, headers, a null value and timestamps; the
    first 6 hardened to Kafka, the rest only in Kiln."""
    create_topic_confluent(kiln.bootstrap, topic, 2)
    lines = [Line(i % 2, b"key-%d" % i, None if i == 7 else b"value-%d" % i,
                  (("trace", b"t-%d" % i),) if i % 3 else ()) for i in range(12)]
    timestamps = [BASE_TIMESTAMP_MS + i * 1000 for i in range(12)]
    produce_lines(kiln.bootstrap, topic, lines[:6], timestamps[:6])
    assert kiln.flush()
    produce_lines(kiln.bootstrap, topic, lines[6:], timestamps[6:])
    return lines


def as_kcat_json(topic: str, lines: list[Line], partition: int) -> list[dict[str, Any]]:
    """What kcat -J prints for the records of `partition` (read with --broker ids)."""
    ours = [(i, line) for i, line in enumerate(lines) if line.partition == partition]
    out = []
    for offset, (i, line) in enumerate(ours):
        record: dict[str, Any] = {
            "topic": topic, "partition": partition, "offset": offset, "tstype": "create",
            "ts": BASE_TIMESTAMP_MS + i * 1000}
        if line.headers:
            record["headers"] = [part.decode() if isinstance(part, bytes) else part
                                 for header in line.headers for part in header]
        record["key"] = None if line.key is None else line.key.decode()
        record["payload"] = None if line.value is None else line.value.decode()
        out.append(record)
    return out


def without_broker(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "broker"}


def test_consume_every_partition_from_the_beginning_to_the_end(
        kiln_answering_all: RunningKiln, unique_topic: str) -> None:
    kiln = kiln_answering_all
    lines = given_hardened_and_hot_records(kiln, unique_topic)
    # When kcat consumes the topic from the beginning, exiting at the end
    run = kcat("-C", "-J", "-b", kiln.bootstrap, "-t", unique_topic, "-o", "beginning", "-e")
    # Then it printed every record of each partition in order, as produced, from Kiln's
    # node, and exited by itself at the end of both partitions
    assert run.returncode == 0, run
    printed = json_lines(run)
    assert {r["broker"] for r in printed} == {kiln.settings.node_id}
    for partition in (0, 1):
        assert [without_broker(r) for r in printed if r["partition"] == partition] == \
            as_kcat_json(unique_topic, lines, partition), f"partition {partition}"
    for partition in (0, 1):
        assert f"Reached end of topic {unique_topic} [{partition}] at offset 6" in run.stderr


def test_balanced_group_consumer_reads_every_record_once_and_commits(
        kiln_answering_all: RunningKiln, unique_topic: str) -> None:
    kiln = kiln_answering_all
    lines = given_hardened_and_hot_records(kiln, unique_topic)
    group = f"g-{uuid.uuid4().hex[:8]}"
    # When kcat joins a group on the topic, from the beginning, until it has 12 records
    run = kcat("-b", kiln.bootstrap, "-G", group, "-o", "beginning", "-c", "12", "-J",
               "-X", "session.timeout.ms=6000", unique_topic)
    # Then it was assigned both partitions, read every record once, in order, as produced,
    # and committed the end of both partitions when it left
    assert run.returncode == 0, run
    assert (f"assigned: {unique_topic} [0], {unique_topic} [1]" in run.stderr), run
    printed = json_lines(run)
    for partition in (0, 1):
        assert [without_broker(r) for r in printed if r["partition"] == partition] == \
            as_kcat_json(unique_topic, lines, partition), f"partition {partition}"
    assert committed_offsets(kiln.bootstrap, group) == {
        (unique_topic, 0): 6, (unique_topic, 1): 6}


# --- -Q --------------------------------------------------------------------------------------


def test_offsets_for_times(kiln_answering_all: RunningKiln, unique_topic: str) -> None:
    kiln = kiln_answering_all
    lines = given_hardened_and_hot_records(kiln, unique_topic)
    assert len(lines) == 12  # record i at BASE + i s, on partition i % 2
    # When kcat asks for partition 0's offset at 2.5 s (hardened records) and partition 1's
    # at 8.5 s (records only in Kiln), then for a time after every record
    run = kcat("-Q", "-J", "-b", kiln.bootstrap,
               "-t", f"{unique_topic}:0:{BASE_TIMESTAMP_MS + 2500}",
               "-t", f"{unique_topic}:1:{BASE_TIMESTAMP_MS + 8500}")
    after = kcat("-Q", "-J", "-b", kiln.bootstrap,
                 "-t", f"{unique_topic}:0:{BASE_TIMESTAMP_MS + 60_000}")
    # Then each is the offset of the first record at or after the time (partition 0: record
    # 4 at offset 2; partition 1: record 9 at offset 4), and past the last one there is none
    assert run.returncode == 0, run
    [answer] = json_lines(run)
    assert answer == {unique_topic: {"topic": unique_topic,
                                     "0": {"partition": 0, "offset": 2},
                                     "1": {"partition": 1, "offset": 4}}}
    assert after.returncode == 0, after
    assert json_lines(after) == [{unique_topic: {"topic": unique_topic,
                                                 "0": {"partition": 0, "offset": -1}}}]
