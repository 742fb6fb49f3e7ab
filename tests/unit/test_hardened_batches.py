"""Hardening stored client batches: forwarded whole while Kafka offsets are Kiln offsets,
otherwise re-encoded with Kiln's `kiln.offset` header; merged, split and sequenced."""

from __future__ import annotations

import os

import pytest

from storage.hardened_batches import (
    HardenedBatch,
    SourceBatch,
    iter_hardened_batches,
    last_kiln_offset,
)
from tests.unit.test_records import CODECS, Record, client_batch, crc_ok, sample_records
from wire.batch import (
    ATTRIBUTES_AT,
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_NONE,
    CODEC_SNAPPY,
    CODEC_ZSTD,
    HEADER_SIZE,
    PRODUCER,
    PRODUCER_AT,
    read_header,
    set_crc,
    with_base_offset,
)
from wire.errors import KafkaError
from wire.lineage import kiln_offset_header, kiln_offset_of
from wire.records import DecodedRecord, decode_records

PRODUCER_FIELDS = {"producer_id": 7001, "producer_epoch": 3}


def build(sources: list[tuple[int, bytes]], skip_below: int = 0, *, base_sequence: int = 0,
          max_batch_bytes: int = 1_000_000) -> list[HardenedBatch]:
    return list(iter_hardened_batches(sources, skip_below, base_sequence=base_sequence,
                                      max_batch_bytes=max_batch_bytes, **PRODUCER_FIELDS))


def all_records(batches: list[HardenedBatch]) -> list[DecodedRecord]:
    return [r for b in batches for r in decode_records(b.data)]


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_keeps_every_record_and_adds_its_kiln_offset(codec: int) -> None:
    # Given a client batch of 50 records compressed with `codec`, stored at Kiln offset 1000
    records = sample_records(50)
    source = client_batch(records, codec)

    # When it is re-encoded for hardening
    [out] = build([(1000, source)])

    # Then every record comes back intact, in order, with its Kiln offset as the last header
    decoded = decode_records(out.data)
    assert [(r.timestamp, r.key, r.value, list(r.headers)) for r in decoded] == [
        (ts, key, value, [*headers, kiln_offset_header(1000 + i)])
        for i, (ts, key, value, headers) in enumerate(records)
    ]
    assert [r.offset for r in decoded] == list(range(50))
    header = read_header(out.data)
    assert header.compression == codec
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7001, 3, 0)
    assert (header.record_count, header.last_offset_delta) == (50, 49)
    assert header.attributes & 0x08 == 0  # CreateTime
    assert (header.base_timestamp, header.max_timestamp) == (records[0][0], records[-1][0])
    assert header.size == len(out.data)
    assert crc_ok(out.data)
    assert (out.first_kiln_offset, out.last_kiln_offset, out.record_count) == (1000, 1049, 50)


def test_skip_below_inside_a_batch_drops_only_the_earlier_records() -> None:
    # Given two client batches at Kiln offsets 0..9 and 10..19
    first, second = sample_records(10), sample_records(10, start_ts=2_000)
    sources = [(0, client_batch(first, CODEC_LZ4)), (10, client_batch(second, CODEC_LZ4))]

    # When hardening resumes at Kiln offset 4
    [out] = build(sources, skip_below=4)

    # Then records 4..19 are written, 4 first
    decoded = decode_records(out.data)
    assert [kiln_offset_of(r.headers) for r in decoded] == list(range(4, 20))
    assert [r.value for r in decoded] == [v for _, _, v, _ in first[4:] + second]
    assert (out.first_kiln_offset, out.last_kiln_offset, out.record_count) == (4, 19, 16)


def test_skip_below_past_everything_builds_nothing() -> None:
    # Given a batch at Kiln offsets 0..9
    sources = [(0, client_batch(sample_records(10)))]

    # When everything is already hardened
    out = build(sources, skip_below=10)

    # Then there is nothing to write
    assert out == []


def test_small_client_batches_are_merged_with_the_first_batch_codec() -> None:
    # Given five 3-record client batches with different codecs
    codecs = [CODEC_ZSTD, CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4]
    batches = [sample_records(3, start_ts=1_000 * i) for i in range(5)]
    sources = [(100 + 3 * i, client_batch(b, c)) for i, (b, c) in enumerate(zip(batches, codecs,
                                                                                  strict=True))]

    # When they are re-encoded together
    out = build(sources)

    # Then they become one batch, compressed like the first one
    assert len(out) == 1
    assert read_header(out[0].data).compression == CODEC_ZSTD
    assert [kiln_offset_of(r.headers) for r in decode_records(out[0].data)] == list(range(100, 115))
    assert [r.timestamp for r in decode_records(out[0].data)] == [
        ts for b in batches for ts, _, _, _ in b
    ]


def test_a_merged_batch_is_compressed_like_its_first_compressed_source() -> None:
    # Given two uncompressed client batches (as a client sends one that compression would
    # not shrink) followed by a gzip one and a zstd one
    codecs = [CODEC_NONE, CODEC_NONE, CODEC_GZIP, CODEC_ZSTD]
    batches = [sample_records(3, start_ts=1_000 * i) for i in range(4)]
    sources = [(3 * i, client_batch(b, c)) for i, (b, c) in enumerate(zip(batches, codecs,
                                                                           strict=True))]

    # When they are re-encoded together
    out = build(sources)

    # Then the one batch is gzip-compressed, and every record is in it in order
    assert len(out) == 1
    assert read_header(out[0].data).compression == CODEC_GZIP
    assert [kiln_offset_of(r.headers) for r in decode_records(out[0].data)] == list(range(12))


@pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_ZSTD])
def test_batches_are_split_to_fit_the_size_limit_with_consecutive_sequences(codec: int) -> None:
    # Given 2000 records of ~100 bytes in two client batches
    records = sample_records(2000)
    sources = [(0, client_batch(records[:1000], codec)),
               (1000, client_batch(records[1000:], codec))]

    # When re-encoded with a 16 KB batch limit, starting at sequence 500
    out = build(sources, base_sequence=500, max_batch_bytes=16_384)

    # Then every batch fits, sequences follow on, and no record is lost or repeated
    assert len(out) > 10
    assert all(len(b.data) <= 16_384 and crc_ok(b.data) for b in out)
    sequences = [read_header(b.data).base_sequence for b in out]
    expected = [500]
    for b in out[:-1]:
        expected.append(expected[-1] + b.record_count)
    assert sequences == expected
    assert [kiln_offset_of(r.headers) for r in all_records(out)] == list(range(2000))
    assert [(b.first_kiln_offset, b.last_kiln_offset) for b in out] == [
        (b.first_kiln_offset, b.first_kiln_offset + b.record_count - 1) for b in out
    ]
    assert all(read_header(b.data).compression == codec for b in out)


def test_sequences_wrap_at_2_pow_31() -> None:
    # Given records that need several batches
    sources = [(0, client_batch(sample_records(300)))]

    # When the sequence starts just below the wrap
    out = build(sources, base_sequence=2**31 - 100, max_batch_bytes=8_192)

    # Then it wraps to 0 like Kafka's producer does
    sequences = [read_header(b.data).base_sequence for b in out]
    assert sequences[0] == 2**31 - 100
    assert all(0 <= s < 2**31 for s in sequences)
    running = 2**31 - 100
    for b, s in zip(out, sequences, strict=True):
        assert s == running
        running = (running + b.record_count) % 2**31


def test_a_record_larger_than_the_limit_gets_its_own_batch() -> None:
    # Given a big record between two small ones
    records: list[Record] = [(1, b"a", b"small", []), (2, b"b", b"B" * 5_000, []),
                             (3, b"c", b"small", [])]

    # When the limit is below the big record's size
    out = build([(0, client_batch(records))], max_batch_bytes=1_000)

    # Then each record gets a batch, and none is lost
    assert [b.record_count for b in out] == [1, 1, 1]
    assert [r.value for r in all_records(out)] == [b"small", b"B" * 5_000, b"small"]


def test_incompressible_data_is_sent_uncompressed_but_valid() -> None:
    # Given a gzip client batch holding one record of random bytes
    records: list[Record] = [(1, None, os.urandom(5_000), [])]

    # When re-encoded
    [out] = build([(0, client_batch(records, CODEC_GZIP))])

    # Then compression that does not pay is dropped, and the batch still reads back
    assert read_header(out.data).compression == CODEC_NONE
    assert crc_ok(out.data)
    assert [r.value for r in decode_records(out.data)] == [v for _, _, v, _ in records]


def test_kiln_offsets_follow_offset_deltas_whatever_base_offset_the_client_sent() -> None:
    # Given a client batch whose base offset field is not 0
    source = with_base_offset(client_batch(sample_records(5)), 12345)

    # When re-encoded at Kiln offset 50
    [out] = build([(50, source)])

    # Then Kiln offsets count from the batch's first record
    assert [kiln_offset_of(r.headers) for r in decode_records(out.data)] == [50, 51, 52, 53, 54]


def test_a_client_kiln_offset_header_is_kept_but_kiln_s_own_wins() -> None:
    # Given a record that already carries a kiln.offset header (copied from another topic)
    records: list[Record] = [(1, None, b"v", [kiln_offset_header(999_999)])]

    # When re-encoded at Kiln offset 3
    [out] = build([(3, client_batch(records))])

    # Then both headers are there and the last one is read
    [record] = decode_records(out.data)
    assert list(record.headers) == [kiln_offset_header(999_999), kiln_offset_header(3)]
    assert last_kiln_offset(out.data) == 3


def test_a_corrupt_source_batch_is_refused() -> None:
    # Given a client batch with one byte flipped inside its records
    data = bytearray(client_batch(sample_records(5)))
    data[HEADER_SIZE + 10] ^= 0xFF

    # When it is re-encoded, Then the CRC check refuses it
    with pytest.raises(KafkaError, match="CRC"):
        build([(0, bytes(data))])


# --- Forwarding while Kafka offsets are Kiln offsets ---------------------------------------


def big_batch(n: int, codec: int = CODEC_NONE, start_ts: int = 1_700_000_000_000) -> bytes:
    """A client batch large enough to be forwarded whole (n >= 64 records)."""
    return client_batch(sample_records(n, start_ts), codec)


def plan(sources: list[SourceBatch], *, kafka_end: int | None, skip_below: int = 0,
         base_sequence: int = 0, max_batch_bytes: int = 1_000_000) -> list[HardenedBatch]:
    return list(iter_hardened_batches(sources, skip_below, base_sequence=base_sequence,
                                      max_batch_bytes=max_batch_bytes, kafka_end=kafka_end,
                                      **PRODUCER_FIELDS))


@pytest.mark.parametrize("codec", CODECS)
def test_an_aligned_batch_is_forwarded_byte_for_byte_but_its_header(codec: int) -> None:
    # Given an idempotent client's batch at Kiln offset 500, and Kafka's partition ending at 500
    source = bytearray(big_batch(300, codec))
    PRODUCER.pack_into(source, PRODUCER_AT, 42, 1, 77)  # the client's producer fields
    set_crc(source)
    source_bytes = bytes(source)

    # When it is planned for hardening
    [out] = plan([(500, source_bytes)], kafka_end=500, base_sequence=9)

    # Then it goes as the client encoded it: only the producer fields and CRC change
    assert (out.forwarded, out.kiln_headers) == (True, False)
    assert (out.first_kiln_offset, out.last_kiln_offset, out.record_count) == (500, 799, 300)
    header = read_header(out.data)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7001, 3, 9)
    assert (header.base_offset, header.partition_leader_epoch) == (0, -1)
    assert crc_ok(out.data)
    assert out.data[HEADER_SIZE:] == source_bytes[HEADER_SIZE:]
    # attributes, timestamps, counts
    assert out.data[ATTRIBUTES_AT:PRODUCER_AT] == source_bytes[ATTRIBUTES_AT:PRODUCER_AT]
    assert header.compression == codec
    assert [(r.key, r.value, list(r.headers)) for r in decode_records(out.data)] == [
        (key, value, headers) for _, key, value, headers in sample_records(300)
    ]


def test_small_aligned_batches_are_merged_without_headers() -> None:
    # Given three small client batches at Kiln offsets 10..14, 15..19, 20..24; Kafka ends at 10
    sources = [(10 + 5 * i, client_batch(sample_records(5))) for i in range(3)]

    # When planned
    [out] = plan(sources, kafka_end=10)

    # Then one merged batch carries them, with no kiln.offset headers: Kafka offset 10 + i is
    # Kiln offset 10 + i
    assert (out.forwarded, out.kiln_headers) == (False, False)
    assert (out.first_kiln_offset, out.record_count) == (10, 15)
    records = decode_records(out.data)
    assert all(kiln_offset_of(r.headers) is None for r in records)
    assert [r.offset for r in records] == list(range(15))


def test_a_gap_ends_alignment_for_the_rest_of_the_write() -> None:
    # Given batches at Kiln offsets 0..299, then (300..599 dropped as delivered) 600..899 and
    # 900..1199, with Kafka ending at 0
    sources = [(0, big_batch(300)), (600, big_batch(300)), (900, big_batch(300))]

    # When planned
    out = plan(sources, kafka_end=0, base_sequence=5)

    # Then the first is forwarded, and every record after the gap carries its Kiln offset
    assert out[0].forwarded and not out[0].kiln_headers
    assert all(b.kiln_headers and not b.forwarded for b in out[1:])
    assert [kiln_offset_of(r.headers) for r in all_records(out[1:])] == list(range(600, 1200))
    sequences = [read_header(b.data).base_sequence for b in out]
    assert sequences[0] == 5 and sequences[1] == 305
    assert sum(b.record_count for b in out) == 900


def test_kafka_behind_or_ahead_of_kiln_offsets_means_headers_from_the_start() -> None:
    # Given a batch at Kiln offset 100 and a Kafka partition ending at 40 (records were dropped
    # before), or with no Kafka position known
    sources = [(100, big_batch(300))]

    for kafka_end in (40, None):
        # When planned, Then every record gets its kiln.offset header
        out = plan(sources, kafka_end=kafka_end)
        assert all(b.kiln_headers and not b.forwarded for b in out)
        assert [kiln_offset_of(r.headers) for r in all_records(out)] == list(range(100, 400))


def test_resuming_inside_a_batch_stays_aligned_without_headers() -> None:
    # Given a batch at Kiln offsets 0..299 of which Kafka already holds 0..119 (a crash cut a
    # write short), then a whole batch at 300..599
    sources = [(0, big_batch(300)), (300, big_batch(300))]

    # When planned from Kiln offset 120, Kafka ending at 120
    out = plan(sources, kafka_end=120, skip_below=120)

    # Then the rest of the first is re-encoded without headers, the second forwarded
    assert [(b.forwarded, b.kiln_headers, b.first_kiln_offset, b.record_count)
            for b in out] == [(False, False, 120, 180), (True, False, 300, 300)]
    values = [r.value for r in all_records(out)]
    assert values == [v for _, _, v, _ in sample_records(300)[120:] + sample_records(300)]


def test_an_aligned_batch_over_the_size_limit_is_split_without_headers() -> None:
    # Given one aligned client batch larger than the hardened store's batch limit
    source = big_batch(400)

    # When planned with a 16 KiB limit
    out = plan([(0, source)], kafka_end=0, max_batch_bytes=16_384)

    # Then it is re-encoded into several batches, still without headers, nothing lost
    assert len(out) > 1 and not any(b.forwarded or b.kiln_headers for b in out)
    assert [r.value for r in all_records(out)] == [v for _, _, v, _ in sample_records(400)]


def test_forwarding_refuses_a_corrupt_batch() -> None:
    # Given an aligned client batch with a flipped byte in its records
    data = bytearray(big_batch(300))
    data[HEADER_SIZE + 10] ^= 0xFF

    # When planned, Then the CRC check refuses it rather than forward it with a fresh CRC
    with pytest.raises(KafkaError, match="CRC"):
        plan([(0, bytes(data))], kafka_end=0)


def client_headed_batch(n: int, client_offset: int = 999_999) -> bytes:
    """A batch large enough to be forwarded whose records carry the client's own
    `kiln.offset` header (a job mirroring a hardened topic back through Kiln)."""
    records = [(ts, key, value, [*headers, kiln_offset_header(client_offset)])
               for ts, key, value, headers in sample_records(n)]
    return client_batch(records)


@pytest.mark.parametrize("position", ["alone", "between forwarded batches"])
def test_a_batch_flagged_with_a_client_kiln_header_is_re_encoded_even_while_aligned(
        position: str) -> None:
    # Given a flagged batch of 300 records (their own kiln.offset = 999999) at Kiln offset
    # 300, alone or between two forwardable batches, Kafka ending where the first begins
    flagged: SourceBatch = (300, client_headed_batch(300), True)
    sources: list[SourceBatch] = (
        [flagged] if position == "alone"
        else [(0, big_batch(300)), flagged, (600, big_batch(300))])
    kafka_end = 300 if position == "alone" else 0

    # When planned
    out = plan(sources, kafka_end=kafka_end)

    # Then the flagged records are re-encoded, Kiln's header last, the client's kept before
    # it; the lineage rule reads their true Kiln offsets; the batches around are forwarded
    headed = [b for b in out if b.kiln_headers]
    assert all(not b.forwarded for b in headed)
    records = all_records(headed)
    assert [kiln_offset_of(r.headers) for r in records] == list(range(300, 600))
    assert all(r.headers[-2] == kiln_offset_header(999_999) for r in records)
    assert (headed[0].first_kiln_offset, headed[-1].last_kiln_offset) == (300, 599)
    if position != "alone":
        assert [(b.forwarded, b.first_kiln_offset) for b in out if not b.kiln_headers] == [
            (True, 0), (True, 600)]
        sequences = [read_header(b.data).base_sequence for b in out]
        assert sequences == [0, 300, 600]


def test_an_unflagged_batch_is_still_forwarded_with_whatever_headers_it_has() -> None:
    # Given the same records, stored without the flag (no produce validation saw them)
    source = client_headed_batch(300)

    # When planned aligned
    [out] = plan([(0, source)], kafka_end=0)

    # Then it is forwarded: the flag, set at produce time, is what keeps it from Kafka as is
    assert (out.forwarded, out.kiln_headers) == (True, False)
