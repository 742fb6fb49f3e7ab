"""The asyncio coordinator over an in-memory store: timers complete a rebalance, state is
written before anyone is answered, and a failed write drops the group from memory (waiting
members are told COORDINATOR_NOT_AVAILABLE) until it is loaded again."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence

import pytest

from proxy.protocol.errors import ErrorCode
from storage.errors import BufferUnavailable
from storage.groups.coordinator import GroupCoordinator
from storage.groups.model import (
    CommittedOffset,
    JoinRequest,
    JoinResult,
    MembershipSettings,
    Protocol,
    SyncRequest,
)
from storage.groups.store import GroupStore
from storage.model import TopicPartition

SETTINGS = MembershipSettings(initial_rebalance_delay_ms=20, min_session_timeout_ms=100)


class MemoryStore(GroupStore):
    def __init__(self) -> None:  # no Redis
        self.meta: dict[str, str] = {}
        self.offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        self.failing = False
        self.saves = 0

    def _check(self) -> None:
        if self.failing:
            raise BufferUnavailable("connection refused")

    async def load(self, group_id: str) -> bytes | None:
        self._check()
        found = self.meta.get(group_id)
        return None if found is None else found.encode()

    async def save(self, group_id: str, record: str) -> None:
        self._check()
        self.saves += 1
        self.meta[group_id] = record

    async def group_ids(self) -> list[str]:
        self._check()
        return sorted(set(self.meta) | set(self.offsets))

    async def save_offsets(self, group_id: str,
                           offsets: Mapping[TopicPartition, CommittedOffset]) -> None:
        self._check()
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


def coordinator(store: MemoryStore) -> GroupCoordinator:
    ids = itertools.count(1)
    return GroupCoordinator(store, SETTINGS, unique_suffix=lambda: f"u{next(ids)}")


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
