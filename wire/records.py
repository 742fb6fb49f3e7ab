"""Record batches opened up: forwarding or re-encoding survivors for the hardened store,
decoding them, and rebuilding hardened batches in Kiln offsets when they are read back
(read-through).

Every hardened record is traceable to its Kiln offset (DESIGN §5), one of two ways:

- its Kafka offset is its Kiln offset. A partition's Kiln and Kafka offsets start equal (a
  new topic starts both at 0; an adopted one starts Kiln's after Kafka's), and stay equal
  while every record is hardened. Then client batches are forwarded whole, as the client
  encoded and compressed them, with only the 61-byte header's producer fields and CRC
  rewritten: no record is decoded.
- a `kiln.offset` header (8 bytes big-endian) on the record. Once records were dropped
  (delivered before their delay ran out, or never to be hardened), the partition's Kafka
  offsets trail its Kiln offsets for good, and records are decoded and re-encoded with
  aiokafka's C record code, each gaining the header.

A record's Kiln offset is therefore its last `kiln.offset` header, or its Kafka offset when
it has none; recovery, read-through and the Spark jobs all read it so. Small client batches
are merged on the way, because a broker pays per batch.

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

from wire.batch import CONTROL_BIT, HEADER_SIZE, TIMESTAMP_TYPE_BIT, read_header
from wire.errors import ErrorCode, KafkaError
from wire.lineage import (
    KILN_OFFSET_HEADER,
    encode_kiln_offset,
    kiln_offset_of,
    take_kiln_offset,
)

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
_LEADER_EPOCH_AT = 12
_PRODUCER = struct.Struct(">qhi")  # producer_id, producer_epoch, base_sequence
_PRODUCER_AT = 43
# Client batches with fewer records and fewer bytes than these are merged when hardened, not
# forwarded: a broker pays per batch.
MIN_FORWARD_RECORDS = 64
MIN_FORWARD_BYTES = 16 * 1024

Header = tuple[str, bytes | None]

# A stored client batch to harden: (Kiln offset of its first record, the batch[, whether the
# client's records carry a `kiln.offset` header of their own, as produce validation found]).
SourceBatch = tuple[int, bytes] | tuple[int, bytes, bool]


@dataclass(frozen=True, slots=True)
class HardenedBatch:
    """One re-encoded batch, ready for a Produce request (base offset 0, CRC valid)."""

    data: bytes
    first_kiln_offset: int
    last_kiln_offset: int
    record_count: int
    # Its records carry `kiln.offset` headers; without, their Kafka offsets are their Kiln
    # offsets (the batch must land at Kafka offset first_kiln_offset).
    kiln_headers: bool = True
    forwarded: bool = False  # the client's batch as it was encoded, header rewritten


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
    sources: Sequence[SourceBatch],
    skip_below: int,
    *,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    max_batch_bytes: int,
    kafka_end: int | None = None,
) -> list[HardenedBatch]:
    """The batches that harden the records of client batches at or above Kiln offset
    `skip_below`, in order.

    Each source is (Kiln offset of the batch's first record, the client batch). Records keep
    their order, key, value, headers and timestamp. Their lineage (DESIGN §5) is one of two:

    - Kafka offset = Kiln offset. While the records continue the Kafka partition exactly
      (`kafka_end`, its next Kafka offset, is the first Kiln offset written, and no Kiln
      offset is skipped after it), the Kafka offset each record gets *is* its Kiln offset and
      it needs no header. A client batch of MIN_FORWARD_RECORDS records or MIN_FORWARD_BYTES
      (and at most `max_batch_bytes`) is then forwarded whole, as the client encoded and
      compressed it, with only its producer fields and CRC rewritten; smaller ones are
      merged.
    - A `kiln.offset` header. From the first Kiln offset that does not continue Kafka's
      offsets (records delivered and dropped, or not to be hardened; or `kafka_end` None)
      every record gets one, appended after the client's own. So do the records of a source
      flagged as carrying the client's own `kiln.offset` headers, even while aligned (they
      still land at Kafka offset = Kiln offset, and batches after them may be forwarded):
      forwarded, the client's header would be read as Kiln's.

    Re-encoded records are packed into batches of at most `max_batch_bytes` uncompressed (so
    compressed ones are smaller still; a single larger record gets a batch of its own), each
    compressed with the codec of the first of its source batches that was compressed (a
    client sends a batch that compression would not shrink uncompressed, so an uncompressed
    source does not mean the client wants none). Every batch is stamped with the
    producer and consecutive sequences.
    """
    return list(iter_hardened_batches(
        sources, skip_below, producer_id=producer_id, producer_epoch=producer_epoch,
        base_sequence=base_sequence, max_batch_bytes=max_batch_bytes, kafka_end=kafka_end,
    ))


def iter_hardened_batches(
    sources: Iterable[SourceBatch],
    skip_below: int,
    *,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    max_batch_bytes: int,
    kafka_end: int | None = None,
) -> Iterator[HardenedBatch]:
    """build_hardened_batches one batch at a time, so sending can start before the last one
    is built."""
    sequence = base_sequence % _SEQUENCE_MODULUS
    # The Kiln offset that keeps Kafka offset = Kiln offset; None once that is lost.
    aligned_next = kafka_end
    pending: list[tuple[int, bytes]] = []  # sources to re-encode, all in one lineage
    pending_headed = False

    def flush() -> Iterator[HardenedBatch]:
        nonlocal sequence
        for built in _reencoded(pending, skip_below, pending_headed, producer_id,
                                producer_epoch, sequence, max_batch_bytes):
            sequence = (sequence + built.record_count) % _SEQUENCE_MODULUS
            yield built
        pending.clear()

    for source in sources:
        kiln_base, batch = source[0], _checked_batch(source[1])
        # A client's own `kiln.offset` header would pass for Kiln's lineage in a forwarded
        # batch: such records are always re-encoded with Kiln's header appended last.
        client_headed = len(source) > 2 and bool(source[2])
        header = read_header(batch)
        if header.is_control or kiln_base + header.record_count <= skip_below:
            continue
        first = max(kiln_base, skip_below)
        if aligned_next is not None and first != aligned_next:
            aligned_next = None
        if aligned_next is not None:
            aligned_next = kiln_base + header.record_count
        if aligned_next is None or client_headed:
            # Headed records land wherever Kafka puts them; while aligned, that is still
            # at their Kiln offsets, so later batches may be forwarded again.
            if pending and not pending_headed:
                yield from flush()
            pending_headed = True
            pending.append((kiln_base, batch))
            continue
        if pending and pending_headed:
            yield from flush()
        pending_headed = False
        if first == kiln_base and len(batch) <= max_batch_bytes and (
                header.record_count >= MIN_FORWARD_RECORDS or len(batch) >= MIN_FORWARD_BYTES):
            yield from flush()
            yield HardenedBatch(
                forward_batch(batch, producer_id=producer_id, producer_epoch=producer_epoch,
                              base_sequence=sequence),
                kiln_base, aligned_next - 1, header.record_count,
                kiln_headers=False, forwarded=True,
            )
            sequence = (sequence + header.record_count) % _SEQUENCE_MODULUS
            continue
        pending.append((kiln_base, batch))
    yield from flush()


def forward_batch(batch: bytes, *, producer_id: int, producer_epoch: int,
                  base_sequence: int) -> bytes:
    """A client batch (CRC already checked) made ready for a Produce request from another
    producer: base offset 0, no leader epoch, the given producer fields, CRC recomputed.
    Attributes, timestamps and the records section stay as the client encoded them."""
    out = bytearray(batch)
    _INT64.pack_into(out, 0, 0)
    _LENGTH.pack_into(out, _LEADER_EPOCH_AT, -1)
    _PRODUCER.pack_into(out, _PRODUCER_AT, producer_id, producer_epoch, base_sequence)
    _CRC.pack_into(out, _CRC_AT, crc32c.crc32c(memoryview(out)[_ATTRIBUTES_AT:]))
    return bytes(out)


def _reencoded(sources: Sequence[tuple[int, bytes]], skip_below: int, kiln_headers: bool,
               producer_id: int, producer_epoch: int, base_sequence: int,
               max_batch_bytes: int) -> Iterator[HardenedBatch]:
    """Decode the records of checked client batches and build them into new batches, each
    record with a `kiln.offset` header when `kiln_headers`."""
    sequence = base_sequence
    builder: Any = None  # aiokafka's C builder (untyped)
    append: Any = None
    codec = CODEC_NONE
    count = 0
    first = last = -1

    for kiln_base, batch in sources:
        header = read_header(batch)
        delta_to_kiln = kiln_base - header.base_offset
        for record in DefaultRecordBatch(batch):
            kiln_offset = record.offset + delta_to_kiln
            if kiln_offset < skip_below:
                continue
            headers = record.headers  # a fresh list per decoded record: extending it is safe
            if kiln_headers:
                headers.append((KILN_OFFSET_HEADER, encode_kiln_offset(kiln_offset)))
            if append is not None:
                if append(count, record.timestamp, record.key, record.value, headers) is not None:
                    count += 1
                    last = kiln_offset
                    if codec == CODEC_NONE:
                        codec = header.compression
                    continue
                yield HardenedBatch(_finish(builder, codec), first, last, count, kiln_headers)
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
        yield HardenedBatch(_finish(builder, codec), first, last, count, kiln_headers)


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


def last_kiln_offset(record_set: bytes | memoryview) -> int | None:
    """The Kiln offset of the last data record in a fetched record set (its `kiln.offset`
    header, or its Kafka offset when it has none), or None if the set holds no data record.
    Kiln offsets increase along a hardened partition, so it is the largest one."""
    last: int | None = None
    for view in _whole_batches(record_set):
        if not _is_data_batch(view):
            continue
        for located in _located(_checked_batch(view)):
            last = located.kiln_offset if last is None else max(last, located.kiln_offset)
    return last


# --- Reading hardened records back, in Kiln offsets (read-through) -------------------------


@dataclass(frozen=True, slots=True)
class LocatedRecord:
    """A data record of a fetched Kafka record set, in both offset spaces."""

    kafka_offset: int
    kiln_offset: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class BatchSpan:
    """The first and last data record of one whole batch of a fetched record set."""

    first: LocatedRecord
    last: LocatedRecord
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class KilnRecordSet:
    """Fetched Kafka records rebuilt as batches whose record offsets are Kiln offsets.

    `last` is the last record put into `data`; `end_kafka_offset` the Kafka offset after the
    last whole input batch read through (None when there was none); `full` says the output
    reached its byte limit before the input's records ran out.
    """

    data: bytes
    record_count: int
    last: LocatedRecord | None
    end_kafka_offset: int | None
    full: bool


def _batch_end(view: memoryview) -> int:
    """The Kafka offset after a whole batch (any message format)."""
    if len(view) >= HEADER_SIZE and view[_MAGIC_AT] == 2:
        header = read_header(view)
        return header.base_offset + header.last_offset_delta + 1
    return int(_INT64.unpack_from(view, 0)[0]) + 1  # an older message set entry


def _located(batch: bytes) -> Iterator[LocatedRecord]:
    """Each record of a data batch with its Kiln offset: the `kiln.offset` header's, or for a
    record without one (written before Kiln adopted the topic) its Kafka offset."""
    for record in DefaultRecordBatch(batch):
        kiln_offset = kiln_offset_of(record.headers)
        yield LocatedRecord(record.offset, record.offset if kiln_offset is None
                            else kiln_offset, record.timestamp)


def batch_spans(record_set: bytes | memoryview) -> list[BatchSpan]:
    """The first and last record of each whole data batch (control batches and older message
    formats left out); raises KafkaError for a bad CRC."""
    spans: list[BatchSpan] = []
    for view in _whole_batches(record_set):
        if not _is_data_batch(view):
            continue
        batch = _checked_batch(view)
        first: LocatedRecord | None = None
        last: LocatedRecord | None = None
        for located in _located(batch):
            first = first or located
            last = located
        if first is not None and last is not None:
            spans.append(BatchSpan(first, last, read_header(batch).max_timestamp))
    return spans


def first_record_at_or_after(record_set: bytes | memoryview, kafka_offset: int,
                             min_timestamp: int | None = None) -> LocatedRecord | None:
    """The first data record at or after `kafka_offset` (and, if given, with a timestamp at
    or after `min_timestamp`)."""
    for view in _whole_batches(record_set):
        if not _is_data_batch(view):
            continue
        for located in _located(_checked_batch(view)):
            if located.kafka_offset >= kafka_offset and (
                    min_timestamp is None or located.timestamp >= min_timestamp):
                return located
    return None


def to_kiln_offsets(record_set: bytes | memoryview, from_kiln_offset: int, max_bytes: int, *,
                    at_least_one: bool = True) -> KilnRecordSet:
    """Rebuild fetched Kafka batches so that their record offsets are Kiln offsets.

    Records below `from_kiln_offset`, and any whose Kiln offset is not above the last one
    taken (a sequence that is not monotonic), are dropped; Kiln's `kiln.offset` header is
    stripped. Each input batch becomes one uncompressed batch (more if the limit cuts it)
    whose base offset is its first Kiln offset; offset deltas have gaps where Kiln offsets
    do, as after compaction. Keys, values, other headers, timestamps and the timestamp type
    are kept. The output stays within `max_bytes`, except that with `at_least_one` the first
    record is always taken.
    """
    out = bytearray()
    count = 0
    floor = from_kiln_offset  # the lowest Kiln offset still to be taken
    last_kafka = last_timestamp = -1
    end: int | None = None
    full = False
    for view in _whole_batches(record_set):
        if not _is_data_batch(view):
            end = _batch_end(view)
            continue
        batch = _checked_batch(view)
        header = read_header(batch)
        builder: Any = None
        append: Any = None
        base = 0
        for record in DefaultRecordBatch(batch):
            headers = record.headers
            kiln_offset = take_kiln_offset(headers) if headers else None
            if kiln_offset is None:
                kiln_offset = record.offset
            if kiln_offset < floor:
                continue
            timestamp = record.timestamp
            if append is None:
                room = max_bytes - len(out)
                base = kiln_offset
                builder = DefaultRecordBatchBuilder(2, CODEC_NONE, 0, -1, -1, -1, max(room, 0))
                append = builder.append
                append(0, timestamp, record.key, record.value, headers)
                if builder.size() > room and (count or not at_least_one):
                    builder = None  # not even this record fits
                    full = True
                    break
            elif append(kiln_offset - base, timestamp, record.key, record.value,
                        headers) is None:
                full = True
                break
            count += 1
            floor = kiln_offset + 1
            last_kafka, last_timestamp = record.offset, timestamp
        if builder is not None:
            out += _as_read_batch(builder.build(), base, header.attributes & TIMESTAMP_TYPE_BIT)
        if full:
            break
        end = header.base_offset + header.last_offset_delta + 1
    last = LocatedRecord(last_kafka, floor - 1, last_timestamp) if count else None
    return KilnRecordSet(bytes(out), count, last, end, full)


def _as_read_batch(built: bytearray, base_offset: int, timestamp_type: int) -> bytearray:
    """A built batch given its base offset (outside the CRC) and the source's timestamp type
    (LogAppendTime when the topic uses it)."""
    _INT64.pack_into(built, 0, base_offset)
    if timestamp_type:
        attributes = _ATTRIBUTES.unpack_from(built, _ATTRIBUTES_AT)[0] | timestamp_type
        _ATTRIBUTES.pack_into(built, _ATTRIBUTES_AT, attributes)
        _CRC.pack_into(built, _CRC_AT, crc32c.crc32c(memoryview(built)[_ATTRIBUTES_AT:]))
    return built
