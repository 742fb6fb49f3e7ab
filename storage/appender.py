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

from storage.errors import BufferUnavailable, HardenedTopicMissing, StorageError
from storage.hardened_store import Fence, HardenedPartitionWriter
from storage.kafka.client import KafkaClient
from storage.log_queue import AppendRequest, AppendResult, LogQueue
from storage.model import TopicPartition

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


class Appender:
    """The log queue's append, starting partitions Redis does not know first."""

    def __init__(self, queue: LogQueue, starts: PartitionStarts) -> None:
        self._queue = queue
        self._starts = starts

    async def append(self, requests: Sequence[AppendRequest], now_ms: int
                     ) -> list[AppendResult]:
        results = await self._queue.append(requests, now_ms)
        unknown = [i for i, result in enumerate(results) if result.needs_start]
        if not unknown:
            return results
        again: list[int] = []
        for i in unknown:
            try:
                await self._starts.start(requests[i].tp)
                again.append(i)
            except StorageError as exc:
                log.warning("cannot start %s/%d from Kafka: %s", requests[i].tp.topic,
                            requests[i].tp.partition, exc)
                results[i] = AppendResult(exc.error_code, -1, False)
        retried = await self._queue.append([requests[i] for i in again], now_ms) if again else []
        for i, result in zip(again, retried, strict=True):
            if result.needs_start:  # lost again in between: the producer retries
                result = AppendResult(BufferUnavailable("partition lost again").error_code,
                                      -1, False)
            results[i] = result
        return results
