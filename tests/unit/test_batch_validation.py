"""Produce-time record validation (wire/validation.py): batches from real encoders
pass; every way a batch can disagree with its header is refused with Kafka's code."""

from __future__ import annotations

import contextlib
import gzip
import struct
import zlib

import cramjam
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from hypothesis import given, settings
from hypothesis import strategies as st

from wire.batch import (
    ATTRIBUTES_AT,
    BASE_OFFSET,
    HEADER,
    HEADER_SIZE,
    INT32,
    LAST_OFFSET_DELTA_AT,
    LENGTH_AT,
    LOG_OVERHEAD,
    RECORD_COUNT_AT,
    set_crc,
)
from wire.errors import ErrorCode, KafkaError
from wire.lineage import kiln_offset_header
from wire.validation import (
    INVALID_RECORD,
    INVALID_TIMESTAMP,
    RecordLimits,
    validate_produce_records,
)

NOW = 1_700_000_000_000
LIMITS = RecordLimits(max_uncompressed_bytes=1 << 20)
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
_ATTRIBUTES_LOW_BYTE = ATTRIBUTES_AT + 1  # the codec and control bits


def client_batch(count: int = 3, codec: int = 0, *, timestamp: int = NOW,
                 headers: list[tuple[str, bytes | None]] | None = None) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=0,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 22)
    for i in range(count):
        builder.append(i, timestamp=timestamp + i, key=b"k%d" % i, value=b"value-%d" % i,
                       headers=list(headers or []))
    return bytes(builder.build())


def raw_batch(records: bytes, count: int, *, codec: int = 0, last_delta: int | None = None,
              timestamp: int = NOW) -> bytes:
    """A v2 batch around hand-made record bytes, with a valid CRC."""
    batch = bytearray(HEADER.pack(
        0, HEADER_SIZE - LOG_OVERHEAD + len(records), -1, 2, 0, codec,
        count - 1 if last_delta is None else last_delta, timestamp, timestamp, -1, -1, -1, count))
    return with_crc(batch + records)


def varint(value: int) -> bytes:
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def record(offset_delta: int = 0, value: bytes = b"v",
           headers: list[tuple[bytes, bytes]] | None = None, *, header_count: int | None = None,
           extra: bytes = b"") -> bytes:
    hs = headers or []
    body = (b"\x00" + varint(0) + varint(offset_delta) + varint(-1) + varint(len(value)) + value
            + varint(len(hs) if header_count is None else header_count)
            + b"".join(varint(len(k)) + k + varint(len(v)) + v for k, v in hs) + extra)
    return varint(len(body)) + body


def with_crc(batch: bytearray) -> bytes:
    set_crc(batch)
    return bytes(batch)


def refused(records: bytes, *, limits: RecordLimits = LIMITS, api_version: int = 9
            ) -> KafkaError:
    with pytest.raises(KafkaError) as raised:
        validate_produce_records(records, now_ms=NOW, limits=limits, api_version=api_version)
    return raised.value


@pytest.mark.parametrize("codec", CODECS.values(), ids=CODECS.keys())
def test_batches_from_aiokafka_pass_for_every_codec(codec: int) -> None:
    data = client_batch(500, codec)

    checked = validate_produce_records(data, now_ms=NOW, limits=LIMITS)

    assert checked.header.record_count == 500
    assert bytes(checked.data) == data
    assert checked.carries_kiln_header is False


def test_the_kiln_reliability_header_values_are_collected() -> None:
    data = client_batch(3, 2, headers=[("trace", b"t"), ("kiln.reliability", b"express")])

    checked = validate_produce_records(data, now_ms=NOW, limits=LIMITS)

    assert checked.reliability_names == frozenset({b"express"})
    assert validate_produce_records(client_batch(3), now_ms=NOW,
                                    limits=LIMITS).reliability_names == frozenset()


def test_batches_of_many_thousand_records_are_walked_to_the_end() -> None:
    # Given 9,000 records (more than one decoding chunk), the last with a kiln.offset header
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=CODECS["lz4"],
                                        is_transactional=0, producer_id=-1, producer_epoch=-1,
                                        base_sequence=-1, batch_size=1 << 24)
    for i in range(9000):
        headers = [kiln_offset_header(1)] if i == 8999 else []
        builder.append(i, timestamp=NOW, key=None, value=b"v%d" % i, headers=headers)

    checked = validate_produce_records(bytes(builder.build()), now_ms=NOW, limits=LIMITS)

    assert checked.header.record_count == 9000
    assert checked.carries_kiln_header is True


def test_java_style_xerial_snappy_passes() -> None:
    plain = client_batch(300)
    records = plain[HEADER_SIZE:]
    framed = [cramjam.snappy.compress_raw(part) for part in (records[:1000], records[1000:])]
    payload = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + b"".join(
        struct.pack(">i", len(block)) + bytes(block) for block in framed)
    batch = bytearray(plain[:HEADER_SIZE] + payload)
    INT32.pack_into(batch, LENGTH_AT, len(batch) - LOG_OVERHEAD)
    batch[_ATTRIBUTES_LOW_BYTE] |= 2

    checked = validate_produce_records(with_crc(batch), now_ms=NOW, limits=LIMITS)

    assert checked.header.record_count == 300


def test_a_record_with_a_kiln_offset_header_is_flagged() -> None:
    data = client_batch(3, 3, headers=[("trace", b"t"), kiln_offset_header(9)])

    checked = validate_produce_records(data, now_ms=NOW, limits=LIMITS)

    assert checked.carries_kiln_header is True


def test_header_claiming_a_million_records_over_ten_bytes_is_corrupt() -> None:
    records = record(0, b"abc")

    error = refused(raw_batch(records, 1_000_000))

    # Kafka's broker: "Incorrect declared batch size, premature EOF reached", INVALID_RECORD
    # (not the retriable CORRUPT_MESSAGE: the same bytes sent again cannot succeed)
    assert len(records) == 10
    assert error.error_code is ErrorCode.INVALID_RECORD


def test_fewer_records_claimed_than_present_is_refused() -> None:
    error = refused(raw_batch(record(0) + record(1) + record(2), 2))

    assert error.error_code is INVALID_RECORD


def test_trailing_bytes_after_the_last_record_are_refused() -> None:
    error = refused(raw_batch(record(0) + record(1) + b"\x00\x01", 2))

    assert error.error_code is INVALID_RECORD


def test_truncated_record_is_refused() -> None:
    error = refused(raw_batch(record(0) + record(1, b"long value")[:-4], 2))

    assert error.error_code is INVALID_RECORD


def test_record_length_disagreeing_with_its_fields_is_refused() -> None:
    good = record(0, b"abc")
    bad = varint(len(good) - 1 + 1) + good[1:] + b"\x00"  # claims one byte its fields do not use

    error = refused(raw_batch(bad, 1))

    assert error.error_code is INVALID_RECORD


@pytest.mark.parametrize("deltas", [[0, 2], [1, 0], [0, 0]])
def test_offset_deltas_other_than_0_to_n_minus_1_are_refused(deltas: list[int]) -> None:
    error = refused(raw_batch(b"".join(record(d) for d in deltas), 2))

    assert error.error_code is INVALID_RECORD


def test_last_offset_delta_disagreeing_with_the_count_is_refused() -> None:
    error = refused(raw_batch(record(0) + record(1), 2, last_delta=5))

    assert error.error_code is INVALID_RECORD


def test_negative_header_count_is_refused() -> None:
    error = refused(raw_batch(record(0, header_count=-1), 1))

    assert error.error_code is INVALID_RECORD


def test_header_count_beyond_the_record_is_refused() -> None:
    error = refused(raw_batch(record(0, header_count=1_000_000), 1))

    assert error.error_code is INVALID_RECORD


def test_null_header_key_is_refused() -> None:
    body = (b"\x00" + varint(0) + varint(0) + varint(-1) + varint(1) + b"v" + varint(1)
            + varint(-1) + varint(1) + b"x")  # one header: key length -1, value b"x"

    error = refused(raw_batch(varint(len(body)) + body, 1))

    assert error.error_code is INVALID_RECORD


def test_unknown_codec_is_refused() -> None:
    batch = bytearray(client_batch(2))
    batch[_ATTRIBUTES_LOW_BYTE] |= 5

    error = refused(with_crc(batch))

    assert error.error_code is ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


def test_zstd_before_produce_v7_is_refused() -> None:
    error = refused(client_batch(2, 4), api_version=6)

    assert error.error_code is ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


def test_control_batch_from_a_producer_is_refused() -> None:
    batch = bytearray(client_batch(1))
    batch[_ATTRIBUTES_LOW_BYTE] |= 0x20

    error = refused(with_crc(batch))

    assert error.error_code is INVALID_RECORD


def test_two_batches_for_one_partition_are_refused() -> None:
    error = refused(client_batch(2) + client_batch(2))

    assert error.error_code is INVALID_RECORD


def test_base_offset_other_than_zero_is_refused() -> None:
    batch = bytearray(client_batch(2))
    BASE_OFFSET.pack_into(batch, 0, 7)

    error = refused(bytes(batch))

    assert error.error_code is INVALID_RECORD


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_zip_bomb_is_refused_before_it_is_inflated(codec: int) -> None:
    # Given a batch whose few compressed bytes inflate to 64 MiB, against a 1 MiB limit
    plain = b"\x00" * (64 << 20)
    packed = {1: lambda: gzip.compress(plain, 9),
              2: lambda: bytes(cramjam.snappy.compress_raw(plain)),
              3: lambda: bytes(cramjam.lz4.compress(plain)),
              4: lambda: bytes(cramjam.zstd.compress(plain, level=3))}[codec]()
    batch = bytearray(client_batch(1)[:HEADER_SIZE] + packed)
    INT32.pack_into(batch, LENGTH_AT, len(batch) - LOG_OVERHEAD)
    batch[_ATTRIBUTES_LOW_BYTE] |= codec

    error = refused(with_crc(batch))

    assert error.error_code is ErrorCode.MESSAGE_TOO_LARGE


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_compressed_records_that_do_not_decompress_are_refused(codec: int) -> None:
    batch = bytearray(client_batch(50, codec))
    batch[HEADER_SIZE + 4:] = bytes(b ^ 0x5A for b in batch[HEADER_SIZE + 4:])

    error = refused(with_crc(batch))

    assert error.error_code is INVALID_RECORD


def test_compressed_records_fewer_than_claimed_are_refused() -> None:
    records = client_batch(3)[HEADER_SIZE:]
    batch = bytearray(client_batch(3)[:HEADER_SIZE] + zlib.compress(records, wbits=31))
    INT32.pack_into(batch, LENGTH_AT, len(batch) - LOG_OVERHEAD)
    INT32.pack_into(batch, RECORD_COUNT_AT, 4)
    INT32.pack_into(batch, LAST_OFFSET_DELTA_AT, 3)
    batch[_ATTRIBUTES_LOW_BYTE] |= 1

    error = refused(with_crc(batch))

    assert error.error_code is INVALID_RECORD


def test_timestamp_over_an_hour_ahead_is_refused() -> None:
    error = refused(client_batch(3, timestamp=NOW + 3_600_001))

    assert error.error_code is INVALID_TIMESTAMP
    assert "record 0" in error.message


def test_old_timestamps_pass_by_default_and_fail_with_a_bound() -> None:
    old = client_batch(2, timestamp=0)

    checked = validate_produce_records(old, now_ms=NOW, limits=LIMITS)
    error = refused(old, limits=RecordLimits(1 << 20, timestamp_before_max_ms=86_400_000))

    assert checked.header.record_count == 2
    assert error.error_code is INVALID_TIMESTAMP


@settings(max_examples=400, deadline=None)
@given(position=st.integers(HEADER_SIZE, 400), value=st.integers(0, 255),
       codec=st.sampled_from(list(CODECS.values())))
def test_any_flipped_record_byte_with_a_fixed_crc_is_accepted_whole_or_refused(
        position: int, value: int, codec: int) -> None:
    # Given a real batch with one byte of its records changed and its CRC made valid again
    batch = bytearray(client_batch(5, codec))
    position = min(position, len(batch) - 1)
    batch[position] = value

    # Then validation either refuses it with a Kafka error or accepts exactly 5 records
    with contextlib.suppress(KafkaError):
        checked = validate_produce_records(with_crc(batch), now_ms=NOW, limits=LIMITS)
        assert checked.header.record_count == 5


@settings(max_examples=300, deadline=None)
@given(records=st.binary(max_size=200), count=st.integers(1, 2**31 - 1))
def test_random_record_bytes_never_escape_the_kafka_errors(records: bytes, count: int) -> None:
    with contextlib.suppress(KafkaError):
        validate_produce_records(raw_batch(records, count), now_ms=NOW, limits=LIMITS)
