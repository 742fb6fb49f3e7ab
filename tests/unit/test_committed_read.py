"""committed_read: a read_committed Fetch answer as the hardened-record readers use it (the
records a read_committed consumer keeps, and where to fetch next past the ones it drops)."""

from __future__ import annotations

from aiokafka.record import default_records as aiokafka_records

from storage.kafka.client import FetchResult, committed_read
from wire.batch import with_base_offset
from wire.lineage import kiln_offset_header, kiln_offset_of
from wire.records import decode_records
from wire.txn_markers import build_marker

NOW_MS = 1_700_000_000_000
LANE, OTHER = 4001, 4002


def kiln_batch(base_offset: int, kiln_offsets: range, producer_id: int = -1, *,
               transactional: bool = False) -> bytes:
    """A batch of records carrying `kiln.offset` headers, placed at Kafka `base_offset`."""
    builder = aiokafka_records.DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=int(transactional),
        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1, batch_size=1 << 20)
    for i, kiln in enumerate(kiln_offsets):
        builder.append(i, timestamp=NOW_MS, key=None, value=b"v%d" % kiln,
                       headers=[kiln_offset_header(kiln)])
    return with_base_offset(bytes(builder.build()), base_offset)


def marker_at(offset: int, producer_id: int, *, commit: bool) -> bytes:
    return with_base_offset(build_marker(producer_id, 0, commit=commit, timestamp_ms=NOW_MS),
                            offset)


def answer(records: bytes, aborted: tuple[tuple[int, int], ...] = (), *,
           high_watermark: int = 100, last_stable_offset: int = 100) -> FetchResult:
    return FetchResult(0, high_watermark, last_stable_offset, 0, records, aborted)


def kiln_offsets(records: bytes) -> list[int | None]:
    return [kiln_offset_of(r.headers) for r in decode_records(records)]


def test_an_aborted_pass_and_the_markers_are_left_out_but_still_read_past() -> None:
    # Given Kiln 0..4 committed (marker at 5), the lane's pass 5..9 aborted (marker at 11),
    # and the pass written again, committed (13..17, marker at 18)
    log = (kiln_batch(0, range(0, 5), LANE, transactional=True)
           + marker_at(5, LANE, commit=True)
           + kiln_batch(6, range(5, 10), LANE, transactional=True)
           + marker_at(11, LANE, commit=False)
           + kiln_batch(13, range(5, 10), LANE, transactional=True)
           + marker_at(18, LANE, commit=True))

    # When
    read = committed_read(answer(log, ((LANE, 6),)))

    # Then
    assert kiln_offsets(read.records) == list(range(10))
    assert (read.next_fetch_offset, read.fetched) == (19, True)


def test_a_fetch_holding_only_an_aborted_pass_moves_past_it() -> None:
    # Given a fetch that starts inside an aborted pass and holds nothing else
    log = (kiln_batch(20, range(7, 9), LANE, transactional=True)
           + kiln_batch(22, range(9, 12), LANE, transactional=True)
           + marker_at(25, LANE, commit=False))

    # When
    read = committed_read(answer(log, ((LANE, 10),)))

    # Then no record is kept, and the next fetch starts after the marker
    assert (read.records, read.next_fetch_offset, read.fetched) == (b"", 26, True)


def test_other_producers_and_a_truncated_last_batch_are_kept() -> None:
    # Given a non-transactional batch, another producer's committed batch interleaved with
    # the aborted pass, and a fetch that ends inside a batch
    plain = kiln_batch(0, range(0, 3))
    cut = kiln_batch(9, range(7, 9), LANE, transactional=True)
    log = (plain
           + kiln_batch(3, range(3, 5), LANE, transactional=True)
           + kiln_batch(5, range(5, 7), OTHER, transactional=True)
           + marker_at(7, LANE, commit=False)
           + marker_at(8, OTHER, commit=True)
           + cut[:-5])

    # When
    read = committed_read(answer(log, ((LANE, 3),)))

    # Then
    assert kiln_offsets(read.records) == [0, 1, 2, 5, 6]
    assert read.records.endswith(cut[:-5])
    assert read.next_fetch_offset == 9


def test_an_empty_answer_has_nowhere_to_go_next() -> None:
    # Given / When
    read = committed_read(answer(b"", high_watermark=30, last_stable_offset=21))

    # Then
    assert (read.records, read.next_fetch_offset, read.fetched) == (b"", None, False)
    assert (read.last_stable_offset, read.high_watermark) == (21, 30)


def test_a_broker_that_leaves_the_last_stable_offset_out_ends_at_its_high_watermark() -> None:
    # Given / When (Fetch v4+ answers -1 where the broker does not know it)
    read = committed_read(answer(b"", high_watermark=30, last_stable_offset=-1))

    # Then
    assert read.last_stable_offset == 30
