"""Group metadata and committed offsets in Redis; Redis failures become BufferUnavailable.

Layout (one hash tag per group, so a group's keys share a Redis Cluster slot):
  kiln:group:{<group>}:meta     string; the group's metadata as JSON (storage/groups/snapshot)
  kiln:group:{<group>}:offsets  hash; "<topic>:<partition>" -> committed offset as JSON
  kiln:group:{<group>}:rev      integer; bumped by every metadata write (absent: 0)
  kiln:groups                   set; every group id with metadata or offsets (ListGroups)

Metadata is written only over the revision it was read at, and offsets only while the
revision is still the one their committer was validated against (one Lua script each, on
keys of one hash tag): two Kiln processes that both hold a group in memory cannot overwrite
each other's membership, nor store a commit validated against a membership that is gone.
The loser gets GroupConflict, reloads and has its client retry. Deleting a group
(DeleteGroups) or some of its offsets (OffsetDelete) is checked against the revision the
same way: a group another process changed since is not deleted from under it.

`<group>` is the group id percent-encoded (braces included), so any group id, even one with
braces, yields one well-formed tag; the empty group id (allowed for offset commits) is "%".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from redis.typing import EncodableT

from storage import redis_pool
from storage.errors import BufferUnavailable, StorageError
from storage.groups.model import CommittedOffset
from storage.groups.snapshot import offset_from_json, offset_to_json
from storage.model import TopicPartition
from storage.redis_pool import REDIS_FAILURES, RedisClient
from wire.errors import ErrorCode

GROUPS_KEY = "kiln:groups"

# KEYS: meta, rev. ARGV: expected revision, record. Returns the new revision, or -1 when the
# stored revision is not the expected one.
_SAVE = """
local revision = tonumber(redis.call('GET', KEYS[2]) or '0')
if revision ~= tonumber(ARGV[1]) then return -1 end
redis.call('SET', KEYS[1], ARGV[2])
return redis.call('INCR', KEYS[2])
"""

# KEYS: offsets, rev. ARGV: expected revision, then field, value pairs. 1 when stored, 0 when
# the group changed since (nothing is stored then).
_SAVE_OFFSETS = """
if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[1]) then return 0 end
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
return 1
"""

# KEYS: meta, offsets, rev. ARGV: expected revision. Deletes the group's metadata, offsets and
# revision (1), unless another process wrote the group since (0, nothing deleted).
_DELETE = """
if tonumber(redis.call('GET', KEYS[3]) or '0') ~= tonumber(ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return 1
"""

# KEYS: offsets, rev. ARGV: expected revision, then fields. Deletes those committed offsets
# and returns how many there were, or -1 when the group changed since (nothing deleted).
_DELETE_OFFSETS = """
if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[1]) then return -1 end
if #ARGV < 2 then return 0 end
return redis.call('HDEL', KEYS[1], unpack(ARGV, 2))
"""


class GroupConflict(StorageError):
    """Another Kiln process changed the group since this one read it; retriable once the
    group is read again."""

    def __init__(self, group_id: str) -> None:
        super().__init__(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                         f"group {group_id!r} was changed by another Kiln process")


@dataclass(frozen=True, slots=True)
class StoredGroup:
    record: bytes | None  # None: no metadata stored (yet)
    revision: int


def group_key(group_id: str, kind: str) -> str:
    return f"kiln:group:{{{quote(group_id, safe='') or '%'}}}:{kind}"


def offset_field(tp: TopicPartition) -> str:
    # Topic names Kiln accepts cannot contain ':' (validate_topic_name).
    return f"{tp.topic}:{tp.partition}"


def offset_partition(field: bytes | str) -> TopicPartition:
    text = field.decode() if isinstance(field, bytes) else field
    topic, _, partition = text.rpartition(":")
    return TopicPartition(topic, int(partition))


class GroupStore:
    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._save = redis.register_script(_SAVE)
        self._save_offsets = redis.register_script(_SAVE_OFFSETS)
        self._delete = redis.register_script(_DELETE)
        self._delete_offsets = redis.register_script(_DELETE_OFFSETS)

    @classmethod
    def from_url(cls, url: str) -> GroupStore:
        """A store with connections of its own: a busy log queue must not hold up heartbeats
        and commits."""
        return cls(redis_pool.connect(url, max_connections=16))

    async def close(self) -> None:
        await redis_pool.close(self._redis)

    async def load(self, group_id: str) -> StoredGroup:
        try:
            raw, revision = await self._redis.mget(
                [group_key(group_id, "meta"), group_key(group_id, "rev")])
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        record = raw.encode() if isinstance(raw, str) else raw
        return StoredGroup(record, int(revision or 0))

    async def save(self, group_id: str, record: str, revision: int) -> int:
        """Write the group's metadata over `revision` (what it was read at); the new
        revision. GroupConflict when another process wrote it since."""
        try:
            await self._redis.sadd(GROUPS_KEY, group_id)
            written = int(await self._save(
                keys=[group_key(group_id, "meta"), group_key(group_id, "rev")],
                args=[revision, record]))
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        if written < 0:
            raise GroupConflict(group_id)
        return written

    async def group_ids(self) -> list[str]:
        try:
            raw = await self._redis.smembers(GROUPS_KEY)
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return sorted(g.decode() if isinstance(g, bytes) else g for g in raw)

    async def save_offsets(self, group_id: str,
                           offsets: Mapping[TopicPartition, CommittedOffset],
                           revision: int) -> None:
        """Store commits validated against the group at `revision`; GroupConflict (nothing
        stored) when the group changed since."""
        if not offsets:
            return
        args: list[EncodableT] = [revision]
        for tp, committed in offsets.items():
            args += [offset_field(tp), offset_to_json(committed)]
        try:
            await self._redis.sadd(GROUPS_KEY, group_id)
            stored = await self._save_offsets(
                keys=[group_key(group_id, "offsets"), group_key(group_id, "rev")], args=args)
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        if not stored:
            raise GroupConflict(group_id)

    async def load_offsets(self, group_id: str, tps: Sequence[TopicPartition] | None
                           ) -> dict[TopicPartition, CommittedOffset]:
        """The committed offsets of `tps` that exist, or of every partition when None."""
        key = group_key(group_id, "offsets")
        try:
            if tps is None:
                found = await self._redis.hgetall(key)
                return {offset_partition(f): offset_from_json(v) for f, v in found.items()}
            if not tps:
                return {}
            values = await self._redis.hmget(key, [offset_field(tp) for tp in tps])
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return {tp: offset_from_json(v) for tp, v in zip(tps, values, strict=True)
                if v is not None}

    async def forget_partitions(self, tps: Sequence[TopicPartition]) -> int:
        """Remove every group's committed offsets of these partitions (their topic was
        deleted, and Kafka's group coordinator forgets such offsets too); how many there
        were."""
        fields = [offset_field(tp) for tp in tps]
        if not fields:
            return 0
        try:
            group_ids = await self._redis.smembers(GROUPS_KEY)
            async with self._redis.pipeline(transaction=False) as pipe:
                for group_id in group_ids:
                    text = group_id.decode() if isinstance(group_id, bytes) else group_id
                    pipe.hdel(group_key(text, "offsets"), *fields)
                return sum(int(n) for n in await pipe.execute())
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def has_offsets(self, group_id: str) -> bool:
        try:
            return bool(await self._redis.exists(group_key(group_id, "offsets")))
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def delete(self, group_id: str, revision: int) -> None:
        """Delete the group (metadata and committed offsets) as read at `revision`;
        GroupConflict (nothing deleted) when another process wrote it since."""
        try:
            deleted = await self._delete(
                keys=[group_key(group_id, "meta"), group_key(group_id, "offsets"),
                      group_key(group_id, "rev")], args=[revision])
            if deleted:
                await self._redis.srem(GROUPS_KEY, group_id)
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        if not deleted:
            raise GroupConflict(group_id)

    async def delete_offsets(self, group_id: str, tps: Sequence[TopicPartition],
                             revision: int) -> int:
        """Delete the group's committed offsets of `tps`, validated against the group at
        `revision`; how many there were. GroupConflict (nothing deleted) when the group
        changed since."""
        try:
            deleted = int(await self._delete_offsets(
                keys=[group_key(group_id, "offsets"), group_key(group_id, "rev")],
                args=[revision, *(offset_field(tp) for tp in tps)]))
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        if deleted < 0:
            raise GroupConflict(group_id)
        return deleted
