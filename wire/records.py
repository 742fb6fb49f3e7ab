"""Record batches opened up: a record set's whole batches, their records decoded, and new
batches built from records and compressed. Bytes only: which records Kiln writes into the
hardened topic, and how it reads them back in Kiln offsets, is storage's to decide
(storage/hardened_batches.py).

Compression is done here rather than by aiokafka's builder, which compresses gzip and lz4 at
level 9: level 1 is several times faster and compresses 100-byte records nearly as well.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka.codec import gzip_encode, lz4_encode, snappy_encode, zstd_encode
from aiokafka.record._crecords import DefaultRecordBatch, DefaultRecordBatchBuilder

from wire.batch import (
    ATTRIBUTES,
    ATTRIBUTES_AT,
    BASE_OFFSET,
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_NONE,
    CODEC_SNAPPY,
    CODEC_ZSTD,
    CONTROL_BIT,
    HEADER_SIZE,
    INT32,
    LENGTH_AT,
    LOG_OVERHEAD,
    MAGIC_AT,
    NO_PRODUCER_ID,
    computed_crc,
    read_header,
    set_crc,
)
from wire.errors import ErrorCode, KafkaError
from wire.lineage import Header

# A builder's append(offset_delta, timestamp, key, value, headers): None once the batch is full.
Append = Callable[[int, int, bytes | None, bytes | None, list[Header]], object]


@dataclass(frozen=True, slots=True)
class DecodedRecord:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]


class Record(Protocol):
    """A record as aiokafka's C reader decodes it; `headers` is a fresh list each time."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[Header]


def compress(codec: int, data: bytes) -> bytes:
    packed: bytes
    if codec == CODEC_GZIP:
        packed = gzip_encode(data, 1)
    elif codec == CODEC_SNAPPY:
        # xerial framing, as Java clients send it; every Kafka reader accepts it.
        packed = snappy_encode(data)
    elif codec == CODEC_LZ4:
        packed = lz4_encode(data, 1)
    elif codec == CODEC_ZSTD:
        packed = zstd_encode(data, 1)
    else:
        raise KafkaError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"codec {codec}")
    return packed


class BatchBuilder:
    """Records built into one new v2 batch by aiokafka's C builder, up to `max_bytes`
    uncompressed. `append(offset_delta, timestamp, key, value, headers)` returns None, taking
    nothing, once the batch is full; the first record always fits."""

    __slots__ = ("_builder", "append")

    def __init__(self, max_bytes: int, *, producer_id: int = NO_PRODUCER_ID,
                 producer_epoch: int = -1, base_sequence: int = -1,
                 transactional: bool = False) -> None:
        self._builder: Any = DefaultRecordBatchBuilder(
            2, CODEC_NONE, int(transactional), producer_id, producer_epoch, base_sequence,
            max_bytes)
        self.append: Append = self._builder.append

    def size(self) -> int:
        """The batch's size so far, uncompressed."""
        return int(self._builder.size())

    def build(self, codec: int = CODEC_NONE, *, base_offset: int = 0,
              timestamp_type: int = 0) -> bytearray:
        """The batch at `base_offset`, with `timestamp_type` (TIMESTAMP_TYPE_BIT for
        LogAppendTime) in its attributes, compressed with `codec` when that makes it
        smaller; CRC valid."""
        raw: bytearray = self._builder.build()
        BASE_OFFSET.pack_into(raw, 0, base_offset)  # outside the CRC
        attributes = timestamp_type
        if codec != CODEC_NONE:
            body = bytes(memoryview(raw)[HEADER_SIZE:])
            packed = compress(codec, body)
            if len(packed) < len(body):  # else the batch stays as built, uncompressed
                del raw[HEADER_SIZE:]
                raw += packed
                INT32.pack_into(raw, LENGTH_AT, len(raw) - LOG_OVERHEAD)
                attributes |= codec
        if attributes:
            ATTRIBUTES.pack_into(raw, ATTRIBUTES_AT,
                                 ATTRIBUTES.unpack_from(raw, ATTRIBUTES_AT)[0] | attributes)
            set_crc(raw)
        return raw


def checked_batch(data: bytes | memoryview) -> bytes:
    """One whole v2 batch as bytes, after checking its framing and CRC."""
    if len(data) < HEADER_SIZE:
        raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "batch shorter than its header")
    header = read_header(data)
    if header.magic != 2:
        raise KafkaError(ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT, f"magic {header.magic}")
    if header.size > len(data) or header.size < HEADER_SIZE:
        raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "batch length does not fit the data")
    if isinstance(data, bytes) and len(data) == header.size:
        batch = data
    else:
        batch = bytes(memoryview(data)[: header.size])
    if computed_crc(batch) != header.crc:
        raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "batch CRC mismatch")
    return batch


def records_of(batch: bytes) -> Iterator[Record]:
    """The records of a checked batch (see checked_batch), with absolute offsets."""
    return iter(DefaultRecordBatch(batch))


def whole_batches(record_set: bytes | memoryview) -> Iterator[memoryview]:
    """Each complete batch of a record set; a truncated last one (as Fetch may return) is
    left out."""
    view = memoryview(record_set)
    pos = 0
    while len(view) - pos >= LOG_OVERHEAD:
        size = INT32.unpack_from(view, pos + LENGTH_AT)[0] + LOG_OVERHEAD
        if size <= LOG_OVERHEAD or pos + size > len(view):
            return
        yield view[pos : pos + size]
        pos += size


def is_data_batch(batch: memoryview) -> bool:
    """A v2 batch holding data records (not a control batch, not an older message set)."""
    if len(batch) < HEADER_SIZE or batch[MAGIC_AT] != 2:
        return False
    return not ATTRIBUTES.unpack_from(batch, ATTRIBUTES_AT)[0] & CONTROL_BIT


def batch_end(view: memoryview) -> int:
    """The offset after a whole batch (any message format)."""
    if len(view) >= HEADER_SIZE and view[MAGIC_AT] == 2:
        header = read_header(view)
        return header.base_offset + header.last_offset_delta + 1
    return int(BASE_OFFSET.unpack_from(view, 0)[0]) + 1  # an older message set entry


def record_set_end(record_set: bytes | memoryview) -> int | None:
    """The offset just after the last complete batch of a record set (None if it has none):
    where the next fetch should start."""
    end: int | None = None
    for view in whole_batches(record_set):
        end = batch_end(view)
    return end


def decode_records(record_set: bytes | memoryview) -> list[DecodedRecord]:
    """Every data record of a record set (one or more batches), with absolute offsets.

    Control batches are skipped and a truncated trailing batch is ignored; an older message
    format or a bad CRC raises KafkaError.
    """
    records: list[DecodedRecord] = []
    for view in whole_batches(record_set):
        batch = checked_batch(view)
        if read_header(batch).is_control:
            continue
        records.extend(
            DecodedRecord(r.offset, r.timestamp, r.key, r.value, tuple(r.headers))
            for r in records_of(batch)
        )
    return records
