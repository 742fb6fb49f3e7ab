"""The record codec: batches built from records, and record sets opened up."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.record._crecords import DefaultRecordBatchBuilder

from wire.batch import (
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_NONE,
    CODEC_SNAPPY,
    CODEC_ZSTD,
    computed_crc,
    read_header,
    with_base_offset,
)
from wire.records import BatchBuilder, decode_records, record_set_end

CODECS = [CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD]

Record = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def sample_records(n: int, start_ts: int = 1_700_000_000_000) -> list[Record]:
    """Compressible records with every shape: keys and none, null values, headers."""
    out: list[Record] = []
    for i in range(n):
        key = None if i % 3 == 0 else b"key-%d" % (i % 10)
        value = None if i % 7 == 6 else b"value %06d " % i + b"x" * 80
        headers: list[tuple[str, bytes | None]] = []
        if i % 2:
            headers = [("trace", b"t-%d" % i), ("empty", None)]
        out.append((start_ts + i * 5, key, value, headers))
    return out


def client_batch(records: list[Record], codec: int = CODEC_NONE) -> bytes:
    """A batch as a producer (aiokafka's builder) would send it."""
    builder: Any = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 1 << 30)
    for i, (ts, key, value, headers) in enumerate(records):
        builder.append(i, ts, key, value, headers)
    return bytes(builder.build())


def crc_ok(data: bytes) -> bool:
    return computed_crc(data) == read_header(data).crc


@pytest.mark.parametrize("codec", CODECS)
def test_a_built_batch_reads_back_as_appended_with_its_producer_and_codec(codec: int) -> None:
    # Given 50 records appended for producer 7001 (epoch 3) from sequence 9
    records = sample_records(50)
    builder = BatchBuilder(1 << 20, producer_id=7001, producer_epoch=3, base_sequence=9)
    for i, (ts, key, value, headers) in enumerate(records):
        builder.append(i, ts, key, value, headers)

    # When the batch is built with `codec` at base offset 100
    data = builder.build(codec, base_offset=100)

    # Then its records decode as appended, from offset 100, and its header says so
    assert [(r.offset, r.timestamp, r.key, r.value, list(r.headers))
            for r in decode_records(data)] == [(100 + i, *r) for i, r in enumerate(records)]
    header = read_header(data)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7001, 3, 9)
    assert header.compression == codec and crc_ok(data)


def test_a_record_set_ends_after_its_last_whole_batch() -> None:
    # Given batches at offsets 0..9 and 10..14, the second cut short as a fetch may cut it
    first = client_batch(sample_records(10))
    second = with_base_offset(client_batch(sample_records(5)), 10)

    # When the end of the record set is read, whole and cut
    whole, cut = record_set_end(first + second), record_set_end(first + second[:-1])

    # Then it is after the last whole batch
    assert (whole, cut, record_set_end(b"")) == (15, 10, None)
