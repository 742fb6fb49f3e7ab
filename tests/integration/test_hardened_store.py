"""The hardened store against a real broker: batches go in once, in order, and stay traceable.

Reads use kafka-python's consumer from offset 0 of an assigned partition (no group, no
ListOffsets "latest", which tansu 0.6.0 answers wrongly), so no known tansu defect matters.
Fencing is checked only through the fenced writer's next write, which is what tansu and Kafka
both refuse.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from aiokafka.record._crecords import DefaultRecordBatchBuilder
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from storage.errors import Fenced, HardenedStoreRejected
from storage.hardened_batches import iter_hardened_batches
from storage.hardened_store import Fence, HardenedPartitionWriter, WriteResult
from storage.kafka.client import FetchResult, KafkaClient, ProduceResult
from storage.model import Reliability, StoredBatch
from tests.conftest import KafkaRelay
from wire.batch import CODEC_GZIP, CODEC_LZ4, CODEC_NONE, CODEC_SNAPPY, CODEC_ZSTD, read_header
from wire.errors import ErrorCode
from wire.lineage import kiln_offset_of, split_lineage
from wire.records import decode_records

pytestmark = pytest.mark.integration

T = TypeVar("T")
Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class Sent:
    kiln_offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[Header]


def make_records(kiln_base: int, count: int) -> list[Sent]:
    out = []
    for i in range(count):
        offset = kiln_base + i
        out.append(Sent(
            offset,
            1_700_000_000_000 + offset,
            None if offset % 4 == 0 else b"k%d" % offset,
            None if offset % 9 == 8 else b"value-%d-" % offset + b"." * 60,
            [("h", b"%d" % offset)] if offset % 2 else [],
        ))
    return out


def stored(records: list[Sent], codec: int) -> StoredBatch:
    """A client batch as a producer sends it, kept at the Kiln offset of its first record."""
    builder: Any = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 1 << 30)
    for i, r in enumerate(records):
        builder.append(i, r.timestamp, r.key, r.value, r.headers)
    return StoredBatch(records[0].kiln_offset, len(records), 0,
                       Reliability.RELIABLE_PERSISTENT, bytes(builder.build()))


def three_batches() -> tuple[list[StoredBatch], list[Sent]]:
    records = make_records(0, 120)
    chunks = [(records[:50], CODEC_GZIP), (records[50:51], CODEC_LZ4), (records[51:], CODEC_ZSTD)]
    return [stored(chunk, codec) for chunk, codec in chunks], records


def lineage(kafka_offset: int, headers: list[Header]) -> tuple[int, list[Header]]:
    offset, client_headers = split_lineage(kafka_offset, headers)
    return offset, list(client_headers)


def run(bootstrap: str, body: Callable[[KafkaClient], Awaitable[T]]) -> T:
    async def main() -> T:
        client = KafkaClient(bootstrap, client_id="kiln-test")
        await client.start()
        try:
            return await body(client)
        finally:
            await client.close()

    return asyncio.run(main())


def consume(bootstrap: str, topic: str, count: int, partition: int = 0) -> list[Any]:
    """Every record of the partition, from offset 0, once `count` have arrived (plus a short
    wait for any extra ones)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", request_timeout_ms=10_000)
    received: list[Any] = []
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        deadline = time.monotonic() + 30
        while len(received) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                received.extend(records)
        for records in consumer.poll(timeout_ms=300).values():
            received.extend(records)
    finally:
        consumer.close()
    return received


def assert_exactly(received: list[Any], expected: list[Sent]) -> None:
    assert [r.offset for r in received] == list(range(len(expected)))
    assert [(*lineage(r.offset, list(r.headers)), r.timestamp, r.key, r.value)
            for r in received] == [
        (s.kiln_offset, s.headers, s.timestamp, s.key, s.value) for s in expected
    ]


async def new_topic(client: KafkaClient, topic: str, partitions: int = 1) -> None:
    assert await client.create_topic(topic, partitions)


def test_written_batches_arrive_once_in_order_with_everything_intact(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    # Given a fresh partition and three client batches (gzip, lz4, zstd)
    batches, records = three_batches()

    # When a recovered writer writes them
    async def body(client: KafkaClient) -> tuple[int | None, WriteResult, int]:
        await new_topic(client, unique_topic)
        writer = HardenedPartitionWriter(client, unique_topic, 0)
        resume = await writer.recover()
        result = await writer.write(batches, skip_below=0)
        return resume, result, await client.high_watermark(unique_topic, 0)

    resume, result, high_watermark = run(kafka_bootstrap, body)

    # Then a consumer sees every record once, in order, with its Kiln offset added
    assert resume is None
    assert_exactly(consume(kafka_bootstrap, unique_topic, len(records)), records)
    assert high_watermark == len(records)
    # (the gzip and lz4 batches, 51 records, merged; the 69-record zstd one forwarded whole)
    assert (result.last_kiln_offset, result.records, result.batches) == (119, 120, 2)
    assert (result.first_base_offset, result.last_base_offset) == (0, 51)
    assert result.forwarded_records == 69
    assert result.bytes > 0


@pytest.mark.parametrize(("fence", "copies"), [(Fence.AT_LEADER, 1), (Fence.NONE, 2)])
def test_requests_a_stalled_writer_held_land_nowhere_once_a_successor_fenced(
        kafka_bootstrap: str, kafka_relay: KafkaRelay, unique_topic: str, fence: Fence,
        copies: int) -> None:
    # Given a writer in the middle of a write whose requests are held in hand (its
    # connection to Kafka stalled, as a paused process holds them)
    batches, records = three_batches()

    async def body(client: KafkaClient) -> BaseException | None:
        await new_topic(client, unique_topic)
        stalled = KafkaClient(kafka_relay.bootstrap, client_id="kiln-stalled")
        await stalled.start()
        try:
            first = HardenedPartitionWriter(stalled, unique_topic, 0)
            await first.recover()
            kafka_relay.relay.hold()
            pending = asyncio.create_task(first.write(batches, skip_below=0))
            await asyncio.sleep(0.5)
            # When a successor takes the partition over and reads where hardening stopped,
            # then the held requests land, then the successor writes
            second = HardenedPartitionWriter(client, unique_topic, 0)
            resume = await second.recover(fence)
            kafka_relay.relay.release()
            outcome = (await asyncio.gather(pending, return_exceptions=True))[0]
            await second.write(batches, skip_below=resume or 0)
        finally:
            await stalled.close()
        return outcome if isinstance(outcome, BaseException) else None

    outcome = run(kafka_bootstrap, body)

    # Then, fenced at the leader, the held requests are refused and every record is in
    # Kafka once; without the fence (the epoch bumped at the coordinator only) they land
    # and the successor writes the same records again
    received = consume(kafka_bootstrap, unique_topic, copies * len(records))
    contents = [(r.key, r.value, r.timestamp) for r in received]
    assert contents == [(s.key, s.value, s.timestamp) for s in records] * copies
    assert isinstance(outcome, Fenced) == (copies == 1)


def test_recover_after_a_write_returns_the_next_kiln_offset(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    # Given batches at Kiln offsets 0..119 already hardened
    batches, _ = three_batches()

    # When another writer recovers the partition
    async def body(client: KafkaClient) -> int | None:
        await new_topic(client, unique_topic)
        first = HardenedPartitionWriter(client, unique_topic, 0)
        await first.recover()
        await first.write(batches, skip_below=0)
        return await HardenedPartitionWriter(client, unique_topic, 0).recover()

    # Then it resumes right after the last record
    assert run(kafka_bootstrap, body) == 120


def test_a_second_writer_that_fences_refuses_the_first_at_the_partition_leader(
        kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a writer that has written the first batch
    batches, records = three_batches()

    # When a second writer recovers the same partition with a fence (before it writes
    # anything itself)
    async def body(client: KafkaClient) -> tuple[BaseException | None, int | None]:
        await new_topic(client, unique_topic)
        first = HardenedPartitionWriter(client, unique_topic, 0)
        await first.recover()
        await first.write(batches[:1], skip_below=0)
        second = HardenedPartitionWriter(client, unique_topic, 0)
        resume = await second.recover(Fence.AT_LEADER)
        refused: BaseException | None = None
        try:
            await first.write(batches[1:], skip_below=0)
        except Fenced as exc:
            refused = exc
        await second.write(batches, skip_below=resume or 0)
        return refused, resume

    refused, resume = run(kafka_bootstrap, body)

    # Then the first writer's next write is refused, and the second carries on alone: the
    # fence's abort marker takes Kafka offset 50, so the rest carry their Kiln offsets in
    # headers
    received = consume(kafka_bootstrap, unique_topic, len(records))
    assert isinstance(refused, Fenced)
    assert resume == 50
    assert [r.offset for r in received] == [*range(50), *range(51, 121)]
    assert [(*lineage(r.offset, list(r.headers)), r.timestamp, r.key, r.value)
            for r in received] == [
        (s.kiln_offset, s.headers, s.timestamp, s.key, s.value) for s in records]


def test_skip_below_drops_the_records_below_it(kafka_bootstrap: str, unique_topic: str) -> None:
    # Given three batches at Kiln offsets 0..119
    batches, records = three_batches()

    # When written with skip_below in the middle of the first batch
    async def body(client: KafkaClient) -> WriteResult:
        await new_topic(client, unique_topic)
        writer = HardenedPartitionWriter(client, unique_topic, 0)
        await writer.recover()
        return await writer.write(batches, skip_below=30)

    result = run(kafka_bootstrap, body)

    # Then only records 30..119 are in Kafka
    received = consume(kafka_bootstrap, unique_topic, 90)
    assert [kiln_offset_of(r.headers) for r in received] == list(range(30, 120))
    assert [r.value for r in received] == [s.value for s in records[30:]]
    assert result.records == 90


@pytest.mark.parametrize("written_before_crash", [1, 3])
def test_a_crash_then_recovery_and_rewrite_leaves_no_duplicates(
    kafka_bootstrap: str, unique_topic: str, written_before_crash: int
) -> None:
    # Given a writer that crashed after hardening some batches (its progress never saved)
    batches, records = three_batches()
    more = make_records(120, 30)
    later = stored(more, CODEC_NONE)

    async def crashed(client: KafkaClient) -> None:
        await new_topic(client, unique_topic)
        writer = HardenedPartitionWriter(client, unique_topic, 0)
        await writer.recover()
        await writer.write(batches[:written_before_crash], skip_below=0)

    run(kafka_bootstrap, crashed)

    # When a new process recovers and writes everything again from the recovered offset
    async def restarted(client: KafkaClient) -> tuple[int | None, WriteResult]:
        writer = HardenedPartitionWriter(client, unique_topic, 0)
        resume = await writer.recover()
        result = await writer.write([*batches, later], skip_below=resume or 0)
        return resume, result

    resume, result = run(kafka_bootstrap, restarted)

    # Then every record is in Kafka exactly once
    assert resume == batches[written_before_crash - 1].next_offset
    assert result.records == 150 - resume
    assert_exactly(consume(kafka_bootstrap, unique_topic, 150), records + more)


def test_writes_below_what_recovery_saw_are_skipped_whatever_skip_below_says(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    # Given a partition holding Kiln offsets 0..119, recovered by a new writer
    batches, records = three_batches()

    async def body(client: KafkaClient) -> WriteResult:
        await new_topic(client, unique_topic)
        first = HardenedPartitionWriter(client, unique_topic, 0)
        await first.recover()
        await first.write(batches, skip_below=0)
        second = HardenedPartitionWriter(client, unique_topic, 0)
        await second.recover()
        # When the caller asks to write everything again from 0
        return await second.write(batches, skip_below=0)

    result = run(kafka_bootstrap, body)

    # Then nothing is written twice
    assert (result.records, result.last_kiln_offset) == (0, None)
    assert_exactly(consume(kafka_bootstrap, unique_topic, 120), records)


def produce_plain(bootstrap: str, topic: str, count: int) -> None:
    """`count` records from an ordinary producer, straight into Kafka."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", batch_size=4096,
                             linger_ms=5)
    try:
        for i in range(count):
            producer.send(topic, value=b"plain-%d" % i, partition=0)
        producer.flush(timeout=20)
    finally:
        producer.close(timeout=5)


def test_recovery_resumes_after_the_last_record_whoever_wrote_it(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    # Given Kiln records at Kafka offsets 0..119, followed by 500 records from an ordinary
    # producer (which Kiln must never allow: a hardened topic has one writer)
    batches, _ = three_batches()

    async def hardened(client: KafkaClient) -> None:
        await new_topic(client, unique_topic)
        writer = HardenedPartitionWriter(client, unique_topic, 0)
        await writer.recover()
        await writer.write(batches, skip_below=0)

    run(kafka_bootstrap, hardened)
    produce_plain(kafka_bootstrap, unique_topic, 500)

    # When a writer recovers
    resume = run(kafka_bootstrap, lambda c: HardenedPartitionWriter(c, unique_topic, 0).recover())

    # Then the last record's lineage decides: without a header, its Kafka offset (619)
    assert resume == 620


def test_an_adopted_partition_continues_at_its_kafka_offsets(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    # Given a partition holding 300 records from an ordinary producer (Kiln adopts such a
    # topic with its Kiln offsets starting at 300)
    run(kafka_bootstrap, lambda c: new_topic(c, unique_topic))
    produce_plain(kafka_bootstrap, unique_topic, 300)

    # When a writer recovers, then writes a batch at Kiln offsets 300..309
    async def body(client: KafkaClient) -> tuple[int | None, WriteResult, FetchResult]:
        writer = HardenedPartitionWriter(client, unique_topic, 0)
        resume = await writer.recover()
        result = await writer.write([stored(make_records(300, 10), CODEC_NONE)], skip_below=0)
        return resume, result, await client.fetch(unique_topic, 0, 300, 1 << 20)

    resume, result, fetched = run(kafka_bootstrap, body)

    # Then recovery resumes after the plain records, and the batch lands at Kafka offsets
    # 300..309 without kiln.offset headers: Kafka offset = Kiln offset
    assert resume == 300
    assert (result.first_base_offset, result.records) == (300, 10)
    decoded = decode_records(fetched.records)
    assert [(r.offset, list(r.headers)) for r in decoded] == [
        (s.kiln_offset, s.headers) for s in make_records(300, 10)
    ]
    assert fetched.high_watermark == 310


def test_after_a_gap_records_carry_their_kiln_offsets_and_recovery_reads_them(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    # Given Kiln offsets 0..119 hardened (Kafka offsets 0..119), then 120..199 dropped as
    # delivered, then a batch at Kiln offsets 200..299 to harden
    batches, records = three_batches()
    later = make_records(200, 100)

    async def body(client: KafkaClient) -> tuple[WriteResult, WriteResult, int | None]:
        await new_topic(client, unique_topic)
        writer = HardenedPartitionWriter(client, unique_topic, 0)
        await writer.recover()
        first = await writer.write(batches, skip_below=0)
        second = await writer.write([stored(later, CODEC_LZ4)], skip_below=0)
        return first, second, await HardenedPartitionWriter(client, unique_topic, 0).recover()

    first, second, resume = run(kafka_bootstrap, body)

    # Then the first 120 records need no header, the next 100 land at Kafka offsets 120..219
    # each with its Kiln offset 200..299, and recovery resumes after Kiln offset 299
    received = consume(kafka_bootstrap, unique_topic, 220)
    assert [r.offset for r in received] == list(range(220))
    assert [lineage(r.offset, list(r.headers)) for r in received] == [
        (s.kiln_offset, s.headers) for s in records + later
    ]
    assert all(list(r.headers) == s.headers for r, s in zip(received, records, strict=False))
    assert (first.records, second.records, second.forwarded_records) == (120, 100, 0)
    assert resume == 300


def test_a_foreign_write_under_a_forwarded_batch_is_reported(
    kafka_bootstrap: str, unique_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a recovered writer of an empty partition, and then 5 records produced straight
    # into Kafka behind its back
    async def body(client: KafkaClient) -> WriteResult:
        await new_topic(client, unique_topic)
        writer = HardenedPartitionWriter(client, unique_topic, 0)
        await writer.recover()
        await asyncio.to_thread(produce_plain, kafka_bootstrap, unique_topic, 5)
        # When it forwards a batch it believes lands at Kafka offset 0
        return await writer.write([stored(make_records(0, 100), CODEC_NONE)], skip_below=0)

    with caplog.at_level(logging.ERROR, logger="storage.hardened_store"):
        result = run(kafka_bootstrap, body)

    # Then the batch landed at offset 5, and the writer says its lineage is off
    assert (result.first_base_offset, result.forwarded_records) == (5, 100)
    assert any("landed away from their Kiln offsets" in m for m in caplog.messages)


def test_write_before_recover_is_refused(kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a writer that never recovered
    async def body(client: KafkaClient) -> None:
        writer = HardenedPartitionWriter(client, unique_topic, 0)
        # When it is asked to write, Then it refuses before touching Kafka
        with pytest.raises(RuntimeError, match="recover"):
            await writer.write([stored(make_records(0, 1), CODEC_NONE)], skip_below=0)

    run(kafka_bootstrap, body)


def test_a_large_write_is_pipelined_over_many_requests_and_arrives_once(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    # Given 20 000 records in client batches of 1000, every codec kafka-python reads here
    codecs = [CODEC_NONE, CODEC_GZIP, CODEC_LZ4, CODEC_ZSTD]
    records = make_records(0, 20_000)
    batches = [stored(records[i:i + 1000], codecs[(i // 1000) % len(codecs)])
               for i in range(0, 20_000, 1000)]

    # When written in small batches, so many requests are in flight at once
    async def body(client: KafkaClient) -> tuple[WriteResult, int | None]:
        await new_topic(client, unique_topic)
        writer = HardenedPartitionWriter(client, unique_topic, 0, max_batch_bytes=32_768,
                                         max_in_flight=5)
        await writer.recover()
        result = await writer.write(batches, skip_below=0)
        return result, await HardenedPartitionWriter(client, unique_topic, 0).recover()

    result, resume = run(kafka_bootstrap, body)

    # Then all of them arrive once, in order
    # (uncompressed batches above the 32 KiB limit split, compressed ones forwarded whole)
    assert (result.batches, result.forwarded_records) == (30, 15_000)
    assert (result.records, result.first_base_offset, resume) == (20_000, 0, 20_000)
    assert_exactly(consume(kafka_bootstrap, unique_topic, 20_000), records)


def test_snappy_batches_are_hardened_snappy_and_read_back(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    # Given a snappy client batch (kafka-python cannot read snappy without python-snappy, so
    # the read-back goes through Kiln's own fetch and aiokafka's decoder)
    records = make_records(0, 200)

    # When it is hardened and fetched back
    async def body(client: KafkaClient) -> tuple[FetchResult, int]:
        await new_topic(client, unique_topic)
        writer = HardenedPartitionWriter(client, unique_topic, 0)
        await writer.recover()
        await writer.write([stored(records, CODEC_SNAPPY)], skip_below=0)
        return await client.fetch(unique_topic, 0, 0, 1 << 20), writer.next_kiln_offset

    fetched, next_offset = run(kafka_bootstrap, body)

    # Then the batch is still snappy and every record is intact, at its Kiln offset
    assert read_header(fetched.records).compression == CODEC_SNAPPY
    decoded = decode_records(fetched.records)
    assert [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in decoded] == [
        (s.kiln_offset, s.timestamp, s.key, s.value, s.headers) for s in records
    ]
    assert (fetched.high_watermark, next_offset) == (200, 200)


def test_topics_are_created_once_and_listed(kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a new topic name
    # When it is created twice and the topics are listed
    async def body(client: KafkaClient) -> tuple[bool, bool, dict[str, int], Any]:
        created = await client.create_topic(unique_topic, 3)
        again = await client.create_topic(unique_topic, 3)
        return created, again, await client.list_topics(), await client.metadata([unique_topic])

    created, again, topics, meta = run(kafka_bootstrap, body)

    # Then the second creation reports it existed, and metadata shows 3 led partitions
    assert (created, again) == (True, False)
    assert topics[unique_topic] == 3
    info = meta.topics[unique_topic]
    assert info.error_code == 0 and info.partition_count == 3
    assert all(p.leader_id in meta.brokers for p in info.partitions)


def test_a_resent_batch_is_a_duplicate_and_not_stored_twice(
    kafka_bootstrap: str, unique_topic: str
) -> None:
    # Given a hardened batch produced once under a producer id
    async def body(client: KafkaClient) -> tuple[ProduceResult, ProduceResult, int]:
        await new_topic(client, unique_topic)
        pid, epoch = await client.init_producer_id(f"test.{unique_topic}", 60_000)
        [batch] = iter_hardened_batches(
            [(0, stored(make_records(0, 10), CODEC_NONE).data)], 0,
            producer_id=pid, producer_epoch=epoch, base_sequence=0, max_batch_bytes=1 << 20,
        )
        first = await client.produce(unique_topic, 0, batch.data)
        # When the same batch is sent again
        again = await client.produce(unique_topic, 0, batch.data)
        return first, again, await client.high_watermark(unique_topic, 0)

    first, again, high_watermark = run(kafka_bootstrap, body)

    # Then the resend is answered as already there (tansu: 46; Kafka: success with the
    # original offset), and the partition holds the records once
    assert first == (0, 0)
    assert again.error_code in (0, 46) and again.base_offset in (-1, 0)
    assert high_watermark == 10


def test_batches_produced_together_land_in_each_partition_in_one_call(
        kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic of three partitions and one client batch for each
    batches = [stored(make_records(10 * p, 10), CODEC_NONE) for p in range(3)]

    async def body(client: KafkaClient) -> list[ProduceResult]:
        await new_topic(client, unique_topic, 3)
        # When they are produced together
        return await client.produce_together(
            [(unique_topic, p, batch.data) for p, batch in enumerate(batches)])

    results = run(kafka_bootstrap, body)
    # Then each partition answers, in the order given, and holds its batch's records
    assert results == [ProduceResult(0, 0)] * 3
    for p in range(3):
        assert [r.value for r in consume(kafka_bootstrap, unique_topic, 10, partition=p)] == [
            s.value for s in make_records(10 * p, 10)]


def test_a_partition_refusing_a_batch_produced_together_fails_the_call_and_not_the_others(
        kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic of two partitions, a good batch for the first and, for the second, one
    # whose CRC does not match its records
    good = stored(make_records(0, 5), CODEC_NONE)
    bad = bytearray(stored(make_records(5, 5), CODEC_NONE).data)
    bad[-1] ^= 0xFF

    async def body(client: KafkaClient) -> BaseException | None:
        await new_topic(client, unique_topic, 2)
        # When both are produced together
        try:
            await client.produce_together([(unique_topic, 0, good.data),
                                           (unique_topic, 1, bytes(bad))])
        except HardenedStoreRejected as exc:
            return exc
        return None

    refused = run(kafka_bootstrap, body)
    # Then the call fails with the second partition's error, and the first holds its batch
    assert isinstance(refused, HardenedStoreRejected)
    assert refused.error_code == ErrorCode.CORRUPT_MESSAGE
    assert len(consume(kafka_bootstrap, unique_topic, 5, partition=0)) == 5
