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

from storage.errors import BufferUnavailable
from storage.redis_pool import REDIS_FAILURES, RedisClient

_KEY = "kiln:subscriptions"

# How a subscription registered by a group's own first commit is marked. Every other source
# ("config", "operator") is an explicit registration.
AUTO = "auto"

# KEYS[1]: the registry; ARGV: field, value, source. Registers (1); or, when an explicit
# source meets a subscription that was only auto-registered, makes it explicit and keeps its
# `since_ms` (2); else leaves it (0).
_ADD = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
if ARGV[3] == '""" + AUTO + """' then return 0 end
local meta = cjson.decode(current)
if meta['source'] ~= '""" + AUTO + """' then return 0 end
meta['source'] = ARGV[3]
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(meta))
return 2
"""


@dataclass(frozen=True, slots=True)
class Subscription:
    topic: str
    group: str
    source: str  # "auto" (the group's first commit), "config" or "operator" (the CLI)
    since_ms: int

    @property
    def explicit(self) -> bool:
        """Registered by an operator (CLI or configuration), not by the group itself: only
        then do the group's standalone commits count for delivery."""
        return self.source != AUTO


class SubscriptionRegistry:
    def __init__(self, redis: RedisClient, ttl_s: float = 1.0) -> None:
        self._redis = redis
        self._add = redis.register_script(_ADD)
        self._ttl_s = ttl_s
        self._cache: dict[str, dict[str, Subscription]] = {}
        self._loaded_at = float("-inf")

    async def all(self, *, fresh: bool = False) -> dict[str, dict[str, Subscription]]:
        """topic -> group -> subscription."""
        if fresh or time.monotonic() - self._loaded_at > self._ttl_s:
            try:
                raw = await self._redis.hgetall(_KEY)
            except REDIS_FAILURES as exc:
                raise BufferUnavailable(str(exc)) from exc
            subscriptions: dict[str, dict[str, Subscription]] = {}
            for field, value in raw.items():
                topic, group = _text(field).split("/", 1)
                meta = json.loads(value)
                subscriptions.setdefault(topic, {})[group] = Subscription(
                    topic, group, meta["source"], int(meta["since_ms"]))
            self._cache, self._loaded_at = subscriptions, time.monotonic()
        return self._cache

    async def groups(self, topic: str, *, fresh: bool = False) -> frozenset[str]:
        return frozenset((await self.all(fresh=fresh)).get(topic, {}))

    async def get(self, topic: str, group: str) -> Subscription | None:
        return (await self.all()).get(topic, {}).get(group)

    async def add(self, topic: str, group: str, *, source: str, now_ms: int) -> bool:
        """Register; False when it already was. An explicit registration of a subscription
        that was only auto-registered makes it explicit (True)."""
        value = json.dumps({"source": source, "since_ms": now_ms})
        try:
            added = bool(await self._add(keys=[_KEY], args=[f"{topic}/{group}", value, source]))
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        await self.all(fresh=True)
        return added

    async def remove(self, topic: str, group: str) -> bool:
        """Unregister; False when it was not registered."""
        try:
            removed = bool(await self._redis.hdel(_KEY, f"{topic}/{group}"))
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        await self.all(fresh=True)
        return removed

    async def forget_topic(self, topic: str) -> int:
        """Unregister every durable subscription of a deleted topic; how many there were."""
        groups = await self.groups(topic, fresh=True)
        if groups:
            try:
                await self._redis.hdel(_KEY, *(f"{topic}/{group}" for group in groups))
            except REDIS_FAILURES as exc:
                raise BufferUnavailable(str(exc)) from exc
            await self.all(fresh=True)
        return len(groups)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
