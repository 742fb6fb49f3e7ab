"""What one pass of the transactional hardening lane does, I/O-free.

Partitions that carry Kafka transactions are hardened by one writer, the lane, which writes
per pass a *consistent cut* over all of them inside one Kafka transaction
(docs/transactions-design.md §8): below the cut of every partition, each committed
transaction is there whole or not at all, so it lands in Kafka whole or not at all.

The cut of a partition starts at the end of its due batches, never past its last stable
offset (open transactions are never written), and falls to the first record of any
committed transaction that would otherwise be cut through, until no transaction is; cuts
only fall, so this ends, at the largest consistent cut.

Below the cut each batch is decided once:
- a control batch (an end marker Kiln wrote) is never written: Kafka writes its own markers
  for the lane's transaction;
- aborted data is never written;
- committed data is written, whole with its transaction (delivered records too), unless
  the transaction is wholly delivered (every data record of it, in each of its partitions)
  in a topic that hardens survivors only, or its level does not harden;
- non-transactional data is decided by `plan_pass`, as in a partition without transactions.

Counting follows `plan_pass`: hardened records are counted by the writer, delivered and
expired ones here, held ones when they leave; aborted and control records here, apart.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Protocol

from storage.model import StoredBatch, TopicPartition
from storage.policy.hardening_pass import PassView, ReleasePlan, holds, plan_pass, plan_release


class TxnHeader(Protocol):
    """What the lane reads of a stored batch's header (`wire.batch.BatchHeader` has it)."""

    @property
    def producer_id(self) -> int: ...

    @property
    def is_transactional(self) -> bool: ...

    @property
    def is_control(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class TxnSpan:
    """A transaction that ended in a partition: the transactional data of `producer_id` from
    `first` (its first data record here) up to its end marker at `marker`.

    A producer has at most one transaction open in a partition, so a transactional data
    batch belongs to the span of its producer that covers its offset.
    """

    producer_id: int
    first: int
    marker: int
    # A committed transaction's key, the same in every partition it has data in; None for
    # an aborted one (nothing is decided across partitions for it).
    key: str | None

    @property
    def committed(self) -> bool:
        return self.key is not None


@dataclass(frozen=True, slots=True)
class LanePartition:
    """What a pass knows of one lane partition."""

    partition: TopicPartition
    # decided_below, delivered mark, harden=survivors, subscriptions, held head: as for a
    # partition's own hardener.
    view: PassView
    last_stable_offset: int
    # The due batches read from `view.decided_below` on (oldest first, contiguous): the due
    # prefix of what was read, nothing after it, as `plan_pass` takes it. May be empty.
    due: Sequence[StoredBatch]
    # The transactions that ended here and that no pass decided yet: committed ones not yet
    # forgotten, aborted ones from the log queue's start on.
    spans: Sequence[TxnSpan]


@dataclass(frozen=True, slots=True)
class LaneWrite:
    """A batch to write, from `write_from` on: a non-transactional batch may start below the
    delivered mark (under harden=survivors) while a transaction's batches go whole, so one
    mark per partition, as `plan_pass` gives, cannot say what to write."""

    batch: StoredBatch
    write_from: int


@dataclass(frozen=True, slots=True)
class LanePartitionPlan:
    to_write: list[LaneWrite]  # in Kiln offset order
    trim_below: int            # whole batches below it leave the log queue (0: none)
    decided_below: int         # the cut: below it, in Kafka or needing nothing more
    delivered_records: int     # leaving (or skipped) as delivered, never written
    expired_records: int       # leaving, never to be hardened
    aborted_records: int       # of aborted transactions, never written
    control_records: int       # end markers, never written (Kafka writes its own)

    @property
    def written_records(self) -> int:
        return sum(w.batch.next_offset - w.write_from for w in self.to_write)


@dataclass(frozen=True, slots=True)
class LanePlan:
    partitions: dict[TopicPartition, LanePartitionPlan]
    # Committed transactions this pass decides (written, delivered, or with nothing that
    # hardens), and ones an earlier pass decided but did not get to forget: the caller
    # forgets them all once the pass is finished.
    decided_keys: frozenset[str]


def plan_lane(partitions: Sequence[LanePartition],
              participants: Mapping[str, Collection[TopicPartition]],
              header: Callable[[StoredBatch], TxnHeader],
              hardens: Callable[[TopicPartition, StoredBatch], bool]) -> LanePlan:
    """Plan one lane pass over `partitions`.

    `participants` names, per committed transaction key, every partition it has data in: a
    transaction is decided only once all of them were read and its marker is below the cut
    in each. `header` reads a batch's header; `hardens` says whether a batch of a partition
    is hardened at all (its level and its topic's harden policy), as for `plan_pass`.

    Raises ValueError on input no consistent history produces: a transaction an earlier pass
    cut through, transactional data in no transaction, a span whose first batch is not its
    producer's data.
    """
    parts: dict[TopicPartition, LanePartition] = {}
    for part in partitions:
        if part.partition in parts:
            raise ValueError(f"{_name(part.partition)} given twice")
        _check(part)
        parts[part.partition] = part
    spans_of = _committed_spans(parts.values())
    stale = _decided_earlier(parts, spans_of, participants)
    live = {key: spans for key, spans in spans_of.items() if key not in stale}
    complete = {key: key in participants
                and all(tp in spans for tp in participants[key])
                for key, spans in live.items()}
    cut = _consistent_cut({tp: _desired_cut(part) for tp, part in parts.items()},
                          live, complete)
    inside = frozenset(key for key, spans in live.items()
                       if any(span.first < cut[tp] for tp, span in spans.items()))

    classified = {tp: _classify(part, cut[tp], header, inside)
                  for tp, part in parts.items()}
    # Wholly delivered: every data record of the transaction, in each of its partitions
    # (its marker is no record a consumer is given).
    last_data: dict[str, dict[TopicPartition, int]] = {}
    for tp, batches in classified.items():
        for batch, kind in batches:
            if isinstance(kind, str):
                ends = last_data.setdefault(kind, {})
                ends[tp] = max(ends.get(tp, 0), batch.next_offset)
    delivered = frozenset(
        key for key, ends in last_data.items()
        if all(parts[tp].view.delivered_below >= end for tp, end in ends.items()))

    plans = {tp: _plan_partition(parts[tp], cut[tp], classified[tp], delivered, hardens)
             for tp in parts}
    return LanePlan(plans, inside | stale)


def plan_lane_release(head: Sequence[StoredBatch], *, decided_below: int, delivered_below: int,
                      subscribed: bool, header: Callable[[StoredBatch], TxnHeader]
                      ) -> ReleasePlan:
    """`plan_release` for a lane partition's held region: a transaction's batches there
    (its records, its marker) were decided and counted by the pass that cut past them and
    never hold, so they leave with the batches around them, uncounted."""
    plain = [b for b in head if not header(b).is_transactional]
    plan = plan_release(plain, decided_below=decided_below, delivered_below=delivered_below,
                        subscribed=subscribed)
    if plan.blocked:
        held = next(b for b in plain if b.next_offset <= decided_below
                    and holds(b, subscribed=subscribed, delivered_below=delivered_below))
        trim_below = held.base_offset
    else:
        trim_below = max((b.next_offset for b in head if b.next_offset <= decided_below),
                         default=0)
    return ReleasePlan(max(trim_below, plan.trim_below), plan.delivered_records,
                       plan.expired_records, plan.blocked)


class _Other(enum.Enum):
    PLAIN = enum.auto()  # not transactional
    ABORTED = enum.auto()
    CONTROL = enum.auto()


# What a batch below the cut is: a committed transaction's key, or another kind.
_Kind = str | _Other


def _check(part: LanePartition) -> None:
    for before, after in pairwise(part.due):
        if after.base_offset != before.next_offset:
            raise ValueError(f"{_name(part.partition)}: due batches not contiguous at "
                             f"{before.next_offset}")
    for span in part.spans:
        if span.first >= span.marker:
            raise ValueError(f"{_name(part.partition)}: transaction data from {span.first} "
                             f"ends at a marker at {span.marker}")


def _committed_spans(parts: Collection[LanePartition]
                     ) -> dict[str, dict[TopicPartition, TxnSpan]]:
    spans_of: dict[str, dict[TopicPartition, TxnSpan]] = {}
    for part in parts:
        for span in part.spans:
            if span.key is None:
                continue
            spans = spans_of.setdefault(span.key, {})
            if part.partition in spans:
                raise ValueError(f"{_name(part.partition)}: transaction {span.key!r} twice")
            spans[part.partition] = span
    return spans_of


def _decided_earlier(parts: Mapping[TopicPartition, LanePartition],
                     spans_of: Mapping[str, Mapping[TopicPartition, TxnSpan]],
                     participants: Mapping[str, Collection[TopicPartition]]) -> frozenset[str]:
    """The committed transactions an earlier pass decided whole, but whose keys were not all
    forgotten (its finish stopped part way): every cut so far was consistent, so a
    transaction is either below the decided mark in all its partitions or above it in all.
    A transaction whose partitions were all read and none of which still lists it is one
    too (only its participant list was left)."""
    stale = set()
    for key, spans in spans_of.items():
        below = 0
        for tp, span in spans.items():
            decided_below = parts[tp].view.decided_below
            if span.marker < decided_below:
                below += 1
            elif span.first < decided_below:
                raise ValueError(f"{_name(tp)}: transaction {key!r} ({span.first}..."
                                 f"{span.marker}) was cut at {decided_below} by an earlier pass")
        if below == len(spans):
            stale.add(key)
        elif below:
            raise ValueError(f"transaction {key!r} was decided in some partitions only")
    stale.update(key for key, tps in participants.items()
                 if key not in spans_of and tps and all(tp in parts for tp in tps))
    return frozenset(stale)


def _desired_cut(part: LanePartition) -> int:
    """The end of the due batches, never past the last stable offset, at a batch boundary."""
    cut = part.view.decided_below
    for batch in part.due:
        if batch.next_offset > part.last_stable_offset:
            break
        cut = max(cut, batch.next_offset)
    return cut


def _consistent_cut(cut: dict[TopicPartition, int],
                    live: Mapping[str, Mapping[TopicPartition, TxnSpan]],
                    complete: Mapping[str, bool]) -> dict[TopicPartition, int]:
    """Lower `cut` until every committed transaction is wholly below it (all its data and
    its marker, in every partition it has data in) or wholly above it.

    A transaction only forces a cut down to its own first records, and every consistent cut
    below the desired one must lie there too, so what is left is the largest one."""
    changed = True
    while changed:
        changed = False
        for key, spans in live.items():
            if all(span.first >= cut[tp] for tp, span in spans.items()):
                continue
            if complete[key] and all(span.marker < cut[tp] for tp, span in spans.items()):
                continue
            for tp, span in spans.items():
                if span.first < cut[tp]:
                    cut[tp] = span.first
                    changed = True
    return cut


def _classify(part: LanePartition, cut: int, header: Callable[[StoredBatch], TxnHeader],
              inside: frozenset[str]) -> list[tuple[StoredBatch, _Kind]]:
    """Each undecided batch below `cut`, with what it is."""
    decided_below = part.view.decided_below
    below = [b for b in part.due if decided_below < b.next_offset <= cut]
    at = {b.base_offset: b for b in below}
    for span in part.spans:
        # Producer ids are what tell interleaved transactions apart: check them where the
        # span's first batch is at hand.
        if decided_below <= span.first < cut:
            first = at.get(span.first)
            head = None if first is None else header(first)
            if head is None or head.is_control or not head.is_transactional \
                    or head.producer_id != span.producer_id:
                raise ValueError(f"{_name(part.partition)}: no transactional batch of "
                                 f"producer {span.producer_id} at {span.first}")
    out: list[tuple[StoredBatch, _Kind]] = []
    for batch in below:
        head = header(batch)
        if head.is_control:
            out.append((batch, _Other.CONTROL))
            continue
        if not head.is_transactional:
            out.append((batch, _Other.PLAIN))
            continue
        owner = next((s for s in part.spans if s.producer_id == head.producer_id
                      and s.first <= batch.base_offset < s.marker), None)
        if owner is None:
            raise ValueError(f"{_name(part.partition)}: transactional batch at "
                             f"{batch.base_offset} of producer {head.producer_id} is in no "
                             "ended transaction")
        if owner.key is None:
            out.append((batch, _Other.ABORTED))
        elif owner.key in inside:
            out.append((batch, owner.key))
        else:
            raise ValueError(f"{_name(part.partition)}: transaction {owner.key!r} at "
                             f"{batch.base_offset} is below the cut but not decided")
    return out


def _plan_partition(part: LanePartition, cut: int,
                    batches: Sequence[tuple[StoredBatch, _Kind]], delivered: frozenset[str],
                    hardens: Callable[[TopicPartition, StoredBatch], bool]
                    ) -> LanePartitionPlan:
    tp, view = part.partition, part.view
    if cut <= view.decided_below:
        return LanePartitionPlan([], 0, view.decided_below, 0, 0, 0, 0)
    writes: list[LaneWrite] = []
    plain: set[int] = set()
    # What plan_pass decides: non-transactional batches, and committed ones that are not
    # written (their records leave, are held or expire as any other of their level). The
    # batches left out never hold (markers and aborted data stay in no one's way, written
    # ones are persistent) and plan_pass decides each batch on its own but for the trim,
    # which stops at the first held batch: so it plans them as it would the whole run.
    passed: list[StoredBatch] = []
    aborted = control = 0
    for batch, kind in batches:
        records = batch.next_offset - max(batch.base_offset, view.decided_below)
        if kind is _Other.CONTROL:
            control += records
        elif kind is _Other.ABORTED:
            aborted += records
        elif kind is _Other.PLAIN:
            plain.add(batch.base_offset)
            passed.append(batch)
        elif hardens(tp, batch) and not (view.skip_delivered and kind in delivered):
            # Whole, delivered records too: a reader of Kafka must find the transaction
            # entire. Its records are never below the decided mark.
            writes.append(LaneWrite(batch, batch.base_offset))
        else:
            passed.append(batch)
    if not passed:
        return LanePartitionPlan(writes, 0 if view.head_held else cut, cut, 0, 0,
                                 aborted, control)
    plan = plan_pass(passed, view, lambda b: b.base_offset in plain and hardens(tp, b))
    writes.extend(LaneWrite(b, max(b.base_offset, plan.write_from)) for b in plan.to_write)
    writes.sort(key=lambda w: w.batch.base_offset)
    # plan_pass trims to the end of what it was given unless something holds; the batches
    # after its last one are decided too, and hold nothing.
    trim_below = plan.trim_below if plan.trim_below < plan.decided_below else cut
    return LanePartitionPlan(writes, trim_below, cut, plan.delivered_records,
                             plan.expired_records, aborted, control)


def _name(tp: TopicPartition) -> str:
    return f"{tp.topic}/{tp.partition}"
