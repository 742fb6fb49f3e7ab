"""What a hardening pass writes, trims, holds and counts (storage.policy.hardening_pass)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from storage.model import Reliability, StoredBatch
from storage.policy.hardening_pass import PassView, holds, plan_pass, plan_release

R = Reliability


def _batch(base: int, level: Reliability, count: int = 10) -> StoredBatch:
    return StoredBatch(base, count, 0, level, b"")


def _persistent(batch: StoredBatch) -> bool:
    return batch.reliability.persistent


def _view(decided: int = 0, delivered: int = 0, *, subscribed: bool = True,
          skip_delivered: bool = True, head_held: bool = False) -> PassView:
    return PassView(decided_below=decided, delivered_below=delivered,
                    skip_delivered=skip_delivered, subscribed=subscribed, head_held=head_held)


def test_nonpersistent_reliable_records_are_held_until_delivered_on_a_subscribed_topic() -> None:
    batch = _batch(0, R.RELIABLE_NONPERSISTENT)

    assert holds(batch, subscribed=True, delivered_below=9)
    assert not holds(batch, subscribed=True, delivered_below=10)
    assert not holds(batch, subscribed=False, delivered_below=0)
    assert not any(holds(_batch(0, level), subscribed=True, delivered_below=0)
                   for level in R if level is not R.RELIABLE_NONPERSISTENT)


def test_records_behind_a_held_batch_are_written_on_time_and_the_trim_stops_at_it() -> None:
    # Given a persistent batch, a reliable_nonpersistent one nobody has read, and another
    # persistent one, all due
    due = [_batch(0, R.RELIABLE_PERSISTENT), _batch(10, R.RELIABLE_NONPERSISTENT),
           _batch(20, R.ASSURED_PERSISTENT)]

    # When the pass is planned
    plan = plan_pass(due, _view(), _persistent)

    # Then both persistent batches are written, only the first leaves, and the hardened
    # mark passes them all (assured acks behind the held batch are due)
    assert [b.base_offset for b in plan.to_write] == [0, 20]
    assert plan.trim_below == 10
    assert plan.decided_below == 30
    assert (plan.delivered_records, plan.expired_records) == (0, 0)


def test_without_durable_subscriptions_nonpersistent_records_expire_at_the_delay() -> None:
    due = [_batch(0, R.RELIABLE_NONPERSISTENT), _batch(10, R.EXPRESS)]

    plan = plan_pass(due, _view(subscribed=False), _persistent)

    assert plan.to_write == []
    assert plan.trim_below == 20
    assert (plan.delivered_records, plan.expired_records) == (0, 20)


def test_delivered_records_are_skipped_and_counted_delivered() -> None:
    # Given a delivered mark inside the second batch
    due = [_batch(0, R.RELIABLE_PERSISTENT), _batch(10, R.RELIABLE_PERSISTENT),
           _batch(20, R.RELIABLE_NONPERSISTENT)]

    plan = plan_pass(due, _view(delivered=15), _persistent)

    assert plan.write_from == 15
    assert [b.base_offset for b in plan.to_write] == [10]
    # the nonpersistent batch is not delivered yet: held, counted when it leaves
    assert plan.trim_below == 20
    assert plan.delivered_records == 15


def test_under_harden_all_delivered_persistent_records_are_written() -> None:
    due = [_batch(0, R.RELIABLE_PERSISTENT), _batch(10, R.RELIABLE_NONPERSISTENT)]

    plan = plan_pass(due, _view(delivered=20, skip_delivered=False), _persistent)

    assert plan.write_from == 0
    assert [b.base_offset for b in plan.to_write] == [0]
    assert plan.trim_below == 20
    assert (plan.delivered_records, plan.expired_records) == (10, 0)


def test_a_held_head_stops_every_trim_but_not_the_writes() -> None:
    due = [_batch(40, R.RELIABLE_PERSISTENT), _batch(50, R.RELIABLE_NONPERSISTENT)]

    plan = plan_pass(due, _view(decided=40, subscribed=False, head_held=True), _persistent)

    assert [b.base_offset for b in plan.to_write] == [40]
    assert plan.trim_below == 0
    # the expired nonpersistent batch behind the held head is counted when it leaves
    assert (plan.delivered_records, plan.expired_records) == (0, 0)
    assert plan.decided_below == 60


def test_records_below_the_decided_mark_are_neither_written_nor_counted_again() -> None:
    due = [_batch(0, R.RELIABLE_PERSISTENT), _batch(10, R.EXPRESS)]

    plan = plan_pass(due, _view(decided=5, subscribed=False), _persistent)

    assert plan.write_from == 5
    assert (plan.delivered_records, plan.expired_records) == (0, 10)


def test_a_release_lets_go_up_to_the_first_batch_still_held() -> None:
    # Given a held region: a delivered nonpersistent batch, a hardened one, one not yet
    # delivered, another hardened one
    head = [_batch(0, R.RELIABLE_NONPERSISTENT), _batch(10, R.RELIABLE_PERSISTENT),
            _batch(20, R.RELIABLE_NONPERSISTENT), _batch(30, R.RELIABLE_PERSISTENT)]

    plan = plan_release(head, decided_below=40, delivered_below=25, subscribed=True)

    assert plan.blocked
    assert plan.trim_below == 20
    assert (plan.delivered_records, plan.expired_records) == (10, 0)


def test_a_release_never_passes_the_decided_mark() -> None:
    head = [_batch(0, R.RELIABLE_NONPERSISTENT), _batch(10, R.RELIABLE_PERSISTENT),
            _batch(20, R.RELIABLE_PERSISTENT)]

    plan = plan_release(head, decided_below=25, delivered_below=5, subscribed=False)

    assert not plan.blocked
    assert plan.trim_below == 20  # the batch straddling 25 is the pass's
    assert (plan.delivered_records, plan.expired_records) == (5, 5)


_levels = st.sampled_from(list(R))


@given(levels=st.lists(_levels, min_size=1, max_size=12),
       delivered=st.integers(0, 130), subscribed=st.booleans(),
       still_subscribed=st.booleans(), more_delivered=st.integers(0, 130))
def test_every_record_is_counted_exactly_once_across_a_pass_and_its_release(
        levels: list[Reliability], delivered: int, subscribed: bool, still_subscribed: bool,
        more_delivered: int) -> None:
    # Given due batches of any levels, a pass, then (once more is delivered) a release of
    # whatever the pass left behind a held batch
    batches = [_batch(10 * i, level) for i, level in enumerate(levels)]
    plan = plan_pass(batches, _view(delivered=delivered, subscribed=subscribed), _persistent)
    written = sum(b.next_offset - max(b.base_offset, plan.write_from) for b in plan.to_write)
    left = [b for b in batches if b.next_offset > plan.trim_below]
    later = min(130, delivered + more_delivered)
    release = plan_release(left, decided_below=plan.decided_below, delivered_below=later,
                           subscribed=subscribed and still_subscribed)
    still = [b for b in left if b.next_offset > release.trim_below]

    # Then every record is counted once, except the reliable_nonpersistent ones still
    # held (or behind a held batch), and what stays starts at a batch that must be held
    counted = (written + plan.delivered_records + plan.expired_records
               + release.delivered_records + release.expired_records)
    uncounted = sum(b.record_count for b in still
                    if b.reliability is R.RELIABLE_NONPERSISTENT)
    assert counted == sum(b.record_count for b in batches) - uncounted
    if still:
        assert release.blocked
        assert holds(still[0], subscribed=True, delivered_below=later)
