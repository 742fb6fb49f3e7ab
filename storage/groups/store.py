"""Group metadata and committed offsets in Redis; Redis failures become BufferUnavailable.

Layout (one hash tag per group, so a group's keys share a Redis Cluster slot):
  kiln:group:{<group>}:meta     string; the group's metadata as JSON (storage/groups/snapshot)
  kiln:group:{<group>}:offsets  hash; "<topic>:<partition>" -> committed offset as JSON
  kiln:groups                   set; every group id with metadata or offsets (ListGroups)

`<group>` is the group id percent-encoded (braces included), so any group id, even one with
braces, yields one well-formed tag; the empty group id (allowed for offset commits) is "%".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import quote

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from redis.typing import EncodableT, FieldT

from storage import redis_pool
from storage.errors import BufferUnavailable
from storage.groups.model import CommittedOffset
from storage.groups.snapshot import offset_from_json, offset_to_json
from storage.model import TopicPartition

GROUPS_KEY = "kiln:groups"


def group_key(group_id: str, kind: str) -> str:
    return f"kiln:group:{{{quote(group_id, safe='') or '%'}}}:{kind}"


def _field(tp: TopicPartition) -> str:
    # Topic names Kiln accepts cannot contain ':' (validate_topic_name).
    return f"{tp.topic}:{tp.partition}"


def _partition(field: bytes | str) -> TopicPartition:
    text = field.decode() if isinstance(field, bytes) else field
    topic, _, partition = text.rpartition(":")
    return TopicPartition(topic, int(partition))


class GroupStore:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    @classmethod
    def from_url(cls, url: str) -> GroupStore:
        """A store with connections of its own: a busy log queue must not hold up heartbeats
        and commits."""
        return cls(redis_pool.connect(url, max_connections=16))

    async def close(self) -> None:
        await redis_pool.close(self._redis)

    async def load(self, group_id: str) -> bytes | None:
        try:
            raw = await self._redis.get(group_key(group_id, "meta"))
        except (RedisError, OSError) as exc:
            raise BufferUnavailable(str(exc)) from exc
        return raw.encode() if isinstance(raw, str) else raw

    async def save(self, group_id: str, record: str) -> None:
        try:
            await self._redis.sadd(GROUPS_KEY, group_id)
            await self._redis.set(group_key(group_id, "meta"), record)
        except (RedisError, OSError) as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def group_ids(self) -> list[str]:
        try:
            raw = await self._redis.smembers(GROUPS_KEY)
        except (RedisError, OSError) as exc:
            raise BufferUnavailable(str(exc)) from exc
        return sorted(g.decode() if isinstance(g, bytes) else g for g in raw)

    async def save_offsets(self, group_id: str,
                           offsets: Mapping[TopicPartition, CommittedOffset]) -> None:
        if not offsets:
            return
        mapping: dict[FieldT, EncodableT] = {
            _field(tp): offset_to_json(c) for tp, c in offsets.items()}
        try:
            await self._redis.sadd(GROUPS_KEY, group_id)
            await self._redis.hset(group_key(group_id, "offsets"), mapping=mapping)
        except (RedisError, OSError) as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def load_offsets(self, group_id: str, tps: Sequence[TopicPartition] | None
                           ) -> dict[TopicPartition, CommittedOffset]:
        """The committed offsets of `tps` that exist, or of every partition when None."""
        key = group_key(group_id, "offsets")
        try:
            if tps is None:
                found = await self._redis.hgetall(key)
                return {_partition(f): offset_from_json(v) for f, v in found.items()}
            if not tps:
                return {}
            values = await self._redis.hmget(key, [_field(tp) for tp in tps])
        except (RedisError, OSError) as exc:
            raise BufferUnavailable(str(exc)) from exc
        return {tp: offset_from_json(v) for tp, v in zip(tps, values, strict=True)
                if v is not None}
