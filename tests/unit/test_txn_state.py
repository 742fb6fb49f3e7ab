"""The transaction coordinator's state machine (Transactions V1), I/O-free: every (state,
request) pair of Kafka's TransactionCoordinator as a table, the KIP-360, epoch-exhaustion and
fence flows end to end, timeouts with literal clocks, the JSON record, and random request
sequences checked against Kafka's own transition rules."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.transactions.state import (
    MAX_PRODUCER_EPOCH,
    MAX_TIMEOUT_MS,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    Step,
    TxnState,
    TxnStatus,
    add_group,
    add_partitions,
    completed,
    deadline_ms,
    end_transaction,
    expire,
    fence,
    fence_expired,
    init_producer_id,
    is_expired,
)
from wire.errors import ErrorCode

S = TxnStatus
E = ErrorCode
T0 = 1_700_000_000_000
TID = "orders-tx"
PID = 4_000
FRESH = 7_777
EPOCH = 5
PREPARED = (S.PREPARE_COMMIT, S.PREPARE_ABORT)
AT_REST = (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT)
A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)

# Kafka's TransactionMetadata.scala, `validPreviousStates` of each state, verbatim.
# PrepareEpochFence is pending-only in Kafka; Kiln folds it into the fence.
VALID_PREVIOUS: dict[str, frozenset[str]] = {
    "Empty": frozenset({"Empty", "CompleteCommit", "CompleteAbort"}),
    "Ongoing": frozenset({"Ongoing", "Empty", "CompleteCommit", "CompleteAbort"}),
    "PrepareCommit": frozenset({"Ongoing"}),
    "PrepareAbort": frozenset({"Ongoing", "PrepareEpochFence"}),
    "CompleteCommit": frozenset({"PrepareCommit"}),
    "CompleteAbort": frozenset({"PrepareAbort"}),
    "Dead": frozenset({"Empty", "CompleteAbort", "CompleteCommit"}),
    "PrepareEpochFence": frozenset({"Ongoing"}),
}


def txn(status: TxnStatus, **changes: Any) -> TxnState:
    """A stored state as the coordinator would have left it in `status`."""
    busy = status in (S.ONGOING, *PREPARED)
    base = TxnState(
        transactional_id=TID, producer_id=PID, producer_epoch=EPOCH,
        last_producer_epoch=NO_PRODUCER_EPOCH, timeout_ms=60_000, status=status, number=3,
        partitions=frozenset({A0, B0}) if busy else frozenset(),
        groups=frozenset({"g1"}) if busy else frozenset(),
        start_ms=-1 if status is S.EMPTY else T0 - 5_000, updated_ms=T0 - 1_000,
        previous_producer_id=PID)
    return dataclasses.replace(base, **changes)


def init(current: TxnState | None, *, expected: tuple[int, int] = (-1, -1),
         timeout_ms: int = 30_000, fresh: int | None = None, tid: str = TID) -> Step:
    return init_producer_id(current, transactional_id=tid, timeout_ms=timeout_ms,
                            expected_producer_id=expected[0], expected_epoch=expected[1],
                            now=T0, fresh_producer_id=fresh)


def outcome(step: Step) -> tuple[Any, ...]:
    """Error, then what is saved (status, pid, epoch, last epoch) or None, then the flags and
    the answered producer id and epoch."""
    saved = None if step.state is None else (
        step.state.status, step.state.producer_id, step.state.producer_epoch,
        step.state.last_producer_epoch)
    return (step.error, saved, step.complete, step.needs_producer_id,
            (step.producer_id, step.producer_epoch))


NO_ANSWER = (NO_PRODUCER_ID, NO_PRODUCER_EPOCH)


def refused(error: ErrorCode) -> tuple[Any, ...]:
    return (error, None, False, False, NO_ANSWER)


def empty_at(pid: int, epoch: int, last: int) -> tuple[Any, ...]:
    return (E.NONE, (S.EMPTY, pid, epoch, last), False, False, (pid, epoch))


NEEDS_ID = (E.NONE, None, False, True, NO_ANSWER)
FENCE = (E.CONCURRENT_TRANSACTIONS, (S.PREPARE_ABORT, PID, EPOCH + 1, -1), True, False,
         NO_ANSWER)
EXHAUSTED = MAX_PRODUCER_EPOCH - 1

# (name, stored state, request, outcome). Rows follow TransactionCoordinator.handleInitProducerId
# and prepareInitProducerIdTransit, TransactionMetadata.prepareIncrementProducerEpoch and
# prepareProducerIdRotation.
INIT_CASES: list[tuple[str, TxnState | None, dict[str, Any], tuple[Any, ...]]] = [
    ("empty transactional id", None, {"tid": "", "fresh": FRESH}, refused(E.INVALID_REQUEST)),
    ("zero timeout", None, {"timeout_ms": 0}, refused(E.INVALID_TRANSACTION_TIMEOUT)),
    ("negative timeout", txn(S.EMPTY), {"timeout_ms": -1},
     refused(E.INVALID_TRANSACTION_TIMEOUT)),
    ("timeout above the maximum", txn(S.EMPTY), {"timeout_ms": MAX_TIMEOUT_MS + 1},
     refused(E.INVALID_TRANSACTION_TIMEOUT)),
    ("timeout at the maximum", txn(S.EMPTY), {"timeout_ms": MAX_TIMEOUT_MS},
     empty_at(PID, EPOCH + 1, -1)),
    ("expected id without epoch", txn(S.EMPTY), {"expected": (PID, -1)},
     refused(E.INVALID_REQUEST)),
    ("expected epoch without id", txn(S.EMPTY), {"expected": (-1, EPOCH)},
     refused(E.INVALID_REQUEST)),
    ("new id asks for a producer id", None, {}, NEEDS_ID),
    ("new id with its producer id", None, {"fresh": FRESH}, empty_at(FRESH, 0, -1)),
    ("new id, KIP-360 recovery of an expired id", None,
     {"expected": (PID, EPOCH), "fresh": FRESH}, empty_at(FRESH, 0, -1)),
    ("dead id is a new one", txn(S.DEAD), {}, NEEDS_ID),
    ("dead id with its producer id", txn(S.DEAD), {"fresh": FRESH}, empty_at(FRESH, 0, -1)),
    ("prepare commit", txn(S.PREPARE_COMMIT), {}, refused(E.CONCURRENT_TRANSACTIONS)),
    ("prepare abort", txn(S.PREPARE_ABORT), {"expected": (PID, EPOCH)},
     refused(E.CONCURRENT_TRANSACTIONS)),
    ("prepare, unknown expected id", txn(S.PREPARE_COMMIT), {"expected": (PID + 1, EPOCH)},
     refused(E.PRODUCER_FENCED)),
    ("ongoing is fenced", txn(S.ONGOING), {}, FENCE),
    ("ongoing, its own producer", txn(S.ONGOING), {"expected": (PID, EPOCH)}, FENCE),
    ("ongoing, an older epoch of its producer id", txn(S.ONGOING),
     {"expected": (PID, EPOCH - 2)}, FENCE),
    ("ongoing, unknown expected id", txn(S.ONGOING), {"expected": (PID + 1, EPOCH)},
     refused(E.PRODUCER_FENCED)),
    ("ongoing at the last epoch fences to Short.MaxValue",
     txn(S.ONGOING, producer_epoch=EXHAUSTED), {},
     (E.CONCURRENT_TRANSACTIONS, (S.PREPARE_ABORT, PID, MAX_PRODUCER_EPOCH, -1), True, False,
      NO_ANSWER)),
    ("exhausted asks for a producer id", txn(S.EMPTY, producer_epoch=EXHAUSTED), {}, NEEDS_ID),
    ("exhausted, new producer id, no last epoch",
     txn(S.EMPTY, producer_epoch=EXHAUSTED), {"fresh": FRESH}, empty_at(FRESH, 0, -1)),
    ("exhausted, its own producer keeps its last epoch",
     txn(S.COMPLETE_COMMIT, producer_epoch=EXHAUSTED),
     {"expected": (PID, EXHAUSTED), "fresh": FRESH}, empty_at(FRESH, 0, EXHAUSTED)),
    ("one below exhaustion still bumps", txn(S.EMPTY, producer_epoch=EXHAUSTED - 1),
     {"fresh": FRESH}, empty_at(PID, EXHAUSTED, -1)),
    ("after a fence at the last epoch, a new producer gets a new id",
     txn(S.COMPLETE_ABORT, producer_epoch=MAX_PRODUCER_EPOCH), {"fresh": FRESH},
     empty_at(FRESH, 0, -1)),
    # Kafka throws (UNKNOWN_SERVER_ERROR) on the next two; Kiln answers as below exhaustion.
    ("after a fence at the last epoch, the fenced producer",
     txn(S.COMPLETE_ABORT, producer_epoch=MAX_PRODUCER_EPOCH),
     {"expected": (PID, EXHAUSTED), "fresh": FRESH}, refused(E.PRODUCER_FENCED)),
    ("exhausted, retry of the bump that exhausted it",
     txn(S.EMPTY, producer_epoch=EXHAUSTED, last_producer_epoch=EXHAUSTED - 1),
     {"expected": (PID, EXHAUSTED - 1)}, empty_at(PID, EXHAUSTED, EXHAUSTED - 1)),
    ("retry of the call that replaced the exhausted id",
     txn(S.EMPTY, producer_id=FRESH, producer_epoch=0, last_producer_epoch=EXHAUSTED),
     {"expected": (PID, EXHAUSTED)}, empty_at(FRESH, 0, EXHAUSTED)),
    ("the replaced id at an epoch not exhausted",
     txn(S.EMPTY, producer_id=FRESH, producer_epoch=0, last_producer_epoch=EXHAUSTED),
     {"expected": (PID, EXHAUSTED - 1)}, refused(E.PRODUCER_FENCED)),
]
for _status in AT_REST:
    INIT_CASES += [
        (f"{_status.value}, new producer", txn(_status), {}, empty_at(PID, EPOCH + 1, -1)),
        (f"{_status.value}, KIP-360 bump", txn(_status), {"expected": (PID, EPOCH)},
         empty_at(PID, EPOCH + 1, EPOCH)),
        (f"{_status.value}, KIP-360 retry", txn(_status, last_producer_epoch=EPOCH - 1),
         {"expected": (PID, EPOCH - 1)}, empty_at(PID, EPOCH, EPOCH - 1)),
        (f"{_status.value}, fenced epoch", txn(_status, last_producer_epoch=EPOCH - 1),
         {"expected": (PID, EPOCH - 2)}, refused(E.PRODUCER_FENCED)),
        (f"{_status.value}, newer epoch than the coordinator's", txn(_status),
         {"expected": (PID, EPOCH + 1)}, refused(E.PRODUCER_FENCED)),
        (f"{_status.value}, unknown producer id", txn(_status),
         {"expected": (PID + 1, EPOCH)}, refused(E.PRODUCER_FENCED)),
    ]


@pytest.mark.parametrize(("current", "request_", "expected"),
                         [c[1:] for c in INIT_CASES], ids=[c[0] for c in INIT_CASES])
def test_init_producer_id(current: TxnState | None, request_: dict[str, Any],
                          expected: tuple[Any, ...]) -> None:
    assert outcome(init(current, **request_)) == expected


@pytest.mark.parametrize("status", AT_REST)
def test_init_producer_id_starts_afresh_with_the_requested_timeout(status: TxnStatus) -> None:
    step = init(txn(status), timeout_ms=9_000)

    assert step.state is not None
    assert (step.state.timeout_ms, step.state.start_ms, step.state.updated_ms) == (9_000, -1, T0)
    assert (step.state.partitions, step.state.groups, step.state.number) == (
        frozenset(), frozenset(), 3)
    assert step.state.previous_producer_id == PID


def test_a_replaced_producer_id_is_remembered() -> None:
    step = init(txn(S.EMPTY, producer_epoch=EXHAUSTED), fresh=FRESH)

    assert step.state is not None
    assert step.state.previous_producer_id == PID


def test_a_new_id_starts_with_transaction_number_zero_and_a_dead_one_continues() -> None:
    new, revived = init(None, fresh=FRESH), init(txn(S.DEAD, number=9), fresh=FRESH)

    assert new.state == TxnState(TID, FRESH, 0, -1, 30_000, S.EMPTY, 0, frozenset(),
                                 frozenset(), -1, T0, FRESH)
    assert revived.state is not None and revived.state.number == 9


def test_the_fence_keeps_the_transaction_to_abort() -> None:
    ongoing = txn(S.ONGOING)

    step = init(ongoing, timeout_ms=1_000)

    assert step.state == dataclasses.replace(
        ongoing, status=S.PREPARE_ABORT, producer_epoch=EPOCH + 1, last_producer_epoch=-1,
        updated_ms=T0)


# AddPartitionsToTxn / AddOffsetsToTxn: handleAddPartitionsToTransaction.
def add(current: TxnState | None, participant: tuple[str, int] | str | None = None, *,
        pid: int = PID, epoch: int = EPOCH, now: int = T0) -> Step:
    if isinstance(participant, str):
        return add_group(current, producer_id=pid, producer_epoch=epoch, group_id=participant,
                         now=now)
    return add_partitions(current, producer_id=pid, producer_epoch=epoch,
                          partitions=[] if participant is None else [participant], now=now)


ADD_REFUSALS: list[tuple[str, TxnState | None, dict[str, Any], ErrorCode]] = [
    ("no state", None, {}, E.INVALID_PRODUCER_ID_MAPPING),
    ("dead", txn(S.DEAD), {}, E.INVALID_PRODUCER_ID_MAPPING),
]
for _status in (S.EMPTY, S.ONGOING, *PREPARED, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
    ADD_REFUSALS += [
        (f"{_status.value}, other producer id", txn(_status), {"pid": PID + 1},
         E.INVALID_PRODUCER_ID_MAPPING),
        (f"{_status.value}, older epoch", txn(_status), {"epoch": EPOCH - 1},
         E.PRODUCER_FENCED),
        (f"{_status.value}, newer epoch", txn(_status), {"epoch": EPOCH + 1},
         E.PRODUCER_FENCED),
    ]
ADD_REFUSALS += [(f"{s.value}", txn(s), {}, E.CONCURRENT_TRANSACTIONS) for s in PREPARED]


@pytest.mark.parametrize("participant", [A1, "g2"], ids=["partition", "group"])
@pytest.mark.parametrize(("current", "who", "error"), [c[1:] for c in ADD_REFUSALS],
                         ids=[c[0] for c in ADD_REFUSALS])
def test_add_refused(current: TxnState | None, who: dict[str, Any], error: ErrorCode,
                     participant: tuple[str, int] | str) -> None:
    assert outcome(add(current, participant, **who)) == refused(error)


@pytest.mark.parametrize("participant", [A0, "g1"], ids=["partition", "group"])
def test_add_of_a_participant_already_in_the_transaction_saves_nothing(
        participant: tuple[str, int] | str) -> None:
    assert outcome(add(txn(S.ONGOING), participant)) == refused(E.NONE)


@pytest.mark.parametrize(("participant", "partitions", "groups"), [
    (A1, {A0, A1, B0}, {"g1"}),
    ("g2", {A0, B0}, {"g1", "g2"}),
], ids=["partition", "group"])
def test_add_to_an_ongoing_transaction(participant: tuple[str, int] | str,
                                       partitions: set[tuple[str, int]],
                                       groups: set[str]) -> None:
    ongoing = txn(S.ONGOING)

    step = add(ongoing, participant)

    assert outcome(step) == (E.NONE, (S.ONGOING, PID, EPOCH, -1), False, False, NO_ANSWER)
    assert step.state == dataclasses.replace(ongoing, partitions=frozenset(partitions),
                                             groups=frozenset(groups), updated_ms=T0)


@pytest.mark.parametrize("participant", [A1, "g2"], ids=["partition", "group"])
@pytest.mark.parametrize("status", AT_REST)
def test_add_starts_a_transaction(status: TxnStatus, participant: tuple[str, int] | str) -> None:
    resting = txn(status)

    step = add(resting, participant)

    assert step.error is E.NONE and not step.complete
    assert step.state == dataclasses.replace(
        resting, status=S.ONGOING, number=4, start_ms=T0, updated_ms=T0,
        partitions=frozenset() if isinstance(participant, str) else frozenset({participant}),
        groups=frozenset({participant}) if isinstance(participant, str) else frozenset())


def test_add_of_no_partition_still_starts_a_transaction() -> None:
    step = add(txn(S.EMPTY), None)

    assert step.state is not None
    assert (step.state.status, step.state.partitions, step.state.start_ms) == (
        S.ONGOING, frozenset(), T0)


def test_add_past_the_timeout_is_accepted_until_the_abort_reaches_it() -> None:
    late = txn(S.ONGOING, start_ms=T0 - 120_000, timeout_ms=60_000)

    step = add(late, A1)

    assert step.error is E.NONE and step.state is not None
    assert step.state.status is S.ONGOING


# EndTxn v0-4: handleEndTransaction with isFromClient = true and Transactions V1.
def end(current: TxnState | None, commit: bool, *, pid: int = PID, epoch: int = EPOCH) -> Step:
    return end_transaction(current, producer_id=pid, producer_epoch=epoch, commit=commit, now=T0)


END_CASES: list[tuple[str, TxnState | None, bool, dict[str, Any], tuple[Any, ...]]] = []
for _commit in (True, False):
    _word = "commit" if _commit else "abort"
    _same, _other = ((S.COMPLETE_COMMIT, S.COMPLETE_ABORT) if _commit
                     else (S.COMPLETE_ABORT, S.COMPLETE_COMMIT))
    _prep_same, _prep_other = ((S.PREPARE_COMMIT, S.PREPARE_ABORT) if _commit
                               else (S.PREPARE_ABORT, S.PREPARE_COMMIT))
    END_CASES += [
        (f"{_word}, no state", None, _commit, {}, refused(E.INVALID_PRODUCER_ID_MAPPING)),
        (f"{_word}, dead", txn(S.DEAD), _commit, {}, refused(E.INVALID_PRODUCER_ID_MAPPING)),
        (f"{_word}, ongoing", txn(S.ONGOING), _commit, {},
         (E.NONE, (_prep_same, PID, EPOCH, -1), True, False, (PID, EPOCH))),
        (f"{_word}, ongoing without participants",
         txn(S.ONGOING, partitions=frozenset(), groups=frozenset()), _commit, {},
         (E.NONE, (_prep_same, PID, EPOCH, -1), True, False, (PID, EPOCH))),
        (f"{_word}, retry after {_same.value}", txn(_same), _commit, {},
         (E.NONE, None, False, False, (PID, EPOCH))),
        (f"{_word} after {_other.value}", txn(_other), _commit, {},
         refused(E.INVALID_TXN_STATE)),
        (f"{_word}, retry during {_prep_same.value}", txn(_prep_same), _commit, {},
         refused(E.CONCURRENT_TRANSACTIONS)),
        (f"{_word} during {_prep_other.value}", txn(_prep_other), _commit, {},
         refused(E.INVALID_TXN_STATE)),
        (f"{_word}, empty", txn(S.EMPTY), _commit, {}, refused(E.INVALID_TXN_STATE)),
    ]
    for _status in (S.EMPTY, S.ONGOING, *PREPARED, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
        END_CASES += [
            (f"{_word}, {_status.value}, other producer id", txn(_status), _commit,
             {"pid": PID + 1}, refused(E.INVALID_PRODUCER_ID_MAPPING)),
            # V1 has no "one epoch below" retry (that is V2's epoch bump per transaction).
            (f"{_word}, {_status.value}, older epoch", txn(_status), _commit,
             {"epoch": EPOCH - 1}, refused(E.PRODUCER_FENCED)),
            (f"{_word}, {_status.value}, newer epoch", txn(_status), _commit,
             {"epoch": EPOCH + 1}, refused(E.PRODUCER_FENCED)),
        ]


@pytest.mark.parametrize(("current", "commit", "who", "expected"), [c[1:] for c in END_CASES],
                         ids=[c[0] for c in END_CASES])
def test_end_transaction(current: TxnState | None, commit: bool, who: dict[str, Any],
                         expected: tuple[Any, ...]) -> None:
    assert outcome(end(current, commit, **who)) == expected


def test_end_transaction_keeps_the_participants_for_the_markers() -> None:
    ongoing = txn(S.ONGOING)

    step = end(ongoing, True)

    assert step.state == dataclasses.replace(ongoing, status=S.PREPARE_COMMIT, updated_ms=T0)


@pytest.mark.parametrize(("prepared", "complete"), [
    (S.PREPARE_COMMIT, S.COMPLETE_COMMIT), (S.PREPARE_ABORT, S.COMPLETE_ABORT)])
def test_completed_clears_the_participants(prepared: TxnStatus, complete: TxnStatus) -> None:
    state = txn(prepared, last_producer_epoch=EPOCH - 1)

    done = completed(state, now=T0)

    assert done == dataclasses.replace(state, status=complete, partitions=frozenset(),
                                       groups=frozenset(), updated_ms=T0)


@pytest.mark.parametrize("status", [S.EMPTY, S.ONGOING, S.COMPLETE_COMMIT, S.COMPLETE_ABORT,
                                    S.DEAD])
def test_completed_needs_a_prepared_transaction(status: TxnStatus) -> None:
    with pytest.raises(ValueError, match="not prepared"):
        completed(txn(status), now=T0)


# Timeouts: TransactionStateManager.timedOutTransactions and abortTimedOutTransactions.
def test_deadline_of_an_ongoing_transaction() -> None:
    ongoing = txn(S.ONGOING, start_ms=1_000, timeout_ms=500)

    assert (deadline_ms(ongoing), is_expired(ongoing, 1_500), is_expired(ongoing, 1_501)) == (
        1_500, False, True)


@pytest.mark.parametrize("status", [s for s in S if s is not S.ONGOING])
def test_only_an_ongoing_transaction_times_out(status: TxnStatus) -> None:
    state = txn(status, start_ms=1_000, timeout_ms=500)

    assert (deadline_ms(state), is_expired(state, 10_000)) == (None, False)
    assert outcome(fence_expired(state, now=10_000)) == refused(E.NONE)


def test_fence_expired_before_the_deadline_does_nothing() -> None:
    assert outcome(fence_expired(txn(S.ONGOING, start_ms=1_000, timeout_ms=500),
                                 now=1_500)) == refused(E.NONE)


def test_fence_expired_aborts_at_a_bumped_epoch() -> None:
    ongoing = txn(S.ONGOING, start_ms=1_000, timeout_ms=500, last_producer_epoch=EPOCH - 1)

    step = fence_expired(ongoing, now=1_501)

    assert (step.error, step.complete) == (E.NONE, True)
    assert step.state == dataclasses.replace(ongoing, status=S.PREPARE_ABORT,
                                             producer_epoch=EPOCH + 1, last_producer_epoch=-1,
                                             updated_ms=1_501)


def fenced_by_timeout() -> TxnState:
    step = fence_expired(txn(S.ONGOING, start_ms=T0 - 70_000, timeout_ms=60_000), now=T0)
    assert step.state is not None
    return completed(step.state, now=T0 + 1)


@pytest.mark.parametrize("request_", [
    lambda s: add(s, A1),
    lambda s: add(s, "g2"),
    lambda s: end(s, False),
    lambda s: end(s, True),
    lambda s: init(s, expected=(PID, EPOCH)),
], ids=["add partition", "add group", "abort", "commit", "KIP-360 init"])
def test_the_producer_of_a_timed_out_transaction_is_fenced(
        request_: Callable[[TxnState], Step]) -> None:
    assert outcome(request_(fenced_by_timeout())) == refused(E.PRODUCER_FENCED)


def test_a_new_producer_takes_over_after_a_timeout() -> None:
    assert outcome(init(fenced_by_timeout())) == empty_at(PID, EPOCH + 2, -1)


def test_expire_an_idle_id() -> None:
    idle = txn(S.COMPLETE_COMMIT, updated_ms=1_000)

    not_yet, due = expire(idle, now=1_999, expiration_ms=1_000), expire(
        idle, now=2_000, expiration_ms=1_000)

    assert outcome(not_yet) == refused(E.NONE)
    assert due.state == dataclasses.replace(idle, status=S.DEAD)


@pytest.mark.parametrize("status", [S.ONGOING, *PREPARED, S.DEAD])
def test_only_an_id_at_rest_expires(status: TxnStatus) -> None:
    assert outcome(expire(txn(status, updated_ms=0), now=T0)) == refused(E.NONE)


# Whole flows, as a client drives them.
def test_client_retrying_after_init_fenced_its_open_transaction() -> None:
    fence = init(txn(S.ONGOING))
    assert fence.state is not None and fence.complete
    during = init(fence.state)
    after = init(completed(fence.state, now=T0))

    assert outcome(during) == refused(E.CONCURRENT_TRANSACTIONS)
    assert outcome(after) == empty_at(PID, EPOCH + 2, -1)


def test_kip_360_bump_lost_answer_retry_and_fencing() -> None:
    # The producer aborted (CompleteAbort at epoch 5) and asks for a bump; the answer is lost.
    bumped = init(txn(S.COMPLETE_ABORT), expected=(PID, EPOCH)).state
    assert bumped is not None
    retry = init(bumped, expected=(PID, EPOCH))
    assert retry.state is not None
    other = init(retry.state).state  # another instance with the same transactional id
    assert other is not None

    late_retry = init(other, expected=(PID, EPOCH))

    assert outcome(retry) == empty_at(PID, EPOCH + 1, EPOCH)
    assert outcome(late_retry) == refused(E.PRODUCER_FENCED)


def test_epoch_exhaustion_rotates_the_producer_id_once_for_the_retry() -> None:
    first = init(txn(S.COMPLETE_COMMIT, producer_epoch=EXHAUSTED), expected=(PID, EXHAUSTED))
    assert first.needs_producer_id
    rotated = init(txn(S.COMPLETE_COMMIT, producer_epoch=EXHAUSTED), expected=(PID, EXHAUSTED),
                   fresh=FRESH).state
    assert rotated is not None

    retry = init(rotated, expected=(PID, EXHAUSTED), fresh=FRESH + 1)

    assert outcome(retry) == empty_at(FRESH, 0, EXHAUSTED)


# The stored record.
def test_json_is_compact_sorted_and_stable() -> None:
    state = txn(S.ONGOING, partitions=frozenset({("t", 10), ("t", 2), ("a.b-c", 0)}),
                groups=frozenset({"z", "g"}))

    assert state.to_json() == (
        '{"format":1,"tid":"orders-tx","pid":4000,"epoch":5,"last_epoch":-1,"prev_pid":4000,'
        '"timeout_ms":60000,"state":"Ongoing","n":3,"parts":["a.b-c/0","t/2","t/10"],'
        '"groups":["g","z"],"start_ms":1699999995000,"updated_ms":1699999999000}')


def test_json_from_bytes() -> None:
    state = txn(S.PREPARE_ABORT)

    assert TxnState.from_json(state.to_json().encode()) == state


def test_json_of_another_format_is_refused() -> None:
    with pytest.raises(ValueError, match="format"):
        TxnState.from_json('{"format":2}')


STATES = st.builds(
    TxnState,
    transactional_id=st.text(min_size=1, max_size=20),
    producer_id=st.integers(0, 2**63 - 1),
    producer_epoch=st.integers(0, MAX_PRODUCER_EPOCH),
    last_producer_epoch=st.integers(-1, MAX_PRODUCER_EPOCH),
    timeout_ms=st.integers(1, MAX_TIMEOUT_MS),
    status=st.sampled_from(S),
    number=st.integers(0, 2**40),
    partitions=st.frozensets(st.tuples(st.text(max_size=10), st.integers(0, 10_000)),
                             max_size=5),
    groups=st.frozensets(st.text(max_size=10), max_size=3),
    start_ms=st.integers(-1, 2**45),
    updated_ms=st.integers(0, 2**45),
    previous_producer_id=st.integers(-1, 2**63 - 1),
)


@given(STATES)
def test_json_round_trip(state: TxnState) -> None:
    assert TxnState.from_json(state.to_json()) == state


# Random request sequences against Kafka's rules. Producers are client instances: each
# remembers the producer id and epoch it was last answered and names them (KIP-360) when it
# initializes again; a new instance names none. An answer can be lost on the way back.
NEW, REINIT, ADD, GROUP, END, MARKERS, TICK, SCAN, EXPIRE = range(9)
# Weighted towards the newest instance and towards transactions, so that sequences get far.
WHO = st.sampled_from([0, 0, 0, 1, 2])  # counted from the newest instance
LOST = st.sampled_from([False, False, False, True])
WORK = st.one_of(
    st.tuples(st.just(ADD), WHO, st.sampled_from([A0, A1, B0])),
    st.tuples(st.just(GROUP), WHO, st.sampled_from(["g1", "g2"])),
    st.tuples(st.just(END), WHO, st.booleans()),
    st.tuples(st.just(MARKERS)),
)
ACTIONS = st.one_of(
    st.tuples(st.just(NEW), st.sampled_from([1, 50, 5_000, MAX_TIMEOUT_MS]), LOST),
    st.tuples(st.just(REINIT), WHO, LOST),
    WORK, WORK, WORK,
    st.tuples(st.just(TICK), st.sampled_from([0, 1, 30, 2_000])),
    st.tuples(st.just(SCAN)),
    st.tuples(st.just(EXPIRE)),
)
START = st.one_of(
    st.none(),
    st.builds(lambda status, epoch: txn(status, producer_epoch=epoch, updated_ms=T0),
              st.sampled_from([S.EMPTY, S.ONGOING, S.COMPLETE_ABORT]),
              st.sampled_from([0, EPOCH, EXHAUSTED - 2, EXHAUSTED - 1, EXHAUSTED])),
)


class Driver:
    """A coordinator around the state machine: saves Steps, allocates producer ids when asked,
    writes markers when told to (here: on MARKERS), and checks every save and answer."""

    def __init__(self, start: TxnState | None) -> None:
        self.current = start
        self.now = T0
        self.next_pid = 10_000
        self.timeout = 1_000  # of the next InitProducerId
        self.sessions: list[tuple[int, int]] = []  # (producer id, epoch) each instance holds
        self.live: object = None  # the instance answered last; None once a fence hit them all

    def run(self, request: Callable[[TxnState | None, int | None], Step]) -> Step:
        step, allocated = request(self.current, None), None
        if step.needs_producer_id:
            assert (step.state, step.error) == (None, E.NONE)
            allocated, self.next_pid = self.next_pid, self.next_pid + 1
            step = request(self.current, allocated)
            assert not step.needs_producer_id
        if step.state is None:
            assert not step.complete
        else:
            check_transition(self.current, step.state, allocated)
            assert step.complete == (step.state.status in PREPARED)
            assert TxnState.from_json(step.state.to_json()) == step.state
            self.current = step.state
        return step

    def init(self, expected: tuple[int, int]) -> Step:
        step = self.run(lambda cur, fresh: init_producer_id(
            cur, transactional_id=TID, timeout_ms=self.timeout, expected_producer_id=expected[0],
            expected_epoch=expected[1], now=self.now, fresh_producer_id=fresh))
        if step.error is E.NONE:
            assert step.state is not None and step.state.status is S.EMPTY
            assert (step.producer_id, step.producer_epoch) == (
                step.state.producer_id, step.state.producer_epoch)
            assert 0 <= step.producer_epoch < MAX_PRODUCER_EPOCH
        elif step.state is not None:  # the fence of an open transaction
            assert step.error is E.CONCURRENT_TRANSACTIONS
            self.live = None
        return step

    def act(self, action: tuple[Any, ...]) -> None:
        kind = action[0]
        if kind == NEW:
            self.timeout, lost = action[1], action[2]
            step = self.init((NO_PRODUCER_ID, NO_PRODUCER_EPOCH))
            if step.error is E.NONE:
                self.live = object()  # an instance nobody else is
                if not lost:
                    self.sessions.append((step.producer_id, step.producer_epoch))
                    self.live = len(self.sessions) - 1
            return
        if kind in (MARKERS, TICK, SCAN, EXPIRE):
            self.background(action)
            return
        if not self.sessions:
            return
        k = len(self.sessions) - 1 - action[1] % len(self.sessions)
        pid, epoch = self.sessions[k]
        fenced = self.live != k
        current_is_gone = self.current is None or self.current.status is S.DEAD
        if kind == REINIT:
            step = self.init((pid, epoch))
            if step.error is E.NONE:
                # A fenced instance gets in again only with a new producer id for an id that
                # expired meanwhile (Kafka: KIP-360 recovery), never at someone else's epoch.
                assert not fenced or current_is_gone, (k, self.live, step)
                self.live = k
                if not action[2]:
                    self.sessions[k] = (step.producer_id, step.producer_epoch)
            return
        if kind == ADD:
            step = self.run(lambda cur, _: add_partitions(
                cur, producer_id=pid, producer_epoch=epoch, partitions=[action[2]], now=self.now))
        elif kind == GROUP:
            step = self.run(lambda cur, _: add_group(
                cur, producer_id=pid, producer_epoch=epoch, group_id=action[2], now=self.now))
        else:
            step = self.run(lambda cur, _: end_transaction(
                cur, producer_id=pid, producer_epoch=epoch, commit=action[2], now=self.now))
        if step.error is E.NONE:
            assert not fenced, (k, self.live, step)
            assert self.current is not None
            assert (pid, epoch) == (self.current.producer_id, self.current.producer_epoch)
        elif fenced:
            assert step.error in (E.PRODUCER_FENCED, E.INVALID_PRODUCER_ID_MAPPING), step

    def background(self, action: tuple[Any, ...]) -> None:
        kind, current = action[0], self.current
        if kind == TICK:
            self.now += action[1]
        elif current is None:
            return
        elif kind == MARKERS and current.status in PREPARED:
            done = completed(current, now=self.now)
            check_transition(current, done, None)
            self.current = done
        elif kind == SCAN:
            step = self.run(lambda cur, _: fence_expired(current, now=self.now))
            if step.state is not None:
                self.live = None
        elif kind == EXPIRE:
            step = self.run(lambda cur, _: expire(current, now=self.now, expiration_ms=100))
            if step.state is not None:
                self.live = None


def check_transition(old: TxnState | None, new: TxnState, allocated: int | None) -> None:
    """Kafka's prepareTransitionTo and completeTransitionTo checks, and Kiln's number."""
    assert new.status is not S.DEAD or (old is not None and new.producer_id == old.producer_id)
    if old is None or old.status is S.DEAD:
        # Kafka: no metadata (a Dead one is removed) -> new metadata, Empty at epoch 0.
        assert (new.status, new.producer_id, new.producer_epoch) == (S.EMPTY, allocated, 0)
        assert new.number == (0 if old is None else old.number)
        return
    assert old.status.value in VALID_PREVIOUS[new.status.value], (old.status, new.status)
    if new.producer_id != old.producer_id:
        # A new producer id only from InitProducerId, freshly allocated, at epoch 0, and
        # never while a transaction is open (prepareProducerIdRotation).
        assert new.producer_id == allocated and new.producer_epoch == 0
        assert new.status is S.EMPTY and old.status in AT_REST
        assert is_epoch_exhausted_at(old)
    else:
        assert new.producer_epoch in (old.producer_epoch, old.producer_epoch + 1)
        assert new.producer_epoch <= MAX_PRODUCER_EPOCH
    assert new.updated_ms >= old.updated_ms
    if new.status is S.EMPTY:
        assert (new.partitions, new.groups, new.start_ms) == (frozenset(), frozenset(), -1)
    elif new.status is S.ONGOING:
        assert new.producer_epoch == old.producer_epoch
        assert old.partitions <= new.partitions and old.groups <= new.groups
        assert new.timeout_ms == old.timeout_ms
        fresh_txn = old.status is not S.ONGOING
        assert new.number == old.number + (1 if fresh_txn else 0)
        assert new.start_ms == (new.updated_ms if fresh_txn else old.start_ms)
    elif new.status in PREPARED:
        fence = new.producer_epoch == old.producer_epoch + 1
        assert not fence or (new.status, new.last_producer_epoch) == (S.PREPARE_ABORT, -1)
        assert fence or new.last_producer_epoch == old.last_producer_epoch
        assert (new.partitions, new.groups) == (old.partitions, old.groups)
        assert (new.timeout_ms, new.start_ms) == (old.timeout_ms, old.start_ms)
    elif new.status in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
        assert new.producer_epoch == old.producer_epoch
        assert new.last_producer_epoch == old.last_producer_epoch
        assert (new.partitions, new.groups) == (frozenset(), frozenset())
        assert new.timeout_ms == old.timeout_ms and new.start_ms != -1
    if new.status is not S.ONGOING:
        assert new.number == old.number


def is_epoch_exhausted_at(state: TxnState) -> bool:
    return state.producer_epoch >= MAX_PRODUCER_EPOCH - 1


@settings(max_examples=400, deadline=None)
@given(START, st.lists(ACTIONS, min_size=5, max_size=60))
def test_random_request_sequences_follow_kafkas_rules(start: TxnState | None,
                                                      actions: list[tuple[Any, ...]]) -> None:
    driver = Driver(start)

    for action in actions:
        driver.act(action)

    assert driver.current is None or driver.current.producer_epoch <= MAX_PRODUCER_EPOCH


# An operator's abort (`kiln transactions abort`): a fence, whatever the deadline.
def test_an_operator_fences_an_open_transaction_before_its_deadline() -> None:
    ongoing = txn(S.ONGOING, start_ms=T0, timeout_ms=60_000)

    step = fence(ongoing, now=T0 + 1)

    assert (step.error, step.complete) == (E.NONE, True)
    assert step.state is not None
    assert (step.state.status, step.state.producer_epoch, step.state.last_producer_epoch) == (
        S.PREPARE_ABORT, EPOCH + 1, NO_PRODUCER_EPOCH)
    assert step.state.partitions == ongoing.partitions


@pytest.mark.parametrize("status", [s for s in S if s is not S.ONGOING])
def test_an_operator_cannot_abort_what_is_not_open(status: TxnStatus) -> None:
    assert outcome(fence(txn(status), now=T0)) == refused(E.INVALID_TXN_STATE)

