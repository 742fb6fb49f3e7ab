"""Record batches opened up: decoding them, and re-encoding survivors for the hardened store.

Client batches are stored whole, but when they are hardened every record gets a `kiln.offset`
header (its Kiln offset, 8 bytes big-endian) so that, after a crash, the tail of the Kafka
partition says exactly how far hardening got. The records are decoded and re-encoded with
aiokafka's C record code; small client batches are merged on the way, because a broker pays
per batch.

Compression is done here rather than by aiokafka's builder, which compresses gzip and lz4 at
level 9: level 1 is several times faster and compresses 100-byte records nearly as well.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import crc32c
from aiokafka.codec import gzip_encode, lz4_encode, snappy_encode, zstd_encode
from aiokafka.record._crecords import DefaultRecordBatch, DefaultRecordBatchBuilder

from proxy.protocol.batch import CONTROL_BIT, HEADER_SIZE, read_header
from proxy.protocol.errors import ErrorCode, KafkaError

KILN_OFFSET_HEADER = "kiln.offset"

CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_SNAPPY = 2
CODEC_LZ4 = 3
CODEC_ZSTD = 4

_INT64 = struct.Struct(">q")
_LENGTH = struct.Struct(">i")
_CRC = struct.Struct(">I")
_ATTRIBUTES = struct.Struct(">h")
_LENGTH_AT = 8
_CRC_AT = 17
_ATTRIBUTES_AT = 21
_LOG_OVERHEAD = 12  # base_offset + batch_length precede what batch_length counts
_MAGIC_AT = 16
_SEQUENCE_MODULUS = 1 << 31

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class HardenedBatch:
    """One re-encoded batch, ready for a Produce request (base offset 0, CRC valid)."""

    data: bytes
    first_kiln_offset: int
    last_kiln_offset: int
    record_count: int


@dataclass(frozen=True, slots=True)
class DecodedRecord:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]


def _compress(codec: int, data: bytes) -> bytes:
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


def _finish(builder: Any, codec: int) -> bytes:
    """The built batch, compressed with `codec` when that makes it smaller, CRC recomputed."""
    raw: bytearray = builder.build()
    if codec == CODEC_NONE:
        return bytes(raw)
    body = bytes(memoryview(raw)[HEADER_SIZE:])
    packed = _compress(codec, body)
    if len(packed) >= len(body):
        return bytes(raw)  # the builder already wrote a valid uncompressed batch
    out = bytearray(memoryview(raw)[:HEADER_SIZE])
    out += packed
    _LENGTH.pack_into(out, _LENGTH_AT, len(out) - _LOG_OVERHEAD)
    attributes = _ATTRIBUTES.unpack_from(out, _ATTRIBUTES_AT)[0]
    _ATTRIBUTES.pack_into(out, _ATTRIBUTES_AT, attributes | codec)
    _CRC.pack_into(out, _CRC_AT, crc32c.crc32c(memoryview(out)[_ATTRIBUTES_AT:]))
    return bytes(out)


def _checked_batch(data: bytes | memoryview) -> bytes:
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
    if crc32c.crc32c(memoryview(batch)[_ATTRIBUTES_AT:]) != header.crc:
        raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "batch CRC mismatch")
    return batch


def build_hardened_batches(
    sources: Sequence[tuple[int, bytes]],
    skip_below: int,
    *,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    max_batch_bytes: int,
) -> list[HardenedBatch]:
    """Re-encode the records of client batches at or above Kiln offset `skip_below`.

    Each source is (Kiln offset of the batch's first record, the client batch). Records keep
    their order, key, value, headers and timestamp and gain a `kiln.offset` header; they are
    packed into batches of at most `max_batch_bytes` uncompressed (so compressed ones are
    smaller still; a single larger record gets a batch of its own), each compressed with the
    codec of its first source batch and stamped with the producer and consecutive sequences.
    """
    return list(iter_hardened_batches(
        sources, skip_below, producer_id=producer_id, producer_epoch=producer_epoch,
        base_sequence=base_sequence, max_batch_bytes=max_batch_bytes,
    ))


def iter_hardened_batches(
    sources: Iterable[tuple[int, bytes]],
    skip_below: int,
    *,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    max_batch_bytes: int,
) -> Iterator[HardenedBatch]:
    """build_hardened_batches one batch at a time, so sending can start before the last one
    is built."""
    sequence = base_sequence % _SEQUENCE_MODULUS
    builder: Any = None  # aiokafka's C builder (untyped)
    append: Any = None
    codec = CODEC_NONE
    count = 0
    first = last = -1
    pack = _INT64.pack

    for kiln_base, data in sources:
        batch = _checked_batch(data)
        header = read_header(batch)
        if header.is_control or kiln_base + header.record_count <= skip_below:
            continue
        delta_to_kiln = kiln_base - header.base_offset
        for record in DefaultRecordBatch(batch):
            kiln_offset = record.offset + delta_to_kiln
            if kiln_offset < skip_below:
                continue
            headers = record.headers  # a fresh list per decoded record: extending it is safe
            headers.append((KILN_OFFSET_HEADER, pack(kiln_offset)))
            if append is not None:
                if append(count, record.timestamp, record.key, record.value, headers) is not None:
                    count += 1
                    last = kiln_offset
                    continue
                yield HardenedBatch(_finish(builder, codec), first, last, count)
                sequence = (sequence + count) % _SEQUENCE_MODULUS
            codec = header.compression
            builder = DefaultRecordBatchBuilder(
                2, CODEC_NONE, 0, producer_id, producer_epoch, sequence, max_batch_bytes
            )
            append = builder.append
            # The first record always fits, however large.
            append(0, record.timestamp, record.key, record.value, headers)
            count = 1
            first = last = kiln_offset
    if builder is not None:
        yield HardenedBatch(_finish(builder, codec), first, last, count)


def _whole_batches(record_set: bytes | memoryview) -> Iterator[memoryview]:
    """Each complete batch of a record set; a truncated last one (as Fetch may return) is
    left out."""
    view = memoryview(record_set)
    pos = 0
    while len(view) - pos >= _LOG_OVERHEAD:
        size = _LENGTH.unpack_from(view, pos + _LENGTH_AT)[0] + _LOG_OVERHEAD
        if size <= _LOG_OVERHEAD or pos + size > len(view):
            return
        yield view[pos : pos + size]
        pos += size


def _is_data_batch(batch: memoryview) -> bool:
    """A v2 batch holding data records (not a control batch, not an older message set)."""
    if len(batch) < HEADER_SIZE or batch[_MAGIC_AT] != 2:
        return False
    return not _ATTRIBUTES.unpack_from(batch, _ATTRIBUTES_AT)[0] & CONTROL_BIT


def record_set_end(record_set: bytes | memoryview) -> int | None:
    """The offset just after the last complete batch of a record set (None if it has none):
    where the next fetch should start."""
    end: int | None = None
    for view in _whole_batches(record_set):
        if len(view) >= HEADER_SIZE and view[_MAGIC_AT] == 2:
            header = read_header(view)
            end = header.base_offset + header.last_offset_delta + 1
        else:  # an older message set entry carries the offset of its (last) message
            end = int(_INT64.unpack_from(view, 0)[0]) + 1
    return end


def decode_records(record_set: bytes | memoryview) -> list[DecodedRecord]:
    """Every data record of a record set (one or more batches), with absolute offsets.

    Control batches are skipped and a truncated trailing batch is ignored; an older message
    format or a bad CRC raises KafkaError.
    """
    records: list[DecodedRecord] = []
    for view in _whole_batches(record_set):
        batch = _checked_batch(view)
        if read_header(batch).is_control:
            continue
        records.extend(
            DecodedRecord(r.offset, r.timestamp, r.key, r.value, tuple(r.headers))
            for r in DefaultRecordBatch(batch)
        )
    return records


def kiln_offset_of(headers: Sequence[Header]) -> int | None:
    """The Kiln offset a hardened record carries; the last such header wins, because Kiln
    appends its own after any a client sent."""
    for key, value in reversed(headers):
        if key == KILN_OFFSET_HEADER and value is not None and len(value) == _INT64.size:
            return int(_INT64.unpack(value)[0])
    return None


def last_kiln_offset(record_set: bytes | memoryview) -> int | None:
    """The largest Kiln offset in a fetched record set, or None if no record carries one."""
    best: int | None = None
    for view in _whole_batches(record_set):
        if not _is_data_batch(view):
            continue
        for record in DefaultRecordBatch(_checked_batch(view)):
            offset = kiln_offset_of(record.headers)
            if offset is not None and (best is None or offset > best):
                best = offset
    return best
