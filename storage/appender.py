"""Appends that survive Redis losing a partition: a partition Redis holds no state for is
started again from what Kafka holds before anything is appended to it.

Redis can lose a partition's state (restarted without persistence, flushed, failed over to a
replica that lagged). Appending as if the partition were new would hand out offsets Kafka
already holds, and records acknowledged before the loss would be shadowed by new ones at the
same offsets. So the log queue refuses to append to a partition without an incarnation
(`AppendResult.needs_start`), and `PartitionStarts` begins a new incarnation where Kafka's
Kiln records end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from storage.errors import BufferUnavailable, HardenedTopicMissing, StorageError
from storage.hardened_store import Fence, HardenedPartitionWriter
from storage.kafka.client import KafkaClient
from storage.log_queue import AppendRequest, AppendResult, LogQueue
from storage.model import TopicPartition
from wire.errors import ErrorCode

log = logging.getLogger(__name__)


class PartitionStarts:
    """Starts partitions Redis does not know, once each however many callers (appends that
    found the partition unknown, the catalog adopting a topic) ask at the same time."""

    def __init__(self, queue: LogQueue, kafka: KafkaClient) -> None:
        self._queue = queue
        self._kafka = kafka
        self._starting: dict[TopicPartition, asyncio.Lock] = {}

    async def start(self, tp: TopicPartition) -> bool:
        """Start `tp` unless Redis knows it by now; True when it was started here."""
        lock = self._starting.setdefault(tp, asyncio.Lock())
        try:
            async with lock:
                if await self._queue.started(tp):
                    return False
                return await self._start(tp)
        finally:
            if not lock.locked():
                self._starting.pop(tp, None)

    async def _start(self, tp: TopicPartition) -> bool:
        """Start `tp` in Redis after the last Kiln offset Kafka holds (or Kafka's own end
        when it holds no Kiln record), in a new incarnation.

        Earlier writers of the partition are fenced first, at the partition's leader, if
        Kiln ever hardened it (after Redis lost its data, one of the lost incarnation may be
        in the middle of a write): a write still in flight cannot land after the tail was
        read, so no record of it can hide behind offsets issued anew. The fence's marker
        takes one Kafka offset; the partition's Kiln offsets skip it (start at Kafka's end
        when that is further), so that while nothing is dropped, Kafka offsets still equal
        Kiln offsets."""
        writer = HardenedPartitionWriter(self._kafka, tp.topic, tp.partition)
        try:
            resume = await writer.recover(Fence.IF_EVER_WRITTEN)
            resume = max(resume or 0, await self._kafka.high_watermark(tp.topic, tp.partition))
        except HardenedTopicMissing:
            resume = 0  # Kafka holds nothing of the topic: its hardener creates it first
        started = await self._queue.initialize(tp, resume)
        if started:
            log.warning("%s/%d started in Redis at Kiln offset %d from what Kafka holds (new "
                        "to this Redis, or Redis lost its state)", tp.topic, tp.partition,
                        resume)
        return started


class PartitionLeases(Protocol):
    """The fencing tokens appends are made under (storage.leadership)."""

    async def token(self, tp: TopicPartition) -> str | None:
        """None when this node does not lead `tp`."""

    def lost(self, tp: TopicPartition, token: str) -> None: ...


# One more attempt for a lease found lost (another node took it, or Redis lost it), and one
# for a partition Redis does not know.
_ATTEMPTS = 3


class Appender:
    """The log queue's append under this node's partition leases, starting partitions Redis
    does not know first."""

    def __init__(self, queue: LogQueue, starts: PartitionStarts,
                 leases: PartitionLeases) -> None:
        self._queue = queue
        self._starts = starts
        self._leases = leases

    async def append(self, requests: Sequence[AppendRequest], now_ms: int
                     ) -> list[AppendResult]:
        """A result per request: NOT_LEADER_OR_FOLLOWER for a partition this node does not
        lead (or whose lease it cannot take yet)."""
        results = [_NOT_LEADER] * len(requests)
        pending = list(range(len(requests)))
        for _ in range(_ATTEMPTS):
            tokens: dict[int, str] = {}
            for i in pending:
                token = await self._leases.token(requests[i].tp)
                if token is None:
                    results[i] = _NOT_LEADER
                else:
                    tokens[i] = token
            if not tokens:
                break
            ready = list(tokens)
            replies = await self._queue.append([requests[i] for i in ready], now_ms,
                                               [tokens[i] for i in ready])
            pending = []
            for i, result in zip(ready, replies, strict=True):
                results[i] = result
                if result.error_code is ErrorCode.NOT_LEADER_OR_FOLLOWER:
                    self._leases.lost(requests[i].tp, tokens[i])
                    pending.append(i)
                elif result.needs_start:
                    results[i] = await self._start(requests[i].tp)
                    if results[i] is _STARTED:
                        pending.append(i)
        return [_LOST_AGAIN if r is _STARTED else r for r in results]

    async def _start(self, tp: TopicPartition) -> AppendResult:
        try:
            await self._starts.start(tp)
        except StorageError as exc:
            log.warning("cannot start %s/%d from Kafka: %s", tp.topic, tp.partition, exc)
            return AppendResult(exc.error_code, -1, False)
        return _STARTED


_NOT_LEADER = AppendResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, -1, False)
# Started, to be appended again; if the attempts run out first (lost again in between), the
# producer retries.
_STARTED = AppendResult(ErrorCode.NONE, -1, False, needs_start=True)
_LOST_AGAIN = AppendResult(BufferUnavailable("partition lost again").error_code, -1, False)
