"""Transaction coordinator state in Redis; Redis failures become BufferUnavailable.

Layout (one hash tag per transactional id, so an id's keys share a Redis Cluster slot):
  kiln:txn:{<tid>}:state  string; the id's coordinator state as JSON (storage/transactions/state)
  kiln:txn:{<tid>}:rev    integer; bumped by every state write (absent: 0)
  kiln:txns               set; every transactional id with state (ListTransactions, the CLI)
  kiln:txn-due            sorted set; id -> when its coordinator must act on its own (ms): the
                          timeout of an open transaction, or at once for a decided one whose
                          markers are not all written

State is written only over the revision it was read at (one Lua script): two Kiln nodes that
both believe they coordinate an id cannot both move it on; the loser answers NOT_COORDINATOR
and the client finds the coordinator again. The two indexes are kept beside it (other slots),
best effort: the state record is the truth, and a missing index entry is restored at the
id's next write.

`<tid>` is the transactional id percent-encoded, as group ids are (storage/groups/store).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from storage.errors import BufferUnavailable
from storage.redis_pool import REDIS_FAILURES, RedisClient
from storage.transactions.state import TxnState

TRANSACTIONS_KEY = "kiln:txns"
DUE_KEY = "kiln:txn-due"

# KEYS: state, rev. ARGV: expected revision, record. The new revision, or -1 when the stored
# revision is not the expected one.
_SAVE = """
if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[1]) then return -1 end
redis.call('SET', KEYS[1], ARGV[2])
return redis.call('INCR', KEYS[2])
"""


def txn_key(transactional_id: str, kind: str) -> str:
    return f"kiln:txn:{{{quote(transactional_id, safe='')}}}:{kind}"


@dataclass(frozen=True, slots=True)
class StoredTxn:
    state: TxnState | None  # None: no state stored
    revision: int


class TxnConflict(Exception):
    """Another Kiln node wrote the transactional id's state since it was read here."""


# KEYS: state, rev. ARGV: expected revision. Deletes both (1), unless the state was written
# since (0).
_REMOVE = """
if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"""


class TxnStore:
    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._save = redis.register_script(_SAVE)
        self._remove = redis.register_script(_REMOVE)

    async def load(self, transactional_id: str) -> StoredTxn:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.get(txn_key(transactional_id, "state"))
                pipe.get(txn_key(transactional_id, "rev"))
                raw, revision = await pipe.execute()
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return StoredTxn(None if raw is None else TxnState.from_json(raw), int(revision or 0))

    async def load_many(self, transactional_ids: list[str]) -> list[TxnState]:
        """The states of those ids that have one, in one round trip."""
        if not transactional_ids:
            return []
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for tid in transactional_ids:
                    pipe.get(txn_key(tid, "state"))
                raws = await pipe.execute()
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return [TxnState.from_json(raw) for raw in raws if raw is not None]

    async def save(self, state: TxnState, revision: int, due_ms: int | None) -> int:
        """Write `state` over `revision`; returns the new revision. Raises TxnConflict when
        the state changed since. `due_ms`: when the coordinator must act on the id by itself
        (None: never)."""
        tid = state.transactional_id
        try:
            new = int(await self._save(keys=[txn_key(tid, "state"), txn_key(tid, "rev")],
                                       args=[revision, state.to_json()]))
            if new < 0:
                raise TxnConflict(tid)
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.sadd(TRANSACTIONS_KEY, tid)
                if due_ms is None:
                    pipe.zrem(DUE_KEY, tid)
                else:
                    pipe.zadd(DUE_KEY, {tid: due_ms})
                await pipe.execute()
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return new

    async def remove(self, transactional_id: str, revision: int) -> bool:
        """Forget the id, unless its state was written since `revision`."""
        tid = transactional_id
        try:
            removed = bool(await self._remove(keys=[txn_key(tid, "state"),
                                                    txn_key(tid, "rev")], args=[revision]))
            if removed:
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.srem(TRANSACTIONS_KEY, tid)
                    pipe.zrem(DUE_KEY, tid)
                    await pipe.execute()
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return removed

    async def due(self, now_ms: int, limit: int = 100) -> list[str]:
        """Ids whose coordinator must act by now."""
        try:
            ids = await self._redis.zrangebyscore(DUE_KEY, "-inf", now_ms, start=0, num=limit)
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return [i.decode() if isinstance(i, bytes) else str(i) for i in ids]

    async def transactional_ids(self) -> list[str]:
        try:
            ids = await self._redis.smembers(TRANSACTIONS_KEY)
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return sorted(i.decode() if isinstance(i, bytes) else str(i) for i in ids)
