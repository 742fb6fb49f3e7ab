"""The hardener: moves survivors whose delay has expired from the log queue into Kafka.

One task per topic-partition this node leads (storage/leadership.py), each holding that
partition's hardening lease in Redis (so one Kiln process hardens a partition at a time, also
while leadership moves) and a fenced writer in Kafka (so a paused process
that lost the lease cannot write after its successor). Order per partition:

  1. recover: fence earlier writers; ask Kafka which Kiln offset it holds last;
  2. read due batches from Redis; write the records Kafka does not hold yet, except those
     already delivered to every durable subscription (topic policy `harden = survivors`);
  3. trim what was written from Redis and advance the hardened mark; wake waiting acks.

`reliable_nonpersistent` batches are never written and are held in Redis until delivered
(storage.policy.hardening_pass): the batches behind a held one are written on time and
leave with it.

Delivered batches are also dropped as commits arrive (storage.delivery), concurrently with
this loop; both only ever remove a prefix of the log queue, so they cannot conflict.

A crash between 2 and 3 leaves records in both tiers; step 1 after restart skips them, so
Kafka receives every record exactly once.

A deleted topic's tasks stop: at once in the process that deletes it, at the next topic scan
(or the next pass) in the others. A task never creates in Kafka a topic that is no longer
registered under the id it started with (storage.catalog's ensure_in_kafka), and starts over
when its partition's incarnation changes under it (the topic was deleted and created anew:
its offsets start again at 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from storage.acks import SettledWaiters
from storage.catalog import Catalog
from storage.clock import wall_clock_ms
from storage.errors import BufferUnavailable, Fenced, PartitionLost, StorageError
from storage.hardened_store import NOTHING_WRITTEN, Fence, HardenedPartitionWriter
from storage.kafka.client import KafkaClient
from storage.log_queue import Lease, LogQueue, PartitionState, Peek
from storage.model import Reliability, StoredBatch, TopicPartition
from storage.operator_requests import flush_requests, request_flush
from storage.policy.delay import due_prefix
from storage.policy.hardening_pass import PassView, plan_pass, plan_release
from storage.policy.observer import DelayObserver
from storage.policy.reliability import shed_now, should_harden
from storage.tasks import stop_task
from storage.topics import HardenPolicy, TopicConfig, TopicGone
from wire.txn_markers import batch_is_transactional

log = logging.getLogger(__name__)


class DurableSubscriptions(Protocol):
    async def groups(self, topic: str, *, fresh: bool = False) -> frozenset[str]: ...


@dataclass(frozen=True, slots=True)
class HardenerSettings:
    owner: str
    tick_s: float = 0.05
    read_limit_bytes: int = 16 * 1024 * 1024
    max_batch_bytes: int = 1_000_000
    # After a crash the successor waits this long for the dead process's lease (unless the
    # process's node is seen dead first); Kafka-side fencing, not the lease, is what keeps
    # a paused process from writing.
    lease_ms: int = 4_000
    max_backoff_s: float = 5.0
    topic_scan_s: float = 1.0
    # Idempotence state of a producer silent this long is forgotten, as Kafka's
    # producer.id.expiration.ms (1 day) does; looked for every producer_prune_s.
    producer_expiration_ms: int = 86_400_000
    producer_prune_s: float = 600.0


@dataclass
class HardenerCounters:
    records_hardened: int = 0
    records_forwarded: int = 0  # of records_hardened: in client batches forwarded whole
    bytes_hardened: int = 0
    batches_written: int = 0
    errors: int = 0
    per_topic_records: dict[str, int] = field(default_factory=dict)
    # Told of every write (topic, batches written, now in ms): hardening latency metrics.
    on_written: Callable[[str, Sequence[StoredBatch], int], None] | None = None


class Hardener:
    def __init__(self, queue: LogQueue, catalog: Catalog, client: KafkaClient,
                 delay: DelayObserver, waiters: SettledWaiters, settings: HardenerSettings,
                 subscriptions: DurableSubscriptions,
                 clock: Callable[[], int] = wall_clock_ms,
                 buffer_fill: Callable[[], float] = lambda: 0.0,
                 leads: Callable[[TopicPartition], bool] = lambda tp: True,
                 live_owners: Callable[[], Sequence[str]] = lambda: ()) -> None:
        self._queue = queue
        # The owners (node incarnations) of the live nodes: a lease one that is not among them
        # holds is taken over at once, not when it runs out.
        self._live_owners = live_owners
        # Whether this node leads a partition (storage/leadership.py): only its leader
        # hardens it, so that the appends that wake a partition's task are this node's.
        self._leads = leads
        self._subscriptions = subscriptions
        self._catalog = catalog
        self._client = client
        self._delay = delay
        self._waiters = waiters
        self._settings = settings
        self._clock = clock
        # How full the buffer is (0..1): best_effort, then express, are shed past a point.
        self._buffer_fill = buffer_fill
        self._tasks: dict[TopicPartition, asyncio.Task[None]] = {}
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._wakeups: dict[TopicPartition, asyncio.Event] = {}
        # Partitions to harden regardless of the delay, up to this offset (flush, drain).
        self._flush_goal: dict[TopicPartition, int] = {}
        # Partitions whose task found the log queue empty; the supervisor wakes them.
        self._idle_empty: set[TopicPartition] = set()
        # When each partition last tried to release the batches it holds until delivered.
        self._released_at: dict[TopicPartition, float] = {}
        # The incarnation each partition's task recovered in (it recovers again on a change).
        self._recovered_in: dict[TopicPartition, str] = {}
        self.counters = HardenerCounters()

    def start(self) -> None:
        self._catalog.on_deleting(self.topic_deleted)
        self._supervisor = asyncio.create_task(self._supervise(), name="kiln-hardener")

    async def topic_deleted(self, topic: str, partitions: int = 0) -> None:
        """Stop hardening a topic that is being deleted (waiting for a write under way to
        end) and forget what was kept for its partitions."""
        ending = [tp for tp in self._tasks if tp.topic == topic]
        await asyncio.gather(*(stop_task(self._tasks.pop(tp)) for tp in ending))
        for kept in (self._wakeups, self._flush_goal, self._released_at, self._recovered_in):
            for tp in [tp for tp in kept if tp.topic == topic]:
                del kept[tp]
        self._idle_empty = {tp for tp in self._idle_empty if tp.topic != topic}
        if ending:
            log.info("hardening of deleted topic %s stopped (%d partitions)", topic,
                     len(ending))

    async def stop(self) -> None:
        self._stopping.set()
        tasks = [t for t in [self._supervisor, *self._tasks.values()] if t is not None]
        await asyncio.gather(*(stop_task(t) for t in tasks))
        for tp in list(self._tasks):
            with contextlib.suppress(BufferUnavailable):
                await self._queue.release_lease(tp, self._settings.owner)

    async def flush(self, topics: Sequence[str] | None = None, timeout_s: float = 60.0) -> bool:
        """Harden every buffered persistent record of the given topics (all if None) in the
        partitions this node leads now, ignoring the delay. True when everything buffered at
        the call has left the log queue: hardened, or needing no hardening (delivered,
        non-persistent)."""
        deadline = time.monotonic() + timeout_s
        await self._scan_topics()
        targets = [tp for tp in self._tasks
                   if (topics is None or tp.topic in topics) and self._leads(tp)]
        at_call = dict(zip(targets, await self._queue.states(targets), strict=True))
        goals = {tp: state.next_offset for tp, state in at_call.items()}
        for tp, goal in goals.items():
            self._flush_goal[tp] = max(self._flush_goal.get(tp, 0), goal)
            self._wakeup(tp).set()
        # The hardening lane's partitions are asked of the lane, wherever it runs. (An open
        # transaction holds a partition's flush back until it ends.)
        await request_flush(self._queue.redis, {tp: goals[tp] for tp, state in at_call.items()
                                                if state.in_lane})
        while goals:
            states = await self._queue.states(list(goals))
            goals = {tp: goal for (tp, goal), state in zip(goals.items(), states, strict=True)
                     if state.flushed_offset < goal}
            if goals and time.monotonic() >= deadline:
                return False
            if goals:
                await asyncio.sleep(self._settings.tick_s)
        return True

    def _wakeup(self, tp: TopicPartition) -> asyncio.Event:
        return self._wakeups.setdefault(tp, asyncio.Event())

    def leadership_changed(self) -> None:
        """The nodes changed: every partition looks at once whether this node leads it now
        (a partition taken from a dead node is hardened without waiting a lease period)."""
        for wakeup in self._wakeups.values():
            wakeup.set()

    def appended(self, tp: TopicPartition) -> None:
        """Records were appended through this process: wake the partition if it was idle, or
        start its task if it has none yet (a topic created a moment ago: the next topic scan
        would come up to `topic_scan_s` later)."""
        if tp in self._idle_empty:
            self._wakeup(tp).set()
        elif tp not in self._tasks and self._supervisor is not None \
                and not self._stopping.is_set() and not self._catalog.being_deleted(tp.topic):
            self._start_partition(tp)

    async def _supervise(self) -> None:
        """Start a task for every partition as topics appear. (An idle partition's task
        looks at Redis once per lease renewal period, which is how appends through other
        Kiln processes are noticed; appends through this one call `appended` at once.)"""
        pruned_at = time.monotonic()
        while not self._stopping.is_set():
            try:
                await self._scan_topics()
                await self._take_flush_requests()
                if time.monotonic() - pruned_at >= self._settings.producer_prune_s:
                    pruned_at = time.monotonic()
                    await self._prune_producers()
            except StorageError as exc:
                log.warning("hardener cannot scan topics: %s", exc)
            await asyncio.sleep(self._settings.topic_scan_s)

    async def _prune_producers(self) -> None:
        silent_since = self._clock() - self._settings.producer_expiration_ms
        forgotten = 0
        for tp in list(self._tasks):
            forgotten += await self._queue.prune_producers(tp, silent_since)
        if forgotten:
            log.info("forgot the idempotence state of %d silent producers", forgotten)

    async def _scan_topics(self) -> None:
        # Kiln's own topics only: a Kafka topic Kiln has not adopted holds nothing in the
        # log queue, and adopting every topic Kafka has would fence partitions Kiln never
        # serves.
        topics = await self._catalog.registry.all()
        for config in topics.values():
            if self._catalog.being_deleted(config.name):
                continue
            for partition in range(config.partitions):
                tp = TopicPartition(config.name, partition)
                if tp not in self._tasks or self._tasks[tp].done():
                    self._start_partition(tp)
        # Topics deleted through another process (not those Redis lost: they are adopted
        # again from Kafka).
        for gone in {tp.topic for tp in self._tasks} - set(topics):
            if await self._catalog.registry.deletion(gone) is not None:
                await self.topic_deleted(gone)

    def _start_partition(self, tp: TopicPartition) -> None:
        log.debug("%s/%d: hardening task started", tp.topic, tp.partition)
        self._tasks[tp] = asyncio.create_task(
            self._run_partition(tp), name=f"kiln-harden-{tp.topic}-{tp.partition}"
        )

    async def _take_flush_requests(self) -> None:
        """Flushes asked for through Redis (`kiln flush`); the lease holder does the work."""
        for tp, goal in (await flush_requests(self._queue.redis)).items():
            if tp in self._tasks and goal > self._flush_goal.get(tp, 0):
                self._flush_goal[tp] = goal
                self._wakeup(tp).set()

    async def _run_partition(self, tp: TopicPartition) -> None:
        """Wait until the partition's oldest undecided batch is due, then take the lease,
        recover the writer if needed (only partitions with work ever fence or read Kafka)
        and harden."""
        writer: HardenedPartitionWriter | None = None
        decided_below = 0
        fence = False
        backoff = 0.0
        wakeup = self._wakeup(tp)
        idle_s = self._settings.lease_ms / 4000  # renew the lease well before it expires
        while not self._stopping.is_set():
            try:
                if not self._leads(tp):
                    if writer is not None:  # the partition moved to another node
                        writer = None
                        await self._queue.release_lease(tp, self._settings.owner)
                    wakeup.clear()  # set by leadership_changed (or an append here)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(idle_s):
                            await wakeup.wait()
                    continue
                wakeup.clear()
                peeked = await self._queue.peek(tp, decided_below)
                if peeked.in_lane:
                    # A transaction registered here: the hardening lane has it from now on.
                    if writer is not None:
                        writer = None
                        await self._queue.release_lease(tp, self._settings.owner)
                        log.info("%s/%d: handed to the hardening lane", tp.topic, tp.partition)
                    await asyncio.sleep(idle_s)
                    continue
                wait_s = self._until_due(tp, peeked, decided_below, idle_s)
                if wait_s > 0:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(min(wait_s, idle_s)):
                            await wakeup.wait()
                    continue
                if writer is None:
                    # A deleted topic's partition (records appended as it was deleted) takes
                    # no lease: its keys would outlive it.
                    await self._registered(tp.topic)
                lease = await self._queue.acquire_lease(tp, self._settings.owner,
                                                        self._settings.lease_ms,
                                                        self._live_owners())
                if lease is Lease.REFUSED:
                    log.debug("%s/%d: another Kiln process holds the lease", tp.topic,
                              tp.partition)
                    writer = None
                    await asyncio.sleep(idle_s)
                    continue
                if lease is Lease.TAKEN_OVER:
                    writer = None
                    fence = True  # until a recovery succeeds
                if writer is None:
                    writer, decided_below = await self._recover(tp, fence=fence)
                    fence = False
                decided_below = await self._harden_due(tp, writer, decided_below)
                backoff = 0.0
            except TopicGone as exc:
                log.info("hardening of %s/%d ends: %s", tp.topic, tp.partition, exc.message)
                return
            except Fenced as exc:
                log.warning("hardening of %s/%d fenced: %s", tp.topic, tp.partition, exc)
                writer = None
                self.counters.errors += 1
                await asyncio.sleep(self._settings.tick_s)
            except StorageError as exc:
                writer = None
                self.counters.errors += 1
                if not isinstance(exc, BufferUnavailable | PartitionLost):
                    self._delay.kafka_failed(self._clock())
                backoff = min(self._settings.max_backoff_s, max(0.05, backoff * 2))
                log.warning("hardening of %s/%d paused %.2fs: %s",
                            tp.topic, tp.partition, backoff, exc)
                await asyncio.sleep(backoff)

    def _due_before(self, tp: TopicPartition, now: int, hardened: int) -> int:
        """Batches appended at or before this instant are due (all of them while a flush
        of the partition is unfinished)."""
        if hardened < self._flush_goal.get(tp, 0):
            return now
        return self._delay.decision(tp.topic, now).due_before(now)

    def _until_due(self, tp: TopicPartition, peeked: Peek, decided_below: int,
                   idle_s: float) -> float:
        """Seconds until the partition's oldest undecided batch is due (0: now; inf: the
        log queue is empty). Batches held until delivered are looked at again every
        `idle_s` (deliveries through other Kiln processes are not announced here)."""
        oldest, undecided = peeked.oldest, peeked.undecided
        if oldest is None:
            self._idle_empty.add(tp)
            return float("inf")
        self._idle_empty.discard(tp)
        wait_s = float("inf")
        if oldest.base_offset < decided_below:  # a held region
            since = time.monotonic() - self._released_at.get(tp, float("-inf"))
            wait_s = max(0.0, idle_s - since)
        if undecided is not None:
            if self._shed(undecided):
                return 0.0
            due_before = self._due_before(tp, self._clock(), undecided.base_offset)
            wait_s = min(wait_s, max(0.0, (undecided.append_time_ms - due_before) / 1000))
        return wait_s

    def _shed(self, batch: StoredBatch) -> bool:
        return shed_now(batch.reliability, self._buffer_fill())

    async def _recover(self, tp: TopicPartition, *, fence: bool
                       ) -> tuple[HardenedPartitionWriter, int]:
        """Find where hardening goes on (after fencing, at the partition's leader, a writer
        that did not let go): returns the writer and the offset below which every record is
        decided (in Kafka, or needing nothing)."""
        config = await self._registered(tp.topic)
        state = await self._queue.state(tp)
        await self._catalog.ensure_in_kafka(tp.topic, config.partitions, fresh=True,
                                            topic_id=config.topic_id)
        writer = HardenedPartitionWriter(self._client, tp.topic, tp.partition,
                                         max_batch_bytes=self._settings.max_batch_bytes)
        in_kafka = await writer.recover(Fence.AT_LEADER if fence else Fence.NONE)
        self._recovered_in[tp] = state.incarnation
        state = await self._queue.state(tp)
        if in_kafka is not None and in_kafka > state.next_offset:
            log.error("%s/%d: Kafka holds Kiln offsets up to %d but the log queue is at %d: "
                      "Redis lost this partition's state while the topic stayed registered",
                      tp.topic, tp.partition, in_kafka - 1, state.next_offset)
        decided_below = max(in_kafka or 0, state.hardened_offset)
        if in_kafka is not None and in_kafka > state.hardened_offset:
            # Crashed after writing to Kafka and before finishing the pass: its records are
            # in Kafka (counted as hardened, the few delivered or expired among them too);
            # the batches leave with the next pass, except those held until delivered.
            await self._queue.finish_pass(tp, state.incarnation, owner=self._settings.owner,
                                          trim_below=0,
                                          hardened_below=in_kafka,
                                          written_records=in_kafka - state.hardened_offset)
        if state.incarnation:
            self._waiters.settled(tp, state.incarnation, decided_below)
        log.info("hardening %s/%d from Kiln offset %d", tp.topic, tp.partition, decided_below)
        return writer, decided_below

    async def _harden_due(self, tp: TopicPartition, writer: HardenedPartitionWriter,
                          decided_below: int) -> int:
        """Release what the partition held and may now let go, then harden its due
        undecided batches (up to the read limit); returns the new `decided_below`."""
        state = await self._queue.state(tp)
        if state.incarnation != self._recovered_in.get(tp, state.incarnation):
            # Started again under this task (Redis lost it, or the topic was deleted and
            # created anew): what the writer knows of it is of the old one.
            raise PartitionLost(f"{tp.topic}/{tp.partition}: started again since recovered")
        head_held = False
        if state.start_offset < decided_below:
            head_held = await self._release(tp, state, decided_below)
        read = await self._queue.read(tp, self._settings.read_limit_bytes,
                                      from_offset=decided_below)
        batches = read.batches
        if not batches:
            return decided_below
        due = _before_transactions(due_prefix(
            batches, self._due_before(tp, self._clock(), batches[0].base_offset), self._shed))
        if not due:
            return decided_below
        policy = (await self._registered(tp.topic)).harden
        plan = plan_pass(due, PassView(
            decided_below=decided_below, delivered_below=state.delivered_offset,
            skip_delivered=policy is not HardenPolicy.ALL,
            subscribed=await self._subscribed(tp.topic, due), head_held=head_held),
            lambda batch: hardens(batch, policy))
        result = NOTHING_WRITTEN
        if plan.to_write:
            started = time.monotonic()
            async with self._lease_kept(tp):
                result = await writer.write(plan.to_write, plan.write_from)
            self._delay.kafka_write((time.monotonic() - started) * 1000, self._clock())
            self.counters.records_hardened += result.records
            self.counters.records_forwarded += result.forwarded_records
            self.counters.bytes_hardened += result.bytes
            self.counters.batches_written += result.batches
            per_topic = self.counters.per_topic_records
            per_topic[tp.topic] = per_topic.get(tp.topic, 0) + result.records
            if self.counters.on_written is not None:
                self.counters.on_written(tp.topic, plan.to_write, self._clock())
        await self._queue.finish_pass(
            tp, read.incarnation, owner=self._settings.owner, trim_below=plan.trim_below,
            hardened_below=plan.decided_below, written_records=result.records,
            written_bytes=result.bytes, delivered_records=plan.delivered_records,
            expired_records=plan.expired_records)
        self._waiters.settled(tp, read.incarnation, plan.decided_below)
        return max(decided_below, plan.decided_below)

    @contextlib.asynccontextmanager
    async def _lease_kept(self, tp: TopicPartition) -> AsyncIterator[None]:
        """Renew the partition's lease while a write runs: a write slower than the lease
        (a large backlog, a slow Kafka) must not let another process take over a live
        writer. Renewal ends when the lease changed hands; the new owner fences Kafka, so
        this write's remaining requests fail, and its pass is not finished (Fenced)."""
        async def renew() -> Lease:
            while True:
                await asyncio.sleep(self._settings.lease_ms / 4000)
                try:
                    lease = await self._queue.acquire_lease(tp, self._settings.owner,
                                                            self._settings.lease_ms)
                except BufferUnavailable:
                    continue
                if lease is not Lease.HELD:
                    return lease

        renewing = asyncio.create_task(renew(), name=f"kiln-lease-{tp.topic}/{tp.partition}")
        try:
            yield
        finally:
            lost = renewing.done() and not renewing.cancelled() \
                and renewing.exception() is None
            await stop_task(renewing)
        if lost:
            raise Fenced(f"{tp.topic}/{tp.partition}: another Kiln process took the lease "
                         "over during a write")

    async def _release(self, tp: TopicPartition, state: PartitionState, decided_below: int
                       ) -> bool:
        """Let the held region at the head of the log queue go up to the first batch that
        must still be held; True when one still is."""
        self._released_at[tp] = time.monotonic()
        while True:
            read = await self._queue.read(tp, self._settings.read_limit_bytes)
            plan = plan_release(read.batches, decided_below=decided_below,
                                delivered_below=state.delivered_offset,
                                subscribed=await self._subscribed(tp.topic, read.batches))
            if plan.trim_below:
                await self._queue.finish_pass(
                    tp, read.incarnation, owner=self._settings.owner,
                    trim_below=plan.trim_below,
                    hardened_below=decided_below, delivered_records=plan.delivered_records,
                    expired_records=plan.expired_records)
            if plan.blocked or not read.batches \
                    or read.batches[-1].next_offset >= decided_below \
                    or plan.trim_below < read.batches[-1].next_offset:
                return plan.blocked


    async def _registered(self, topic: str) -> TopicConfig:
        return await registered(self._catalog, topic)

    async def _subscribed(self, topic: str, batches: Sequence[StoredBatch]) -> bool:
        return await subscribed(self._subscriptions, topic, batches)


async def registered(catalog: Catalog, topic: str) -> TopicConfig:
    """The topic as registered; TopicGone (the task ends) once it was deleted. One that
    Redis lost (registry and all) is adopted again from Kafka."""
    config = await catalog.registry.get(topic)
    if config is None and await catalog.registry.deletion(topic) is None:
        config = await catalog.lookup(topic, allow_create=False)
    if config is None:
        raise TopicGone(f"topic {topic!r} was deleted")
    return config


async def subscribed(subscriptions: DurableSubscriptions, topic: str,
                     batches: Sequence[StoredBatch]) -> bool:
    """Whether `topic` has durable subscriptions, for the reliable_nonpersistent
    batches among `batches`: they are dropped when it has none, so a subscription
    registered a moment ago (the registry is read at most once a second) is looked for
    in Redis before that."""
    if not any(b.reliability is Reliability.RELIABLE_NONPERSISTENT for b in batches):
        return False  # nothing it decides
    if await subscriptions.groups(topic):
        return True
    return bool(await subscriptions.groups(topic, fresh=True))


def hardens(batch: StoredBatch, policy: HardenPolicy) -> bool:
    """Persistent batches are hardened unless the topic says never; an assured batch always
    is (unless delivered): its producer waits to be told it is safe, and the topic may have
    been set to never only after it was appended."""
    if batch.reliability is Reliability.ASSURED_PERSISTENT:
        return True
    return policy is not HardenPolicy.NEVER and should_harden(batch.reliability)


def _before_transactions(due: list[StoredBatch]) -> list[StoredBatch]:
    """The due batches before the first of a transaction (its records or its marker). A
    partition's hardener writes no transaction: that takes one Kafka transaction for all of
    a transaction's partitions, which this per-partition writer cannot give, so hardening
    stops there (docs/transactions-design.md, the hardening lane)."""
    for i, batch in enumerate(due):
        if batch_is_transactional(batch.data):
            return due[:i]
    return due
