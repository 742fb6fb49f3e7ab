"""Record batch (magic v2) headers: the only part of a produced batch Kiln reads on the hot path.

Batches are stored whole, as the client encoded and compressed them. The CRC covers bytes
21.. (attributes onward) so base_offset and partition_leader_epoch can be rewritten without
recomputing it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c

from wire.errors import ErrorCode, KafkaError

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
# Where HEADER's fields start; the one statement of the layout, for whatever patches a header.
LENGTH_AT = 8  # batch_length: the bytes after it
LEADER_EPOCH_AT = 12
MAGIC_AT = 16
CRC_AT = 17
ATTRIBUTES_AT = 21  # the CRC covers the batch from here on
LAST_OFFSET_DELTA_AT = 23
PRODUCER_AT = 43  # producer_id, producer_epoch, base_sequence
RECORD_COUNT_AT = 57
LOG_OVERHEAD = 12  # base_offset + batch_length precede what batch_length counts
BASE_OFFSET = struct.Struct(">q")
INT32 = struct.Struct(">i")  # batch_length, partition_leader_epoch, last delta, record count
CRC = struct.Struct(">I")
ATTRIBUTES = struct.Struct(">h")
PRODUCER = struct.Struct(">qhi")
# base_offset, batch_length, partition_leader_epoch: what precedes the magic byte.
_PREFIX = struct.Struct(">qii")

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
# The compression codecs, as the attributes' low bits name them.
CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_SNAPPY = 2
CODEC_LZ4 = 3
CODEC_ZSTD = 4

NO_PRODUCER_ID = -1


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def size(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_sequence(self) -> int:
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF


def read_header(buf: bytes | memoryview, pos: int = 0) -> BatchHeader:
    return BatchHeader(*HEADER.unpack_from(buf, pos))


def split_batches(records: bytes | memoryview) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Each batch in a produce request's `records` field, validated; raises KafkaError."""
    view = memoryview(records)
    pos = 0
    total = len(view)
    if total == 0:
        raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "empty record set")
    while pos < total:
        if total - pos < HEADER_SIZE:
            raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "record set ends inside a batch header")
        header = read_header(view, pos)
        if header.magic != 2:
            raise KafkaError(
                ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT, f"magic {header.magic} (only v2)"
            )
        end = pos + header.size
        if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or end > total:
            raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "batch length does not fit the record set")
        if header.record_count <= 0 or header.last_offset_delta != header.record_count - 1:
            raise KafkaError(ErrorCode.INVALID_RECORD, "record count and offset delta disagree")
        if header.compression > CODEC_ZSTD:
            raise KafkaError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"codec {header.compression}")
        if header.is_control:
            raise KafkaError(ErrorCode.INVALID_RECORD, "producers may not send control batches")
        batch = view[pos:end]
        if computed_crc(batch) != header.crc:
            raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "batch CRC mismatch")
        yield header, batch
        pos = end


def computed_crc(batch: bytes | bytearray | memoryview) -> int:
    """The CRC-32C a batch's header should state: of its bytes from the attributes on."""
    return int(crc32c.crc32c(memoryview(batch)[ATTRIBUTES_AT:]))


def set_crc(batch: bytearray) -> None:
    """Restate a batch's CRC after bytes it covers were changed."""
    CRC.pack_into(batch, CRC_AT, computed_crc(batch))


def with_producer(batch: bytes, *, producer_id: int, producer_epoch: int,
                  base_sequence: int) -> bytes:
    """A batch made ready for a Produce request from another producer: base offset 0, no
    leader epoch, the given producer fields, CRC recomputed. Attributes, timestamps and the
    records section stay as they were encoded."""
    out = bytearray(batch)
    BASE_OFFSET.pack_into(out, 0, 0)
    INT32.pack_into(out, LEADER_EPOCH_AT, -1)
    PRODUCER.pack_into(out, PRODUCER_AT, producer_id, producer_epoch, base_sequence)
    set_crc(out)
    return bytes(out)


def with_base_offset(batch: bytes | memoryview, base_offset: int) -> bytes:
    """The batch with its base offset set (the CRC does not cover it)."""
    return BASE_OFFSET.pack(base_offset) + bytes(memoryview(batch)[BASE_OFFSET.size:])


def as_served(batch: bytes | memoryview, base_offset: int, leader_epoch: int) -> bytes:
    """The batch as a fetch serves it: its base offset and partition leader epoch set (the
    CRC covers neither)."""
    view = memoryview(batch)
    length = _PREFIX.unpack_from(view)[1]
    return _PREFIX.pack(base_offset, length, leader_epoch) + bytes(view[_PREFIX.size:])


def with_leader_epoch(record_set: bytes | memoryview, leader_epoch: int) -> bytes:
    """Every magic-2 batch of a record set with its partition leader epoch set (outside the
    CRC)."""
    out = bytearray(record_set)
    pos = 0
    while len(out) - pos > MAGIC_AT:
        if out[pos + MAGIC_AT] == 2:
            INT32.pack_into(out, pos + LEADER_EPOCH_AT, leader_epoch)
        length = _PREFIX.unpack_from(out, pos)[1]
        if length <= 0:
            break
        pos += length + LOG_OVERHEAD
    return bytes(out)
