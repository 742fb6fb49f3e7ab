"""The group coordinator: Kafka's classic group protocol and the KIP-848 consumer group
protocol for the clients of this Kiln.

One Kiln node coordinates a given group: FindCoordinator names the node the group is placed
on (storage/leadership.py), and every other node answers the group's requests with
NOT_COORDINATOR, so every member of a group talks to the same node. When the nodes change,
a group that moves is dropped from the old node's memory (`forget_uncoordinated`); should
two nodes hold a group at once while their views of the nodes differ, the store's revision
check below keeps either from overwriting the other's writes.

A group lives in memory while it is used, driven by an I/O-free state machine: `membership`
for a classic group, `consumer_group` for a KIP-848 one (one group id is one kind at a time:
an empty group turns into the other kind when a member of that kind arrives, as in Kafka; a
group with members refuses the other protocol's members). This module owns its timers and
the futures of members waiting for a JoinGroup or SyncGroup answer. Every change that
matters is written to Redis before anyone is answered; if that write fails, or another Kiln
process wrote the group since it was read (the store checks a revision), the group is
dropped from memory (its waiting members are told COORDINATOR_NOT_AVAILABLE and retry) and
reloaded from Redis on next use. A restarted Kiln loads a group the first time it is asked
about it, with member session timers starting at load time, so members that keep
heartbeating carry on without a rebalance.

Memory is bounded by use, not by how many group ids clients ever named: a group that is
Empty with nothing pending leaves memory after `idle_ms` (or sooner, least recently used
first, beyond `max_groups`), and a group's lock lives only while it is held or awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import itertools
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from storage.clock import wall_clock_ms
from storage.errors import NotCoordinator, StorageError
from storage.groups.consumer_group import ConsumerGroup
from storage.groups.consumer_model import (
    ConsumerGroupSettings,
    ConsumerHeartbeat,
    HeartbeatResult,
    TopicMetadata,
    heartbeat_precheck,
)
from storage.groups.consumer_protocol import CONSUMER_PROTOCOL_TYPE, is_subscribed
from storage.groups.locks import KeyedLocks
from storage.groups.membership import Group, is_standalone_commit, join_precheck
from storage.groups.model import (
    UNKNOWN_MEMBER_ID,
    CommittedOffset,
    GroupState,
    GroupSummary,
    JoinRequest,
    JoinResult,
    MemberIdentity,
    MembershipSettings,
    Reply,
    SyncRequest,
    SyncResult,
    dead_summary,
)
from storage.groups.snapshot import (
    consumer_group_from_json,
    consumer_group_to_json,
    group_from_json,
    group_to_json,
    is_consumer_group_record,
)
from storage.groups.store import GroupConflict, GroupStore
from storage.model import TopicPartition
from storage.tasks import stop_task
from wire.errors import ErrorCode

log = logging.getLogger(__name__)


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class OffsetListener(Protocol):
    """Told of every change to a group's committed offsets while the group is still locked,
    so the consequences (storage.delivery) happen in the order the changes were stored."""

    async def committed(self, group: str, offsets: Mapping[TopicPartition, int], *,
                        by_member: bool) -> None:
        """Offsets stored (the next offset to read, per partition); `by_member`: by a
        member of the group's current generation, not a standalone commit."""

    async def offsets_deleted(self, group: str, tps: Sequence[TopicPartition]) -> None: ...

    async def group_deleted(self, group: str) -> object: ...


class TopicDirectory(Protocol):
    """The topics a consumer group's heartbeat is resolved against (name -> id and partition
    count; names that are no topic are left out)."""

    async def named(self, names: Iterable[str]) -> dict[str, TopicMetadata]: ...

    async def every(self) -> dict[str, TopicMetadata]: ...


@dataclass(frozen=True, slots=True)
class GroupCacheSettings:
    # An Empty group with nothing pending is dropped from memory after this long unused.
    idle_ms: int = 300_000
    # Beyond this many groups in memory, idle ones go first, least recently used first.
    max_groups: int = 10_000
    # Looking for groups to drop walks the cache; not more often than this when under
    # `max_groups`.
    sweep_interval_ms: int = 1_000


AnyGroup = Group | ConsumerGroup
CLASSIC = "classic"
CONSUMER = "consumer"


@dataclass(slots=True, eq=False)
class _Loaded:
    group: AnyGroup
    # `group.revision` when last written to Redis (the in-memory change counter)...
    stored_revision: int
    # ...and the store's revision of the group then (what the next write must find there).
    redis_revision: int
    persisted: bool
    last_used_ms: int
    timer: asyncio.TimerHandle | None = None
    announced_generation: int = -1


@dataclass(frozen=True, slots=True)
class _Waiter:
    future: asyncio.Future[Any]
    # The answer if the group is dropped before the state machine answers.
    failure: Reply


@dataclass(frozen=True, slots=True)
class OffsetDeletion:
    """What an OffsetDelete did: a group-level error, or the topics left alone because the
    group's members are subscribed to them, and the partitions whose offsets are gone."""

    error_code: ErrorCode
    subscribed_topics: frozenset[str] = frozenset()
    deleted: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str  # Kafka's name of the group's state (classic or consumer group states)
    group_type: str  # "classic" or "consumer"


class GroupCoordinator:
    def __init__(self, store: GroupStore, settings: MembershipSettings,
                 clock_ms: Callable[[], int] = monotonic_ms,
                 unique_suffix: Callable[[], str] = lambda: str(uuid.uuid4()),
                 cache: GroupCacheSettings | None = None,
                 consumer_settings: ConsumerGroupSettings | None = None,
                 offsets_listener: OffsetListener | None = None,
                 coordinates: Callable[[str], bool] = lambda group_id: True) -> None:
        self._store = store
        # Whether this node coordinates a group now (storage/leadership.py).
        self._coordinates = coordinates
        self._offsets_listener = offsets_listener
        self.settings = settings
        self.consumer_settings = consumer_settings or ConsumerGroupSettings()
        self._clock_ms = clock_ms
        self._unique_suffix = unique_suffix
        self._cache = cache or GroupCacheSettings()
        # Least recently used first.
        self._groups: OrderedDict[str, _Loaded] = OrderedDict()
        self._swept_at_ms: int | None = None
        self._locks = KeyedLocks()
        self._waiters: dict[int, _Waiter] = {}
        self._tickets = itertools.count(1)
        self._ticks: set[asyncio.Task[None]] = set()
        self._closed = False

    async def stop(self) -> None:
        self._closed = True
        for loaded in list(self._groups.values()):
            self._abandon(loaded)
        for task in list(self._ticks):
            await stop_task(task)
        await self._store.close()

    # --- the group APIs ------------------------------------------------------------------

    async def join(self, request: JoinRequest) -> asyncio.Future[JoinResult]:
        """The answer, once the group has one (at once, or when the rebalance completes)."""
        error = join_precheck(request, self.settings)
        if error is not None:
            return _done(JoinResult(error, request.member_id))
        async with self._coordinating(request.group_id):
            loaded = await self._get(request.group_id,
                                     create=request.member_id == UNKNOWN_MEMBER_ID)
            if loaded is None:
                return _done(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, request.member_id))
            group = self._as_classic(loaded)
            if group is None:
                return _done(JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                                        request.member_id))
            ticket, future = self._wait(
                JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, request.member_id))
            group.join(self._clock_ms(), request, ticket)
            await self._settle(loaded)
        return future

    async def sync(self, request: SyncRequest) -> asyncio.Future[SyncResult]:
        """The answer, once the group has one (a follower waits for the leader's)."""
        if not request.group_id:
            return _done(SyncResult(ErrorCode.INVALID_GROUP_ID))
        async with self._coordinating(request.group_id):
            loaded = await self._get(request.group_id, create=False)
            if loaded is None or not isinstance(loaded.group, Group):
                return _done(SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
            ticket, future = self._wait(SyncResult(ErrorCode.COORDINATOR_NOT_AVAILABLE))
            loaded.group.sync(self._clock_ms(), request, ticket)
            await self._settle(loaded)
        return future

    async def heartbeat(self, group_id: str, member_id: str, group_instance_id: str | None,
                        generation_id: int) -> ErrorCode:
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        async with self._coordinating(group_id):
            loaded = await self._get(group_id, create=False)
            if loaded is None or not isinstance(loaded.group, Group):
                return ErrorCode.UNKNOWN_MEMBER_ID
            code = loaded.group.heartbeat(self._clock_ms(), member_id, group_instance_id,
                                          generation_id)
            self._arm(loaded)
            return code

    async def leave(self, group_id: str, leaving: Sequence[MemberIdentity]) -> list[ErrorCode]:
        """One code per leaving member; raises nothing for unknown groups (each member is
        then UNKNOWN_MEMBER_ID, as Kafka answers)."""
        async with self._coordinating(group_id):
            loaded = await self._get(group_id, create=False)
            if loaded is None or not isinstance(loaded.group, Group):
                return [ErrorCode.UNKNOWN_MEMBER_ID for _ in leaving]
            codes = loaded.group.leave(self._clock_ms(), leaving)
            await self._settle(loaded)
            return codes

    async def describe(self, group_id: str) -> GroupSummary:
        """A classic group as DescribeGroups tells it; a consumer group is not one (Kafka
        describes it as Dead there: ConsumerGroupDescribe tells it)."""
        async with self._coordinating(group_id):
            loaded = await self._get(group_id, create=False)
            if loaded is None or not isinstance(loaded.group, Group):
                return dead_summary(group_id)
            return loaded.group.summary()

    async def describe_consumer_group(self, group_id: str) -> ConsumerGroup | None:
        """A copy of the consumer group as it is now; None when there is no consumer group
        of that id."""
        async with self._coordinating(group_id):
            loaded = await self._get(group_id, create=False)
            if loaded is None or not isinstance(loaded.group, ConsumerGroup):
                return None
            return copy.deepcopy(loaded.group)

    async def list_groups(self) -> list[GroupListing]:
        """The groups this node coordinates, as Kafka's brokers each list theirs."""
        listed = []
        for group_id in sorted(set(await self._store.group_ids()) | set(self._groups)):
            if not self._coordinates(group_id):
                continue
            async with self._coordinating(group_id):
                loaded = await self._get(group_id, create=False)
                if loaded is None:
                    continue
                group = loaded.group
                if isinstance(group, ConsumerGroup):
                    listed.append(GroupListing(group_id, CONSUMER_PROTOCOL_TYPE,
                                               group.state.value, CONSUMER))
                elif group.state is not GroupState.DEAD:
                    listed.append(GroupListing(group_id, group.protocol_type or "",
                                               group.state.value, CLASSIC))
        return listed

    # --- the KIP-848 consumer group protocol ---------------------------------------------

    async def consumer_heartbeat(self, request: ConsumerHeartbeat,
                                 topics: TopicDirectory) -> HeartbeatResult:
        """One ConsumerGroupHeartbeat; subscriptions and assignments are resolved against the
        topics it needs (every one only while a member subscribes by regex)."""
        refused = heartbeat_precheck(request)
        if refused is not None:
            return refused
        async with self._coordinating(request.group_id):
            loaded = await self._get(request.group_id, create=False)
            if loaded is None:
                loaded = self._install(request.group_id,
                                       ConsumerGroup(request.group_id, self.consumer_settings),
                                       persisted=False, redis_revision=0)
            group = self._as_consumer(loaded)
            if group is None:
                return HeartbeatResult(ErrorCode.GROUP_ID_NOT_FOUND,
                                       f"Group {request.group_id} is not a consumer group.")
            needed = group.topics_needed(request)
            known = await (topics.every() if needed is None else topics.named(needed))
            result = group.heartbeat(self._clock_ms(), request, known, self._unique_suffix)
            if result.error_code is ErrorCode.NONE:
                await self._settle(loaded)
            else:
                self._arm(loaded)
            return result

    def _as_classic(self, loaded: _Loaded) -> Group | None:
        """The classic group; an empty consumer group becomes one (None when it has
        members)."""
        if isinstance(loaded.group, Group):
            return loaded.group
        if loaded.group.members:
            return None
        loaded.group = Group(loaded.group.group_id, self.settings, self._unique_suffix)
        loaded.stored_revision = -1  # written with its first change
        return loaded.group

    def _as_consumer(self, loaded: _Loaded) -> ConsumerGroup | None:
        """The consumer group; an empty classic group becomes one (None when it has
        members or a rebalance under way)."""
        if isinstance(loaded.group, ConsumerGroup):
            return loaded.group
        classic = loaded.group
        if classic.state is not GroupState.EMPTY or classic.members or classic.pending_members:
            return None
        loaded.group = ConsumerGroup(classic.group_id, self.consumer_settings)
        loaded.stored_revision = -1
        return loaded.group

    # --- offsets -------------------------------------------------------------------------

    async def commit_offsets(self, group_id: str, generation_id: int, member_id: str,
                             group_instance_id: str | None,
                             offsets: Mapping[TopicPartition, CommittedOffset],
                             version: int = 8) -> dict[TopicPartition, ErrorCode]:
        """Validate the committer as Kafka does, then store what passed (before answering)
        and tell the offsets listener."""
        async with self._coordinating(group_id):
            loaded, refused = await self._validate_commit(
                group_id, generation_id, member_id, group_instance_id, list(offsets), version)
            if loaded is None:
                return refused
            codes: dict[TopicPartition, ErrorCode] = dict(refused)
            if len(codes) == len(offsets):
                return codes
            accepted: dict[TopicPartition, CommittedOffset] = {}
            stamp = wall_clock_ms()
            for tp, committed in offsets.items():
                if tp in refused:
                    continue
                metadata = committed.metadata or ""
                if len(metadata) > self.settings.max_offset_metadata_bytes:
                    codes[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
                    continue
                accepted[tp] = dataclasses.replace(committed, commit_timestamp_ms=stamp)
                codes[tp] = ErrorCode.NONE
            if not loaded.persisted:
                await self._persist(loaded)
            try:
                # Stored only if the membership it was validated against is still Redis's.
                await self._store.save_offsets(group_id, accepted, loaded.redis_revision)
            except GroupConflict:
                log.info("group %s changed in Redis since it was loaded; reloading", group_id)
                self._abandon(loaded)
                raise
            if accepted and self._offsets_listener is not None:
                await self._offsets_listener.committed(
                    group_id, {tp: c.offset for tp, c in accepted.items()},
                    by_member=not is_standalone_commit(generation_id, member_id,
                                                       group_instance_id))
            return codes

    async def validate_transactional_commit(
            self, group_id: str, generation_id: int, member_id: str,
            group_instance_id: str | None, tps: Sequence[TopicPartition], version: int
            ) -> dict[TopicPartition, ErrorCode]:
        """TxnOffsetCommit: the partitions whose commit the group refuses, checked as an
        OffsetCommit's (the offsets themselves wait for the transaction's end)."""
        async with self._coordinating(group_id):
            return (await self._validate_commit(group_id, generation_id, member_id,
                                                group_instance_id, tps, version))[1]

    async def _validate_commit(self, group_id: str, generation_id: int, member_id: str,
                               group_instance_id: str | None, tps: Sequence[TopicPartition],
                               version: int) -> tuple[_Loaded | None,
                                                      dict[TopicPartition, ErrorCode]]:
        # A group unknown to Kafka is created by a commit that does not use group
        # management (generation < 0); otherwise it is a commit from an old generation.
        loaded = await self._get(group_id, create=generation_id < 0)
        if loaded is None:
            return None, {tp: ErrorCode.ILLEGAL_GENERATION for tp in tps}
        if isinstance(loaded.group, ConsumerGroup):
            # The generation field carries the member epoch (OffsetCommit v9+), checked per
            # partition (KIP-1251).
            refused = loaded.group.validate_commit(member_id, generation_id, version,
                                                   list(tps))
        else:
            error = loaded.group.validate_commit(self._clock_ms(), generation_id, member_id,
                                                 group_instance_id)
            refused = {} if error is ErrorCode.NONE else {tp: error for tp in tps}
        self._arm(loaded)
        return loaded, refused

    async def fetch_offsets(self, group_id: str, tps: Sequence[TopicPartition] | None
                            ) -> dict[TopicPartition, CommittedOffset]:
        """The committed offsets among `tps` (every committed one when None)."""
        if not self._coordinates(group_id):
            raise NotCoordinator(group_id)
        return await self._store.load_offsets(group_id, tps)

    async def validate_fetch(self, group_id: str, member_id: str | None,
                             member_epoch: int) -> ErrorCode:
        """OffsetFetch v9+ from a member of a consumer group names itself and its epoch;
        Kafka checks them (a classic group, or none, checks nothing)."""
        if member_id is None and member_epoch < 0:
            return ErrorCode.NONE
        async with self._coordinating(group_id):
            loaded = await self._get(group_id, create=False)
            if loaded is None or not isinstance(loaded.group, ConsumerGroup):
                return ErrorCode.NONE
            return loaded.group.validate_fetch(member_id, member_epoch)

    # --- deleting ------------------------------------------------------------------------

    async def delete_group(self, group_id: str) -> ErrorCode:
        """Delete a group without members, its metadata and committed offsets (Kafka's
        DeleteGroups): GROUP_ID_NOT_FOUND for a group Kiln does not know, NON_EMPTY_GROUP
        for one with members."""
        async with self._coordinating(group_id):
            loaded = await self._get(group_id, create=False)
            if loaded is None:
                stored = await self._store.load(group_id)
                if stored.record is None and not await self._store.has_offsets(group_id):
                    return ErrorCode.GROUP_ID_NOT_FOUND
                revision = stored.revision
            elif not _is_empty(loaded.group):
                return ErrorCode.NON_EMPTY_GROUP
            else:
                revision = loaded.redis_revision
            try:
                await self._store.delete(group_id, revision)
            finally:
                # Deleted, or changed by another process: either way reloaded on next use.
                if loaded is not None:
                    self._abandon(loaded)
            log.info("group %s deleted", group_id)
            if self._offsets_listener is not None:
                await self._offsets_listener.group_deleted(group_id)
            return ErrorCode.NONE

    async def delete_offsets(self, group_id: str, tps: Sequence[TopicPartition]
                             ) -> OffsetDeletion:
        """Delete the group's committed offsets of `tps` (Kafka's OffsetDelete), except those
        of topics its members are subscribed to."""
        if not group_id:
            return OffsetDeletion(ErrorCode.INVALID_GROUP_ID)
        async with self._coordinating(group_id):
            loaded = await self._get(group_id, create=False)
            if loaded is None:
                stored = await self._store.load(group_id)
                if stored.record is None and not await self._store.has_offsets(group_id):
                    return OffsetDeletion(ErrorCode.GROUP_ID_NOT_FOUND)
                revision, subscribed = stored.revision, frozenset[str]()
            elif isinstance(loaded.group, ConsumerGroup):
                subscribed = loaded.group.subscribed_topics() & {tp.topic for tp in tps}
                revision = loaded.redis_revision
            else:
                group = loaded.group
                if group.state is not GroupState.EMPTY \
                        and group.protocol_type != CONSUMER_PROTOCOL_TYPE:
                    return OffsetDeletion(ErrorCode.NON_EMPTY_GROUP)
                metadata = [m.metadata(group.protocol_name) for m in group.members.values()]
                subscribed = frozenset(
                    topic for topic in {tp.topic for tp in tps}
                    if is_subscribed(topic, group.protocol_type, group.protocol_name, metadata))
                revision = loaded.redis_revision
            deleted = [tp for tp in tps if tp.topic not in subscribed]
            try:
                await self._store.delete_offsets(group_id, deleted, revision)
            except GroupConflict:
                if loaded is not None:
                    self._abandon(loaded)
                raise
            if deleted and self._offsets_listener is not None:
                await self._offsets_listener.offsets_deleted(group_id, deleted)
            return OffsetDeletion(ErrorCode.NONE, subscribed, tuple(deleted))

    # --- loading, persisting, answering, timers ------------------------------------------

    @contextlib.asynccontextmanager
    async def _coordinating(self, group_id: str) -> AsyncIterator[None]:
        """Hold the group's lock, if this node coordinates the group (else NotCoordinator)."""
        if not self._coordinates(group_id):
            raise NotCoordinator(group_id)
        async with self._locks.hold(group_id):
            yield

    def forget_uncoordinated(self) -> int:
        """Drop from memory the groups another node coordinates now (the nodes changed):
        their waiting members are answered and look the coordinator up again, and the group
        is read from Redis afresh if it comes back. How many were dropped."""
        moved = [loaded for group_id, loaded in self._groups.items()
                 if not self._coordinates(group_id)]
        for loaded in moved:
            self._abandon(loaded)
        if moved:
            log.info("%d groups moved to other nodes", len(moved))
        return len(moved)

    async def _get(self, group_id: str, *, create: bool) -> _Loaded | None:
        now = self._clock_ms()
        loaded = self._groups.get(group_id)
        if loaded is not None:
            loaded.last_used_ms = now
            self._groups.move_to_end(group_id)
            self._sweep(now)
            return loaded
        stored = await self._store.load(group_id)
        if stored.record is not None:
            group: AnyGroup
            if is_consumer_group_record(stored.record):
                group = consumer_group_from_json(group_id, stored.record, now,
                                                 self.consumer_settings)
            else:
                group = group_from_json(group_id, stored.record, now, self.settings,
                                        self._unique_suffix)
            log.info("group %s loaded from Redis: %s, generation %d, %d members", group_id,
                     group.state.value, _epoch(group), len(group.members))
            return self._install(group_id, group, persisted=True,
                                 redis_revision=stored.revision)
        if create:
            return self._install(group_id, Group(group_id, self.settings, self._unique_suffix),
                                 persisted=False, redis_revision=stored.revision)
        return None

    def _install(self, group_id: str, group: AnyGroup, *, persisted: bool,
                 redis_revision: int) -> _Loaded:
        now = self._clock_ms()
        loaded = _Loaded(group, group.revision, redis_revision, persisted=persisted,
                         last_used_ms=now, announced_generation=_epoch(group))
        self._groups[group_id] = loaded
        self._arm(loaded)
        self._sweep(now)
        return loaded

    @property
    def cached_groups(self) -> int:
        return len(self._groups)

    @property
    def held_locks(self) -> int:
        return len(self._locks)

    def _sweep(self, now_ms: int) -> None:
        """Drop idle groups from memory: past `idle_ms`, and beyond `max_groups` the least
        recently used. Redis holds all of it; the next use loads it again."""
        over = len(self._groups) - self._cache.max_groups
        if (over <= 0 and self._swept_at_ms is not None
                and now_ms - self._swept_at_ms < self._cache.sweep_interval_ms):
            return
        self._swept_at_ms = now_ms
        cutoff = now_ms - self._cache.idle_ms
        for group_id, loaded in list(self._groups.items()):
            # Least recently used first: past the cutoff only a surplus still calls for more.
            if loaded.last_used_ms > cutoff and over <= 0:
                break
            if self._idle(loaded):
                del self._groups[group_id]
                over -= 1
                log.debug("group %s dropped from memory (idle)", group_id)

    def _idle(self, loaded: _Loaded) -> bool:
        group = loaded.group
        return (_is_empty(group) and group.next_deadline_ms() is None
                and loaded.timer is None and loaded.stored_revision == group.revision
                and not self._locks.held(group.group_id))

    def _wait(self, failure: Reply) -> tuple[int, asyncio.Future[Any]]:
        ticket = next(self._tickets)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = _Waiter(future, failure)
        return ticket, future

    async def _settle(self, loaded: _Loaded) -> None:
        """Persist what changed, then hand out the answers, then re-arm the timer."""
        group = loaded.group
        if group.revision != loaded.stored_revision:
            await self._persist(loaded)
        if _epoch(group) != loaded.announced_generation:
            loaded.announced_generation = _epoch(group)
            if isinstance(group, Group):
                log.info("group %s: generation %d, %s with %d members (protocol %s, "
                         "leader %s)", group.group_id, group.generation_id, group.state.value,
                         len(group.members), group.protocol_name, group.leader_id)
            else:
                log.info("consumer group %s: epoch %d, %s with %d members (assignor %s)",
                         group.group_id, group.group_epoch, group.state.value,
                         len(group.members), group.assignor_name)
        if isinstance(group, Group):
            for ticket, reply in group.take_replies():
                self._answer(ticket, reply)
        self._arm(loaded)

    async def _persist(self, loaded: _Loaded) -> None:
        group = loaded.group
        revision = group.revision
        record = (group_to_json(group) if isinstance(group, Group)
                  else consumer_group_to_json(group))
        try:
            loaded.redis_revision = await self._store.save(
                group.group_id, record, loaded.redis_revision)
        except GroupConflict:
            log.info("group %s changed in Redis since it was loaded; dropped from memory to "
                     "be reloaded", group.group_id)
            self._abandon(loaded)
            raise
        except StorageError:
            log.warning("group %s could not be persisted; dropped from memory",
                        group.group_id)
            self._abandon(loaded)
            raise
        loaded.stored_revision = revision
        loaded.persisted = True

    def _answer(self, ticket: int, reply: Reply) -> None:
        waiter = self._waiters.pop(ticket, None)
        # The future is cancelled when the member's connection closed while it waited.
        if waiter is not None and not waiter.future.done():
            waiter.future.set_result(reply)

    def _abandon(self, loaded: _Loaded) -> None:
        group = loaded.group
        if self._groups.get(group.group_id) is loaded:
            del self._groups[group.group_id]
        if loaded.timer is not None:
            loaded.timer.cancel()
            loaded.timer = None
        for ticket in group.abandon():
            waiter = self._waiters.get(ticket)
            if waiter is not None:
                self._answer(ticket, waiter.failure)

    def _arm(self, loaded: _Loaded) -> None:
        if loaded.timer is not None:
            loaded.timer.cancel()
            loaded.timer = None
        deadline = loaded.group.next_deadline_ms()
        if deadline is None or self._closed:
            return
        # One millisecond late rather than early: the state machine acts on `due <= now`.
        delay_s = max(0, deadline - self._clock_ms() + 1) / 1000
        loaded.timer = asyncio.get_running_loop().call_later(delay_s, self._on_timer, loaded)

    def _on_timer(self, loaded: _Loaded) -> None:
        loaded.timer = None
        task = asyncio.create_task(self._tick(loaded), name=f"kiln-group-{loaded.group.group_id}")
        self._ticks.add(task)
        task.add_done_callback(self._ticks.discard)

    async def _tick(self, loaded: _Loaded) -> None:
        group_id = loaded.group.group_id
        async with self._locks.hold(group_id):
            if self._groups.get(group_id) is not loaded:
                return
            loaded.group.tick(self._clock_ms())
            try:
                await self._settle(loaded)
            except StorageError as exc:
                log.warning("group %s: timer actions not persisted: %s", group_id, exc)


def _epoch(group: AnyGroup) -> int:
    return group.generation_id if isinstance(group, Group) else group.group_epoch


def _is_empty(group: AnyGroup) -> bool:
    if isinstance(group, ConsumerGroup):
        return not group.members
    return (group.state is GroupState.EMPTY and not group.members
            and not group.pending_members)


def _done(result: Any) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(result)
    return future
