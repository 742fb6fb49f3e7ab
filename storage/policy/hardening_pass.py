"""What one hardening pass does with the batches it read, I/O-free.

A pass looks at the due batches of a partition that no earlier pass decided (from the
`decided_below` offset on) and decides each record once: written to Kafka (persistent
levels), skipped as delivered, dropped as expired (best_effort and express at the delay,
or shed), or **held**: `reliable_nonpersistent` records stay in the log queue until every
durable subscription of their topic has committed past them (DESIGN §3: kept until
delivered, back-pressured, never hardened). A topic without durable subscriptions can
deliver nothing, so there they are dropped at the delay like the weaker levels.

The log queue only ever loses a prefix, so a held batch also keeps the batches after it in
Redis: they are written to Kafka on time (ahead of the trim), and leave once the held batch
is delivered (`plan_release`). Offsets below `decided_below` that are still buffered are
that held region.

Counting: each record is counted once, when it leaves or is written: hardened by the
writer's own count, delivered or expired here. A held batch, and every
`reliable_nonpersistent` batch behind one, is counted when it leaves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from storage.model import Reliability, StoredBatch


def holds(batch: StoredBatch, *, subscribed: bool, delivered_below: int) -> bool:
    """Whether `batch` must stay in the log queue: reliable_nonpersistent, on a topic with
    durable subscriptions, not yet delivered to all of them."""
    return (batch.reliability is Reliability.RELIABLE_NONPERSISTENT and subscribed
            and batch.next_offset > delivered_below)


@dataclass(frozen=True, slots=True)
class PassView:
    """What a pass knows of its partition besides the batches."""

    decided_below: int     # every record below was decided by an earlier pass
    delivered_below: int   # the partition's delivered mark
    skip_delivered: bool   # harden=survivors: delivered records are not written
    subscribed: bool       # the topic has durable subscriptions
    head_held: bool        # a held batch before `decided_below` still stops every trim


@dataclass(frozen=True, slots=True)
class PassPlan:
    to_write: list[StoredBatch]
    write_from: int         # records below it are not written (in Kafka, or delivered)
    trim_below: int         # whole batches below it leave the log queue (0: none)
    decided_below: int      # the hardened mark: below it, in Kafka or needing nothing more
    delivered_records: int  # leaving (or skipped) as delivered, never written
    expired_records: int    # leaving, never to be hardened


def plan_pass(due: Sequence[StoredBatch], view: PassView,
              hardens: Callable[[StoredBatch], bool]) -> PassPlan:
    """Plan a pass over `due` (oldest first, all due, not empty)."""
    write_from = view.decided_below
    if view.skip_delivered:
        write_from = max(write_from, view.delivered_below)
    upto = due[-1].next_offset
    first_held = next((b for b in due
                       if holds(b, subscribed=view.subscribed,
                                delivered_below=view.delivered_below)), None)
    trim_below = 0 if view.head_held else (upto if first_held is None
                                            else first_held.base_offset)
    delivered = expired = 0
    for batch in due:
        lo = max(batch.base_offset, view.decided_below)
        if lo >= batch.next_offset:
            continue
        if hardens(batch):
            delivered += _span(lo, min(batch.next_offset, write_from))
            continue
        if batch.reliability is Reliability.RELIABLE_NONPERSISTENT \
                and batch.next_offset > trim_below:
            continue  # stays (held, or behind a held batch): counted when it leaves
        gone = _span(lo, min(batch.next_offset, view.delivered_below))
        delivered += gone
        expired += batch.next_offset - lo - gone
    return PassPlan([b for b in due if hardens(b) and b.next_offset > write_from],
                    write_from, trim_below, upto, delivered, expired)


@dataclass(frozen=True, slots=True)
class ReleasePlan:
    trim_below: int
    delivered_records: int
    expired_records: int
    blocked: bool  # a batch that must still be held stops the release here


def plan_release(head: Sequence[StoredBatch], *, decided_below: int, delivered_below: int,
                 subscribed: bool) -> ReleasePlan:
    """How much of the held region at the head of the log queue (`head`: its oldest
    batches) may leave now: everything up to the first batch that must still be held, and
    never a record at or above `decided_below` (no pass decided it yet)."""
    trim_below = 0
    delivered = expired = 0
    for batch in head:
        if batch.next_offset > decided_below:
            break
        if holds(batch, subscribed=subscribed, delivered_below=delivered_below):
            return ReleasePlan(trim_below, delivered, expired, blocked=True)
        if batch.reliability is Reliability.RELIABLE_NONPERSISTENT:
            gone = _span(batch.base_offset, min(batch.next_offset, delivered_below))
            delivered += gone
            expired += batch.record_count - gone
        trim_below = batch.next_offset
    return ReleasePlan(trim_below, delivered, expired, blocked=False)


def _span(lo: int, hi: int) -> int:
    return max(0, hi - lo)
