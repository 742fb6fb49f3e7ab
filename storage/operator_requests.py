"""Requests an operator makes of the running Kiln processes through Redis, so the CLI works
from any machine that reaches it:

- **flush**: per partition, an offset below which everything must leave the log queue now,
  ignoring the delay. The hardener holding the partition's lease picks it up on its next
  topic scan (about a second).
- **drain**: a planned shutdown of every Kiln process started before the request: stop
  accepting, harden every buffered persistent record, exit (as SIGTERM does).
"""

from __future__ import annotations

from collections.abc import Mapping

from redis.typing import EncodableT, FieldT

from storage.errors import BufferUnavailable
from storage.model import TopicPartition
from storage.redis_pool import REDIS_FAILURES, RedisClient

FLUSH_KEY = "kiln:flush"
DRAIN_KEY = "kiln:drain"
_DRAIN_TTL_S = 600


def _field(tp: TopicPartition) -> str:
    return f"{tp.partition}/{tp.topic}"


def _parse_request(field: bytes | str, goal: bytes | str) -> tuple[TopicPartition, int] | None:
    """A flush request, or None when the entry is not one (written by hand, say)."""
    text = field.decode(errors="replace") if isinstance(field, bytes) else field
    partition, _, topic = text.partition("/")
    try:
        return TopicPartition(topic, int(partition)), int(goal)
    except ValueError:
        return None


async def request_flush(redis: RedisClient, goals: Mapping[TopicPartition, int]) -> None:
    """Ask for everything below `goals[tp]` to leave each partition's log queue now."""
    if not goals:
        return
    mapping: dict[FieldT, EncodableT] = {_field(tp): goal for tp, goal in goals.items()}
    try:
        await redis.hset(FLUSH_KEY, mapping=mapping)
    except REDIS_FAILURES as exc:
        raise BufferUnavailable(str(exc)) from exc


async def flush_requests(redis: RedisClient) -> dict[TopicPartition, int]:
    try:
        raw = await redis.hgetall(FLUSH_KEY)
    except REDIS_FAILURES as exc:
        raise BufferUnavailable(str(exc)) from exc
    requests = (_parse_request(field, goal) for field, goal in raw.items())
    return dict(request for request in requests if request is not None)


async def clear_flush(redis: RedisClient, tps: list[TopicPartition]) -> None:
    if not tps:
        return
    try:
        await redis.hdel(FLUSH_KEY, *(_field(tp) for tp in tps))
    except REDIS_FAILURES as exc:
        raise BufferUnavailable(str(exc)) from exc


async def request_drain(redis: RedisClient, now_ms: int) -> None:
    """Ask every Kiln process started before `now_ms` to drain and exit."""
    try:
        await redis.set(DRAIN_KEY, now_ms, ex=_DRAIN_TTL_S)
    except REDIS_FAILURES as exc:
        raise BufferUnavailable(str(exc)) from exc


async def drain_requested(redis: RedisClient, started_ms: int) -> bool:
    """True when a drain was requested after a process started at `started_ms`."""
    try:
        raw = await redis.get(DRAIN_KEY)
    except REDIS_FAILURES as exc:
        raise BufferUnavailable(str(exc)) from exc
    try:
        return raw is not None and int(raw) >= started_ms
    except ValueError:
        return False  # not a request time: not a request
