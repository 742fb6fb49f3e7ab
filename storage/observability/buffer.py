"""What the log queue holds, per topic, read from Redis when metrics are scraped.

Bounded cost: one read of the topic registry, one pipelined read of every partition's meta
hash, and the oldest entry of each partition that holds records (at most `peek_concurrency`
at a time); a snapshot is reused for `max_age_s`, so frequent scrapes do not add load.
Values come from Redis, so every Kiln process sharing it reports the same ones.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from storage.clock import wall_clock_ms
from storage.errors import BufferUnavailable
from storage.log_queue import LogQueue, PartitionState
from storage.model import Reliability, TopicPartition
from storage.topics import HardenPolicy, TopicConfig, TopicRegistry


@dataclass(frozen=True, slots=True)
class TopicBuffer:
    records: int = 0
    bytes: int = 0
    oldest_age_ms: int = 0  # 0 when nothing is buffered
    # Buffered records Kiln has promised to harden and that exist only in Redis (lost if
    # Redis is lost before hardening): see `at_risk_share`.
    at_risk_records: int = 0
    at_risk_bytes: int = 0
    # Cumulative: records that left the log queue as delivered, never written to Kafka.
    delivered_records: int = 0
    delivered_bytes: int = 0


def levels_of(config: TopicConfig) -> set[Reliability]:
    """The levels a producer can give this topic's records (storage.policy.reliability):
    the topic's level, or with producer override its level and what acks=all asks for, both
    capped at the topic's maximum."""
    if not config.producer_override:
        return {config.reliability}
    return {min(config.reliability, config.max_reliability),
            min(Reliability.ASSURED_PERSISTENT, config.max_reliability)}


def at_risk_share(config: TopicConfig) -> bool:
    """Whether the topic's buffered records count as at risk: records of a persistent level
    waiting to be hardened. Per-batch levels are not summed in Redis, so a topic whose
    producers may choose both persistent and non-persistent levels counts all its buffered
    records (an upper bound); a topic that never hardens (`harden = never`) counts none."""
    if config.harden is HardenPolicy.NEVER:
        return False
    return any(level.persistent for level in levels_of(config))


def topic_buffer(config: TopicConfig, states: Sequence[PartitionState],
                 oldest_append_ms: Sequence[int | None], now_ms: int) -> TopicBuffer:
    records = sum(s.buffered_records for s in states)
    size = sum(s.buffered_bytes for s in states)
    appended = [t for t in oldest_append_ms if t is not None]
    at_risk = at_risk_share(config)
    return TopicBuffer(
        records=records,
        bytes=size,
        oldest_age_ms=max(0, now_ms - min(appended)) if appended else 0,
        at_risk_records=records if at_risk else 0,
        at_risk_bytes=size if at_risk else 0,
        delivered_records=sum(s.delivered_records for s in states),
        delivered_bytes=sum(s.delivered_bytes for s in states),
    )


class BufferSnapshot:
    def __init__(self, queue: LogQueue, registry: TopicRegistry, *, max_age_s: float = 1.0,
                 timeout_s: float = 2.0, peek_concurrency: int = 8,
                 clock_ms: Callable[[], int] = wall_clock_ms,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._queue = queue
        self._registry = registry
        self._max_age_s = max_age_s
        self._timeout_s = timeout_s
        self._peeks = asyncio.Semaphore(peek_concurrency)
        self._clock_ms = clock_ms
        self._monotonic = monotonic
        self._lock = asyncio.Lock()
        self._read_at = float("-inf")
        # None until a read succeeds, and again after one fails: stale numbers would mislead.
        self.topics: Mapping[str, TopicBuffer] | None = None

    async def refresh(self) -> None:
        """Read Redis again unless the snapshot is younger than max_age_s; raises
        BufferUnavailable (and forgets the snapshot) when Redis does not answer in time."""
        async with self._lock:
            if self._monotonic() - self._read_at < self._max_age_s:
                return
            self._read_at = self._monotonic()
            try:
                async with asyncio.timeout(self._timeout_s):
                    self.topics = await self._read()
            except TimeoutError:
                self.topics = None
                raise BufferUnavailable(f"no answer within {self._timeout_s}s") from None
            except BufferUnavailable:
                self.topics = None
                raise

    async def _read(self) -> dict[str, TopicBuffer]:
        configs = await self._registry.all()
        tps = [TopicPartition(c.name, p) for c in configs.values() for p in range(c.partitions)]
        states = dict(zip(tps, await self._queue.states(tps), strict=True)) if tps else {}
        busy = [tp for tp in tps if states[tp].buffered_records > 0]
        oldest = dict(zip(busy, await asyncio.gather(*(self._oldest(tp) for tp in busy)),
                          strict=True))
        now = self._clock_ms()
        out = {}
        for name, config in configs.items():
            mine = [TopicPartition(name, p) for p in range(config.partitions)]
            out[name] = topic_buffer(config, [states[tp] for tp in mine],
                                     [oldest.get(tp) for tp in mine], now)
        return out

    async def _oldest(self, tp: TopicPartition) -> int | None:
        async with self._peeks:
            batch = await self._queue.peek_oldest(tp)
        return None if batch is None else batch.append_time_ms
