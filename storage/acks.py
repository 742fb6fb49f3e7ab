"""Produce responses that wait: a producer asking for assured_persistent is answered once
its records are hardened or delivered to every durable subscription, whichever comes first.

The hardener and the commits of this process wake waiters at once; records settled through
another Kiln process are noticed by polling the partition's marks in Redis.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

from storage.errors import BufferUnavailable
from storage.log_queue import LogQueue
from storage.model import TopicPartition
from storage.tasks import stop_task

log = logging.getLogger(__name__)


class SettledWaiters:
    def __init__(self, queue: LogQueue, poll_interval_s: float = 0.1) -> None:
        self._queue = queue
        self._poll_interval_s = poll_interval_s
        self._marks: dict[TopicPartition, int] = defaultdict(int)
        self._waiting: dict[TopicPartition, list[tuple[int, asyncio.Future[None]]]] = (
            defaultdict(list)
        )
        self._poller: asyncio.Task[None] | None = None

    def pending(self) -> int:
        return sum(len(w) for w in self._waiting.values())

    def pending_by_topic(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for tp, waiting in self._waiting.items():
            if waiting:
                counts[tp.topic] += len(waiting)
        return dict(counts)

    def settled(self, tp: TopicPartition, upto: int) -> None:
        """Everything of `tp` below `upto` is hardened or delivered."""
        if upto <= self._marks[tp]:
            return
        self._marks[tp] = upto
        waiting = self._waiting.get(tp)
        if not waiting:
            return
        still = []
        for offset, fut in waiting:
            if offset < upto:
                if not fut.done():
                    fut.set_result(None)
            else:
                still.append((offset, fut))
        self._waiting[tp] = still

    async def wait(self, tp: TopicPartition, last_offset: int, timeout_s: float) -> bool:
        """True once `last_offset` is settled; False when timeout_s passes first."""
        if last_offset < self._marks[tp]:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[tp].append((last_offset, fut))
        self._ensure_poller()
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
            return True
        except TimeoutError:
            self._waiting[tp] = [(o, f) for o, f in self._waiting[tp] if f is not fut]
            return False

    def _ensure_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="kiln-ack-poller")

    async def _poll(self) -> None:
        while any(self._waiting.values()):
            await asyncio.sleep(self._poll_interval_s)
            tps = [tp for tp, w in self._waiting.items() if w]
            try:
                states = await self._queue.states(tps)
            except BufferUnavailable as exc:
                log.debug("ack poll failed: %s", exc)
                continue
            for tp, state in zip(tps, states, strict=True):
                self.settled(tp, state.settled_offset)

    async def close(self) -> None:
        if self._poller is not None:
            await stop_task(self._poller)
