"""The transaction coordinator's decisions for one transactional id, I/O-free.

Each request function takes the stored state (None: nothing stored) and the request, and
returns a `Step`: the error to answer, the state to save over the read revision (or none),
and what the caller must do next (write markers, allocate a producer id). The clock is an
argument. The rules are Kafka's `TransactionCoordinator` and `TransactionMetadata` for
Transactions V1 clients (EndTxn <= v4: no epoch bump per transaction); where Kiln differs,
the comment at the spot says so and why.

Kafka keeps a pending state while a transition is written to its log and answers
CONCURRENT_TRANSACTIONS meanwhile; Kiln writes each transition with one compare-and-set, so
there is no pending state here: a writer that loses the race reads again. Kafka's
PrepareEpochFence is such a pending-only state; its transition is folded into the fence
itself (Ongoing -> PrepareAbort at epoch + 1).

Handlers still own what Kafka decides in KafkaApis: an empty transactional id on
AddPartitionsToTxn/AddOffsetsToTxn/EndTxn answers INVALID_REQUEST before any state is read,
and PRODUCER_FENCED becomes INVALID_PRODUCER_EPOCH for clients too old to know it
(InitProducerId < v4, AddPartitionsToTxn/AddOffsetsToTxn/EndTxn < v2).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from wire.errors import ErrorCode


class TxnStatus(enum.Enum):
    """Kafka's transaction states; the values are the names DescribeTransactions reports."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    # An id idle past transactional.id.expiration.ms. Kafka writes a tombstone and drops the
    # id from its cache, so every request after that finds no state: the functions here
    # treat a stored Dead state exactly like no state.
    DEAD = "Dead"


MAX_TIMEOUT_MS = 900_000  # Kafka's transaction.max.timeout.ms default
TRANSACTIONAL_ID_EXPIRATION_MS = 604_800_000  # Kafka's transactional.id.expiration.ms (7 days)
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
# Short.MaxValue: epochs are int16 on the wire. The coordinator hands out at most one less,
# so that it can always fence a producer by bumping once more.
MAX_PRODUCER_EPOCH = 32_767

_PREPARED = {TxnStatus.PREPARE_COMMIT: TxnStatus.COMPLETE_COMMIT,
             TxnStatus.PREPARE_ABORT: TxnStatus.COMPLETE_ABORT}
_AT_REST = frozenset({TxnStatus.EMPTY, TxnStatus.COMPLETE_COMMIT, TxnStatus.COMPLETE_ABORT})
_FORMAT = 1


def is_epoch_exhausted(epoch: int) -> bool:
    """Kafka's TransactionMetadata.isEpochExhausted."""
    return epoch >= MAX_PRODUCER_EPOCH - 1


@dataclass(frozen=True, slots=True)
class TxnState:
    """What Kafka's TransactionMetadata holds for a transactional id, plus Kiln's transaction
    number (participants record the number of the transaction they belong to, so a replayed
    registration or marker of an ended transaction is told apart from the next one)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    # The epoch before the last InitProducerId bump when the producer named its own epoch
    # (KIP-360), so a retry of that call is answered without another bump; -1 otherwise.
    # Kafka does not write it to its log, so such a retry across a coordinator move is
    # fenced there; Kiln stores it with the rest.
    last_producer_epoch: int
    timeout_ms: int
    status: TxnStatus
    number: int
    partitions: frozenset[tuple[str, int]]
    groups: frozenset[str]
    # Kept through Complete* (DescribeTransactions shows when the finished one started, as
    # Kafka does); -1 from InitProducerId until the next transaction starts.
    start_ms: int
    updated_ms: int
    # The producer id before the last InitProducerId (Kafka's previousProducerId): a retry of
    # the call that replaced an exhausted producer id still names the old one.
    previous_producer_id: int = NO_PRODUCER_ID

    def to_json(self) -> str:
        return json.dumps({
            "format": _FORMAT,
            "tid": self.transactional_id,
            "pid": self.producer_id,
            "epoch": self.producer_epoch,
            "last_epoch": self.last_producer_epoch,
            "prev_pid": self.previous_producer_id,
            "timeout_ms": self.timeout_ms,
            "state": self.status.value,
            "n": self.number,
            "parts": [f"{topic}/{partition}" for topic, partition in sorted(self.partitions)],
            "groups": sorted(self.groups),
            "start_ms": self.start_ms,
            "updated_ms": self.updated_ms,
        }, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> TxnState:
        record: dict[str, Any] = json.loads(text)
        if record.get("format") != _FORMAT:
            raise ValueError(f"unknown transaction state format {record.get('format')!r}")
        return cls(
            transactional_id=str(record["tid"]),
            producer_id=int(record["pid"]),
            producer_epoch=int(record["epoch"]),
            last_producer_epoch=int(record["last_epoch"]),
            timeout_ms=int(record["timeout_ms"]),
            status=TxnStatus(record["state"]),
            number=int(record["n"]),
            partitions=frozenset(_partition(p) for p in record["parts"]),
            groups=frozenset(str(g) for g in record["groups"]),
            start_ms=int(record["start_ms"]),
            updated_ms=int(record["updated_ms"]),
            previous_producer_id=int(record["prev_pid"]),
        )


def _partition(text: str) -> tuple[str, int]:
    # The last "/": Kafka topic names cannot contain one, but the split must not depend on it.
    topic, _, partition = text.rpartition("/")
    return topic, int(partition)


@dataclass(frozen=True, slots=True)
class Step:
    """What the coordinator does with one request."""

    error: ErrorCode
    state: TxnState | None  # the new state to save over the read revision; None: save nothing
    # The saved state is Prepare*: the caller writes the markers, then saves `completed()`.
    complete: bool = False
    # Call again with `fresh_producer_id` (a new transactional id, or its epochs exhausted).
    needs_producer_id: bool = False
    # The producer id and epoch to answer: InitProducerId's, -1/-1 with an error as Kafka
    # answers; EndTxn's are the current ones (its responses carry them from v5 only).
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


def _error(error: ErrorCode) -> Step:
    return Step(error, None)


def _answer(state: TxnState, *, complete: bool = False) -> Step:
    return Step(ErrorCode.NONE, state, complete=complete,
                producer_id=state.producer_id, producer_epoch=state.producer_epoch)


def _live(current: TxnState | None) -> TxnState | None:
    return None if current is None or current.status is TxnStatus.DEAD else current


def init_producer_id(current: TxnState | None, *, transactional_id: str, timeout_ms: int,
                     expected_producer_id: int, expected_epoch: int, now: int,
                     fresh_producer_id: int | None = None,
                     max_timeout_ms: int = MAX_TIMEOUT_MS) -> Step:
    """InitProducerId with a transactional id. `expected_*`: the request's producer id and
    epoch (v3+, KIP-360; -1/-1 for a new producer)."""
    # KafkaApis: an expected producer id without an epoch, or the reverse, is malformed.
    if (expected_producer_id == NO_PRODUCER_ID) != (expected_epoch == NO_PRODUCER_EPOCH):
        return _error(ErrorCode.INVALID_REQUEST)
    if not transactional_id:
        return _error(ErrorCode.INVALID_REQUEST)
    if not 0 < timeout_ms <= max_timeout_ms:
        return _error(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
    expected = expected_producer_id != NO_PRODUCER_ID
    live = _live(current)
    if live is None:
        if fresh_producer_id is None:
            return Step(ErrorCode.NONE, None, needs_producer_id=True)
        # Kafka creates the metadata at epoch -1 and bumps it to 0 at once, whatever the
        # expected id and epoch (a producer recovering from an expired id gets the new one).
        # The transaction number continues past a Dead state, so a number never names two
        # transactions of one id.
        return _answer(TxnState(
            transactional_id=transactional_id, producer_id=fresh_producer_id,
            producer_epoch=0, last_producer_epoch=NO_PRODUCER_EPOCH, timeout_ms=timeout_ms,
            status=TxnStatus.EMPTY, number=0 if current is None else current.number,
            partitions=frozenset(), groups=frozenset(), start_ms=-1, updated_ms=now,
            previous_producer_id=fresh_producer_id))
    # isValidProducerId: the current producer id, or the one just replaced by a new id
    # because its epochs ran out (a retry of the call that replaced it).
    if expected and not (
            expected_producer_id == live.producer_id
            or (expected_producer_id == live.previous_producer_id
                and is_epoch_exhausted(expected_epoch))):
        return _error(ErrorCode.PRODUCER_FENCED)
    if live.status in _PREPARED:
        # The caller is (or, after a crash, its scanner is) completing it; the client retries.
        return _error(ErrorCode.CONCURRENT_TRANSACTIONS)
    if live.status is TxnStatus.ONGOING:
        # Kafka aborts the open transaction at a bumped epoch, which fences its producer, and
        # answers CONCURRENT_TRANSACTIONS; the client's retry then bumps again (and, if the
        # fence exhausted the epochs, gets a new producer id).
        return Step(ErrorCode.CONCURRENT_TRANSACTIONS, _fence(live, now), complete=True)
    if is_epoch_exhausted(live.producer_epoch) and (
            not expected or expected_epoch == live.producer_epoch):
        if fresh_producer_id is None:
            return Step(ErrorCode.NONE, None, needs_producer_id=True)
        # prepareProducerIdRotation: the last epoch is kept only for a producer that named
        # it, so its retry (old id, old epoch) is answered with the new id.
        return _answer(_reset(live, now, timeout_ms, producer_id=fresh_producer_id, epoch=0,
                              last_epoch=live.producer_epoch if expected else NO_PRODUCER_EPOCH))
    # prepareIncrementProducerEpoch. Kafka throws (UNKNOWN_SERVER_ERROR) when the epochs are
    # exhausted and the expected epoch is not the current one; Kiln goes on to the checks
    # below, where only the retry and the fenced answers can apply.
    if not expected:
        epoch, last = live.producer_epoch + 1, NO_PRODUCER_EPOCH
    elif expected_epoch == live.producer_epoch:
        epoch, last = live.producer_epoch + 1, live.producer_epoch
    elif expected_epoch == live.last_producer_epoch:
        # A retry of a call that succeeded: a new producer's call would have set the last
        # epoch to -1, so this one is still the newest.
        epoch, last = live.producer_epoch, live.last_producer_epoch
    else:
        return _error(ErrorCode.PRODUCER_FENCED)
    return _answer(_reset(live, now, timeout_ms, producer_id=live.producer_id, epoch=epoch,
                          last_epoch=last))


def _reset(live: TxnState, now: int, timeout_ms: int, *, producer_id: int, epoch: int,
           last_epoch: int) -> TxnState:
    """An InitProducerId transition: Empty, no participants, the request's timeout."""
    return replace(live, producer_id=producer_id, producer_epoch=epoch,
                   last_producer_epoch=last_epoch, timeout_ms=timeout_ms,
                   status=TxnStatus.EMPTY, partitions=frozenset(), groups=frozenset(),
                   start_ms=-1, updated_ms=now, previous_producer_id=live.producer_id)


def _fence(live: TxnState, now: int) -> TxnState:
    """prepareFenceProducerEpoch followed by the coordinator's own EndTxn(abort): the open
    transaction aborts at epoch + 1, which no client holds yet."""
    if live.producer_epoch >= MAX_PRODUCER_EPOCH:
        # Unreachable: a client never holds Short.MaxValue, so no transaction opens with it.
        raise ValueError(f"cannot fence producer epoch {live.producer_epoch}")
    # Kafka sets the last epoch to -1 here (not the fenced epoch): the fenced producer's
    # InitProducerId naming its old epoch must not pass as a retry.
    return replace(live, producer_epoch=live.producer_epoch + 1,
                   last_producer_epoch=NO_PRODUCER_EPOCH, status=TxnStatus.PREPARE_ABORT,
                   updated_ms=now)


def _check_producer(current: TxnState | None, producer_id: int,
                    producer_epoch: int) -> tuple[TxnState | None, ErrorCode]:
    live = _live(current)
    if live is None or live.producer_id != producer_id:
        return None, ErrorCode.INVALID_PRODUCER_ID_MAPPING
    if live.producer_epoch != producer_epoch:
        return None, ErrorCode.PRODUCER_FENCED
    return live, ErrorCode.NONE


def _add(current: TxnState | None, producer_id: int, producer_epoch: int, now: int,
         partitions: frozenset[tuple[str, int]], groups: frozenset[str]) -> Step:
    live, error = _check_producer(current, producer_id, producer_epoch)
    if live is None:
        return _error(error)
    if live.status in _PREPARED:
        return _error(ErrorCode.CONCURRENT_TRANSACTIONS)
    if live.status is TxnStatus.ONGOING:
        if partitions <= live.partitions and groups <= live.groups:
            return _error(ErrorCode.NONE)
        # Kafka lets an Ongoing transaction past its timeout grow until the periodic abort
        # reaches it; so does Kiln.
        return Step(ErrorCode.NONE, replace(live, partitions=live.partitions | partitions,
                                            groups=live.groups | groups, updated_ms=now))
    # Empty or Complete*: a new transaction starts (Complete* already holds no participants).
    return Step(ErrorCode.NONE, replace(live, status=TxnStatus.ONGOING, number=live.number + 1,
                                        partitions=partitions, groups=groups, start_ms=now,
                                        updated_ms=now))


def add_partitions(current: TxnState | None, *, producer_id: int, producer_epoch: int,
                   partitions: Iterable[tuple[str, int]], now: int) -> Step:
    """AddPartitionsToTxn (v0-3, one error for all of the request's partitions)."""
    return _add(current, producer_id, producer_epoch, now, frozenset(partitions), frozenset())


def add_group(current: TxnState | None, *, producer_id: int, producer_epoch: int,
              group_id: str, now: int) -> Step:
    """AddOffsetsToTxn. Kafka adds the group's __consumer_offsets partition as a participant
    through the AddPartitionsToTxn path; Kiln keeps the group itself, by the same rules."""
    return _add(current, producer_id, producer_epoch, now, frozenset(), frozenset({group_id}))


def end_transaction(current: TxnState | None, *, producer_id: int, producer_epoch: int,
                    commit: bool, now: int) -> Step:
    """EndTxn (v0-4: Transactions V1). Kafka's retries of an epoch-bumping EndTxn (the
    epoch one below the current one) are Transactions V2 only: here the epoch must match."""
    live, error = _check_producer(current, producer_id, producer_epoch)
    if live is None:
        return _error(error)
    if live.status is TxnStatus.ONGOING:
        # Also with no participant at all: Kafka still goes through Prepare* to Complete*.
        prepared = TxnStatus.PREPARE_COMMIT if commit else TxnStatus.PREPARE_ABORT
        return _answer(replace(live, status=prepared, updated_ms=now), complete=True)
    if live.status is (TxnStatus.COMPLETE_COMMIT if commit else TxnStatus.COMPLETE_ABORT):
        # A retry of an EndTxn that succeeded.
        return Step(ErrorCode.NONE, None, producer_id=live.producer_id,
                    producer_epoch=live.producer_epoch)
    if live.status is (TxnStatus.PREPARE_COMMIT if commit else TxnStatus.PREPARE_ABORT):
        return _error(ErrorCode.CONCURRENT_TRANSACTIONS)
    # Empty, or the other result already decided.
    return _error(ErrorCode.INVALID_TXN_STATE)


def is_expired(state: TxnState, now: int) -> bool:
    """An Ongoing transaction past its timeout (Kafka: start + timeout < now)."""
    deadline = deadline_ms(state)
    return deadline is not None and deadline < now


def deadline_ms(state: TxnState) -> int | None:
    """When an Ongoing transaction times out; `is_expired` holds from one ms later."""
    if state.status is not TxnStatus.ONGOING:
        return None
    return state.start_ms + state.timeout_ms


def fence_expired(current: TxnState, *, now: int) -> Step:
    """The periodic abort of timed-out transactions (abortTimedOutTransactions)."""
    if not is_expired(current, now):
        return _error(ErrorCode.NONE)
    return Step(ErrorCode.NONE, _fence(current, now), complete=True)


def fence(current: TxnState, *, now: int) -> Step:
    """An operator aborts an open transaction (`kiln transactions abort`): as a timeout
    aborts it, at a bumped epoch that fences its producer. INVALID_TXN_STATE when none is
    open."""
    if current.status is not TxnStatus.ONGOING:
        return _error(ErrorCode.INVALID_TXN_STATE)
    return Step(ErrorCode.NONE, _fence(current, now), complete=True)


def completed(current: TxnState, *, now: int) -> TxnState:
    """Every participant has its marker: Prepare* -> Complete*, participants cleared. For
    Transactions V1 Kafka keeps the epochs (and the last epoch) as they are."""
    status = _PREPARED.get(current.status)
    if status is None:
        raise ValueError(f"transaction {current.transactional_id!r} is {current.status.value}, "
                         "not prepared")
    return replace(current, status=status, partitions=frozenset(), groups=frozenset(),
                   updated_ms=now)


def expire(current: TxnState, *, now: int,
           expiration_ms: int = TRANSACTIONAL_ID_EXPIRATION_MS) -> Step:
    """An id idle (Empty or Complete*) for `expiration_ms` becomes Dead; Kafka's
    removeExpiredTransactionalIds. Error NONE and no state when it is not due."""
    if current.status not in _AT_REST or current.updated_ms > now - expiration_ms:
        return _error(ErrorCode.NONE)
    return Step(ErrorCode.NONE, replace(current, status=TxnStatus.DEAD,
                                        partitions=frozenset(), groups=frozenset()))
