"""Produce-time validation of record batches: what Apache Kafka's broker checks before it
appends, so that Kiln never stores (and later forwards to Kafka byte for byte) a batch Kafka
would refuse, or one that lies about its record count and so moves the partition's offsets.

Sources read (apache/kafka trunk, Oct 2024): `ProduceRequest.validateRecords` (one v2 batch
per partition), `UnifiedLog.analyzeAndValidateRecords` (base offset 0, CRC),
`LogValidator.validateBatch` / `validateRecord` / `validateTimestamp`, and the record
iterators of `DefaultRecordBatch` and `DefaultRecord.readFrom` (record lengths, header
counts and keys, nothing left over, exactly `record_count` records).

Records are walked by aiokafka's C decoder, which checks each record's bounds, its length
against the bytes its fields took, header counts and non-null header keys, that there are
exactly `record_count` records and no byte after them. Python touches each record only
through C-level `map` calls (offset, timestamp, headers). Compressed records are
decompressed here, never by aiokafka, which has no bound on the output (a zip bomb).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from operator import attrgetter
from typing import Any

import cramjam
from aiokafka.errors import CorruptRecordException
from aiokafka.record._crecords import DefaultRecordBatch

from wire.batch import (
    ATTRIBUTES,
    ATTRIBUTES_AT,
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_NONE,
    CODEC_SNAPPY,
    CODEC_ZSTD,
    COMPRESSION_MASK,
    HEADER_SIZE,
    TIMESTAMP_TYPE_BIT,
    BatchHeader,
    split_batches,
)
from wire.errors import ErrorCode, KafkaError
from wire.lineage import KILN_OFFSET_HEADER

# Kafka's codes: INVALID_RECORD for records that are not what their batch header says (not
# retriable: sending the same bytes again cannot help), INVALID_TIMESTAMP for timestamps.
INVALID_RECORD = ErrorCode.INVALID_RECORD
INVALID_TIMESTAMP = ErrorCode.INVALID_TIMESTAMP

# A record header by which a producer asks for a reliability level (its value, the level's
# name); the server layer reads the names (see produce.py).
KILN_RELIABILITY_KEY = "kiln.reliability"

# Kafka 4.0's defaults (KIP-1030 bounded the future at one hour; the past stays unbounded).
DEFAULT_TIMESTAMP_AFTER_MAX_MS = 3_600_000
DEFAULT_TIMESTAMP_BEFORE_MAX_MS: int | None = None

_FIRST_GUESS = 256 * 1024
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16  # magic, version, compatible version
_BLOCK_LENGTH = struct.Struct(">i")
# aiokafka reads varints with no bounds check (a hostile one runs up to 10 bytes past the
# end): every buffer it walks ends in this much padding outside the view it is given.
_PADDING = bytes(16)
_CHUNK = 4096  # records decoded at a time: bounds memory whatever the batch claims
_NO_TIMESTAMP = -1
_MIN_PRODUCE_VERSION_FOR_ZSTD = 7

_offset: Callable[[Any], int] = attrgetter("offset")
_timestamp: Callable[[Any], int] = attrgetter("timestamp")
_headers: Callable[[Any], list[tuple[str, bytes | None]]] = attrgetter("headers")


@dataclass(frozen=True, slots=True)
class RecordLimits:
    """What a produced batch may hold besides a well-formed structure."""

    # Decompressed records above this are refused (MESSAGE_TOO_LARGE): a few hundred bytes
    # of zstd can claim gigabytes.
    max_uncompressed_bytes: int
    timestamp_after_max_ms: int | None = DEFAULT_TIMESTAMP_AFTER_MAX_MS
    timestamp_before_max_ms: int | None = DEFAULT_TIMESTAMP_BEFORE_MAX_MS


@dataclass(frozen=True, slots=True)
class ValidatedBatch:
    header: BatchHeader
    data: memoryview
    # Some record has a header named `kiln.offset` of the client's own: the hardener must
    # then never forward the batch, or that header would pass for Kiln's lineage.
    carries_kiln_header: bool
    # The values of the records' `kiln.reliability` headers (distinct; empty when none).
    reliability_names: frozenset[bytes] = frozenset()


def validate_produce_records(records: bytes | memoryview, *, now_ms: int,
                             limits: RecordLimits, api_version: int = 9
                             ) -> ValidatedBatch:
    """The one batch of a Produce request's partition, checked as Kafka's broker checks it;
    raises KafkaError with the code Kafka would answer (see INVALID_RECORD)."""
    batches = list(split_batches(records))
    if len(batches) != 1:
        raise KafkaError(INVALID_RECORD, "exactly one record batch per partition")
    header, view = batches[0]
    if header.base_offset != 0:
        raise KafkaError(INVALID_RECORD, f"base offset {header.base_offset}, not 0")
    if header.producer_id >= 0 and header.base_sequence < 0:
        raise KafkaError(INVALID_RECORD, f"sequence {header.base_sequence} with a producer id")
    if header.compression == CODEC_ZSTD and api_version < _MIN_PRODUCE_VERSION_FOR_ZSTD:
        raise KafkaError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
                         f"zstd needs Produce v{_MIN_PRODUCE_VERSION_FOR_ZSTD}+")
    flagged, levels = _check_records(header, view, now_ms, limits)
    return ValidatedBatch(header, view, flagged, levels)


def _check_records(header: BatchHeader, batch: memoryview, now_ms: int,
                   limits: RecordLimits) -> tuple[bool, frozenset[bytes]]:
    """Walk every record; (whether one carries a `kiln.offset` header, the values of their
    `kiln.reliability` headers)."""
    walkable = _uncompressed_batch(header, batch, limits.max_uncompressed_bytes)
    after = limits.timestamp_after_max_ms
    before = limits.timestamp_before_max_ms
    latest = None if after is None else now_ms + after
    earliest = None if before is None else now_ms - before
    log_append_time = bool(header.attributes & TIMESTAMP_TYPE_BIT)
    expected = header.base_offset
    flagged = False
    levels: set[bytes] = set()
    try:
        for chunk in _chunks(DefaultRecordBatch(walkable)):
            # Kafka rewrites uncompressed offsets in place and rebuilds compressed batches
            # whose deltas are not 0..n-1; Kiln stores and forwards batches whole, so such a
            # batch could only be refused.
            end = expected + len(chunk)
            if list(map(_offset, chunk)) != list(range(expected, end)):
                raise KafkaError(INVALID_RECORD, "record offset deltas are not 0..n-1")
            _check_timestamps(list(map(_timestamp, chunk)), expected - header.base_offset,
                              earliest, latest, log_append_time)
            expected = end
            headers = list(map(_headers, chunk))
            if any(headers):
                for record_headers in filter(None, headers):
                    for key, value in record_headers:
                        if key == KILN_OFFSET_HEADER:
                            flagged = True
                        elif key == KILN_RELIABILITY_KEY:
                            levels.add(value or b"")
    except CorruptRecordException as exc:
        # Kafka: InvalidRecordException (premature EOF, records left over, bad lengths).
        raise KafkaError(INVALID_RECORD, f"records do not match the batch header: {exc}"
                         ) from None
    except UnicodeDecodeError:
        # Kafka would take it; Kiln's hardener re-encodes header keys as text.
        raise KafkaError(INVALID_RECORD, "a record header key is not UTF-8") from None
    return flagged, frozenset(levels)


def _chunks(batch: DefaultRecordBatch) -> Iterator[list[Any]]:
    # aiokafka's batch asserts, each time it is asked for an iterator, that none of its
    # records was read yet; so it is asked once, then read through its `__next__` (a
    # callable iterator ends at StopIteration and, unlike the batch, is its own iterator).
    records = iter(iter(batch).__next__, None)
    while True:
        chunk = list(islice(records, _CHUNK))
        if chunk:
            yield chunk
        if len(chunk) < _CHUNK:
            return


def _check_timestamps(timestamps: list[int], first_index: int, earliest: int | None,
                      latest: int | None, log_append_time: bool) -> None:
    """LogValidator.validateTimestamp for a topic of CreateTime (Kiln's topics are)."""
    def refuse(i: int, why: str) -> KafkaError:
        return KafkaError(INVALID_TIMESTAMP, f"record {first_index + i}: {why}")

    if latest is not None and max(timestamps) > latest:
        i = next(i for i, t in enumerate(timestamps) if t > latest)
        raise refuse(i, f"timestamp {timestamps[i]} is after {latest}")
    if earliest is not None and min(timestamps) < earliest:
        for i, t in enumerate(timestamps):
            if t != _NO_TIMESTAMP and t < earliest:
                raise refuse(i, f"timestamp {t} is before {earliest}")
    if log_append_time and _NO_TIMESTAMP in timestamps:
        raise refuse(timestamps.index(_NO_TIMESTAMP), "producers may not set LogAppendTime")


def _uncompressed_batch(header: BatchHeader, batch: memoryview, limit: int) -> memoryview:
    """The batch as aiokafka can walk it without decompressing: header with the codec bits
    cleared, records uncompressed, padding after the end of the view."""
    payload = batch[HEADER_SIZE:]
    if header.compression == CODEC_NONE:
        buf = bytearray(batch)
    else:
        # Decompressed straight after a gap for the header: one copy of the records.
        buf = _decompress(header.compression, payload, limit, HEADER_SIZE)
        buf[:HEADER_SIZE] = batch[:HEADER_SIZE]
        ATTRIBUTES.pack_into(buf, ATTRIBUTES_AT, header.attributes & ~COMPRESSION_MASK)
    end = len(buf)
    buf += _PADDING
    return memoryview(buf)[:end]


def _too_large(limit: int) -> KafkaError:
    return KafkaError(ErrorCode.MESSAGE_TOO_LARGE,
                      f"records decompress to more than {limit} bytes")


def _decompress(codec: int, payload: memoryview, limit: int, gap: int) -> bytearray:
    """`gap` bytes of room, then the records of a compressed batch, never more than `limit`
    bytes of them."""
    try:
        if codec == CODEC_GZIP:
            return _gunzip(payload, limit, gap)
        if codec == CODEC_SNAPPY:
            return _unsnappy(payload, limit, gap)
        if codec == CODEC_LZ4:
            return _into_growing_buffer(cramjam.lz4.decompress_into, payload, limit, gap)
        if codec == CODEC_ZSTD:
            return _into_growing_buffer(cramjam.zstd.decompress_into, payload, limit, gap)
    except (zlib.error, RuntimeError, ValueError, cramjam.DecompressionError) as exc:
        # Kafka fails these with an IOException (UNKNOWN_SERVER_ERROR, an accident of
        # wrapping); the records are unreadable, so Kiln says so.
        raise KafkaError(INVALID_RECORD, f"records do not decompress: {exc}") from None
    raise KafkaError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"codec {codec}")


def _gunzip(payload: memoryview, limit: int, gap: int) -> bytearray:
    out = bytearray(gap)
    rest: bytes | memoryview = payload
    while True:  # Java's GZIPInputStream reads concatenated members on
        inflater = zlib.decompressobj(wbits=31)
        out += inflater.decompress(rest, limit + 1 - (len(out) - gap))
        if len(out) - gap > limit:
            raise _too_large(limit)
        if not inflater.eof:
            raise ValueError("gzip stream ends early")
        rest = inflater.unused_data
        if not rest:
            return out


def _unsnappy(payload: memoryview, limit: int, gap: int) -> bytearray:
    """Raw snappy (librdkafka) or xerial-framed blocks (Java clients); each block states its
    uncompressed length up front, so the limit is checked before anything is allocated."""
    if bytes(payload[:len(_XERIAL_MAGIC)]) != _XERIAL_MAGIC:
        blocks = [payload]
    else:
        blocks = []
        pos = _XERIAL_HEADER
        while pos < len(payload):
            if pos + _BLOCK_LENGTH.size > len(payload):
                raise ValueError("xerial block length cut short")
            size = _BLOCK_LENGTH.unpack_from(payload, pos)[0]
            pos += _BLOCK_LENGTH.size
            if size < 0 or pos + size > len(payload):
                raise ValueError("xerial block runs past the batch")
            blocks.append(payload[pos:pos + size])
            pos += size
    sizes = [cramjam.snappy.decompress_raw_len(block) for block in blocks]
    if sum(sizes) > limit:
        raise _too_large(limit)
    out = bytearray(gap + sum(sizes))
    pos = gap
    for block, size in zip(blocks, sizes, strict=True):
        if cramjam.snappy.decompress_raw_into(block, memoryview(out)[pos:pos + size]) != size:
            raise ValueError("snappy block shorter than it says")
        pos += size
    return out


def _into_growing_buffer(decompress_into: Callable[[Any, memoryview], int],
                         payload: memoryview, limit: int, gap: int) -> bytearray:
    """lz4 and zstd frames, into a buffer that grows (4x at a time, up to the limit) while
    it is too small: their frames need not state their size, and Java clients' streaming
    ones do not. Memory stays within the limit whatever the frame claims."""
    size = min(limit + 1, max(_FIRST_GUESS, 4 * len(payload)))
    while True:
        out = bytearray(gap + size)
        try:
            with memoryview(out) as view:
                written = decompress_into(payload, view[gap:])
        except cramjam.DecompressionError as exc:
            # cramjam tells a full buffer from bad data only by its message.
            if "whole buffer" not in str(exc):
                raise
            if size > limit:
                raise _too_large(limit) from None
            size = min(limit + 1, size * 4)
            continue
        if written > limit:
            raise _too_large(limit)
        del out[gap + written:]
        return out
