"""End-transaction markers and the read_committed filter: marker bytes as Kafka writes them
and as third-party readers decode them; committed_batches on hand-built record sets, and
against kafka-python's own read_committed consumer on generated logs."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka.record import default_records as aiokafka_records
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.consumer.fetcher import Fetcher
from kafka.protocol.consumer import IsolationLevel
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch
from kafka.structs import TopicPartition

from wire.batch import (
    ATTRIBUTES,
    ATTRIBUTES_AT,
    CONTROL_BIT,
    HEADER_SIZE,
    MAGIC_AT,
    as_served,
    read_header,
    set_crc,
    with_base_offset,
)
from wire.errors import ErrorCode, KafkaError
from wire.records import decode_records
from wire.txn_markers import (
    Marker,
    batch_is_control,
    batch_is_transactional,
    build_marker,
    committed_batches,
    parse_marker,
)

NOW_MS = 1_700_000_000_000

# Kafka 4.4's MemoryRecords.withEndTransactionMarker(0, timestamp, NO_PARTITION_LEADER_EPOCH,
# producerId, producerEpoch, new EndTransactionMarker(type, coordinatorEpoch)), hex.
KAFKA_COMMIT = bytes.fromhex(  # producer 7, epoch 3, COMMIT, coordinator epoch 5, NOW_MS
    "000000000000000000000042ffffffff02c60df61d0030000000000000018bcfe568000000018bcfe568"
    "0000000000000000070003ffffffff000000012000000008000000010c00000000000500")
KAFKA_ABORT = bytes.fromhex(  # producer 123456789012, epoch 0, ABORT, coordinator epoch 0, 1
    "000000000000000000000042ffffffff0209f0958c00300000000000000000000000010000000000000001"
    "0000001cbe991a140000ffffffff000000012000000008000000000c00000000000000")

P1, P2, P3 = 1001, 1002, 1003


def data_batch(base_offset: int, producer_id: int = -1, *, transactional: bool = False,
               count: int = 1) -> bytes:
    """A client-built v2 batch of `count` records, placed at `base_offset`."""
    builder = aiokafka_records.DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=int(transactional),
        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1, batch_size=1 << 20)
    for i in range(count):
        builder.append(i, timestamp=NOW_MS + i, key=None, value=b"v%d" % (base_offset + i),
                       headers=[])
    return with_base_offset(bytes(builder.build()), base_offset)


def marker_at(offset: int, producer_id: int, *, commit: bool) -> bytes:
    return with_base_offset(build_marker(producer_id, 0, commit=commit, timestamp_ms=NOW_MS),
                            offset)


def control_batch(records: list[tuple[bytes | None, bytes | None]]) -> bytes:
    """A transactional control batch holding exactly the given (key, value) records."""
    builder = aiokafka_records.DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=1, producer_id=P1, producer_epoch=0,
        base_sequence=-1, batch_size=1 << 20)
    for i, (key, value) in enumerate(records):
        builder.append(i, timestamp=NOW_MS, key=key, value=value, headers=[])
    batch = builder.build()
    ATTRIBUTES.pack_into(batch, ATTRIBUTES_AT,
                         ATTRIBUTES.unpack_from(batch, ATTRIBUTES_AT)[0] | CONTROL_BIT)
    set_crc(batch)
    return bytes(batch)


def offsets_of(record_set: bytes) -> list[int]:
    return [record.offset for record in decode_records(record_set)]


# --- marker bytes -----------------------------------------------------------------------


def test_marker_bytes_are_the_ones_kafka_writes() -> None:
    # Given / When
    commit = build_marker(7, 3, commit=True, timestamp_ms=NOW_MS, coordinator_epoch=5)
    abort = build_marker(123456789012, 0, commit=False, timestamp_ms=1)

    # Then
    assert commit == KAFKA_COMMIT
    assert abort == KAFKA_ABORT


@pytest.mark.parametrize("reader", [aiokafka_records.DefaultRecordBatch,
                                    aiokafka_records._DefaultRecordBatchPy],
                         ids=["aiokafka-c", "aiokafka-py"])
@pytest.mark.parametrize("commit", [True, False])
def test_aiokafka_decodes_the_marker(reader: Any, commit: bool) -> None:
    # Given
    marker = build_marker(42, 7, commit=commit, timestamp_ms=NOW_MS, coordinator_epoch=9)

    # When
    batch = reader(marker)
    crc_valid = batch.validate_crc()  # readers check it before iterating
    records = list(batch)

    # Then
    assert crc_valid
    assert batch.is_control_batch
    assert batch.is_transactional
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (42, 7, -1)
    assert (batch.base_offset, batch.compression_type, batch.timestamp_type) == (0, 0, 0)
    assert len(records) == 1
    assert records[0].key == struct.pack(">hh", 0, 1 if commit else 0)
    assert records[0].value == struct.pack(">hi", 0, 9)
    assert records[0].timestamp == NOW_MS
    assert records[0].headers == []


@pytest.mark.parametrize("commit", [True, False])
def test_kafka_python_decodes_the_marker(commit: bool) -> None:
    # Given
    marker = build_marker(42, 7, commit=commit, timestamp_ms=NOW_MS, coordinator_epoch=9)

    # When
    batch = KafkaPythonBatch(marker)
    crc_valid = batch.validate_crc()  # readers check it before iterating
    records = list(batch)

    # Then
    assert crc_valid
    assert batch.is_control_batch
    assert batch.is_transactional
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (42, 7, -1)
    assert len(records) == 1
    assert (records[0].version, records[0].commit, records[0].abort) == (0, commit, not commit)
    assert records[0].value == struct.pack(">hi", 0, 9)
    assert records[0].timestamp == NOW_MS


def test_a_producer_id_is_required() -> None:
    with pytest.raises(ValueError):
        build_marker(-1, 0, commit=True, timestamp_ms=NOW_MS)


# --- parse_marker -----------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(producer_id=st.integers(0, 2**63 - 1), producer_epoch=st.integers(0, 2**15 - 1),
       commit=st.booleans(), coordinator_epoch=st.integers(-(2**31), 2**31 - 1),
       timestamp_ms=st.integers(0, 2**48), base_offset=st.integers(0, 2**62),
       leader_epoch=st.integers(-1, 2**31 - 1))
def test_parse_marker_reads_back_what_build_marker_wrote(
        producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
        timestamp_ms: int, base_offset: int, leader_epoch: int) -> None:
    # Given a marker as Kiln serves it: offset and leader epoch set, outside the CRC
    marker = as_served(build_marker(producer_id, producer_epoch, commit=commit,
                                    timestamp_ms=timestamp_ms,
                                    coordinator_epoch=coordinator_epoch),
                       base_offset, leader_epoch)

    # When
    parsed = parse_marker(marker)

    # Then
    assert parsed == Marker(producer_id, producer_epoch, commit, coordinator_epoch)


def test_parse_marker_of_kafkas_bytes() -> None:
    assert parse_marker(KAFKA_ABORT) == Marker(123456789012, 0, False, 0)


def test_a_data_batch_carries_no_marker() -> None:
    assert parse_marker(data_batch(0, P1, transactional=True)) is None


def test_an_older_message_format_carries_no_marker() -> None:
    # Given a marker's bytes with magic 1: the attributes are no longer a v2 header's
    batch = bytearray(build_marker(7, 0, commit=True, timestamp_ms=NOW_MS))
    batch[MAGIC_AT] = 1

    # When / Then
    assert parse_marker(bytes(batch)) is None


def test_a_control_batch_emptied_by_compaction_carries_no_marker() -> None:
    assert parse_marker(control_batch([])) is None


def test_a_control_type_other_than_commit_or_abort_is_not_a_marker() -> None:
    # LEADER_CHANGE (2): a KRaft control record, ignored by consumers
    assert parse_marker(control_batch([(struct.pack(">hh", 0, 2), b"")])) is None


def test_only_the_first_record_counts_and_later_value_versions_read_as_zero() -> None:
    # Given a control batch Kafka would read as COMMIT at coordinator epoch 3
    batch = control_batch([(struct.pack(">hh", 1, 1), struct.pack(">hi", 2, 3) + b"more"),
                           (None, None)])

    # When / Then
    assert parse_marker(batch) == Marker(P1, 0, True, 3)


@pytest.mark.parametrize(("key", "value"), [
    (None, struct.pack(">hi", 0, 0)),
    (b"\x00\x00\x01", struct.pack(">hi", 0, 0)),
    (struct.pack(">hh", -1, 1), struct.pack(">hi", 0, 0)),
    (struct.pack(">hh", 0, 1), None),
    (struct.pack(">hh", 0, 0), b"\x00\x00\x00\x00\x00"),
    (struct.pack(">hh", 0, 1), struct.pack(">hi", -1, 0)),
], ids=["null key", "short key", "negative key version", "null value", "short value",
        "negative value version"])
def test_a_malformed_marker_record_is_an_invalid_record(key: bytes | None,
                                                        value: bytes | None) -> None:
    # Given
    batch = control_batch([(key, value)])

    # When
    with pytest.raises(KafkaError) as raised:
        parse_marker(batch)

    # Then
    assert raised.value.error_code is ErrorCode.INVALID_RECORD


def test_a_control_record_running_past_its_batch_is_an_invalid_record() -> None:
    # Given a marker whose record claims 32 bytes where 16 follow (CRC restated)
    batch = bytearray(build_marker(7, 0, commit=True, timestamp_ms=NOW_MS))
    batch[HEADER_SIZE] = 32 << 1  # zigzag varint
    set_crc(batch)

    # When
    with pytest.raises(KafkaError) as raised:
        parse_marker(bytes(batch))

    # Then
    assert raised.value.error_code is ErrorCode.INVALID_RECORD


def test_a_marker_failing_its_crc_is_corrupt() -> None:
    # Given
    batch = bytearray(build_marker(7, 0, commit=True, timestamp_ms=NOW_MS))
    batch[-2] ^= 0xFF

    # When
    with pytest.raises(KafkaError) as raised:
        parse_marker(bytes(batch))

    # Then
    assert raised.value.error_code is ErrorCode.CORRUPT_MESSAGE


# --- attributes ---------------------------------------------------------------------------


@pytest.mark.parametrize(("batch", "control", "transactional"), [
    (build_marker(7, 0, commit=False, timestamp_ms=NOW_MS), True, True),
    (data_batch(0, P1, transactional=True), False, True),
    (data_batch(0, P1), False, False),
    (data_batch(0), False, False),
    (build_marker(7, 0, commit=False, timestamp_ms=NOW_MS)[:30], False, False),
], ids=["marker", "transactional", "idempotent", "plain", "fragment"])
def test_attributes_of_a_batch(batch: bytes, control: bool, transactional: bool) -> None:
    assert (batch_is_control(batch), batch_is_transactional(batch)) == (control, transactional)


# --- committed_batches on hand-built record sets ----------------------------------------


def test_interleaved_producers_keep_the_committed_one() -> None:
    # Given P1 aborts and P2 commits, their batches interleaved, a plain batch between
    p1_a = data_batch(0, P1, transactional=True, count=2)
    p2_a = data_batch(2, P2, transactional=True)
    plain = data_batch(3)
    p1_b = data_batch(4, P1, transactional=True)
    p2_b = data_batch(5, P2, transactional=True, count=3)
    record_set = b"".join([p1_a, p2_a, plain, p1_b, p2_b, marker_at(8, P2, commit=True),
                           marker_at(9, P1, commit=False)])

    # When
    kept = committed_batches(record_set, [(P1, 0)])

    # Then
    assert kept == p2_a + plain + p2_b
    assert offsets_of(kept) == [2, 3, 5, 6, 7]


def test_an_aborted_producers_next_transaction_is_kept_when_committed() -> None:
    # Given P1 aborts a transaction, then commits a new one; P3 writes idempotently between
    aborted = [data_batch(0, P1, transactional=True), data_batch(1, P1, transactional=True)]
    idempotent = data_batch(2, P3)
    committed = data_batch(4, P1, transactional=True, count=2)
    record_set = b"".join([*aborted, idempotent, marker_at(3, P1, commit=False), committed,
                           marker_at(6, P1, commit=True)])

    # When
    kept = committed_batches(record_set, [(P1, 0)])

    # Then
    assert kept == idempotent + committed


def test_aborted_transactions_are_applied_in_offset_order_whatever_the_list_order() -> None:
    # Given P1: aborted at 0, committed at 2, aborted again at 4
    first = data_batch(0, P1, transactional=True)
    second = data_batch(2, P1, transactional=True)
    third = data_batch(4, P1, transactional=True)
    record_set = b"".join([first, marker_at(1, P1, commit=False), second,
                           marker_at(3, P1, commit=True), third,
                           marker_at(5, P1, commit=False)])

    # When
    kept = committed_batches(record_set, [(P1, 4), (P1, 0)])

    # Then
    assert kept == second


def test_a_fetch_starting_inside_an_aborted_transaction_drops_its_rest() -> None:
    # Given the record set starts at offset 10; P1's aborted transaction began at 7
    p1 = data_batch(10, P1, transactional=True)
    p2 = data_batch(11, P2, transactional=True)
    record_set = b"".join([p1, p2, marker_at(12, P1, commit=False),
                           marker_at(13, P2, commit=True)])

    # When
    kept = committed_batches(record_set, [(P1, 7)])

    # Then
    assert kept == p2


def test_a_transaction_aborted_after_the_record_set_is_still_dropped() -> None:
    # Given a read_committed fetch stops at the LSO: the list names what the set holds
    p1 = data_batch(0, P1, transactional=True)
    plain = data_batch(1)

    # When
    kept = committed_batches(p1 + plain, [(P1, 0)])

    # Then
    assert kept == plain


def test_without_aborted_transactions_only_control_batches_go() -> None:
    # Given
    p1 = data_batch(0, P1, transactional=True)
    plain = data_batch(1, count=2)
    record_set = b"".join([p1, plain, marker_at(3, P1, commit=False),
                           marker_at(4, P2, commit=True)])

    # When
    kept = committed_batches(record_set, [])

    # Then
    assert kept == p1 + plain


def test_a_truncated_last_batch_is_kept_as_is() -> None:
    # Given a fetch that ended inside P2's batch
    p1 = data_batch(0, P1, transactional=True)
    partial = data_batch(2, P2, transactional=True, count=4)[:40]
    record_set = p1 + marker_at(1, P1, commit=False) + partial

    # When
    kept = committed_batches(record_set, [(P1, 0)])

    # Then
    assert kept == partial


def test_a_record_set_with_nothing_to_drop_comes_back_unchanged() -> None:
    record_set = data_batch(0, P1, transactional=True) + data_batch(1, count=3)

    assert committed_batches(memoryview(record_set), [(P2, 0)]) == record_set


def test_a_malformed_marker_in_a_record_set_is_an_invalid_record() -> None:
    # Given a control batch whose key is cut short, after P1's data
    record_set = data_batch(0, P1, transactional=True) + with_base_offset(
        control_batch([(b"\x00", b"")]), 1)

    # When
    with pytest.raises(KafkaError) as raised:
        committed_batches(record_set, [(P1, 0)])

    # Then
    assert raised.value.error_code is ErrorCode.INVALID_RECORD


# --- committed_batches against kafka-python's read_committed consumer --------------------


@dataclass
class _Log:
    """A partition's log as a broker writes it, and the aborted index it keeps."""

    batches: list[bytes] = field(default_factory=list)
    # Per data batch: whether a read_committed consumer sees it (None until its txn ends).
    visible: list[bool | None] = field(default_factory=list)
    # (producer_id, first_offset, marker offset) of every aborted transaction.
    aborted: list[tuple[int, int, int]] = field(default_factory=list)
    next_offset: int = 0
    # producer -> (first offset, indexes of its batches) of its open transaction
    open: dict[int, tuple[int, list[int]]] = field(default_factory=dict)

    def append(self, batch: bytes, visible: bool | None) -> None:
        self.batches.append(batch)
        self.visible.append(visible)
        self.next_offset = read_header(batch).base_offset + read_header(batch).record_count

    def data(self, producer_id: int, count: int) -> None:
        _, members = self.open.setdefault(producer_id, (self.next_offset, []))
        members.append(len(self.batches))
        self.append(data_batch(self.next_offset, producer_id, transactional=True, count=count),
                    None)

    def plain(self, count: int) -> None:
        self.append(data_batch(self.next_offset, count=count), True)

    def end(self, producer_id: int, commit: bool) -> None:
        if producer_id not in self.open:
            return
        first, members = self.open.pop(producer_id)
        for index in members:
            self.visible[index] = commit
        if not commit:
            self.aborted.append((producer_id, first, self.next_offset))
        self.append(marker_at(self.next_offset, producer_id, commit=commit), False)


_EVENTS = st.lists(st.tuples(st.sampled_from(["data", "data", "plain", "commit", "abort"]),
                             st.sampled_from([P1, P2, P3]), st.integers(1, 3)),
                   max_size=30)


@dataclass(frozen=True)
class _AbortedTxn:
    """kafka-python's shape of a fetch response's aborted transaction."""

    producer_id: int
    first_offset: int


@settings(max_examples=300, deadline=None)
@given(events=_EVENTS, endings=st.lists(st.booleans(), min_size=3, max_size=3),
       start=st.integers(0, 40), data=st.data())
def test_committed_batches_keeps_what_a_read_committed_consumer_reads(
        events: list[tuple[str, int, int]], endings: list[bool], start: int,
        data: st.DataObject) -> None:
    # Given a log of interleaved transactions, all ended (a fetch stops at the LSO), read from
    # the batch at `start`, with the aborted transactions a broker lists for that fetch
    log = _Log()
    for kind, producer_id, count in events:
        if kind == "data":
            log.data(producer_id, count)
        elif kind == "plain":
            log.plain(count)
        else:
            log.end(producer_id, kind == "commit")
    for producer_id, commit in zip([P1, P2, P3], endings, strict=True):
        log.end(producer_id, commit)
    start = min(start, len(log.batches))
    fetch_offset = read_header(log.batches[start]).base_offset if start < len(log.batches) \
        else log.next_offset
    record_set = b"".join(log.batches[start:])
    listed = data.draw(st.permutations(
        [(pid, first) for pid, first, last in log.aborted if last >= fetch_offset]))

    # When
    kept = committed_batches(record_set, listed)

    # Then it holds exactly the committed and non-transactional batches, byte for byte
    assert kept == b"".join(batch for batch, visible in
                            zip(log.batches[start:], log.visible[start:], strict=True)
                            if visible)
    # and the same records as kafka-python's consumer returns
    consumer = Fetcher.PartitionRecords(
        fetch_offset, TopicPartition("t", 0), MemoryRecords(record_set),
        isolation_level=IsolationLevel.READ_COMMITTED,
        aborted_transactions=[_AbortedTxn(pid, first) for pid, first in listed])
    assert offsets_of(kept) == [record.offset for record in consumer.take()]
