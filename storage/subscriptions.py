"""Durable subscriptions: the consumer groups whose commits decide what is delivered.

One Redis hash (`kiln:subscriptions`, field `<topic>/<group>` -> JSON with how and when it
was registered) shared by every Kiln process; topic names cannot contain '/', so the first
'/' splits the field. Reads come from a local copy at most `ttl_s` old: a subscription added
through another process counts here within that time.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from storage.errors import BufferUnavailable

_KEY = "kiln:subscriptions"


@dataclass(frozen=True, slots=True)
class Subscription:
    topic: str
    group: str
    source: str  # "auto" (the group's first commit), "config" or "operator" (the CLI)
    since_ms: int


class SubscriptionRegistry:
    def __init__(self, redis: aioredis.Redis, ttl_s: float = 1.0) -> None:
        self._redis = redis
        self._ttl_s = ttl_s
        self._cache: dict[str, dict[str, Subscription]] = {}
        self._loaded_at = float("-inf")

    async def all(self, *, fresh: bool = False) -> dict[str, dict[str, Subscription]]:
        """topic -> group -> subscription."""
        if fresh or time.monotonic() - self._loaded_at > self._ttl_s:
            try:
                raw = await self._redis.hgetall(_KEY)
            except (RedisError, OSError) as exc:
                raise BufferUnavailable(str(exc)) from exc
            subscriptions: dict[str, dict[str, Subscription]] = {}
            for field, value in raw.items():
                topic, group = _text(field).split("/", 1)
                meta = json.loads(value)
                subscriptions.setdefault(topic, {})[group] = Subscription(
                    topic, group, meta["source"], int(meta["since_ms"]))
            self._cache, self._loaded_at = subscriptions, time.monotonic()
        return self._cache

    async def groups(self, topic: str) -> frozenset[str]:
        return frozenset((await self.all()).get(topic, {}))

    async def add(self, topic: str, group: str, *, source: str, now_ms: int) -> bool:
        """Register; False when it already was."""
        value = json.dumps({"source": source, "since_ms": now_ms})
        try:
            added = bool(await self._redis.hsetnx(_KEY, f"{topic}/{group}", value))
        except (RedisError, OSError) as exc:
            raise BufferUnavailable(str(exc)) from exc
        await self.all(fresh=True)
        return added

    async def remove(self, topic: str, group: str) -> bool:
        """Unregister; False when it was not registered."""
        try:
            removed = bool(await self._redis.hdel(_KEY, f"{topic}/{group}"))
        except (RedisError, OSError) as exc:
            raise BufferUnavailable(str(exc)) from exc
        await self.all(fresh=True)
        return removed


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
