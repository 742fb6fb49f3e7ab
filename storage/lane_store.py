"""What the hardening lane keeps in Redis, apart from the partitions' own keys.

Layout (`{lane:default}` is the hash tag; one lane for now, docs/transactions-design.md §8):
  kiln:{lane:default}:committed   hash; transaction key ("<producer id>.<number>") -> JSON
                                  {"partitions": [[topic, partition], ...], "assured": bool}:
                                  every partition a committed transaction has records in,
                                  written once all its markers are; the lane decides it only
                                  once it has read them all. Its producer's commit waits
                                  until the lane decided it when it is assured.
  kiln:{lane:default}:settled     hash; transaction key -> 1 once the lane decided it (its
                                  Kafka transaction committed, or it was wholly delivered),
                                  before it is forgotten: an assured commit is answered then
  kiln:{lane:default}:lease       string; the Kiln process that runs the lane
  kiln:{lane:default}:writer      string; the last one that took the lease and has not let go

Which partitions the lane hardens is in each partition's own keys (`lane` in its meta hash,
set when a transaction first registers there: storage/log_queue.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from storage.errors import BufferUnavailable
from storage.log_queue import LEASE_LUA, RELEASE_LUA, Lease
from storage.model import TopicPartition
from storage.redis_pool import REDIS_FAILURES, RedisClient

LANE = "default"
_OWNER_SUFFIX = "/lane"


def lane_owner(incarnation: str) -> str:
    """Who holds the lane's lease, and its partitions' leases, for a node incarnation."""
    return incarnation + _OWNER_SUFFIX


@dataclass(frozen=True, slots=True)
class LaneView:
    """The lane as Redis holds it at one moment, for operators."""

    holder: str | None  # who holds the lease; None when nobody does
    awaiting: int  # committed transactions listed and not decided yet
    assured_awaiting: int  # of those, the assured ones: their producers' commits wait

    @property
    def holder_incarnation(self) -> str | None:
        """The node incarnation (storage/nodes.py) that runs the lane."""
        return None if self.holder is None else self.holder.removesuffix(_OWNER_SUFFIX)


def lane_key(kind: str, lane: str = LANE) -> str:
    return f"kiln:{{lane:{lane}}}:{kind}"


class LaneStore:
    """Redis errors become BufferUnavailable."""

    def __init__(self, redis: RedisClient, lane: str = LANE,
                 on_committed: Callable[[], None] = lambda: None) -> None:
        self._redis = redis
        self._lane = lane
        # Told when an assured committed transaction was listed: a lane in this process
        # looks at once.
        self._on_committed = on_committed
        self._lease = redis.register_script(LEASE_LUA)
        self._release = redis.register_script(RELEASE_LUA)
        # Set (and replaced) each time a lane sharing this store settles transactions.
        self._settled_here = asyncio.Event()

    def _key(self, kind: str) -> str:
        return lane_key(kind, self._lane)

    async def committed(self, key: str, tps: Collection[TopicPartition], *, assured: bool
                        ) -> None:
        """Name the partitions committed transaction `key` has records in. The first call
        wins: one finishing the decision again after a crash may find some of them decided
        and forgotten already."""
        value = json.dumps({"partitions": sorted([tp.topic, tp.partition] for tp in tps),
                            "assured": assured})
        try:
            await self._redis.hsetnx(self._key("committed"), key, value)
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        if assured:  # its producer waits for the lane; the others wait for the delay
            self._on_committed()

    async def participants(self) -> dict[str, list[TopicPartition]]:
        try:
            raw = await self._redis.hgetall(self._key("committed"))
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return {(k.decode() if isinstance(k, bytes) else str(k)):
                [TopicPartition(str(t), int(p)) for t, p in json.loads(v)["partitions"]]
                for k, v in raw.items()}

    async def view(self) -> LaneView:
        """Read only, one round trip."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.get(self._key("lease"))
                pipe.hgetall(self._key("committed"))
                pipe.hkeys(self._key("settled"))
                holder, committed, settled = await pipe.execute()
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        decided = set(settled)
        awaiting = [value for key, value in committed.items() if key not in decided]
        return LaneView(
            holder=holder.decode() if isinstance(holder, bytes) else holder,
            awaiting=len(awaiting),
            assured_awaiting=sum(1 for value in awaiting if _assured(value)))

    async def awaits_hardening(self, key: str) -> bool:
        """Whether committed transaction `key` is assured and the lane has not decided it
        yet (hardened it, or found it wholly delivered)."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hget(self._key("committed"), key)
                pipe.hexists(self._key("settled"), key)
                raw, settled = await pipe.execute()
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return raw is not None and bool(json.loads(raw)["assured"]) and not settled

    async def settle(self, keys: Collection[str]) -> None:
        """The lane decided these transactions (they are forgotten after its pass ends)."""
        if not keys:
            return
        try:
            await self._redis.hset(self._key("settled"), mapping=dict.fromkeys(keys, 1))
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        settled, self._settled_here = self._settled_here, asyncio.Event()
        settled.set()

    async def settled_or_after(self, timeout_s: float) -> None:
        """Return when a lane sharing this store (the one running in this process) settles
        transactions, or after `timeout_s`: a lane on another node is only seen by asking
        Redis again."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._settled_here.wait()

    async def forget(self, keys: Collection[str]) -> None:
        if not keys:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hdel(self._key("committed"), *keys)
                pipe.hdel(self._key("settled"), *keys)
                await pipe.execute()
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def acquire_lease(self, owner: str, ttl_ms: int, live_owners: Sequence[str] = ()
                            ) -> Lease:
        try:
            return Lease(int(await self._lease(keys=[self._key("lease"), self._key("writer")],
                                               args=[owner, ttl_ms, *live_owners])))
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def release_lease(self, owner: str) -> None:
        try:
            await self._release(keys=[self._key("lease"), self._key("writer")], args=[owner])
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc


def _assured(value: bytes | str) -> bool:
    # An entry that does not decode still awaits the lane (as not assured): operators look
    # with this, it must not fail on what it came to find.
    try:
        return bool(json.loads(value)["assured"])
    except (ValueError, TypeError, KeyError):
        return False
