"""End-transaction markers (Kafka's control batches), and the filter a read_committed
consumer applies to a fetched record set.

Kiln writes a marker into a partition's log when a transaction ends, as a Kafka broker does
when the coordinator's WriteTxnMarkers reaches it, and reads record sets back from Kafka in
which markers and aborted transactions are interleaved with data.

Sources read (apache/kafka trunk, Oct 2024): `MemoryRecords.writeEndTransactionalMarker`,
`MemoryRecordsBuilder.appendEndTxnMarker`, `EndTransactionMarker`, `ControlRecordType`,
`ProducerAppendInfo.append` (an empty control batch is one compaction emptied), and the
consumer's `CompletedFetch` (`nextFetchedRecord`, `consumeAbortedTransactionsUpTo`,
`isBatchAborted`, `containsAbortMarker`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import CorruptRecordException
from aiokafka.record._crecords import DefaultRecordBatch, DefaultRecordBatchBuilder

from wire.batch import (
    ATTRIBUTES,
    ATTRIBUTES_AT,
    CODEC_NONE,
    CONTROL_BIT,
    HEADER_SIZE,
    MAGIC_AT,
    NO_PRODUCER_ID,
    TRANSACTIONAL_BIT,
    BatchHeader,
    read_header,
    set_crc,
)
from wire.errors import ErrorCode, KafkaError
from wire.records import checked_batch, whole_batches

# ControlRecordType ids. Kafka also has KRaft types (2..6) that only its metadata log holds;
# consumers ignore any type they do not know, and so does parse_marker.
ABORT = 0
COMMIT = 1

_KEY = struct.Struct(">hh")  # version, type
_VALUE = struct.Struct(">hi")  # version, coordinator_epoch
_MARKER_VERSION = 0
_NO_SEQUENCE = -1
_MARKER_BATCH_BYTES = 1024  # the builder's limit; a marker takes 78
# aiokafka's C reader bounds-checks records but not the varints inside them (see
# wire/validation.py): it is only ever given a view with this much padding after its end.
_PADDING = bytes(16)


@dataclass(frozen=True, slots=True)
class Marker:
    """What an end-transaction marker says: how the producer's transaction ended."""

    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int


def build_marker(producer_id: int, producer_epoch: int, *, commit: bool, timestamp_ms: int,
                 coordinator_epoch: int = 0) -> bytes:
    """The control batch Kafka's broker writes to end a transaction, at base offset 0 (Kiln
    sets the offset when it serves the batch), with no partition leader epoch; CRC valid."""
    if producer_id <= NO_PRODUCER_ID:
        # Kafka's builder refuses this too: a marker ends some producer's transaction.
        raise ValueError(f"a marker needs a producer id, not {producer_id}")
    builder: Any = DefaultRecordBatchBuilder(
        2, CODEC_NONE, 1, producer_id, producer_epoch, _NO_SEQUENCE, _MARKER_BATCH_BYTES)
    builder.append(0, timestamp_ms, _KEY.pack(_MARKER_VERSION, COMMIT if commit else ABORT),
                   _VALUE.pack(_MARKER_VERSION, coordinator_epoch), [])
    batch: bytearray = builder.build()
    # aiokafka's builder has no control flag; uncompressed and CreateTime are the zero bits.
    ATTRIBUTES.pack_into(batch, ATTRIBUTES_AT, TRANSACTIONAL_BIT | CONTROL_BIT)
    set_crc(batch)
    return bytes(batch)


def batch_is_control(batch: bytes | memoryview) -> bool:
    """A v2 batch whose attributes mark it as a control batch."""
    return bool(_attributes(batch) & CONTROL_BIT)


def batch_is_transactional(batch: bytes | memoryview) -> bool:
    """A v2 batch whose attributes mark it as part of a transaction (markers are too)."""
    return bool(_attributes(batch) & TRANSACTIONAL_BIT)


def parse_marker(batch: bytes | memoryview) -> Marker | None:
    """The end-transaction marker a batch carries, or None: for a data batch, an older
    message format, a control batch compaction has emptied, or a control type other than
    ABORT or COMMIT. A control batch that fails its CRC raises KafkaError(CORRUPT_MESSAGE);
    one whose record is malformed, KafkaError(INVALID_RECORD), as Kafka's
    InvalidRecordException."""
    if not batch_is_control(batch):
        return None
    checked = checked_batch(batch)
    header = read_header(checked)
    control_type, value = _first_control_record(header, checked)
    if control_type not in (ABORT, COMMIT):
        return None
    if value is None or len(value) < _VALUE.size:
        raise KafkaError(ErrorCode.INVALID_RECORD,
                         f"end transaction marker value of {_size(value)} bytes")
    version, coordinator_epoch = _VALUE.unpack_from(value)
    if version < 0:
        raise KafkaError(ErrorCode.INVALID_RECORD, f"end transaction marker version {version}")
    # Later value versions are read as version 0, as Kafka reads them.
    return Marker(header.producer_id, header.producer_epoch, control_type == COMMIT,
                  coordinator_epoch)


def committed_batches(record_set: bytes | memoryview,
                      aborted: Sequence[tuple[int, int]]) -> bytes:
    """A read_committed fetch's record set as a Kafka consumer reads it: control batches
    gone, and the transactional batches of aborted transactions gone. `aborted` is the
    partition's aborted transactions from the fetch response, (producer_id, first_offset).

    Kept batches are returned byte for byte, and so is a truncated last batch (a fetch may
    end inside one). Only control batches are decoded, and their CRC checked; a bad one
    raises KafkaError as parse_marker does.
    """
    # The consumer's algorithm: a producer becomes aborted once a batch reaches the first
    # offset of one of its aborted transactions, and stays so until its ABORT marker.
    # Offsets are what decide it, not the order of the list.
    pending = sorted(aborted, key=lambda txn: txn[1])
    next_pending = 0
    aborted_producers: set[int] = set()
    view = memoryview(record_set)
    kept: list[memoryview] = []
    end = 0
    for batch in whole_batches(view):
        end += len(batch)
        if len(batch) < HEADER_SIZE or batch[MAGIC_AT] != 2:
            kept.append(batch)  # an older message format: no producer, no transaction
            continue
        header = read_header(batch)
        if header.producer_id > NO_PRODUCER_ID:
            # A batch's last offset, not its base offset, as the consumer compares.
            last_offset = header.base_offset + header.last_offset_delta
            while next_pending < len(pending) and pending[next_pending][1] <= last_offset:
                aborted_producers.add(pending[next_pending][0])
                next_pending += 1
            if header.is_control:
                if _is_abort(batch):
                    aborted_producers.discard(header.producer_id)
            elif header.is_transactional and header.producer_id in aborted_producers:
                continue
        if not header.is_control:
            kept.append(batch)
    kept.append(view[end:])
    return b"".join(kept)


def _attributes(batch: bytes | memoryview) -> int:
    """A v2 batch's attributes; none set for an older message format or a fragment."""
    if len(batch) < HEADER_SIZE or batch[MAGIC_AT] != 2:
        return 0
    return int(ATTRIBUTES.unpack_from(batch, ATTRIBUTES_AT)[0])


def _is_abort(batch: memoryview) -> bool:
    """A control batch ends an aborted transaction (its first record says ABORT)."""
    checked = checked_batch(batch)
    return _first_control_record(read_header(checked), checked)[0] == ABORT


def _first_control_record(header: BatchHeader, batch: bytes) -> tuple[int | None, bytes | None]:
    """(control type, value) of a control batch's first record, as Kafka reads a marker:
    only that record counts. (None, None) when compaction left the batch empty."""
    if header.compression != CODEC_NONE:
        # Kafka writes markers uncompressed and never compresses a control batch later.
        raise KafkaError(ErrorCode.INVALID_RECORD, "compressed control batch")
    padded = memoryview(batch + _PADDING)[: len(batch)]
    try:
        record = next(iter(DefaultRecordBatch(padded)), None)
    except CorruptRecordException as exc:
        raise KafkaError(ErrorCode.INVALID_RECORD, f"control record: {exc}") from None
    if record is None:
        return None, None
    key: bytes | None = record.key
    if key is None or len(key) < _KEY.size:
        raise KafkaError(ErrorCode.INVALID_RECORD, f"control record key of {_size(key)} bytes")
    version, control_type = _KEY.unpack_from(key)
    if version < 0:
        raise KafkaError(ErrorCode.INVALID_RECORD, f"control record key version {version}")
    value: bytes | None = record.value
    return int(control_type), value


def _size(field: bytes | None) -> str:
    return "null" if field is None else str(len(field))
