"""Hardened Kafka batches read back in Kiln offsets: rebuilt as read-through serves them,
and searched as read-through and recovery search them."""

from __future__ import annotations

import pytest
from kafka.record.memory_records import MemoryRecords

from storage.hardened_batches import (
    LocatedRecord,
    batch_spans,
    first_record_at_or_after,
    last_kiln_offset,
    to_kiln_offsets,
)
from tests.unit.test_hardened_batches import build
from tests.unit.test_records import CODECS, Record, client_batch, crc_ok, sample_records
from wire.batch import (
    ATTRIBUTES,
    ATTRIBUTES_AT,
    CODEC_NONE,
    CONTROL_BIT,
    TIMESTAMP_TYPE_BIT,
    read_header,
    set_crc,
    with_base_offset,
)
from wire.lineage import kiln_offset_header
from wire.records import decode_records


def hardened(kafka_base: int, sources: list[tuple[int, list[Record]]], codec: int = CODEC_NONE
             ) -> bytes:
    """One batch as Kafka returns it after Kiln hardened `sources` (Kiln offset of the first
    record, records) into it: merged, with kiln.offset headers, at Kafka offset kafka_base."""
    [batch] = build([(kiln, client_batch(records, codec)) for kiln, records in sources])
    return with_base_offset(batch.data, kafka_base)


def with_attribute(batch: bytes, bit: int) -> bytes:
    data = bytearray(batch)
    ATTRIBUTES.pack_into(data, ATTRIBUTES_AT, ATTRIBUTES.unpack_from(data, ATTRIBUTES_AT)[0] | bit)
    set_crc(data)
    return bytes(data)


def plain_batch(kafka_base: int, records: list[Record]) -> bytes:
    """A batch some other producer wrote before Kiln adopted the topic: no kiln.offset."""
    return with_base_offset(client_batch(records), kafka_base)


@pytest.mark.parametrize("codec", CODECS)
def test_records_come_back_in_kiln_offsets_as_they_were_produced(codec: int) -> None:
    # Given 50 records hardened (compressed with `codec`) at Kiln offsets 1000.. and stored
    # by Kafka at offsets 500..
    records = sample_records(50)
    fetched = hardened(500, [(1000, records)], codec)

    # When they are rebuilt from Kiln offset 1000
    out = to_kiln_offsets(fetched, 1000, 1 << 20)

    # Then every record is there with its Kiln offset, without Kiln's header, as produced
    decoded = decode_records(out.data)
    assert [r.offset for r in decoded] == list(range(1000, 1050))
    assert [(r.timestamp, r.key, r.value, list(r.headers)) for r in decoded] == records
    header = read_header(out.data)
    assert (header.base_offset, header.last_offset_delta, header.record_count) == (1000, 49, 50)
    assert header.compression == CODEC_NONE
    assert header.attributes & TIMESTAMP_TYPE_BIT == 0
    assert (header.base_timestamp, header.max_timestamp) == (records[0][0], records[-1][0])
    assert header.size == len(out.data) and crc_ok(out.data)
    assert (out.record_count, out.full) == (50, False)
    assert out.last == LocatedRecord(549, 1049, records[-1][0])
    assert out.end_kafka_offset == 550


def test_gaps_in_kiln_offsets_become_gaps_in_offset_deltas() -> None:
    # Given one Kafka batch holding Kiln offsets 0..9 and 20..29 (10..19 were dropped)
    first, second = sample_records(10), sample_records(10, start_ts=2_000)
    fetched = hardened(0, [(0, first), (20, second)])

    # When rebuilt from 0
    out = to_kiln_offsets(fetched, 0, 1 << 20)

    # Then the batch keeps its base, skips the gap, and ends at the last Kiln offset
    header = read_header(out.data)
    assert (header.base_offset, header.record_count, header.last_offset_delta) == (0, 20, 29)
    assert [r.offset for r in decode_records(out.data)] == [*range(10), *range(20, 30)]
    assert [r.value for r in decode_records(out.data)] == [v for _, _, v, _ in first + second]


def test_kafka_python_reads_a_batch_with_gaps_and_continues_after_its_last_offset() -> None:
    # Given a rebuilt batch with a gap, followed by one starting further on
    fetched = hardened(0, [(0, sample_records(3)), (7, sample_records(2))]) + hardened(
        5, [(40, sample_records(2))])
    out = to_kiln_offsets(fetched, 0, 1 << 20)

    # When kafka-python's own record reader decodes it
    records = MemoryRecords(out.data)
    offsets = []
    next_offsets = []
    while records.has_next():
        batch = records.next_batch()
        offsets += [r.offset for r in batch]
        next_offsets.append(batch.next_offset)

    # Then it sees every Kiln offset and the next fetch offset after each batch
    assert offsets == [0, 1, 2, 7, 8, 40, 41]
    assert next_offsets == [9, 42]


def test_reading_from_inside_a_batch_or_a_gap_starts_at_the_next_record() -> None:
    # Given Kiln offsets 0..9 and 20..29 in one Kafka batch
    fetched = hardened(0, [(0, sample_records(10)), (20, sample_records(10))])

    # When rebuilt from 5, and from 12 (inside the gap)
    from_five = to_kiln_offsets(fetched, 5, 1 << 20)
    from_gap = to_kiln_offsets(fetched, 12, 1 << 20)

    # Then the earlier records are left out and each batch starts at its first record
    assert [r.offset for r in decode_records(from_five.data)] == [*range(5, 10), *range(20, 30)]
    assert read_header(from_five.data).base_offset == 5
    assert [r.offset for r in decode_records(from_gap.data)] == list(range(20, 30))
    assert read_header(from_gap.data).base_offset == 20
    assert read_header(from_gap.data).last_offset_delta == 9


def test_records_without_a_kiln_offset_are_read_at_their_kafka_offset() -> None:
    # Given records another producer wrote at Kafka offsets 0..4, then Kiln's from Kiln 10
    plain = sample_records(5)
    fetched = plain_batch(0, plain) + hardened(5, [(10, sample_records(3))])

    # When rebuilt from 0
    out = to_kiln_offsets(fetched, 0, 1 << 20)

    # Then the plain records keep their offsets and headers, Kiln's follow at theirs
    decoded = decode_records(out.data)
    assert [r.offset for r in decoded] == [0, 1, 2, 3, 4, 10, 11, 12]
    assert [list(r.headers) for r in decoded[:5]] == [h for _, _, _, h in plain]


def test_a_kiln_offset_header_sent_by_a_client_is_kept() -> None:
    # Given a record whose producer sent its own kiln.offset header, hardened at Kiln 3
    records: list[Record] = [(1, None, b"v", [kiln_offset_header(999_999), ("other", b"x")])]
    fetched = hardened(0, [(3, records)])

    # When rebuilt
    [record] = decode_records(to_kiln_offsets(fetched, 0, 1 << 20).data)

    # Then only Kiln's own header is gone
    assert record.offset == 3
    assert list(record.headers) == [kiln_offset_header(999_999), ("other", b"x")]


def test_the_byte_limit_cuts_between_records_and_says_so() -> None:
    # Given 2000 records of ~100 bytes in two Kafka batches
    records = sample_records(2000)
    fetched = hardened(0, [(0, records[:1000])]) + hardened(1000, [(1000, records[1000:])])

    # When rebuilt within 16 KB
    out = to_kiln_offsets(fetched, 0, 16_384)

    # Then what fits comes back, whole records only, and the cut is reported
    decoded = decode_records(out.data)
    assert 100 < len(decoded) < 200
    assert len(out.data) <= 16_384
    assert [r.offset for r in decoded] == list(range(len(decoded)))
    assert out.full and out.last is not None
    assert out.last.kiln_offset == len(decoded) - 1


def test_at_least_one_record_whatever_the_limit_unless_told_otherwise() -> None:
    # Given one record larger than the limit
    records: list[Record] = [(1, None, b"B" * 5_000, [])]
    fetched = hardened(0, [(0, records)])

    # When rebuilt with a 100-byte limit, with and without the at-least-one rule
    first = to_kiln_offsets(fetched, 0, 100)
    later = to_kiln_offsets(fetched, 0, 100, at_least_one=False)

    # Then the first partition of a response gets it; a later one gets nothing, marked full
    assert [r.value for r in decode_records(first.data)] == [b"B" * 5_000]
    assert (later.data, later.record_count, later.full) == (b"", 0, True)


def test_a_sequence_that_goes_backwards_never_serves_a_record_twice() -> None:
    # Given Kiln offsets 0..9, then a batch that repeats 5..14 (not monotonic)
    fetched = hardened(0, [(0, sample_records(10))]) + hardened(10, [(5, sample_records(10))])

    # When rebuilt
    out = to_kiln_offsets(fetched, 0, 1 << 20)

    # Then each Kiln offset comes once, in order
    assert [r.offset for r in decode_records(out.data)] == list(range(15))


def test_log_append_time_is_kept() -> None:
    # Given a Kafka batch stamped with LogAppendTime (the broker's time for every record)
    fetched = with_attribute(hardened(0, [(0, sample_records(5))]), TIMESTAMP_TYPE_BIT)
    broker_time = read_header(fetched).max_timestamp

    # When rebuilt
    out = to_kiln_offsets(fetched, 0, 1 << 20)

    # Then the batch says LogAppendTime, and records read with the broker's time
    assert read_header(out.data).attributes & TIMESTAMP_TYPE_BIT
    assert crc_ok(out.data)
    assert [r.timestamp for r in decode_records(out.data)] == [broker_time] * 5


def test_control_batches_and_a_truncated_tail_are_skipped() -> None:
    # Given a control batch, a data batch, and a data batch cut short by the fetch size
    control = with_attribute(plain_batch(0, [(1, None, b"\x00\x00\x00\x00", [])]), CONTROL_BIT)
    data = hardened(1, [(100, sample_records(3))])
    tail = hardened(4, [(103, sample_records(3))])
    fetched = control + data + tail[:-5]

    # When rebuilt
    out = to_kiln_offsets(fetched, 0, 1 << 20)

    # Then only the whole data batch comes back, and reading goes on after it
    assert [r.offset for r in decode_records(out.data)] == [100, 101, 102]
    assert out.end_kafka_offset == 4


def test_batch_spans_and_first_record_find_records_in_both_offset_spaces() -> None:
    # Given two Kafka batches: Kiln 0..9 at Kafka 0..9, Kiln 30..34 at Kafka 10..14
    records = sample_records(10)
    fetched = hardened(0, [(0, records)]) + hardened(10, [(30, sample_records(5, 9_000))])

    # When their spans and particular records are looked up
    spans = batch_spans(fetched)
    at_twelve = first_record_at_or_after(fetched, 12)
    by_time = first_record_at_or_after(fetched, 0, min_timestamp=records[4][0])

    # Then each batch's ends, and each record, are placed in both offset spaces
    assert [(s.first.kafka_offset, s.first.kiln_offset, s.last.kafka_offset,
             s.last.kiln_offset) for s in spans] == [(0, 0, 9, 9), (10, 30, 14, 34)]
    assert spans[1].max_timestamp == 9_000 + 4 * 5
    assert at_twelve == LocatedRecord(12, 32, 9_000 + 10)
    assert by_time == LocatedRecord(4, 4, records[4][0])
    assert first_record_at_or_after(fetched, 15) is None


def test_an_empty_record_set_gives_nothing() -> None:
    out = to_kiln_offsets(b"", 0, 1 << 20)

    assert (out.data, out.record_count, out.last, out.end_kafka_offset, out.full) == (
        b"", 0, None, None, False)


def test_last_kiln_offset_reads_a_fetched_record_set() -> None:
    # Given two hardened batches as a broker returns them: concatenated, with absolute base
    # offsets, and the second one cut short by the fetch size
    a, b = build([(0, client_batch(sample_records(300)))], max_batch_bytes=16_384)[:2]
    fetched = with_base_offset(a.data, 40) + with_base_offset(b.data, 40 + a.record_count)

    # When the last Kiln offset is read
    whole = last_kiln_offset(fetched)
    truncated = last_kiln_offset(fetched[:-10])

    # Then it is the last record's, ignoring the incomplete batch
    assert whole == b.last_kiln_offset
    assert truncated == a.last_kiln_offset
    assert decode_records(fetched)[0].offset == 40


def test_a_record_without_a_kiln_header_has_its_kafka_offset_as_kiln_offset() -> None:
    # Given a batch of 10 records without kiln.offset headers, fetched at Kafka offset 70
    plain = with_base_offset(client_batch(sample_records(10)), 70)

    # When the last Kiln offset is read, Then it is the last record's Kafka offset
    assert last_kiln_offset(plain) == 79
    assert last_kiln_offset(b"") is None
