"""Fetched record sets decoded into columns: ranges, truncated batches, headers, timestamp
types, transaction markers and aborted transactions (read_committed). Batches are built
with aiokafka's builder, then patched where a broker would have set fields."""

from __future__ import annotations

import struct

import crc32c
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from spark_examples.record_sets import (
    AbortedTransaction,
    CorruptRecords,
    RecordColumns,
    decode_into,
    record_set_end,
)

_CONTROL = 0x20
_LOG_APPEND_TIME = 0x08
_COMMIT, _ABORT = 1, 0


def batch(base: int, count: int, *, producer_id: int = -1, transactional: bool = False,
          timestamp: int = 1_000, headers: list[tuple[str, bytes | None]] | None = None,
          attributes: int = 0) -> bytes:
    """A v2 batch of `count` records at Kafka offsets base.., values b"v<offset>"."""
    builder = DefaultRecordBatchBuilder(2, 0, int(transactional), producer_id, 0,
                                        0 if producer_id >= 0 else -1, 10**7)
    for i in range(count):
        builder.append(i, timestamp + i, b"k%d" % (base + i), b"v%d" % (base + i),
                       headers if headers is not None else [])
    return _patched(bytes(builder.build()), base, attributes)


def marker(offset: int, producer_id: int, kind: int) -> bytes:
    """A transaction marker (control batch) ending producer_id's transaction."""
    builder = DefaultRecordBatchBuilder(2, 0, 1, producer_id, 0, -1, 10**6)
    builder.append(0, 5_000, struct.pack(">hh", 0, kind), struct.pack(">hi", 0, 0), [])
    return _patched(bytes(builder.build()), offset, _CONTROL)


def _patched(data: bytes, base: int, attributes: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(">q", out, 0, base)
    old = struct.unpack_from(">h", out, 21)[0]
    struct.pack_into(">h", out, 21, old | attributes)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def decode(record_set: bytes, start: int = 0, until: int = 10**9,
           aborted: list[AbortedTransaction] | None = None,
           headers: bool = True) -> tuple[RecordColumns, int | None]:
    columns = RecordColumns()
    after = decode_into(columns, record_set, from_offset=start, until_offset=until,
                        aborted=aborted, include_headers=headers)
    return columns, after


def test_only_records_in_range_are_taken_and_the_next_position_follows() -> None:
    # Given two batches, offsets 0-4 and 5-9
    record_set = batch(0, 5) + batch(5, 5)
    # When offsets 3..7 are wanted
    columns, after = decode(record_set, start=3, until=8)
    # Then exactly those are decoded, and reading goes on at 8
    assert columns.offsets == [3, 4, 5, 6, 7]
    assert columns.values == [b"v3", b"v4", b"v5", b"v6", b"v7"]
    assert columns.keys == [b"k3", b"k4", b"k5", b"k6", b"k7"]
    assert after == 8


def test_a_truncated_last_batch_is_left_for_the_next_fetch() -> None:
    whole = batch(0, 5)
    partial = batch(5, 5)
    columns, after = decode(whole + partial[: len(partial) // 2])
    assert columns.offsets == [0, 1, 2, 3, 4]
    assert after == 5
    assert decode(partial[:30]) == (RecordColumns(), None)


def test_the_next_fetch_position_comes_from_batch_headers_alone() -> None:
    whole = batch(0, 5) + batch(5, 3) + marker(8, 9, _COMMIT)
    assert record_set_end(whole) == 9
    assert record_set_end(whole + batch(9, 4)[:40]) == 9  # a truncated batch does not count
    assert record_set_end(b"") is None
    assert record_set_end(whole) == decode(whole)[1]


def test_headers_are_flattened_per_record() -> None:
    headers: list[tuple[str, bytes | None]] = [("kiln.offset", b"\x00" * 8), ("empty", None)]
    columns, _ = decode(batch(0, 2, headers=headers))
    assert columns.header_counts == [2, 2]
    assert columns.header_keys == ["kiln.offset", "empty", "kiln.offset", "empty"]
    assert columns.header_values == [b"\x00" * 8, None, b"\x00" * 8, None]
    without, _ = decode(batch(0, 2, headers=headers), headers=False)
    assert without.header_counts == [] and without.header_keys == []


def test_timestamps_and_their_type() -> None:
    create, _ = decode(batch(0, 2, timestamp=7_000))
    assert create.timestamps == [7_000, 7_001]
    assert create.timestamp_types == [0, 0]
    # A broker stamping LogAppendTime gives every record the batch's max timestamp
    appended, _ = decode(batch(0, 2, timestamp=7_000, attributes=_LOG_APPEND_TIME))
    assert appended.timestamp_types == [1, 1]
    assert appended.timestamps == [7_001, 7_001]


def transactions() -> bytes:
    """Producer 7 writes 0-2 and aborts (marker at 3); producer 8 writes 4-5 and commits
    (marker at 6); a plain record at 7."""
    return (batch(0, 3, producer_id=7, transactional=True) + marker(3, 7, _ABORT)
            + batch(4, 2, producer_id=8, transactional=True) + marker(6, 8, _COMMIT)
            + batch(7, 1))


def test_read_committed_skips_aborted_transactions_and_markers() -> None:
    columns, after = decode(transactions(), aborted=[AbortedTransaction(7, 0)])
    assert columns.offsets == [4, 5, 7]
    assert after == 8


def test_read_uncommitted_keeps_aborted_records_but_never_markers() -> None:
    columns, after = decode(transactions(), aborted=None)
    assert columns.offsets == [0, 1, 2, 4, 5, 7]
    assert after == 8


def test_an_abort_marker_ends_what_it_aborted() -> None:
    # Given producer 7 aborting a transaction, then writing a committed one
    record_set = (batch(0, 2, producer_id=7, transactional=True) + marker(2, 7, _ABORT)
                  + batch(3, 2, producer_id=7, transactional=True) + marker(5, 7, _COMMIT))
    columns, _ = decode(record_set, aborted=[AbortedTransaction(7, 0)])
    assert columns.offsets == [3, 4]


def test_a_range_ending_in_markers_still_moves_on() -> None:
    columns, after = decode(batch(0, 1) + marker(1, 9, _COMMIT), start=1)
    assert columns.offsets == []
    assert after == 2


def test_corrupt_batches_are_refused() -> None:
    damaged = bytearray(batch(0, 3))
    damaged[-1] ^= 0xFF
    with pytest.raises(CorruptRecords, match="CRC"):
        decode(bytes(damaged))
    old_format = bytearray(batch(0, 3))
    old_format[16] = 1
    with pytest.raises(CorruptRecords, match="v2"):
        decode(bytes(old_format))
