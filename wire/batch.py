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
_BASE_OFFSET = struct.Struct(">q")
# base_offset, batch_length, partition_leader_epoch: what precedes the magic byte.
_PREFIX = struct.Struct(">qii")
_LEADER_EPOCH = struct.Struct(">i")
_LEADER_EPOCH_AT = 12
_MAGIC_AT = 16
_LENGTH_AT = 8
_LOG_OVERHEAD = 12  # base_offset + batch_length precede what batch_length counts
_CRC_FROM = 21

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20

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
        return self.batch_length + _LOG_OVERHEAD

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
        if header.batch_length < HEADER_SIZE - _LOG_OVERHEAD or end > total:
            raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "batch length does not fit the record set")
        if header.record_count <= 0 or header.last_offset_delta != header.record_count - 1:
            raise KafkaError(ErrorCode.INVALID_RECORD, "record count and offset delta disagree")
        if header.compression > 4:
            raise KafkaError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"codec {header.compression}")
        if header.is_control:
            raise KafkaError(ErrorCode.INVALID_RECORD, "producers may not send control batches")
        batch = view[pos:end]
        if crc32c.crc32c(batch[_CRC_FROM:]) != header.crc:
            raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "batch CRC mismatch")
        yield header, batch
        pos = end


def with_base_offset(batch: bytes | memoryview, base_offset: int) -> bytes:
    """The batch with its base offset set (the CRC does not cover it)."""
    return _BASE_OFFSET.pack(base_offset) + bytes(memoryview(batch)[8:])


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
    while len(out) - pos > _MAGIC_AT:
        if out[pos + _MAGIC_AT] == 2:
            _LEADER_EPOCH.pack_into(out, pos + _LEADER_EPOCH_AT, leader_epoch)
        length = _PREFIX.unpack_from(out, pos)[1]
        if length <= 0:
            break
        pos += length + _LOG_OVERHEAD
    return bytes(out)
