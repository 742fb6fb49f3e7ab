"""Producer ids for idempotent producers, allocated in Redis so they are unique across every
Kiln process and survive restarts."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from storage.errors import BufferUnavailable

_COUNTER = "kiln:producer_ids"
_MAX_EPOCH = 32767


class ProducerIds:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    async def allocate(self) -> tuple[int, int]:
        """A fresh (producer_id, epoch 0)."""
        try:
            return int(await self._redis.incr(_COUNTER)), 0
        except (RedisError, OSError) as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def bump(self, producer_id: int, epoch: int) -> tuple[int, int]:
        """KIP-360: an idempotent producer that lost track of its sequences asks for a new
        epoch of its own id; when the epoch would overflow it gets a new id instead."""
        if epoch + 1 > _MAX_EPOCH:
            return await self.allocate()
        return producer_id, epoch + 1
