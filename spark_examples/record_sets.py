"""Fetched Kafka record sets decoded into columns for the compatible reader. No I/O.

Batches are decoded with aiokafka's C record code: kafka-python's consumer decodes records in
pure Python at about 60 k records/s on this project's machine, below what a Spark source must
sustain. What a consumer must skip is skipped here, as Kafka's Java consumer does: records
outside the wanted range, control batches (transaction markers) and, when reading committed
data, the batches of aborted transactions the broker listed in its Fetch answer.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiokafka.record.default_records import DefaultRecordBatch

_LOG_OVERHEAD = 12  # base offset and batch length precede what the length counts
_LENGTH_AT = 8
_MAGIC_AT = 16
_HEADER_SIZE = 61
_LAST_OFFSET_DELTA_AT = 23
_LENGTH = struct.Struct(">i")
_BASE_OFFSET = struct.Struct(">q")
_CONTROL_KEY = struct.Struct(">hh")  # version, type
_ABORT_MARKER = 0


class CorruptRecords(Exception):
    """A record set that is not Kafka's v2 format, or a batch whose CRC does not match."""


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    """One entry of a Fetch answer's aborted transactions."""

    producer_id: int
    first_offset: int


@dataclass(slots=True)
class RecordColumns:
    """Decoded records of one partition, column by column (what Arrow is built from).
    Headers are flattened: `header_counts[i]` of them belong to record i."""

    offsets: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)  # milliseconds since the epoch
    timestamp_types: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    header_counts: list[int] = field(default_factory=list)
    header_keys: list[str] = field(default_factory=list)
    header_values: list[bytes | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)


def whole_batches(record_set: bytes | memoryview) -> list[memoryview]:
    """The complete batches of a record set; a truncated last one (as Fetch may return) is
    left out."""
    view = memoryview(record_set)
    out = []
    pos = 0
    while len(view) - pos >= _LOG_OVERHEAD:
        size = _LENGTH.unpack_from(view, pos + _LENGTH_AT)[0] + _LOG_OVERHEAD
        if size <= _LOG_OVERHEAD or pos + size > len(view):
            break
        out.append(view[pos:pos + size])
        pos += size
    return out


def record_set_end(record_set: bytes | memoryview) -> int | None:
    """The offset after the last whole v2 batch of a record set (None if it holds none):
    where the next fetch starts, found from the batch headers alone."""
    end = None
    for view in whole_batches(record_set):
        if len(view) < _HEADER_SIZE or view[_MAGIC_AT] != 2:
            return None  # decode_into says what is wrong with it
        base = _BASE_OFFSET.unpack_from(view, 0)[0]
        end = base + _LENGTH.unpack_from(view, _LAST_OFFSET_DELTA_AT)[0] + 1
    return end


def decode_into(columns: RecordColumns, record_set: bytes | memoryview, *, from_offset: int,
                until_offset: int, aborted: Sequence[AbortedTransaction] | None,
                include_headers: bool) -> int | None:
    """Append the data records at offsets [from_offset, until_offset) to `columns`.

    `aborted` is None to read uncommitted data, else the Fetch answer's aborted transactions
    (possibly empty). Returns where the next fetch should start: after the last whole batch,
    or `until_offset` once it is reached; None when the set holds no whole batch.
    """
    pending = deque(sorted(aborted or (), key=lambda t: t.first_offset))
    aborted_producers: set[int] = set()
    position: int | None = None
    for view in whole_batches(record_set):
        magic = view[_MAGIC_AT] if len(view) > _MAGIC_AT else -1
        if magic != 2 or len(view) < _HEADER_SIZE:
            raise CorruptRecords("only v2 record batches (Kafka 0.11+) can be read, got magic "
                                 f"{magic} in a {len(view)}-byte batch")
        batch = DefaultRecordBatch(view)
        if not batch.validate_crc():
            raise CorruptRecords(f"record batch at offset {batch.base_offset}: CRC mismatch")
        last = batch.base_offset + batch.last_offset_delta
        position = last + 1
        if last < from_offset:
            continue
        if aborted is not None and batch.producer_id >= 0:
            while pending and pending[0].first_offset <= last:
                aborted_producers.add(pending.popleft().producer_id)
        if batch.is_control_batch:
            if aborted is not None and _is_abort_marker(batch):
                aborted_producers.discard(batch.producer_id)
            continue
        if (aborted is not None and batch.is_transactional
                and batch.producer_id in aborted_producers):
            continue
        if _append_records(columns, batch, batch.timestamp_type, from_offset, until_offset,
                           include_headers):
            return until_offset
    return None if position is None else min(position, until_offset)


def _append_records(columns: RecordColumns, batch: DefaultRecordBatch, timestamp_type: int,
                    from_offset: int, until_offset: int, include_headers: bool) -> bool:
    """Append a batch's records in range; True once `until_offset` is reached."""
    offsets, timestamps = columns.offsets, columns.timestamps
    keys, values, types = columns.keys, columns.values, columns.timestamp_types
    counts, header_keys, header_values = (columns.header_counts, columns.header_keys,
                                          columns.header_values)
    for record in batch:
        offset = record.offset
        if offset < from_offset:
            continue
        if offset >= until_offset:
            return True
        offsets.append(offset)
        timestamps.append(record.timestamp)
        types.append(timestamp_type)
        keys.append(record.key)
        values.append(record.value)
        if include_headers:
            headers = record.headers
            counts.append(len(headers))
            for key, value in headers:
                header_keys.append(key)
                header_values.append(value)
    return bool(offsets) and offsets[-1] + 1 >= until_offset


def _is_abort_marker(batch: DefaultRecordBatch) -> bool:
    """Whether a control batch's marker ends a transaction by aborting it."""
    for record in batch:
        key = record.key
        if key is None or len(key) < _CONTROL_KEY.size:
            return False
        return bool(_CONTROL_KEY.unpack_from(key)[1] == _ABORT_MARKER)
    return False
