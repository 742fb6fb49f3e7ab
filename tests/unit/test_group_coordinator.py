"""The asyncio coordinator over an in-memory store: timers complete a rebalance, state is
written before anyone is answered, a failed write drops the group from memory (waiting
members are told COORDINATOR_NOT_AVAILABLE) until it is loaded again, a write over a group
another process changed is refused, and idle groups and unused locks leave memory."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence

import pytest

from storage.errors import BufferUnavailable
from storage.groups.coordinator import GroupCacheSettings, GroupCoordinator
from storage.groups.model import (
    CommittedOffset,
    JoinRequest,
    JoinResult,
    MembershipSettings,
    Protocol,
    SyncRequest,
)
from storage.groups.store import GroupConflict, GroupStore, StoredGroup
from storage.model import TopicPartition
from wire.errors import ErrorCode

SETTINGS = MembershipSettings(initial_rebalance_delay_ms=20, min_session_timeout_ms=100)


class MemoryStore(GroupStore):
    def __init__(self) -> None:  # no Redis
        self.meta: dict[str, str] = {}
        self.revisions: dict[str, int] = {}
        self.offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        self.failing = False
        self.saves = 0
        self.loads = 0

    def _check(self) -> None:
        if self.failing:
            raise BufferUnavailable("connection refused")

    async def load(self, group_id: str) -> StoredGroup:
        self._check()
        self.loads += 1
        found = self.meta.get(group_id)
        return StoredGroup(None if found is None else found.encode(),
                           self.revisions.get(group_id, 0))

    async def save(self, group_id: str, record: str, revision: int) -> int:
        self._check()
        if self.revisions.get(group_id, 0) != revision:
            raise GroupConflict(group_id)
        self.saves += 1
        self.meta[group_id] = record
        self.revisions[group_id] = revision + 1
        return revision + 1

    async def group_ids(self) -> list[str]:
        self._check()
        return sorted(set(self.meta) | set(self.offsets))

    async def save_offsets(self, group_id: str,
                           offsets: Mapping[TopicPartition, CommittedOffset],
                           revision: int) -> None:
        self._check()
        if self.revisions.get(group_id, 0) != revision:
            raise GroupConflict(group_id)
        self.offsets.setdefault(group_id, {}).update(offsets)

    async def load_offsets(self, group_id: str, tps: Sequence[TopicPartition] | None
                           ) -> dict[TopicPartition, CommittedOffset]:
        self._check()
        stored = self.offsets.get(group_id, {})
        return dict(stored) if tps is None else {tp: stored[tp] for tp in tps if tp in stored}

    async def close(self) -> None:
        pass


def joining(member_id: str = "", client: str = "c") -> JoinRequest:
    return JoinRequest("g", member_id, None, client, "/127.0.0.1", 10_000, 10_000, "consumer",
                       (Protocol("range", b"m"),), require_known_member_id=True)


# What an offsets listener was told of a commit: (group, offsets, by a member).
Reported = tuple[str, dict[TopicPartition, int], bool]


def coordinator(store: MemoryStore, cache: GroupCacheSettings | None = None,
                clock_ms: list[int] | None = None, prefix: str = "u") -> GroupCoordinator:
    """With `clock_ms`, the coordinator's clock is `clock_ms[0]` (tests move it)."""
    ids = itertools.count(1)
    if clock_ms is None:
        return GroupCoordinator(store, SETTINGS, unique_suffix=lambda: f"{prefix}{next(ids)}",
                                cache=cache)
    clock = clock_ms
    return GroupCoordinator(store, SETTINGS, clock_ms=lambda: clock[0],
                            unique_suffix=lambda: f"{prefix}{next(ids)}", cache=cache)


async def member_id_for(groups: GroupCoordinator, client: str) -> str:
    answer = await (await groups.join(joining(client=client)))
    assert answer.error_code is ErrorCode.MEMBER_ID_REQUIRED
    return answer.member_id


def test_a_join_is_answered_when_the_initial_delay_ends_and_the_group_is_stored() -> None:
    async def scenario() -> tuple[JoinResult, bool, int]:
        store = MemoryStore()
        groups = coordinator(store)
        member = await member_id_for(groups, "a")
        pending = await groups.join(joining(member, "a"))
        waited = not pending.done()
        answer = await asyncio.wait_for(pending, 5)
        await groups.stop()
        return answer, waited, store.saves

    answer, waited, saves = asyncio.run(scenario())

    assert waited
    assert (answer.error_code, answer.generation_id, answer.leader) == (
        ErrorCode.NONE, 1, "a-u1")
    assert saves >= 2  # the member's arrival, then generation 1


def test_a_failed_write_drops_the_group_and_tells_waiting_members_to_retry() -> None:
    async def scenario() -> tuple[JoinResult, ErrorCode, str]:
        store = MemoryStore()
        groups = coordinator(store)
        a = await member_id_for(groups, "a")
        first = await groups.join(joining(a, "a"))
        await asyncio.wait_for(first, 5)
        sync = await groups.sync(SyncRequest("g", a, None, 1, None, None, {a: b"p"}))
        await sync
        # The group is Stable; Redis goes away and a newcomer's join cannot be stored.
        b = await member_id_for(groups, "b")
        store.failing = True
        with pytest.raises(BufferUnavailable):
            await groups.join(joining(b, "b"))
        with pytest.raises(BufferUnavailable):  # dropped from memory, not loadable
            await groups.heartbeat("g", a, None, 1)
        store.failing = False
        # Loaded again from what was stored: a, Stable, generation 1.
        heartbeat_after = await groups.heartbeat("g", a, None, 1)
        described = await groups.describe("g")
        await groups.stop()
        return await first, heartbeat_after, described.state.value

    first, after, state = asyncio.run(scenario())

    assert first.generation_id == 1
    assert after is ErrorCode.NONE
    assert state == "Stable"


def test_waiting_members_of_a_group_whose_write_failed_are_answered() -> None:
    async def scenario() -> JoinResult:
        store = MemoryStore()
        groups = coordinator(store)
        a = await member_id_for(groups, "a")
        waiting = await groups.join(joining(a, "a"))  # waits out the initial delay
        b = await member_id_for(groups, "b")
        store.failing = True
        with pytest.raises(BufferUnavailable):
            await groups.join(joining(b, "b"))
        answer = await asyncio.wait_for(waiting, 5)
        await groups.stop()
        return answer

    answer = asyncio.run(scenario())

    assert answer.error_code is ErrorCode.COORDINATOR_NOT_AVAILABLE


def test_a_simple_commit_creates_an_empty_group_and_stores_its_offsets() -> None:
    async def scenario() -> tuple[dict[TopicPartition, ErrorCode], dict[TopicPartition, int],
                                  str, list[str]]:
        store = MemoryStore()
        groups = coordinator(store)
        tp = TopicPartition("t", 0)
        codes = await groups.commit_offsets("g", -1, "", None, {tp: CommittedOffset(7, "m")})
        found = await groups.fetch_offsets("g", None)
        described = await groups.describe("g")
        listed = [g.group_id for g in await groups.list_groups()]
        await groups.stop()
        return codes, {t: c.offset for t, c in found.items()}, described.state.value, listed

    codes, found, state, listed = asyncio.run(scenario())

    assert codes == {TopicPartition("t", 0): ErrorCode.NONE}
    assert found == {TopicPartition("t", 0): 7}
    assert (state, listed) == ("Empty", ["g"])


def test_a_commit_from_an_unknown_generation_of_an_unknown_group_is_refused() -> None:
    async def scenario() -> dict[TopicPartition, ErrorCode]:
        groups = coordinator(MemoryStore())
        codes = await groups.commit_offsets("g", 3, "m", None,
                                            {TopicPartition("t", 0): CommittedOffset(1)})
        await groups.stop()
        return codes

    assert asyncio.run(scenario()) == {TopicPartition("t", 0): ErrorCode.ILLEGAL_GENERATION}


# --- what a commit reports ----------------------------------------------------------------


def test_a_stored_commit_is_reported_saying_whether_a_member_made_it() -> None:
    async def scenario() -> tuple[list[Reported], list[bool]]:
        store = MemoryStore()
        tp = TopicPartition("t", 0)
        reports: list[Reported] = []
        stored_when_reported: list[bool] = []

        class Listener:
            async def committed(self, group: str, offsets: Mapping[TopicPartition, int], *,
                                by_member: bool) -> None:
                stored_when_reported.append(tp in store.offsets.get(group, {}))
                reports.append((group, dict(offsets), by_member))

            async def offsets_deleted(self, group: str, tps: Sequence[TopicPartition]) -> None:
                raise AssertionError("no offsets deleted")

            async def group_deleted(self, group: str) -> None:
                raise AssertionError("no group deleted")

        groups = GroupCoordinator(store, SETTINGS, offsets_listener=Listener())
        await groups.commit_offsets("g", -1, "", None, {tp: CommittedOffset(3)})
        a = await member_id_for(groups, "a")
        joined = await (await groups.join(joining(a, "a")))
        await (await groups.sync(SyncRequest("g", a, None, joined.generation_id, None, None,
                                             {a: b"p"})))
        await groups.commit_offsets("g", joined.generation_id, a, None,
                                    {tp: CommittedOffset(5)})
        # A standalone commit while the group has a member is refused, and not reported.
        refused = await groups.commit_offsets("g", -1, "", None, {tp: CommittedOffset(9)})
        assert refused == {tp: ErrorCode.UNKNOWN_MEMBER_ID}
        await groups.stop()
        return reports, stored_when_reported

    reports, stored_first = asyncio.run(scenario())

    tp = TopicPartition("t", 0)
    # (group, offsets stored, made by a member of the current generation)
    assert reports == [("g", {tp: 3}, False), ("g", {tp: 5}, True)]
    assert stored_first == [True, True]


# --- two Kiln processes on one group -------------------------------------------------------


def test_a_write_over_a_group_another_process_changed_is_refused_and_reloaded() -> None:
    async def scenario() -> tuple[ErrorCode, list[str], list[int], JoinResult, ErrorCode]:
        store = MemoryStore()
        first, second, third = (coordinator(store, prefix=p) for p in "pqr")
        tp = TopicPartition("t", 0)
        # Three processes hold the Empty group "g" in memory.
        await first.commit_offsets("g", -1, "", None, {tp: CommittedOffset(1)})
        await second.describe("g")
        await third.describe("g")
        # The first lets member a join.
        a = await member_id_for(first, "a")
        joined_a = await (await first.join(joining(a, "a")))
        # The second, unaware, validates a standalone commit against its stale Empty group:
        # refused unstored, and once reloaded, refused as Kafka refuses it with a member.
        with pytest.raises(GroupConflict):
            await second.commit_offsets("g", -1, "", None, {tp: CommittedOffset(9)})
        again = await second.commit_offsets("g", -1, "", None, {tp: CommittedOffset(9)})
        # The third, as unaware, cannot write member b's arrival over a's group.
        b = await member_id_for(third, "b")
        with pytest.raises(GroupConflict):
            await third.join(joining(b, "b"))
        rejoined = await third.join(joining(b, "b"))  # reloaded: b is unknown there
        described = await third.describe("g")
        for groups in (first, second, third):
            await groups.stop()
        stored = [c.offset for c in store.offsets["g"].values()]
        return (again[tp], [m.member_id for m in described.members], stored, joined_a,
                (await rejoined).error_code)

    again, members, stored, joined_a, rejoined = asyncio.run(scenario())

    assert joined_a.error_code is ErrorCode.NONE
    assert again is ErrorCode.UNKNOWN_MEMBER_ID
    assert members == [joined_a.member_id]
    assert stored == [1]
    assert rejoined is ErrorCode.UNKNOWN_MEMBER_ID


# --- memory ----------------------------------------------------------------------------------


def test_locks_of_groups_anyone_names_are_freed() -> None:
    async def scenario() -> tuple[int, int, list[ErrorCode]]:
        groups = coordinator(MemoryStore())
        codes = [await groups.heartbeat(f"nobody-{i}", "m", None, 1) for i in range(1000)]
        codes += [c for i in range(100)
                  for c in (await groups.commit_offsets(f"old-{i}", 4, "m", None, {
                      TopicPartition("t", 0): CommittedOffset(1)})).values()]
        locks, cached = groups.held_locks, groups.cached_groups
        await groups.stop()
        return locks, cached, codes

    locks, cached, codes = asyncio.run(scenario())

    assert (locks, cached) == (0, 0)
    assert codes == [ErrorCode.UNKNOWN_MEMBER_ID] * 1000 + [ErrorCode.ILLEGAL_GENERATION] * 100


def test_an_idle_empty_group_leaves_memory_and_is_loaded_again() -> None:
    async def scenario() -> tuple[int, int, int, dict[TopicPartition, int], str]:
        store = MemoryStore()
        clock = [1_000_000]
        groups = coordinator(store, GroupCacheSettings(idle_ms=60_000, sweep_interval_ms=0),
                             clock_ms=clock)
        tp = TopicPartition("t", 0)
        await groups.commit_offsets("g", -1, "", None, {tp: CommittedOffset(4)})
        cached_before = groups.cached_groups
        clock[0] += 60_001
        await groups.commit_offsets("other", -1, "", None, {tp: CommittedOffset(1)})
        cached_after = groups.cached_groups  # "g" idle past 60 s: gone; "other" stays
        loads = store.loads
        again = await groups.commit_offsets("g", -1, "", None, {tp: CommittedOffset(5)})
        described = await groups.describe("g")
        reloads = store.loads - loads
        await groups.stop()
        assert again == {tp: ErrorCode.NONE}
        return (cached_before, cached_after, reloads,
                {t: c.offset for t, c in store.offsets["g"].items()}, described.state.value)

    before, after, reloads, stored, state = asyncio.run(scenario())

    assert (before, after) == (1, 1)
    assert reloads == 1
    assert stored == {TopicPartition("t", 0): 5}
    assert state == "Empty"


def test_groups_with_members_stay_in_memory_and_idle_ones_are_bounded() -> None:
    async def scenario() -> tuple[int, ErrorCode, list[str]]:
        store = MemoryStore()
        groups = coordinator(store, GroupCacheSettings(max_groups=10, sweep_interval_ms=0))
        a = await member_id_for(groups, "a")
        joined = await (await groups.join(joining(a, "a")))
        for i in range(50):
            await groups.commit_offsets(f"g{i}", -1, "", None,
                                        {TopicPartition("t", 0): CommittedOffset(i)})
        cached = groups.cached_groups
        beat = await groups.heartbeat("g", a, None, joined.generation_id)
        stored = sorted(store.offsets)
        await groups.stop()
        return cached, beat, stored

    cached, beat, stored = asyncio.run(scenario())

    assert cached == 10
    assert beat is ErrorCode.NONE  # the group with a member was never dropped
    assert len(stored) == 50
