"""The hardening lane: hardens every partition that carries Kiln transactions, all of them
together, so that each committed transaction reaches Kafka whole (docs/transactions-design.md
§8).

A Kiln transaction may span partitions led by different nodes, and a Kafka transaction
belongs to one producer: so one writer, the lane, hardens every partition a transaction ever
registered in (the partition's own hardener, storage/hardener.py, lets go of it). Each pass
reads those partitions, plans the largest consistent cut over them (below it every committed
transaction is there whole or not at all; storage/policy/lane_pass.py) and writes what the
cut holds to Kafka in one Kafka transaction (storage/lane_writer.py); then, per partition,
the log queue drops what left and the hardened mark advances, as after a partition's own
pass. Aborted records and markers are never written; a committed transaction whose records
were all delivered is not written at all (harden = survivors).

One node runs the lane: the one its placement names (storage/leadership.py), holding the
lane's lease in Redis, and each lane partition's hardening lease under the owner
`<node incarnation>/lane`. A successor bumps the lane's Kafka producer epoch, which aborts
any pass its predecessor left open and fences it; what Kafka holds committed tells where each
partition resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from storage.acks import SettledWaiters
from storage.catalog import Catalog
from storage.clock import wall_clock_ms
from storage.errors import BufferUnavailable, Fenced, PartitionLost, StorageError
from storage.faults import crash_point
from storage.hardened_store import NOTHING_WRITTEN, Fence
from storage.hardener import (
    DurableSubscriptions,
    HardenerCounters,
    hardens,
    registered,
    subscribed,
)
from storage.kafka.client import KafkaClient
from storage.lane_store import LANE, LaneStore, lane_owner
from storage.lane_writer import LaneWriter
from storage.log_queue import CommittedTransaction, Lease, LogQueue, PartitionState
from storage.model import StoredBatch, TopicPartition
from storage.operator_requests import flush_requests
from storage.policy.delay import due_prefix
from storage.policy.hardening_pass import PassView
from storage.policy.lane_pass import (
    LanePartition,
    LanePlan,
    TxnSpan,
    plan_lane,
    plan_lane_release,
)
from storage.policy.observer import DelayObserver
from storage.policy.reliability import shed_now
from storage.tasks import stop_task
from storage.topics import HardenPolicy, TopicConfig
from wire.batch import BatchHeader, read_header

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LaneSettings:
    owner: str  # this node's incarnation
    lane: str = LANE
    # How often an idle lane looks for due batches (appends through any node are seen).
    tick_s: float = 0.1
    read_limit_bytes: int = 16 * 1024 * 1024  # per partition and pass
    max_batch_bytes: int = 1_000_000
    lease_ms: int = 4_000
    max_backoff_s: float = 5.0
    # How often the lane partitions and flush requests are read again.
    scan_s: float = 1.0


@dataclass(slots=True)
class _Held:
    """A lane partition this lane holds the lease of, and has taken over in Kafka."""

    incarnation: str
    decided_below: int


class HardeningLane:
    def __init__(self, queue: LogQueue, store: LaneStore, catalog: Catalog,
                 client: KafkaClient, delay: DelayObserver, waiters: SettledWaiters,
                 settings: LaneSettings, subscriptions: DurableSubscriptions,
                 counters: HardenerCounters, *,
                 runs_here: Callable[[], bool],
                 clock: Callable[[], int] = wall_clock_ms,
                 buffer_fill: Callable[[], float] = lambda: 0.0,
                 live_owners: Callable[[], Sequence[str]] = lambda: ()) -> None:
        self._queue = queue
        self._store = store
        self._catalog = catalog
        self._delay = delay
        self._waiters = waiters
        self._settings = settings
        self._subscriptions = subscriptions
        self.counters = counters
        self._runs_here = runs_here
        self._clock = clock
        self._buffer_fill = buffer_fill
        self._live_owners = live_owners
        self._writer = LaneWriter(client, settings.lane,
                                  max_batch_bytes=settings.max_batch_bytes)
        self._owner = lane_owner(settings.owner)
        self._leading = False
        self._partitions: list[TopicPartition] = []
        self._held: dict[TopicPartition, _Held] = {}
        self._flush_goal: dict[TopicPartition, int] = {}
        self._scanned_at = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._wakeup = asyncio.Event()

    @property
    def leading(self) -> bool:
        """Whether this node runs the lane now."""
        return self._leading

    def _live(self) -> list[str]:
        """Lease holders known alive: every live node's hardeners and lane."""
        owners = list(self._live_owners())
        return owners + [lane_owner(owner) for owner in owners]

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="kiln-harden-lane")

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            await stop_task(self._task)
        with contextlib.suppress(StorageError):
            await self._let_go()

    def wake(self) -> None:
        self._wakeup.set()

    async def _run(self) -> None:
        backoff = 0.0
        while not self._stopping.is_set():
            try:
                if not await self._lead():
                    await self._idle(self._settings.lease_ms / 4000)
                    continue
                await self._scan()
                wait_s = await self._pass()
                backoff = 0.0
                if wait_s > 0:
                    await self._idle(wait_s)
            except Fenced as exc:
                log.warning("hardening lane fenced: %s", exc)
                self._restart()
                await asyncio.sleep(self._settings.tick_s)
            except StorageError as exc:
                self.counters.errors += 1
                if not isinstance(exc, BufferUnavailable | PartitionLost):
                    self._delay.kafka_failed(self._clock())
                self._restart()
                backoff = min(self._settings.max_backoff_s, max(0.05, backoff * 2))
                log.warning("hardening lane paused %.2fs: %s", backoff, exc)
                await asyncio.sleep(backoff)

    async def _idle(self, seconds: float) -> None:
        """Wait `seconds`, or less when woken (also by a wake during the last pass)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wakeup.wait()
        self._wakeup.clear()

    def _restart(self) -> None:
        """After a failure: every partition is taken again (its resume point read from
        Kafka), under a new epoch once the lane's lease is confirmed (a lane fenced by a
        successor must not fence it back)."""
        self._held.clear()
        self._scanned_at = float("-inf")
        self._writer.discard()

    async def _lead(self) -> bool:
        """Take or renew the lane's lease where the lane is placed here; let go elsewhere."""
        if not self._runs_here():
            await self._let_go()
            return False
        lease = await self._store.acquire_lease(self._owner, self._settings.lease_ms,
                                                self._live())
        if lease is Lease.REFUSED:
            if self._leading:
                log.info("hardening lane: another node holds its lease now")
            self._leading = False
            self._held.clear()
            return False
        if not self._leading or lease is Lease.TAKEN_OVER or not self._writer.ready:
            self._held.clear()
            await self._writer.start()
            self._leading = True
            self._scanned_at = float("-inf")
            log.info("hardening lane runs on this node")
        return True

    async def _let_go(self) -> None:
        if not self._leading:
            return
        self._leading = False
        held, self._held = list(self._held), {}
        for tp in held:
            await self._queue.release_lease(tp, self._owner)
        await self._store.release_lease(self._owner)
        log.info("hardening lane let go (%d partitions)", len(held))

    async def _scan(self) -> None:
        """Find the lane partitions (every partition a transaction registered in), renew
        their leases and take those whose own hardener let go; read flush requests."""
        if time.monotonic() - self._scanned_at < self._settings.scan_s:
            return
        self._scanned_at = time.monotonic()
        topics = await self._catalog.registry.all()
        every = [TopicPartition(config.name, p) for config in topics.values()
                 if not self._catalog.being_deleted(config.name)
                 for p in range(config.partitions)]
        self._partitions = [tp for tp, flag in zip(every, await self._queue.in_lane(every),
                                                   strict=True) if flag]
        for tp in [tp for tp in self._held if tp not in self._partitions]:
            # Deleted, or started again by Redis without its transactions: its own
            # hardener has it back.
            del self._held[tp]
            self._writer.let_go(tp)
            await self._queue.release_lease(tp, self._owner)
        for tp, goal in (await flush_requests(self._queue.redis)).items():
            if tp in self._partitions and goal > self._flush_goal.get(tp, 0):
                self._flush_goal[tp] = goal
        for tp in self._partitions:
            lease = await self._queue.acquire_lease(tp, self._owner, self._settings.lease_ms,
                                                    self._live())
            if lease is Lease.REFUSED:  # its own hardener has not let go yet
                self._held.pop(tp, None)
            elif lease is Lease.TAKEN_OVER or tp not in self._held:
                await self._take(tp, Fence.AT_LEADER if lease is Lease.TAKEN_OVER
                                 else Fence.IF_EVER_WRITTEN)

    async def _take(self, tp: TopicPartition, fence: Fence) -> None:
        config = await self._registered(tp.topic)
        await self._catalog.ensure_in_kafka(tp.topic, config.partitions, fresh=True,
                                            topic_id=config.topic_id)
        state = await self._queue.state(tp)
        in_kafka = await self._writer.take(tp, fence)
        decided_below = max(in_kafka or 0, state.hardened_offset)
        if in_kafka is not None and in_kafka > state.hardened_offset:
            # A pass committed in Kafka and not finished in Redis: finish it.
            await self._queue.finish_pass(tp, state.incarnation, owner=self._owner,
                                          trim_below=0, hardened_below=in_kafka,
                                          written_records=in_kafka - state.hardened_offset)
        self._held[tp] = _Held(state.incarnation, decided_below)
        self._waiters.settled(tp, state.incarnation, decided_below)
        log.info("hardening lane takes %s/%d from Kiln offset %d", tp.topic, tp.partition,
                 decided_below)

    async def _pass(self) -> float:
        """One pass over the held partitions; returns how long to wait before the next one
        (0: at once)."""
        tps = [tp for tp in self._partitions if tp in self._held]
        if not tps:
            return self._settings.scan_s  # (a commit through this node wakes it)
        now = self._clock()
        policies = {tp.topic: (await self._registered(tp.topic)).harden for tp in tps}
        states = dict(zip(tps, await self._queue.states(tps), strict=True))
        for tp, state in states.items():
            if state.incarnation != self._held[tp].incarnation:
                raise PartitionLost(f"{tp.topic}/{tp.partition}: started again since taken")
        # Participants first: the coordinator lists a committed transaction in its partitions
        # before it names them here, so a transaction named here and listed in none of its
        # partitions read after is one an earlier pass decided (plan_lane forgets it), not
        # one whose partitions were read just before it was listed.
        participants = await self._store.participants()
        committed = dict(zip(tps, await self._queue.committed_transactions(tps), strict=True))
        for tp, txns in committed.items():
            for txn in txns:
                if txn.assured:  # its producer's commit waits: harden it now
                    self._flush_goal[tp] = max(self._flush_goal.get(tp, 0),
                                               txn.marker_offset + 1)
        found = await asyncio.gather(*(
            self._partition(tp, states[tp], committed[tp], policies[tp.topic], now)
            for tp in tps))
        parts = [part for part, _ in found]
        wait_s = min([self._settings.tick_s, *(due_in_s for _, due_in_s in found)])
        try:
            plan = plan_lane(_without_broken(parts), participants, _header,
                             lambda tp, batch: hardens(batch, policies[tp.topic]))
        except ValueError as exc:
            log.error("hardening lane cannot plan a pass: %s", exc)
            self.counters.errors += 1
            return self._settings.max_backoff_s
        ends = {part.partition: _last_marker(part.due, states[part.partition])
                for part in parts}
        progressed = await self._write(plan, ends)
        await self._forget(plan, committed)
        return 0.0 if progressed else wait_s

    async def _partition(self, tp: TopicPartition, state: PartitionState,
                         committed: Sequence[CommittedTransaction], policy: HardenPolicy,
                         now: int) -> tuple[LanePartition, float]:
        """What the pass knows of one partition, and in how many seconds its oldest
        undecided batch is due (0: now). Batches are read only when some are due."""
        held = self._held[tp]
        held.decided_below = max(held.decided_below, state.hardened_offset)
        decided = held.decided_below
        head_held = False
        if state.start_offset < decided:
            head_held = await self._release(tp, state, decided)
        due: list[StoredBatch] = []
        aborted: list[TxnSpan] = []
        stable = decided
        due_in_s = float("inf")
        due_before = now if decided < self._flush_goal.get(tp, 0) \
            else self._delay.decision(tp.topic, now).due_before(now)
        undecided = (await self._queue.peek(tp, decided)).undecided
        if undecided is not None:
            due_in_s = max(0.0, (undecided.append_time_ms - due_before) / 1000)
        if undecided is not None and (due_in_s == 0 or self._shed(undecided)):
            read = await self._queue.read_from(tp, decided, self._settings.read_limit_bytes)
            due = due_prefix([b for b in read.batches if b.next_offset > decided],
                             due_before, self._shed)
            stable = read.last_stable_offset
            aborted = [TxnSpan(a.producer_id, a.first_offset, a.marker_offset, None)
                       for a in read.aborted]
        spans = [TxnSpan(c.producer_id, c.first_offset, c.marker_offset, c.key)
                 for c in committed] + aborted
        view = PassView(decided_below=decided, delivered_below=state.delivered_offset,
                        skip_delivered=policy is not HardenPolicy.ALL,
                        subscribed=await self._subscribed(tp.topic, due), head_held=head_held)
        return LanePartition(tp, view, stable, due, spans), due_in_s

    def _shed(self, batch: StoredBatch) -> bool:
        # A transaction is never shed in part: shedding stops at its first batch.
        return not _header(batch).is_transactional \
            and shed_now(batch.reliability, self._buffer_fill())

    async def _write(self, plan: LanePlan, last_markers: Mapping[TopicPartition, int | None]
                     ) -> bool:
        writes = {tp: p.to_write for tp, p in plan.partitions.items() if p.to_write}
        results = {}

        async def settle() -> None:
            # Decided: assured commits waiting for these transactions are answered now.
            await self._store.settle(plan.decided_keys)

        if writes:
            started = time.monotonic()
            results = await self._writer.write(writes, committed=settle)
            self._delay.kafka_write((time.monotonic() - started) * 1000, self._clock())
        else:
            await settle()
        progressed = False
        for tp, part in plan.partitions.items():
            held = self._held[tp]
            if part.decided_below <= held.decided_below and not part.trim_below:
                continue
            result = results.get(tp, NOTHING_WRITTEN)
            await self._queue.finish_pass(
                tp, held.incarnation, owner=self._owner,
                trim_below=_kept(part.trim_below, last_markers[tp]),
                hardened_below=part.decided_below, written_records=result.records,
                written_bytes=result.bytes, delivered_records=part.delivered_records,
                expired_records=part.expired_records + part.aborted_records
                + part.control_records)
            crash_point("lane.finishing")
            self._waiters.settled(tp, held.incarnation, part.decided_below)
            progressed = progressed or part.decided_below > held.decided_below
            held.decided_below = max(held.decided_below, part.decided_below)
            self._count(tp, result.records, result.bytes, result.batches)
        return progressed

    def _count(self, tp: TopicPartition, records: int, size: int, batches: int) -> None:
        if not records:
            return
        self.counters.records_hardened += records
        self.counters.bytes_hardened += size
        self.counters.batches_written += batches
        per_topic = self.counters.per_topic_records
        per_topic[tp.topic] = per_topic.get(tp.topic, 0) + records

    async def _forget(self, plan: LanePlan,
                      committed: Mapping[TopicPartition, Sequence[CommittedTransaction]]
                      ) -> None:
        """The transactions the pass decided leave the lists: each partition's, then the
        lane's (a crash between them leaves entries the next pass finds decided)."""
        if not plan.decided_keys:
            return
        await self._queue.forget_committed({
            tp: [c.member for c in txns if c.key in plan.decided_keys]
            for tp, txns in committed.items()})
        await self._store.forget(plan.decided_keys)

    async def _release(self, tp: TopicPartition, state: PartitionState, decided_below: int
                       ) -> bool:
        """Let go of the held region at the head of the partition up to the first batch
        that must still be held; True when one still is."""
        head = (await self._queue.read(tp, self._settings.read_limit_bytes)).batches
        plan = plan_lane_release(head, decided_below=decided_below,
                                 delivered_below=state.delivered_offset,
                                 subscribed=await self._subscribed(tp.topic, head),
                                 header=_header)
        trim_below = _kept(plan.trim_below, _last_marker(head, state))
        if trim_below > state.start_offset:
            await self._queue.finish_pass(
                tp, state.incarnation, owner=self._owner, trim_below=trim_below,
                hardened_below=decided_below, delivered_records=plan.delivered_records,
                expired_records=plan.expired_records)
        return plan.blocked

    async def _registered(self, topic: str) -> TopicConfig:
        return await registered(self._catalog, topic)

    async def _subscribed(self, topic: str, batches: Sequence[StoredBatch]) -> bool:
        return await subscribed(self._subscriptions, topic, batches)


def _header(batch: StoredBatch) -> BatchHeader:
    return read_header(batch.data)


def _last_marker(batches: Sequence[StoredBatch], state: PartitionState) -> int | None:
    """The offset of the partition's last batch when `batches` end with it and it is a
    marker: it stays in the log queue (below). None otherwise."""
    if batches and batches[-1].next_offset == state.next_offset \
            and _header(batches[-1]).is_control:
        return batches[-1].base_offset
    return None


def _kept(trim_below: int, last_marker: int | None) -> int:
    """A marker that ends the partition is never trimmed: Kafka holds no record at its
    offset (its own marker is at another), so a consumer reading up to the end would find
    nothing there to move it past, anywhere; served from the log queue, it is skipped as
    in Kafka. It leaves with the next pass after it."""
    if last_marker is not None and trim_below > last_marker:
        return last_marker
    return trim_below


def _without_broken(parts: list[LanePartition]) -> list[LanePartition]:
    """A committed transaction whose first records in some partition are below what is
    decided there (DeleteRecords removed them) can no longer be hardened whole: it is
    treated as aborted everywhere, so the rest of it is never written and nothing waits
    for it."""
    broken = {span.key for part in parts for span in part.spans
              if span.key is not None and span.first < part.view.decided_below <= span.marker}
    if not broken:
        return parts
    log.warning("hardening lane: %d committed transactions lost records to DeleteRecords; "
                "their remaining records are not hardened", len(broken))
    return [LanePartition(part.partition, part.view, part.last_stable_offset, part.due,
                          [TxnSpan(s.producer_id, s.first, s.marker, None)
                           if s.key in broken else s for s in part.spans])
            for part in parts]
