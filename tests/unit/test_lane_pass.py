"""Which consistent cut a lane pass hardens, and what it writes, skips and counts below it
(storage.policy.lane_pass)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.model import Reliability, StoredBatch, TopicPartition
from storage.policy.hardening_pass import PassView, holds, plan_pass
from storage.policy.lane_pass import (
    LanePartition,
    LanePlan,
    TxnHeader,
    TxnSpan,
    plan_lane,
    plan_lane_release,
)
from wire.batch import CONTROL_BIT, HEADER, TRANSACTIONAL_BIT, read_header

R = Reliability
A = TopicPartition("a", 0)
B = TopicPartition("b", 0)
C = TopicPartition("c", 0)
P, Q = 7, 8  # transactional producers


def _header(producer_id: int, attributes: int) -> bytes:
    return HEADER.pack(0, 49, 0, 2, 0, attributes, 0, 0, 0, producer_id, 0, 0, 1)


def _plain(base: int, level: Reliability = R.RELIABLE_PERSISTENT, count: int = 10
           ) -> StoredBatch:
    return StoredBatch(base, count, 0, level, _header(-1, 0))


def _data(base: int, producer_id: int, level: Reliability = R.RELIABLE_PERSISTENT,
          count: int = 10) -> StoredBatch:
    return StoredBatch(base, count, 0, level, _header(producer_id, TRANSACTIONAL_BIT))


def _marker(base: int, producer_id: int) -> StoredBatch:
    return StoredBatch(base, 1, 0, R.BEST_EFFORT,
                       _header(producer_id, TRANSACTIONAL_BIT | CONTROL_BIT))


def _read(batch: StoredBatch) -> TxnHeader:
    return read_header(batch.data)


def _persistent(tp: TopicPartition, batch: StoredBatch) -> bool:
    return batch.reliability.persistent


def _part(tp: TopicPartition, due: Sequence[StoredBatch], spans: Sequence[TxnSpan] = (), *,
          decided: int = 0, lso: int | None = None, delivered: int = 0,
          skip_delivered: bool = True, subscribed: bool = True,
          head_held: bool = False) -> LanePartition:
    end = due[-1].next_offset if due else decided
    return LanePartition(
        tp, PassView(decided_below=decided, delivered_below=delivered,
                     skip_delivered=skip_delivered, subscribed=subscribed,
                     head_held=head_held),
        end if lso is None else lso, due, spans)


def _plan(parts: Sequence[LanePartition],
          participants: Mapping[str, Collection[TopicPartition]]) -> LanePlan:
    return plan_lane(parts, participants, _read, _persistent)


def _bases(plan: LanePlan, tp: TopicPartition) -> list[int]:
    return [w.batch.base_offset for w in plan.partitions[tp].to_write]


def _cuts(plan: LanePlan) -> dict[TopicPartition, int]:
    return {tp: p.decided_below for tp, p in plan.partitions.items()}


# A committed transaction "t" of producer P: data at 10..20 and its marker at 20 in a and b.
_T = TxnSpan(P, 10, 20, "t")
_A_LOG = [_plain(0), _data(10, P), _marker(20, P), _plain(21)]
_B_LOG = [_plain(0), _data(10, P), _marker(20, P)]


def test_a_transaction_not_due_in_one_partition_keeps_every_cut_before_it() -> None:
    # Given "t" due in a but only b's first batch due
    parts = [_part(A, _A_LOG, [_T]), _part(B, _B_LOG[:1], [_T], lso=21)]

    # When the pass is planned
    plan = _plan(parts, {"t": {A, B}})

    # Then both partitions stop before it and nothing of it is decided
    assert _cuts(plan) == {A: 10, B: 10}
    assert _bases(plan, A) == [0]
    assert _bases(plan, B) == [0]
    assert plan.decided_keys == frozenset()


def test_a_transaction_due_everywhere_is_written_whole_and_its_markers_never() -> None:
    parts = [_part(A, _A_LOG, [_T]), _part(B, _B_LOG, [_T])]

    plan = _plan(parts, {"t": {A, B}})

    assert _cuts(plan) == {A: 31, B: 21}
    assert _bases(plan, A) == [0, 10, 21]
    assert _bases(plan, B) == [0, 10]
    assert [p.control_records for p in plan.partitions.values()] == [1, 1]
    assert plan.partitions[A].written_records == 30
    assert plan.partitions[A].trim_below == 31
    assert plan.decided_keys == frozenset({"t"})


def test_an_aborted_transaction_interleaved_with_a_committed_one_is_never_written() -> None:
    # Given P's committed transaction and Q's aborted one interleaved, then a plain batch
    log = [_data(0, P), _data(10, Q), _data(20, P), _marker(30, Q), _marker(31, P),
           _plain(32)]
    spans = [TxnSpan(P, 0, 31, "t"), TxnSpan(Q, 10, 30, None)]

    plan = _plan([_part(A, log, spans)], {"t": {A}})

    part = plan.partitions[A]
    assert _bases(plan, A) == [0, 20, 32]
    assert (part.aborted_records, part.control_records) == (10, 2)
    assert (part.delivered_records, part.expired_records) == (0, 0)
    assert part.decided_below == 42
    assert plan.decided_keys == frozenset({"t"})


def test_an_open_transaction_stops_the_cut_at_the_last_stable_offset() -> None:
    # Given P's transaction open from 10, with another producer's records after it
    log = [_plain(0), _data(10, P), _plain(20)]

    plan = _plan([_part(A, log, lso=10)], {})

    assert plan.partitions[A].decided_below == 10
    assert _bases(plan, A) == [0]
    assert plan.partitions[A].trim_below == 10


def test_a_wholly_delivered_transaction_is_not_written_and_counts_as_delivered() -> None:
    # Given "t" delivered past its last data record in both partitions (b's consumers have
    # not stepped over its marker)
    parts = [_part(A, _A_LOG[:3], [_T], delivered=21), _part(B, _B_LOG, [_T], delivered=20)]

    plan = _plan(parts, {"t": {A, B}})

    assert _bases(plan, A) == []
    assert _bases(plan, B) == []
    assert [p.delivered_records for p in plan.partitions.values()] == [20, 20]
    assert [p.trim_below for p in plan.partitions.values()] == [21, 21]
    assert plan.decided_keys == frozenset({"t"})


def test_a_partly_delivered_transaction_is_written_whole_delivered_records_too() -> None:
    parts = [_part(A, _A_LOG[:3], [_T], delivered=21), _part(B, _B_LOG, [_T], delivered=15)]

    plan = _plan(parts, {"t": {A, B}})

    assert [(w.batch.base_offset, w.write_from) for w in plan.partitions[A].to_write] \
        == [(10, 10)]
    assert [(w.batch.base_offset, w.write_from) for w in plan.partitions[B].to_write] \
        == [(10, 10)]
    # the plain batches before it are delivered and skipped, as by plan_pass
    assert [p.delivered_records for p in plan.partitions.values()] == [10, 10]
    assert [p.written_records for p in plan.partitions.values()] == [10, 10]


def test_under_harden_all_a_wholly_delivered_transaction_is_written() -> None:
    parts = [_part(A, _A_LOG[:3], [_T], delivered=21, skip_delivered=False),
             _part(B, _B_LOG, [_T], delivered=21)]

    plan = _plan(parts, {"t": {A, B}})

    assert _bases(plan, A) == [0, 10]
    assert _bases(plan, B) == []


def test_a_marker_without_data_in_its_partition_is_counted_and_never_written() -> None:
    # Given a partition the transaction registered at but sent nothing to
    plan = _plan([_part(A, [_plain(0), _marker(10, P), _plain(11)])], {})

    assert _bases(plan, A) == [0, 11]
    assert plan.partitions[A].control_records == 1
    assert plan.partitions[A].decided_below == 21


def test_records_between_transactions_are_decided_as_plan_pass_decides_them() -> None:
    # Given a persistent batch, an unread reliable_nonpersistent one, a transaction, and a
    # persistent batch the delivered mark reaches into, on a subscribed topic
    log = [_plain(0), _plain(10, R.RELIABLE_NONPERSISTENT), _data(20, P), _marker(30, P),
           _plain(31), _plain(41, R.EXPRESS)]
    plain = [log[0], log[1], log[4], log[5]]

    plan = _plan([_part(A, log, [TxnSpan(P, 20, 30, "t")], delivered=5)], {"t": {A}})

    # Then what plan_pass would do with the plain batches is done, and the transaction
    # goes whole: the trim stops at the held batch, the written ones pass it
    alone = plan_pass(plain, PassView(0, 5, True, True, False),
                      lambda b: b.reliability.persistent)
    part = plan.partitions[A]
    assert [(w.batch.base_offset, w.write_from) for w in part.to_write] \
        == [(0, 5), (20, 20), (31, 31)]
    assert part.trim_below == alone.trim_below == 10
    assert (part.delivered_records, part.expired_records) \
        == (alone.delivered_records, alone.expired_records) == (5, 10)
    assert part.decided_below == 51


def test_a_transaction_held_back_pulls_back_those_interleaved_with_it() -> None:
    # Given "u" (P) in a and b, and "t" (Q) in b, where it began before "u", and in c,
    # where nothing is due yet
    parts = [_part(A, [_data(0, P), _marker(10, P)], [TxnSpan(P, 0, 10, "u")]),
             _part(B, [_data(0, Q), _data(10, P), _marker(20, P), _marker(21, Q)],
                   [TxnSpan(P, 10, 20, "u"), TxnSpan(Q, 0, 21, "t")]),
             _part(C, [], [TxnSpan(Q, 0, 10, "t")], lso=11)]

    plan = _plan(parts, {"u": {A, B}, "t": {B, C}})

    # Then "t" keeps b's cut before it, which cuts "u" there, so a's cut falls too
    assert _cuts(plan) == {A: 0, B: 0, C: 0}
    assert plan.decided_keys == frozenset()


def test_a_transaction_whose_participants_are_not_all_known_waits() -> None:
    # Given "t" due in a, with b, one of its partitions, not read by this pass
    plan = _plan([_part(A, _A_LOG, [_T])], {"t": {A, B}})

    assert plan.partitions[A].decided_below == 10
    assert plan.decided_keys == frozenset()


def test_a_committed_transaction_not_yet_listed_with_its_participants_waits() -> None:
    plan = _plan([_part(A, _A_LOG, [_T])], {})

    assert plan.partitions[A].decided_below == 10


def test_a_topic_that_never_hardens_leaves_its_part_of_a_transaction_out() -> None:
    parts = [_part(A, _A_LOG[:3], [_T]), _part(B, _B_LOG, [_T])]

    plan = plan_lane(parts, {"t": {A, B}}, _read,
                     lambda tp, b: tp != B and b.reliability.persistent)

    assert _bases(plan, A) == [0, 10]
    assert _bases(plan, B) == []
    assert plan.partitions[B].expired_records == 20
    assert plan.decided_keys == frozenset({"t"})


def test_keys_an_earlier_pass_decided_but_did_not_forget_are_decided_again() -> None:
    # Given "t" below the decided mark in a, its entry in b already forgotten, and "u"
    # left only in the participant list
    plan = _plan([_part(A, [_plain(21)], [_T], decided=21), _part(B, [], decided=21)],
                 {"t": {A, B}, "u": {B}})

    assert plan.decided_keys == frozenset({"t", "u"})
    assert _bases(plan, A) == [21]


def test_a_transaction_an_earlier_pass_cut_through_is_refused() -> None:
    with pytest.raises(ValueError, match="cut at 15"):
        _plan([_part(A, [_data(15, P, count=5), _marker(20, P)], [_T], decided=15)],
              {"t": {A}})


def test_transactional_data_in_no_ended_transaction_below_the_cut_is_refused() -> None:
    with pytest.raises(ValueError, match="in no ended transaction"):
        _plan([_part(A, [_data(0, Q), _plain(10)])], {})


def test_nothing_is_decided_or_trimmed_when_the_cut_cannot_move() -> None:
    plan = _plan([_part(A, [_data(10, P)], decided=10, lso=10)], {})

    part = plan.partitions[A]
    assert (part.decided_below, part.trim_below, part.to_write) == (10, 0, [])


# --- properties over random histories -------------------------------------------------

_levels = st.sampled_from(list(R))
_Kind = tuple[str, str | None]  # ("plain" | "data" | "aborted" | "control", key)


@dataclass
class _History:
    tps: list[TopicPartition]
    logs: dict[TopicPartition, list[StoredBatch]]
    kinds: dict[tuple[TopicPartition, int], _Kind] = field(default_factory=dict)
    spans: dict[TopicPartition, list[TxnSpan]] = field(default_factory=dict)
    participants: dict[str, set[TopicPartition]] = field(default_factory=dict)
    lso: dict[TopicPartition, int] = field(default_factory=dict)


_Txn = tuple[int, list[tuple[int, Reliability, int]], str, int | None]


@st.composite
def _histories(draw: st.DrawFn) -> _History:
    """Transactions of three producers (data in some partitions, committed, aborted or left
    open, sometimes with a marker also where one registered without data) and plain appends,
    interleaved at random; a producer's transactions one after the other."""
    tps = [TopicPartition(f"t{i}", 0) for i in range(draw(st.integers(1, 3)))]
    part = st.integers(0, len(tps) - 1)
    txns: list[_Txn] = draw(st.lists(st.tuples(
        st.integers(0, 2),
        st.lists(st.tuples(part, _levels, st.integers(1, 3)), min_size=1, max_size=4),
        st.sampled_from(["commit", "commit", "abort", "open"]),
        st.none() | part), max_size=6))
    plains = draw(st.lists(st.tuples(part, _levels, st.integers(1, 3)), max_size=8))
    h = _History(tps, {tp: [] for tp in tps}, spans={tp: [] for tp in tps})
    # each producer's events, a transaction's data then its end ("end" carries no part)
    queues: dict[int, list[tuple[int, int]]] = {}
    for i, (producer, writes, outcome, _) in enumerate(txns):
        queue = queues.setdefault(producer, [])
        if queue and queue[-1][1] == -2:
            continue  # its producer left a transaction open before it
        queue.extend((i, j) for j in range(len(writes)))
        queue.append((i, -1 if outcome != "open" else -2))
    firsts: dict[int, dict[TopicPartition, int]] = {}

    def append(tp: TopicPartition, batch: StoredBatch, kind: _Kind) -> None:
        h.logs[tp].append(batch)
        h.kinds[tp, batch.base_offset] = kind

    def end(tp: TopicPartition) -> int:
        return h.logs[tp][-1].next_offset if h.logs[tp] else 0

    while True:
        ready = [q for q in queues.values() if q and q[0][1] != -2]
        if not ready and not plains:
            break
        pick = draw(st.integers(0, len(ready) - (0 if plains else 1)))
        if pick == len(ready):
            index, level, count = plains.pop(0)
            append(tps[index], _plain(end(tps[index]), level, count), ("plain", None))
            continue
        i, j = ready[pick].pop(0)
        producer, writes, outcome, extra = txns[i]
        pid, key = 100 + producer, f"x{i}"
        if j >= 0:
            tp = tps[writes[j][0]]
            firsts.setdefault(i, {}).setdefault(tp, end(tp))
            append(tp, _data(end(tp), pid, *writes[j][1:]), ("data", key))
            continue
        data_in = firsts.get(i, {})
        registered = {*data_in} | ({tps[extra]} if extra is not None else set())
        for tp in sorted(registered, key=lambda t: t.topic):
            marker = end(tp)
            append(tp, _marker(marker, pid), ("control", None))
            if tp in data_in:
                h.spans[tp].append(TxnSpan(pid, data_in[tp], marker,
                                           key if outcome == "commit" else None))
        if outcome == "commit" and data_in:
            h.participants[key] = set(data_in)
        elif outcome == "abort":
            for (tp, base), kind in list(h.kinds.items()):
                if kind == ("data", key):
                    h.kinds[tp, base] = ("aborted", key)
    for tp in tps:
        h.lso[tp] = min([data_in[tp] for i, data_in in firsts.items()
                         if txns[i][2] == "open" and tp in data_in], default=end(tp))
    return h


@dataclass(frozen=True)
class _Marks:
    due: dict[TopicPartition, int]  # due batches
    delivered: dict[TopicPartition, int]
    skip_delivered: dict[TopicPartition, bool]
    subscribed: dict[TopicPartition, bool]
    head_held: dict[TopicPartition, bool]


def _marks(data: st.DataObject, h: _History) -> _Marks:
    draw = data.draw

    def upto(end: int) -> st.SearchStrategy[int]:
        return st.one_of(st.just(end), st.just(0), st.integers(0, end))

    return _Marks(
        {tp: draw(upto(len(h.logs[tp]))) for tp in h.tps},
        {tp: draw(upto(h.logs[tp][-1].next_offset if h.logs[tp] else 0)) for tp in h.tps},
        {tp: draw(st.booleans()) for tp in h.tps},
        {tp: draw(st.booleans()) for tp in h.tps},
        {tp: draw(st.booleans()) for tp in h.tps} if draw(st.booleans())
        else {tp: False for tp in h.tps})


def _inputs(h: _History, marks: _Marks, decided: Mapping[TopicPartition, int],
            forgotten: Collection[str]) -> list[LanePartition]:
    parts = []
    for tp in h.tps:
        rest = [b for b in h.logs[tp] if b.base_offset >= decided[tp]]
        parts.append(_part(
            tp, rest[:marks.due[tp]],
            [s for s in h.spans[tp] if s.key not in forgotten],
            decided=decided[tp], lso=h.lso[tp], delivered=marks.delivered[tp],
            skip_delivered=marks.skip_delivered[tp], subscribed=marks.subscribed[tp],
            head_held=marks.head_held[tp]))
    return parts


def _consistent(parts: Sequence[LanePartition],
                participants: Mapping[str, Collection[TopicPartition]],
                cut: Mapping[TopicPartition, int]) -> bool:
    """Every committed transaction wholly below the cut (all its partitions known, every
    marker below) or wholly above it."""
    spans: dict[str, dict[TopicPartition, TxnSpan]] = {}
    for part in parts:
        for span in part.spans:
            if span.key is not None:
                spans.setdefault(span.key, {})[part.partition] = span
    for key, of in spans.items():
        known = key in participants and all(tp in of for tp in participants[key])
        inside = known and all(s.marker < cut[tp] for tp, s in of.items())
        outside = all(s.first >= cut[tp] for tp, s in of.items())
        if not (inside or outside):
            return False
    return True


def _check(h: _History, parts: Sequence[LanePartition],
           participants: Mapping[str, Collection[TopicPartition]], plan: LanePlan) -> None:
    cut = _cuts(plan)
    by_tp = {p.partition: p for p in parts}
    # consistent, and maximal: one more due batch anywhere (below the last stable offset)
    # breaks it
    assert _consistent(parts, participants, cut)
    for tp, part in by_tp.items():
        nxt = next((b for b in part.due if b.base_offset == cut[tp]), None)
        if nxt is not None and nxt.next_offset <= part.last_stable_offset:
            assert not _consistent(parts, participants, {**cut, tp: nxt.next_offset})
    # decided: exactly the committed transactions below the cut
    committed_below = {s.key for p in parts for s in p.spans
                       if s.key is not None and s.first < cut[p.partition]}
    assert plan.decided_keys == committed_below
    last: dict[str, dict[TopicPartition, int]] = {}
    for tp, part in by_tp.items():
        for b in part.due:
            kind, key = h.kinds[tp, b.base_offset]
            if kind == "data" and key in plan.decided_keys:
                last.setdefault(key, {})[tp] = b.next_offset
    wholly = {key for key, ends in last.items()
              if all(by_tp[tp].view.delivered_below >= e for tp, e in ends.items())}
    for tp, part in by_tp.items():
        lane = plan.partitions[tp]
        view = part.view
        writes = lane.to_write
        written = {w.batch.base_offset for w in writes}
        assert [w.batch.base_offset for w in writes] == sorted(written)
        assert all(view.decided_below <= w.write_from < w.batch.next_offset <= cut[tp]
                   for w in writes)
        below = [b for b in part.due if b.next_offset <= cut[tp]]
        held_later = 0
        counted = {"aborted": 0, "control": 0}
        first_held = None
        for b in below:
            kind, key = h.kinds[tp, b.base_offset]
            if first_held is None and kind in ("plain", "data") \
                    and holds(b, subscribed=view.subscribed,
                              delivered_below=view.delivered_below):
                first_held = b.base_offset
            if kind in counted:
                assert b.base_offset not in written  # aborted and markers never written
                counted[kind] += b.record_count
            elif kind == "data":
                whole = b.reliability.persistent \
                    and not (view.skip_delivered and key in wholly)
                assert (b.base_offset in written) == whole
                if whole:  # written whole, delivered records too
                    assert next(w for w in writes if w.batch is b).write_from == b.base_offset
            if kind in ("plain", "data") and b.base_offset not in written \
                    and b.reliability is R.RELIABLE_NONPERSISTENT \
                    and b.next_offset > lane.trim_below:
                held_later += b.record_count
        assert (lane.aborted_records, lane.control_records) \
            == (counted["aborted"], counted["control"])
        if cut[tp] > view.decided_below:
            assert lane.written_records + lane.delivered_records + lane.expired_records \
                + lane.aborted_records + lane.control_records + held_later \
                == cut[tp] - view.decided_below
        # the trim stops at the first batch that must stay, at the cut if none does
        if cut[tp] == view.decided_below or view.head_held:
            assert lane.trim_below == 0
        else:
            assert lane.trim_below == (cut[tp] if first_held is None else first_held)


@settings(max_examples=300)
@given(st.data())
def test_two_passes_over_any_history_cut_consistently_maximally_and_count_once(
        data: st.DataObject) -> None:
    # Given any history, some transactions not yet listed with their participants, and a
    # first pass over random due prefixes and delivered marks
    h = data.draw(_histories())
    unlisted = data.draw(st.sets(st.sampled_from(sorted(h.participants)))) \
        if h.participants else set()
    participants = {k: v for k, v in h.participants.items() if k not in unlisted}
    first = _inputs(h, _marks(data, h), {tp: 0 for tp in h.tps}, ())

    # When a pass is planned, then another from where it ended, with what the first
    # decided forgotten and every other transaction listed now
    plan = plan_lane(first, participants, _read, _persistent)
    second = _inputs(h, _marks(data, h), _cuts(plan), plan.decided_keys)
    listed = {k: v for k, v in h.participants.items() if k not in plan.decided_keys}
    again = plan_lane(second, listed, _read, _persistent)

    # Then each holds to the rules
    _check(h, first, participants, plan)
    _check(h, second, listed, again)
    assert not plan.decided_keys & again.decided_keys


@given(levels=st.lists(_levels, min_size=1, max_size=12), delivered=st.integers(0, 130),
       skip_delivered=st.booleans(), subscribed=st.booleans(), head_held=st.booleans(),
       decided=st.integers(0, 2))
def test_without_transactions_a_lane_pass_is_plan_pass(
        levels: list[Reliability], delivered: int, skip_delivered: bool, subscribed: bool,
        head_held: bool, decided: int) -> None:
    # Given a partition with no transaction, its first `decided` batches decided before
    due = [_plain(10 * i, level) for i, level in enumerate(levels)][decided:]
    start = 10 * decided
    view = PassView(start, delivered, skip_delivered, subscribed, head_held)

    lane = plan_lane([LanePartition(A, view, 10 * len(levels), due, [])], {}, _read,
                     _persistent).partitions[A]

    # Then it writes, trims and counts as plan_pass
    if not due:
        assert (lane.decided_below, lane.trim_below, lane.to_write) == (start, 0, [])
        return
    alone = plan_pass(due, view, lambda b: b.reliability.persistent)
    assert [(w.batch, w.write_from) for w in lane.to_write] \
        == [(b, max(b.base_offset, alone.write_from)) for b in alone.to_write]
    assert (lane.trim_below, lane.decided_below, lane.delivered_records,
            lane.expired_records) == (alone.trim_below, alone.decided_below,
                                      alone.delivered_records, alone.expired_records)


# -- the held region of a lane partition ----------------------------------------------------

def test_a_held_region_leaves_up_to_its_first_held_batch_with_the_transactions_before_it(
        ) -> None:
    # Given a held region: a delivered non-persistent batch, a transaction (data, marker)
    # decided by an earlier pass, a non-persistent batch not delivered yet, and more
    head = [_plain(0, R.RELIABLE_NONPERSISTENT), _data(10, P), _marker(20, P),
            _plain(21, R.RELIABLE_NONPERSISTENT), _plain(31)]
    # When the region is released with the delivered mark at 15
    plan = plan_lane_release(head, decided_below=41, delivered_below=15, subscribed=True,
                             header=_read)
    # Then everything before the batch still held leaves, and only the plain batch that left
    # is counted (the transaction was counted by the pass that decided it)
    assert (plan.trim_below, plan.delivered_records, plan.expired_records, plan.blocked) == \
        (21, 10, 0, True)


def test_a_released_region_ends_with_its_last_decided_batch_even_a_marker() -> None:
    head = [_plain(0, R.RELIABLE_NONPERSISTENT), _data(10, P), _marker(20, P), _plain(21)]
    plan = plan_lane_release(head, decided_below=21, delivered_below=21, subscribed=True,
                             header=_read)
    assert (plan.trim_below, plan.delivered_records, plan.blocked) == (21, 10, False)

