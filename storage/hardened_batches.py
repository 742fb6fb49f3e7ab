"""The hardened topic's batches: how Kiln writes stored client batches there (forwarded whole,
or re-encoded with its `kiln.offset` header) and reads them back in Kiln offsets. The lineage
rule itself is wire/lineage.py's; the I/O, hardened_store.py's and read_through.py's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from wire.batch import CODEC_NONE, TIMESTAMP_TYPE_BIT, read_header, with_producer
from wire.lineage import kiln_offset_header, lineage_offset, take_kiln_offset
from wire.records import (
    Append,
    BatchBuilder,
    batch_end,
    checked_batch,
    is_data_batch,
    records_of,
    whole_batches,
)

SEQUENCE_MODULUS = 1 << 31  # producer sequences wrap around to 0 past 2^31 - 1
# Client batches with fewer records and fewer bytes than these are merged when hardened, not
# forwarded: a broker pays per batch.
MIN_FORWARD_RECORDS = 64
MIN_FORWARD_BYTES = 16 * 1024

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


def iter_hardened_batches(
    sources: Iterable[SourceBatch],
    skip_below: int,
    *,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    max_batch_bytes: int,
    kafka_end: int | None = None,
    transactional: bool = False,
) -> Iterator[HardenedBatch]:
    """The batches that harden the records of client batches at or above Kiln offset
    `skip_below`, in order, one at a time (sending can start before the last one is built).

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

    `transactional` batches are written inside a Kafka transaction (the hardening lane's):
    each is marked so, and every record carries a header, since the commit markers Kafka
    puts between passes take offsets of their own.
    """
    sequence = base_sequence % SEQUENCE_MODULUS
    # The Kiln offset that keeps Kafka offset = Kiln offset; None once that is lost.
    aligned_next = None if transactional else kafka_end
    pending: list[tuple[int, bytes]] = []  # sources to re-encode, all in one lineage
    pending_headed = False

    def flush() -> Iterator[HardenedBatch]:
        nonlocal sequence
        for built in _reencoded(pending, skip_below, pending_headed, producer_id,
                                producer_epoch, sequence, max_batch_bytes, transactional):
            sequence = (sequence + built.record_count) % SEQUENCE_MODULUS
            yield built
        pending.clear()

    for source in sources:
        kiln_base, batch = source[0], checked_batch(source[1])
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
                with_producer(batch, producer_id=producer_id, producer_epoch=producer_epoch,
                              base_sequence=sequence),
                kiln_base, aligned_next - 1, header.record_count,
                kiln_headers=False, forwarded=True,
            )
            sequence = (sequence + header.record_count) % SEQUENCE_MODULUS
            continue
        pending.append((kiln_base, batch))
    yield from flush()


def _reencoded(sources: Sequence[tuple[int, bytes]], skip_below: int, kiln_headers: bool,
               producer_id: int, producer_epoch: int, base_sequence: int,
               max_batch_bytes: int, transactional: bool = False) -> Iterator[HardenedBatch]:
    """Decode the records of checked client batches and build them into new batches, each
    record with a `kiln.offset` header when `kiln_headers`."""
    sequence = base_sequence
    builder: BatchBuilder | None = None
    append: Append | None = None  # builder.append, held apart: it is called per record
    codec = CODEC_NONE
    count = 0
    first = last = -1

    for kiln_base, batch in sources:
        header = read_header(batch)
        delta_to_kiln = kiln_base - header.base_offset
        for record in records_of(batch):
            kiln_offset = record.offset + delta_to_kiln
            if kiln_offset < skip_below:
                continue
            headers = record.headers  # a fresh list per decoded record: extending it is safe
            if kiln_headers:
                headers.append(kiln_offset_header(kiln_offset))
            if builder is not None and append is not None:
                if append(count, record.timestamp, record.key, record.value, headers) is not None:
                    count += 1
                    last = kiln_offset
                    if codec == CODEC_NONE:
                        codec = header.compression
                    continue
                yield HardenedBatch(bytes(builder.build(codec)), first, last, count, kiln_headers)
                sequence = (sequence + count) % SEQUENCE_MODULUS
            codec = header.compression
            builder = BatchBuilder(max_batch_bytes, producer_id=producer_id,
                                   producer_epoch=producer_epoch, base_sequence=sequence,
                                   transactional=transactional)
            append = builder.append
            # The first record always fits, however large.
            append(0, record.timestamp, record.key, record.value, headers)
            count = 1
            first = last = kiln_offset
    if builder is not None:
        yield HardenedBatch(bytes(builder.build(codec)), first, last, count, kiln_headers)


# --- Reading hardened records back, in Kiln offsets (read-through, recovery) -----------


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


def _data_batches(record_set: bytes | memoryview) -> Iterator[bytes]:
    """Each whole data batch of a record set, checked (control batches and older message
    formats left out); raises KafkaError for a bad CRC."""
    for view in whole_batches(record_set):
        if is_data_batch(view):
            yield checked_batch(view)


def _located(batch: bytes) -> Iterator[LocatedRecord]:
    """Each record of a data batch with its Kiln offset: the `kiln.offset` header's, or for a
    record without one (written before Kiln adopted the topic) its Kafka offset."""
    for record in records_of(batch):
        yield LocatedRecord(record.offset, lineage_offset(record.headers, record.offset),
                            record.timestamp)


def batch_spans(record_set: bytes | memoryview) -> list[BatchSpan]:
    """The first and last record of each whole data batch (see _data_batches)."""
    spans: list[BatchSpan] = []
    for batch in _data_batches(record_set):
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
    for batch in _data_batches(record_set):
        for located in _located(batch):
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
    for view in whole_batches(record_set):
        if not is_data_batch(view):
            end = batch_end(view)
            continue
        batch = checked_batch(view)
        header = read_header(batch)
        builder: BatchBuilder | None = None
        append: Append | None = None  # builder.append, held apart: it is called per record
        base = 0
        for record in records_of(batch):
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
                builder = BatchBuilder(max(room, 0))
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
            out += builder.build(base_offset=base,
                                 timestamp_type=header.attributes & TIMESTAMP_TYPE_BIT)
        if full:
            break
        end = batch_end(view)
    last = LocatedRecord(last_kafka, floor - 1, last_timestamp) if count else None
    return KilnRecordSet(bytes(out), count, last, end, full)


def last_kiln_offset(record_set: bytes | memoryview) -> int | None:
    """The Kiln offset of the last data record in a fetched record set (its `kiln.offset`
    header, or its Kafka offset when it has none), or None if the set holds no data record.
    Kiln offsets increase along a hardened partition, so it is the largest one."""
    last: int | None = None
    for batch in _data_batches(record_set):
        for located in _located(batch):
            last = located.kiln_offset if last is None else max(last, located.kiln_offset)
    return last
