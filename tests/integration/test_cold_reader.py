"""ColdReader against a real broker: Kafka batches written with chosen Kiln offsets (gaps,
records without a Kiln offset), read back in Kiln offsets."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from aiokafka.record._crecords import DefaultRecordBatchBuilder

from storage.kafka.client import KafkaClient
from storage.model import TopicPartition
from storage.read_through import ColdReader
from wire.lineage import kiln_offset_header
from wire.records import decode_records

BASE_TS = 1_700_000_000_000


def kiln_batch(kiln_offsets: Sequence[int | None], timestamps: Sequence[int]) -> bytes:
    """A batch as the hardener writes it; None: a record without a Kiln offset."""
    builder: Any = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 30)
    for i, (kiln, ts) in enumerate(zip(kiln_offsets, timestamps, strict=True)):
        headers = [] if kiln is None else [kiln_offset_header(kiln)]
        builder.append(i, ts, None, b"kiln-%d" % (-1 if kiln is None else kiln), headers)
    return bytes(builder.build())


def kiln_offset_at(kafka: int) -> int:
    """The Kiln offsets written: gaps inside every batch and between batches."""
    return 3 * kafka + (kafka // 20) * 11


async def write_batches(client: KafkaClient, topic: str, batches: int, per_batch: int) -> None:
    await client.create_topic(topic, 1)
    for b in range(batches):
        kafka = range(b * per_batch, (b + 1) * per_batch)
        await client.produce(topic, 0, kiln_batch([kiln_offset_at(k) for k in kafka],
                                                  [BASE_TS + k for k in kafka]))


def served(records: bytes) -> list[tuple[int, bytes | None]]:
    return [(r.offset, r.value) for r in decode_records(records)]


def test_random_reads_find_the_first_record_at_or_above_the_wanted_offset(
        kafka_bootstrap: str, unique_topic: str) -> None:
    # Given 100 Kafka batches of 20 records whose Kiln offsets have gaps everywhere
    async def run() -> list[tuple[int, list[tuple[int, bytes | None]], int | None]]:
        client = KafkaClient(kafka_bootstrap)
        await write_batches(client, unique_topic, 100, 20)
        reader = ColdReader(client)
        tp = TopicPartition(unique_topic, 0)
        wanted = [0, 1, 2, 3, 59, 60, 61, 5000, kiln_offset_at(1999), kiln_offset_at(1999) + 1]
        wanted += random.Random(7).sample(range(kiln_offset_at(1999)), 30)
        results = []
        for offset in wanted:  # When each is read with room for 3 records of output
            read = await reader.read(tp, offset, 200, at_least_one=False)
            results.append((offset, served(read.records), read.next_offset))
        await client.close()
        return results

    results = asyncio.run(run())

    # Then each read starts at the first Kiln offset at or above the one wanted
    all_offsets = [kiln_offset_at(k) for k in range(2000)]
    for offset, records, next_offset in results:
        expected = [k for k in all_offsets if k >= offset]
        if not expected:
            assert (records, next_offset) == ([], None)
            continue
        assert records, offset
        assert [o for o, _ in records] == expected[:len(records)]
        assert [v for _, v in records] == [b"kiln-%d" % o for o, _ in records]
        assert next_offset == records[-1][0] + 1


def test_a_consumer_reading_on_never_searches_again(
        kafka_bootstrap: str, unique_topic: str) -> None:
    # Given 100 Kafka batches of 20 records
    async def run() -> tuple[list[int], list[int], int | None]:
        client = KafkaClient(kafka_bootstrap)
        await write_batches(client, unique_topic, 100, 20)
        reader = ColdReader(client)
        tp = TopicPartition(unique_topic, 0)
        offsets: list[int] = []
        probes: list[int] = []
        offset: int | None = 700  # When a consumer seeks into the middle and reads on
        earliest = await reader.earliest(tp)
        while offset is not None:
            before = reader.counters.probes
            read = await reader.read(tp, offset, 300)
            probes.append(reader.counters.probes - before)
            offsets += [o for o, _ in served(read.records)]
            offset = read.next_offset
        await client.close()
        return offsets, probes, earliest

    offsets, probes, earliest = asyncio.run(run())

    # Then it gets every record from there once, in order; only the first read searched
    assert offsets == [kiln_offset_at(k) for k in range(2000) if kiln_offset_at(k) >= 700]
    assert probes[0] > 1
    assert set(probes[1:]) == {0}
    assert earliest == 0


def test_records_without_a_kiln_offset_are_read_at_their_kafka_offsets(
        kafka_bootstrap: str, unique_topic: str) -> None:
    # Given 10 records another producer wrote, then Kiln records from Kiln offset 50
    async def run() -> tuple[list[tuple[int, bytes | None]], int | None]:
        client = KafkaClient(kafka_bootstrap)
        await client.create_topic(unique_topic, 1)
        await client.produce(unique_topic, 0, kiln_batch([None] * 10, [BASE_TS] * 10))
        await client.produce(unique_topic, 0, kiln_batch([50, 51, 55], [BASE_TS] * 3))
        reader = ColdReader(client)
        tp = TopicPartition(unique_topic, 0)
        read = await reader.read(tp, 0, 1 << 20)  # When read from the start
        await client.close()
        return served(read.records), read.earliest

    records, earliest = asyncio.run(run())

    # Then the first ten keep their Kafka offsets as Kiln offsets
    assert [o for o, _ in records] == [*range(10), 50, 51, 55]
    assert earliest == 0


def test_a_timestamp_is_found_although_the_broker_answers_the_log_start(
        kafka_bootstrap: str, unique_topic: str) -> None:
    # Given 100 batches of 20 records stamped BASE_TS + Kafka offset
    async def run() -> list[tuple[int, int] | None]:
        client = KafkaClient(kafka_bootstrap)
        await write_batches(client, unique_topic, 100, 20)
        reader = ColdReader(client)
        tp = TopicPartition(unique_topic, 0)
        found = []
        for ts in (BASE_TS - 5, BASE_TS + 777, BASE_TS + 1999, BASE_TS + 5000):
            record = await reader.offset_for_timestamp(tp, ts)  # When a time is looked up
            found.append(None if record is None else (record.kiln_offset, record.timestamp))
        await client.close()
        return found

    found = asyncio.run(run())

    # Then it is the first record at or after that time (tansu 0.6 answers ListOffsets by
    # timestamp with 0 whatever the time; the reader checks and searches)
    assert found == [(0, BASE_TS), (kiln_offset_at(777), BASE_TS + 777),
                     (kiln_offset_at(1999), BASE_TS + 1999), None]


def test_an_empty_partition_holds_nothing(kafka_bootstrap: str, unique_topic: str) -> None:
    async def run() -> tuple[int | None, int | None, bytes]:
        client = KafkaClient(kafka_bootstrap)
        await client.create_topic(unique_topic, 1)
        reader = ColdReader(client)
        tp = TopicPartition(unique_topic, 0)
        earliest = await reader.earliest(tp)
        read = await reader.read(tp, 0, 1000)
        await client.close()
        return earliest, read.next_offset, read.records

    assert asyncio.run(run()) == (None, None, b"")


def test_a_topic_kafka_does_not_have_holds_nothing(kafka_bootstrap: str,
                                                   unique_topic: str) -> None:
    # Given a topic Kafka does not have (created in Kiln while Kafka was down, or lost)
    async def run() -> tuple[int | None, int | None, Any]:
        client = KafkaClient(kafka_bootstrap)
        reader = ColdReader(client)
        tp = TopicPartition(unique_topic, 0)
        earliest = await reader.earliest(tp)  # When it is read
        read = await reader.read(tp, 0, 1000)
        found = await reader.offset_for_timestamp(tp, BASE_TS)
        await client.close()
        return earliest, read.next_offset, found

    # Then Kafka holds none of its records, rather than being unreachable
    assert asyncio.run(run()) == (None, None, None)


def test_that_kafka_held_nothing_is_asked_again_once_records_were_hardened(
        kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a reader that learned Kafka holds none of the partition's records, when Redis
    # counted 0 records hardened, and 3 records written to Kafka since
    async def run() -> tuple[int | None, int | None, int | None, int]:
        client = KafkaClient(kafka_bootstrap)
        await client.create_topic(unique_topic, 1)
        reader = ColdReader(client)
        tp = TopicPartition(unique_topic, 0)
        assert await reader.earliest(tp, hardened_records=0) is None
        await client.produce(unique_topic, 0, kiln_batch([0, 1, 2], [BASE_TS] * 3))

        # When the earliest offset is asked without waiting, with Redis counting 0, then 3
        # records hardened
        cached = reader.earliest_if_known(tp)
        before = reader.counters.probes
        unchanged = await reader.earliest_after_hardening(tp, 0)
        hardened = await reader.earliest_after_hardening(tp, 3)
        probes = reader.counters.probes - before
        await reader.close()
        await client.close()
        return cached, unchanged, hardened, probes

    # Then the cached answer stands until records were hardened, then Kafka is asked (once)
    assert asyncio.run(run()) == (None, None, 0, 1)
