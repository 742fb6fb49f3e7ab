"""The transaction coordinator: Kafka's transaction APIs over state kept in Redis.

Each transactional id is placed on one Kiln node (storage/leadership.py), which answers its
requests one at a time (a lock per id) and keeps nothing in memory that matters after a
crash: every request loads the id's state, decides with the I/O-free state machine
(storage/transactions/state.py) and writes the result over the revision it read. Ending a
transaction is two-phase, as in Kafka: the decision (PrepareCommit/PrepareAbort) is written
first; then a marker goes to every partition in the transaction, and to every consumer group
whose offsets it carries (on commit they become the group's committed offsets, reported to
delivery; on abort they are dropped); then the state becomes CompleteCommit/CompleteAbort.
Whoever coordinates the id next finishes a decision found half done before anything else
(the next request for the id, or the scan below), so a crash between the phases leaves no
transaction undecided in any partition or group.

Unlike Kafka, EndTxn is answered once the markers are written, not once the decision is:
the client's next transaction then never meets the last one's markers still being written
(CONCURRENT_TRANSACTIONS and a backoff). A commit with assured records is answered later
still, once the hardening lane (storage/lane.py) has the transaction in Kafka. A scan on
every node aborts, as Kafka does, the transactions it coordinates that stayed open past
their timeout, fencing their producer's epoch, and finishes decisions left half done.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from storage.clock import wall_clock_ms
from storage.errors import StorageError
from storage.faults import crash_point
from storage.groups.locks import KeyedLocks
from storage.groups.model import CommittedOffset
from storage.log_queue import transaction_key
from storage.model import TopicPartition
from storage.tasks import stop_task
from storage.transactions import state as machine
from storage.transactions.participants import MarkerWritten, TransactionParticipants
from storage.transactions.state import Step, TxnState, TxnStatus
from storage.transactions.store import StoredTxn, TxnConflict, TxnStore
from wire.errors import ErrorCode
from wire.txn_markers import build_marker

log = logging.getLogger(__name__)

_DECIDED = frozenset({TxnStatus.PREPARE_COMMIT, TxnStatus.PREPARE_ABORT})
# Why a transaction ended (the `cause` of TransactionsEnded): its producer's EndTxn, a new
# instance of its producer fencing it, its timeout, or a decision found half done and
# finished (after a crash, or a failure to reach Redis).
_ENDED, _FENCED, _TIMED_OUT, _RESUMED = "end_txn", "fenced", "timeout", "resumed"


class PartitionStarter(Protocol):
    """Starts a partition Redis does not know (storage.appender.PartitionStarts)."""

    async def start(self, tp: TopicPartition) -> bool: ...


class PartitionDirectory(Protocol):
    """Which partitions exist (storage.catalog.Catalog)."""

    async def has_partition(self, tp: TopicPartition) -> bool: ...


class TransactionsEnded(Protocol):
    """Told of every transaction ended here (storage.observability.metrics)."""

    def transaction_ended(self, committed: bool, cause: str) -> None: ...


class ProducerIdSource(Protocol):
    async def allocate(self) -> tuple[int, int]: ...


class HardeningLane(Protocol):
    """The hardening lane's records (storage.lane_store.LaneStore): it decides a committed
    transaction only once it has read every partition the transaction has records in, and
    an assured one's commit is answered once it did."""

    async def committed(self, key: str, tps: Collection[TopicPartition], *, assured: bool
                        ) -> None: ...

    async def awaits_hardening(self, key: str) -> bool: ...

    async def settled_or_after(self, timeout_s: float) -> None:
        """Wait until the lane may have settled something, at most `timeout_s`."""


class OffsetsListener(Protocol):
    """Told of offsets a group committed (storage.delivery.Delivery)."""

    async def committed(self, group: str, offsets: Mapping[TopicPartition, int], *,
                        by_member: bool) -> None: ...


@dataclass(frozen=True, slots=True)
class CoordinatorSettings:
    # How often each node looks for transactions to time out or finish.
    scan_interval_ms: int = 1_000
    # An id idle this long (no transaction open) is forgotten, as Kafka's
    # transactional.id.expiration.ms (7 days); looked for this often (Kafka's
    # transactional.id.expiration.ms cleanup, hourly).
    expiration_ms: int = machine.TRANSACTIONAL_ID_EXPIRATION_MS
    expiration_scan_interval_ms: int = 3_600_000
    # How long EndTxn waits for an assured commit to be hardened before answering
    # CONCURRENT_TRANSACTIONS, which clients retry: below the shortest EndTxn timeout of the
    # clients (franz-go's 10 s; 30 s for the Java client and kafkajs) and at most half the
    # transaction's timeout (librdkafka's EndTxn timeout is transaction.timeout.ms).
    assured_commit_wait_ms: int = 8_000
    # How often it asks Redis meanwhile (a lane in this process tells it at once).
    assured_poll_ms: int = 5


@dataclass(frozen=True, slots=True)
class ProducerIdAnswer:
    error_code: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1


class TransactionCoordinator:
    def __init__(self, store: TxnStore, participants: TransactionParticipants,
                 starts: PartitionStarter, partitions: PartitionDirectory,
                 producer_ids: ProducerIdSource,
                 coordinates: Callable[[str], bool],
                 lane: HardeningLane,
                 offsets_listener: OffsetsListener | None = None,
                 ended: TransactionsEnded | None = None,
                 settings: CoordinatorSettings = CoordinatorSettings(),
                 clock_ms: Callable[[], int] = wall_clock_ms) -> None:
        self._store = store
        self._participants = participants
        self._starts = starts
        self._partitions = partitions
        self._producer_ids = producer_ids
        self._coordinates = coordinates
        self._lane = lane
        self._offsets_listener = offsets_listener
        self._ended = ended
        self._settings = settings
        self._clock_ms = clock_ms
        self._locks = KeyedLocks()
        self._scanner: asyncio.Task[None] | None = None

    # -- requests ------------------------------------------------------------------------------

    async def init_producer_id(self, transactional_id: str, timeout_ms: int,
                               producer_id: int, producer_epoch: int) -> ProducerIdAnswer:
        def decide(current: TxnState | None, fresh: int | None) -> Step:
            return machine.init_producer_id(
                current, transactional_id=transactional_id, timeout_ms=timeout_ms,
                expected_producer_id=producer_id, expected_epoch=producer_epoch,
                now=self._clock_ms(), fresh_producer_id=fresh)

        step = await self._handle(transactional_id, decide)
        if step.error is not ErrorCode.NONE:
            return ProducerIdAnswer(step.error)
        return ProducerIdAnswer(ErrorCode.NONE, step.producer_id, step.producer_epoch)

    async def add_partitions(self, transactional_id: str, producer_id: int,
                             producer_epoch: int, tps: Sequence[TopicPartition]
                             ) -> ErrorCode:
        """Add `tps` to the producer's transaction and register it at each (one code for
        them all: Kafka's coordinator answers the request as a whole)."""
        def decide(current: TxnState | None, _fresh: int | None) -> Step:
            return machine.add_partitions(
                current, producer_id=producer_id, producer_epoch=producer_epoch,
                partitions=[(tp.topic, tp.partition) for tp in tps], now=self._clock_ms())

        async def register(state: TxnState) -> ErrorCode:
            codes = await self._register(list(dict.fromkeys(tps)), state)
            return next((c for c in codes if c is not ErrorCode.NONE), ErrorCode.NONE)

        return (await self._handle(transactional_id, decide, then=register)).error

    async def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          group_id: str) -> ErrorCode:
        """AddOffsetsToTxn: the group joins the transaction, and its offsets committed in it
        (TxnOffsetCommit) become its own only if the transaction commits."""
        def decide(current: TxnState | None, _fresh: int | None) -> Step:
            return machine.add_group(current, producer_id=producer_id,
                                     producer_epoch=producer_epoch, group_id=group_id,
                                     now=self._clock_ms())

        async def register(state: TxnState) -> ErrorCode:
            return await self._participants.register_group(
                group_id, state.producer_id, state.producer_epoch, state.number,
                state.transactional_id)

        return (await self._handle(transactional_id, decide, then=register)).error

    async def stage_offsets(self, group_id: str, producer_id: int, producer_epoch: int,
                            offsets: Mapping[TopicPartition, CommittedOffset]) -> ErrorCode:
        """TxnOffsetCommit, on the group's coordinator (the caller checked the member):
        kept with the producer's open transaction until it ends."""
        try:
            return await self._participants.stage_offsets(group_id, producer_id,
                                                          producer_epoch, offsets)
        except StorageError as exc:
            log.warning("group %r: cannot stage transactional offsets: %s", group_id, exc)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE

    async def unstable_partitions(self, group_id: str) -> set[TopicPartition]:
        """Partitions of the group with offsets staged in an open transaction."""
        return await self._participants.staged_partitions(group_id)

    async def end_transaction(self, transactional_id: str, producer_id: int,
                              producer_epoch: int, commit: bool) -> ErrorCode:
        """EndTxn, answered once the markers are written and, for a commit with assured
        records, once the hardening lane has it in Kafka (or found it wholly delivered): the
        promise acks=all makes moves from the transaction's produces to its commit. A commit
        the lane did not harden in time answers CONCURRENT_TRANSACTIONS (retriable): the
        producer asks again, and that commit is answered as soon as it is."""
        def decide(current: TxnState | None, _fresh: int | None) -> Step:
            return machine.end_transaction(current, producer_id=producer_id,
                                           producer_epoch=producer_epoch, commit=commit,
                                           now=self._clock_ms())

        error = (await self._handle(transactional_id, decide)).error
        if error is ErrorCode.NONE and commit:
            return await self._hardened(transactional_id)
        return error

    async def _hardened(self, transactional_id: str) -> ErrorCode:
        """Wait until the id's last committed transaction, if assured, is decided by the
        hardening lane."""
        started = self._clock_ms()
        try:
            state = (await self._store.load(transactional_id)).state
            if state is None or state.status is not TxnStatus.COMPLETE_COMMIT:
                return ErrorCode.NONE
            wait_ms = min(self._settings.assured_commit_wait_ms, state.timeout_ms // 2)
            key = transaction_key(state.producer_id, state.number)
            while await self._lane.awaits_hardening(key):
                if self._clock_ms() >= started + wait_ms:
                    log.info("transactional id %r: transaction %d not hardened within %d ms",
                             transactional_id, state.number, wait_ms)
                    return ErrorCode.CONCURRENT_TRANSACTIONS
                await self._lane.settled_or_after(self._settings.assured_poll_ms / 1000)
        except StorageError as exc:
            log.warning("transactional id %r: %s", transactional_id, exc)
            return ErrorCode.CONCURRENT_TRANSACTIONS
        return ErrorCode.NONE

    # -- operators (DescribeTransactions, ListTransactions) --------------------------------

    async def describe(self, transactional_id: str) -> tuple[ErrorCode, TxnState | None]:
        """The id's state, as its coordinator tells it: NOT_COORDINATOR on another node,
        TRANSACTIONAL_ID_NOT_FOUND for an id without one."""
        if not self._coordinates(transactional_id):
            return ErrorCode.NOT_COORDINATOR, None
        try:
            state = (await self._store.load(transactional_id)).state
        except StorageError:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, None
        if state is None or state.status is TxnStatus.DEAD:
            return ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, None
        return ErrorCode.NONE, state

    async def coordinated(self) -> list[TxnState]:
        """Every transactional id this node coordinates, with its state (as a Kafka broker
        lists the ids of its coordinator's partitions). Raises StorageError."""
        ids = [tid for tid in await self._store.transactional_ids() if self._coordinates(tid)]
        return [s for s in await self._store.load_many(ids) if s.status is not TxnStatus.DEAD]

    # -- the one path every request takes ------------------------------------------------------

    async def _handle(self, transactional_id: str,
                      decide: Callable[[TxnState | None, int | None], Step],
                      then: Callable[[TxnState], Awaitable[ErrorCode]] | None = None
                      ) -> Step:
        if not self._coordinates(transactional_id):
            return Step(ErrorCode.NOT_COORDINATOR, None)
        async with self._locks.hold(transactional_id):
            try:
                stored = await self._finish_decided(await self._store.load(transactional_id),
                                                    _RESUMED)
            except StorageError as exc:
                log.warning("transactional id %r: %s", transactional_id, exc)
                return Step(ErrorCode.COORDINATOR_NOT_AVAILABLE, None)
            except _Unfinished:
                return Step(ErrorCode.CONCURRENT_TRANSACTIONS, None)
            step = decide(stored.state, None)
            try:
                if step.needs_producer_id:
                    producer_id, _ = await self._producer_ids.allocate()
                    step = decide(stored.state, producer_id)
                revision = stored.revision
                if step.state is not None:
                    revision = await self._save(step.state, stored.revision)
            except StorageError as exc:
                log.warning("transactional id %r: %s", transactional_id, exc)
                return Step(ErrorCode.COORDINATOR_NOT_AVAILABLE, None)
            except TxnConflict:
                return Step(ErrorCode.NOT_COORDINATOR, None)
            target = step.state or stored.state
            crash_point("txn.saved")
            try:
                if step.complete and step.state is not None:
                    # EndTxn's own decision, or InitProducerId fencing an open transaction.
                    cause = _ENDED if step.error is ErrorCode.NONE else _FENCED
                    await self._complete(step.state, revision, cause)
                elif then is not None and step.error is ErrorCode.NONE and target is not None:
                    # Registered again even when nothing changed: a retry after a failed
                    # registration must not leave a partition refusing the records.
                    code = await then(target)
                    if code is not ErrorCode.NONE:
                        return Step(code, None)
            except (StorageError, TxnConflict, _Unfinished) as exc:
                # Decided and saved: the scan (or the client's retry) finishes it.
                log.warning("transactional id %r: %s; finished later", transactional_id, exc)
                return Step(ErrorCode.CONCURRENT_TRANSACTIONS, None)
            return step

    async def _save(self, state: TxnState, revision: int) -> int:
        if state.status in _DECIDED:
            due: int | None = self._clock_ms()
        else:
            due = machine.deadline_ms(state)
        return await self._store.save(state, revision, due)

    async def _finish_decided(self, stored: StoredTxn, cause: str) -> StoredTxn:
        """A decision found half done is finished before anything else."""
        if stored.state is None or stored.state.status not in _DECIDED:
            return stored
        await self._complete(stored.state, stored.revision, cause)
        return await self._store.load(stored.state.transactional_id)

    async def _complete(self, decided: TxnState, revision: int, cause: str) -> None:
        """Write the decision's marker to every partition in the transaction, then record
        it complete. Raises StorageError or _Unfinished, leaving it decided."""
        commit = decided.status is TxnStatus.PREPARE_COMMIT
        now = self._clock_ms()
        marker = build_marker(decided.producer_id, decided.producer_epoch, commit=commit,
                              timestamp_ms=now)
        firsts = await self._mark([TopicPartition(topic, partition)
                                   for topic, partition in sorted(decided.partitions)],
                                  decided, commit, marker, now)
        crash_point("txn.marked")
        holding = [tp for tp, written in firsts.items() if written.first_offset >= 0]
        if commit and holding:
            await self._lane.committed(
                transaction_key(decided.producer_id, decided.number), holding,
                assured=any(written.assured for written in firsts.values()))
        for group_id in sorted(decided.groups):
            committed = await self._participants.end_at_group(
                group_id, decided.producer_id, decided.producer_epoch, decided.number,
                commit=commit)
            if committed and self._offsets_listener is not None:
                # After the group's commit, as for any commit: delivery may lag a stored
                # commit (a crash here is redone by whoever finishes the decision, since
                # the state is still Prepare*), never lead it.
                await self._offsets_listener.committed(
                    group_id, {tp: c.offset for tp, c in committed.items()}, by_member=True)
        crash_point("txn.before_complete")
        try:
            await self._store.save(machine.completed(decided, now=self._clock_ms()),
                                   revision, None)
        except TxnConflict as exc:
            raise _Unfinished(f"{decided.transactional_id}: changed while completing") from exc
        log.debug("transactional id %r: transaction %d %s in %d partitions (%s)",
                  decided.transactional_id, decided.number,
                  "committed" if commit else "aborted", len(decided.partitions), cause)
        if self._ended is not None:
            self._ended.transaction_ended(commit, cause)

    async def _mark(self, tps: list[TopicPartition], decided: TxnState, commit: bool,
                    marker: bytes, now: int) -> dict[TopicPartition, MarkerWritten]:
        """The markers of every partition, in one round trip (and one more for the
        partitions Redis had to start first); what each said of the transaction's records
        there (a first offset of -1: none, or a commit the hardening lane decided already)."""
        firsts: dict[TopicPartition, MarkerWritten] = {}
        for _ in range(2):
            written = await self._participants.write_markers(
                tps, decided.producer_id, decided.producer_epoch, decided.number,
                commit=commit, marker=marker, now_ms=now)
            firsts.update(zip(tps, written, strict=True))
            # A partition deleted with its records since they joined the transaction has
            # nothing left to end (and starting it would bring its keys back).
            tps = await self._start_existing(
                [tp for tp, w in zip(tps, written, strict=True) if w.needs_start])
            if not tps:
                return firsts
        raise _Unfinished(f"{len(tps)} partitions keep being lost by Redis")

    async def _register(self, tps: list[TopicPartition], state: TxnState) -> list[ErrorCode]:
        """Register the transaction at every partition, in one round trip (and one more
        for the partitions Redis had to start first)."""
        codes: dict[TopicPartition, ErrorCode] = {}
        pending = tps
        for _ in range(2):
            found = await self._participants.register(
                pending, state.producer_id, state.producer_epoch, state.number,
                state.transactional_id)
            unknown = [tp for tp, code in zip(pending, found, strict=True) if code is None]
            codes.update((tp, code) for tp, code in zip(pending, found, strict=True)
                         if code is not None)
            pending = await self._start_existing(unknown)
            codes.update((tp, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                         for tp in unknown if tp not in pending)
            if not pending:
                break
        codes.update((tp, ErrorCode.CONCURRENT_TRANSACTIONS) for tp in pending)
        return [codes[tp] for tp in tps]

    async def _start_existing(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        """Start those of `tps` that still exist in Redis; returns them."""
        started = []
        for tp in tps:
            if await self._partitions.has_partition(tp):
                await self._starts.start(tp)
                started.append(tp)
        return started

    # -- timeouts and unfinished decisions -----------------------------------------------------

    def start(self) -> None:
        self._scanner = asyncio.create_task(self._scan_forever(), name="kiln-txn-scan")

    async def stop(self) -> None:
        if self._scanner is not None:
            await stop_task(self._scanner)
            self._scanner = None

    async def _scan_forever(self) -> None:
        next_expiry = self._clock_ms() + self._settings.expiration_scan_interval_ms
        while True:
            await asyncio.sleep(self._settings.scan_interval_ms / 1000)
            try:
                await self.scan()
                if self._clock_ms() >= next_expiry:
                    next_expiry = self._clock_ms() + self._settings.expiration_scan_interval_ms
                    await self.expire_idle()
            except StorageError as exc:
                log.debug("transaction scan: %s", exc)

    async def expire_idle(self) -> int:
        """Forget the ids coordinated here that stayed idle (no transaction open) past the
        expiration, as Kafka's coordinator removes them; how many. Their producers get a new
        producer id at their next InitProducerId. Raises StorageError."""
        now = self._clock_ms()
        expired = 0
        for state in await self.coordinated():
            step = machine.expire(state, now=now, expiration_ms=self._settings.expiration_ms)
            if step.state is None:
                continue
            async with self._locks.hold(state.transactional_id):
                stored = await self._store.load(state.transactional_id)
                if stored.state is None or machine.expire(
                        stored.state, now=now,
                        expiration_ms=self._settings.expiration_ms).state is None:
                    continue  # it was used meanwhile
                if await self._store.remove(state.transactional_id, stored.revision):
                    expired += 1
        if expired:
            log.info("forgot %d transactional ids idle for %d ms", expired,
                     self._settings.expiration_ms)
        return expired

    async def scan(self) -> int:
        """Abort the transactions coordinated here that stayed open past their timeout and
        finish decisions left half done; returns how many ids were acted on."""
        acted = 0
        for transactional_id in await self._store.due(self._clock_ms()):
            if not self._coordinates(transactional_id):
                continue
            async with self._locks.hold(transactional_id):
                try:
                    acted += await self._act_on(transactional_id)
                except (StorageError, TxnConflict, _Unfinished) as exc:
                    log.warning("transactional id %r: %s; tried again later",
                                transactional_id, exc)
        return acted

    async def _act_on(self, transactional_id: str) -> int:
        stored = await self._store.load(transactional_id)
        current = stored.state
        if current is None:
            return 0
        if current.status in _DECIDED:
            await self._complete(current, stored.revision, _RESUMED)
            return 1
        step = machine.fence_expired(current, now=self._clock_ms())
        if step.state is None:
            if machine.deadline_ms(current) is None:
                await self._store.save(current, stored.revision, None)  # a stale index entry
            return 0
        log.info("transactional id %r: transaction %d open past its timeout of %d ms; "
                 "aborted, producer epoch fenced", transactional_id, current.number,
                 current.timeout_ms)
        revision = await self._save(step.state, stored.revision)
        await self._complete(step.state, revision, _TIMED_OUT)
        return 1


class _Unfinished(Exception):
    """A decided transaction's markers could not all be written yet."""
