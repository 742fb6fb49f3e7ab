"""`kiln inspect TOPIC PARTITION`: the buffered records of a partition, decoded, read from a
deployment's Redis as an operator runs it."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from kafka import KafkaProducer

from tests.integration.test_cli import run_kiln
from tests.kiln_harness import RunningKiln

_TIMESTAMP = 1_700_000_000_000




def inspect(redis_url: str, *args: str) -> Any:
    result = run_kiln("inspect", *args, "--json", "--redis-url", redis_url)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def raw(encoded: dict[str, Any] | None) -> bytes | None:
    """The bytes an encoded key, value or header value stands for."""
    if encoded is None:
        return None
    if encoded["encoding"] == "utf-8":
        data: bytes = encoded["data"].encode("utf-8")
    else:
        assert encoded["encoding"] == "base64"
        data = base64.b64decode(encoded["data"])
    assert encoded["size"] == len(data)
    return data


def produce_one_batch(kiln: RunningKiln, topic: str, records: list[tuple[Any, ...]],
                      **config: Any) -> None:
    """(key, value, headers) records to partition 0, in one batch."""
    producer = KafkaProducer(bootstrap_servers=kiln.bootstrap, linger_ms=1000,
                             batch_size=1 << 20, **{"acks": 1, **config})
    futures = [producer.send(topic, key=key, value=value, headers=headers, partition=0,
                             timestamp_ms=_TIMESTAMP + i)
               for i, (key, value, headers) in enumerate(records)]
    producer.flush()
    for future in futures:
        future.get(timeout=10)
    producer.close()


def test_buffered_records_are_decoded_with_keys_values_and_headers(
        slow_kiln: RunningKiln, redis_url: str, unique_topic: str) -> None:
    # Given one lz4 batch: text, bytes that are not UTF-8, and a record with a null value
    records = [
        (b"user-1", "caf\u00e9 \u2615".encode(), [("source", b"web"), ("trace", b"\x00\xff")]),
        (b"\xff\xfe\x00", b"\x80" * 100, []),
        (b"gone", None, [("empty", b"")]),
    ]
    produce_one_batch(slow_kiln, unique_topic, records, compression_type="lz4")

    # When the operator inspects the partition
    rows = inspect(redis_url, unique_topic, "0")

    # Then every record is there, byte for byte, with its batch's facts
    assert [row["offset"] for row in rows] == [0, 1, 2]
    assert [(raw(row["key"]), raw(row["value"])) for row in rows] == [
        (key, value) for key, value, _ in records]
    assert [row["key"]["encoding"] for row in rows] == ["utf-8", "base64", "utf-8"]
    assert rows[0]["value"] == {"encoding": "utf-8", "data": "caf\u00e9 \u2615", "size": 9}
    assert [[(h["key"], raw(h["value"])) for h in row["headers"]] for row in rows] == [
        headers for _, _, headers in records]
    assert [row["timestamp"] for row in rows] == [_TIMESTAMP, _TIMESTAMP + 1, _TIMESTAMP + 2]
    assert {(row["timestamp_type"], row["compression"], row["level"], row["producer_id"],
             row["sequence"], row["batch_offset"]) for row in rows} == {
        ("create", "lz4", "reliable_persistent", -1, None, 0)}
    assert all(row["age_s"] >= 0 and row["appended_ms"] > _TIMESTAMP for row in rows)


def test_the_table_shows_printable_previews(
        slow_kiln: RunningKiln, redis_url: str, unique_topic: str) -> None:
    # Given a long text value and binary bytes
    produce_one_batch(slow_kiln, unique_topic, [
        (b"k", b"x" * 100, [("h", b"1")]),
        (b"\xff\x01", b"tab\there", []),
    ])

    # When the operator inspects the partition as a table
    table = run_kiln("inspect", unique_topic, "0", "--redis-url", redis_url)

    # Then long values are cut, bytes that are not printable appear as escapes
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["OFFSET", "TIMESTAMP", "AGE_S", "KEY", "VALUE", "HEADERS",
                                "PRODUCER", "COMPRESSION", "LEVEL"]
    assert "2023-11-14 22:13:20.000" in lines[1]
    assert "x" * 31 + "\u2026" in lines[1] and "x" * 32 not in lines[1]
    assert "h=1" in lines[1]
    assert "\\xff\\x01" in lines[2] and "tab\\there" in lines[2]
    assert lines[-1] == (f"{unique_topic}/0: showing offsets 0-1; the log queue holds "
                         "offsets 0-1")


def test_an_idempotent_producer_s_id_epoch_and_sequences_are_shown(
        slow_kiln: RunningKiln, redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic capped at reliable_persistent (so acks=all is answered on append) and an
    # idempotent producer's gzip batch of 4 records
    created = run_kiln("topics", "create", unique_topic, "--max-reliability",
                       "reliable_persistent", "--redis-url", redis_url,
                       "--kafka-bootstrap", kafka_bootstrap)
    assert created.returncode == 0, created.stderr
    values = [b"v%d" % i * 50 for i in range(4)]  # compressible: kafka-python keeps gzip
    produce_one_batch(slow_kiln, unique_topic, [(None, value, []) for value in values],
                      acks="all", enable_idempotence=True, compression_type="gzip")

    # When the operator inspects from offset 1
    rows = inspect(redis_url, unique_topic, "0", "--from", "1")

    # Then each record carries the producer and its own sequence number
    assert [(row["offset"], raw(row["value"])) for row in rows] == [
        (1, values[1]), (2, values[2]), (3, values[3])]
    assert [row["sequence"] for row in rows] == [1, 2, 3]
    assert {(row["producer_epoch"], row["compression"]) for row in rows} == {(0, "gzip")}
    assert rows[0]["producer_id"] >= 0


def test_from_and_limit_select_records_across_batches(
        slow_kiln: RunningKiln, redis_url: str, unique_topic: str) -> None:
    # Given three batches: offsets 0-3, 4-7 and 8-11
    for start in (0, 4, 8):
        produce_one_batch(slow_kiln, unique_topic,
                          [(None, b"r%d" % i, []) for i in range(start, start + 4)])

    # When the operator asks for 5 records from the middle of the first batch
    rows = inspect(redis_url, unique_topic, "0", "--from", "2", "--limit", "5")

    # Then exactly those come back
    assert [(row["offset"], raw(row["value"]), row["batch_offset"]) for row in rows] == [
        (2, b"r2", 0), (3, b"r3", 0), (4, b"r4", 4), (5, b"r5", 4), (6, b"r6", 4)]
    assert rows[0]["key"] is None


def test_offsets_that_are_not_buffered_are_refused_with_the_buffered_range(
        slow_kiln: RunningKiln, redis_url: str, unique_topic: str) -> None:
    # Given offsets 0-4 hardened and 5-9 buffered
    produce_one_batch(slow_kiln, unique_topic, [(None, b"a", [])] * 5)
    assert slow_kiln.flush()
    produce_one_batch(slow_kiln, unique_topic, [(None, b"b", [])] * 5)

    # When the operator asks below, at and past the buffered range
    below = run_kiln("inspect", unique_topic, "0", "--from", "2", "--redis-url", redis_url)
    past = run_kiln("inspect", unique_topic, "0", "--from", "10", "--redis-url", redis_url)
    first = inspect(redis_url, unique_topic, "0", "--from", "5", "--limit", "1")

    # Then the refusals say what is buffered
    for refused in (below, past):
        assert refused.returncode == 1
        assert "Traceback" not in refused.stderr
    assert (f"offset 2 is not buffered in {unique_topic}/0: the log queue holds offsets 5-9"
            in below.stderr)
    assert "offset 10 is not buffered" in past.stderr
    assert [row["offset"] for row in first] == [5]


def test_an_empty_partition_says_so(
        slow_kiln: RunningKiln, redis_url: str, unique_topic: str) -> None:
    produce_one_batch(slow_kiln, unique_topic, [(None, b"a", [])] * 3)
    assert slow_kiln.flush()

    table = run_kiln("inspect", unique_topic, "0", "--redis-url", redis_url)
    listed = inspect(redis_url, unique_topic, "0")
    asked = run_kiln("inspect", unique_topic, "0", "--from", "0", "--redis-url", redis_url)

    assert (table.returncode, table.stdout) == (
        0, f"{unique_topic}/0: nothing is buffered (next offset 3)\n")
    assert listed == []
    assert asked.returncode == 1
    assert (f"offset 0 is not buffered in {unique_topic}/0: nothing is buffered (next "
            "offset 3)") in asked.stderr


@pytest.mark.parametrize(("args", "code", "message"), [
    (["no-such-topic", "0"], 1, "unknown topic 'no-such-topic'"),
    (["{topic}", "1"], 1, "topic {topic} has partitions 0-0, not 1"),
    (["{topic}", "zero"], 2, "'zero' is not a valid integer"),
    (["{topic}", "0", "--limit", "0"], 2, "0 is not in the range x>=1"),
])
def test_bad_topic_partition_or_limit_is_named(
        slow_kiln: RunningKiln, redis_url: str, unique_topic: str, args: list[str], code: int,
        message: str) -> None:
    produce_one_batch(slow_kiln, unique_topic, [(None, b"a", [])])

    result = run_kiln("inspect", *[a.format(topic=unique_topic) for a in args],
                      "--redis-url", redis_url)

    assert result.returncode == code
    assert message.format(topic=unique_topic) in result.stderr
    assert "Traceback" not in result.stderr
