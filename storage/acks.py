"""Produce responses that wait: a producer asking for assured_persistent is answered once
its records are hardened or delivered to every durable subscription, whichever comes first.

A waiter is tied to the partition's incarnation its records went into, never to an offset
alone: after Redis lost a partition, Kiln starts it again from what Kafka holds and issues
the same offsets anew, so "offset 41 is hardened" says nothing about the records a waiter
appended at 41 before the loss. A waiter whose incarnation is gone learns its records were
lost (and its producer gets a retriable error), never that they are safe.

The hardener and the commits of this process wake waiters at once; records settled through
another Kiln process, and partitions Redis lost, are noticed by polling the partition's
marks in Redis.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from storage.errors import BufferUnavailable
from storage.log_queue import LogQueue
from storage.model import TopicPartition
from storage.tasks import stop_task

log = logging.getLogger(__name__)


class AckOutcome(enum.Enum):
    SETTLED = "settled"  # hardened or delivered
    TIMED_OUT = "timed_out"  # still in Redis when the request's timeout ran out
    LOST = "lost"  # Redis lost the partition before the records were hardened


@dataclass(frozen=True, slots=True)
class _Mark:
    incarnation: str
    upto: int  # every offset below it is settled


@dataclass(slots=True)
class _Waiter:
    incarnation: str
    last_offset: int
    serial: int  # order of registration: a poll judges only waiters older than its read
    future: asyncio.Future[AckOutcome]


class SettledWaiters:
    def __init__(self, queue: LogQueue, poll_interval_s: float = 0.1) -> None:
        self._queue = queue
        self._poll_interval_s = poll_interval_s
        self._marks: dict[TopicPartition, _Mark] = {}
        self._waiting: dict[TopicPartition, list[_Waiter]] = defaultdict(list)
        self._poller: asyncio.Task[None] | None = None
        self._serial = 0

    def pending(self) -> int:
        return sum(len(w) for w in self._waiting.values())

    def pending_by_topic(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for tp, waiting in self._waiting.items():
            if waiting:
                counts[tp.topic] += len(waiting)
        return dict(counts)

    def settled(self, tp: TopicPartition, incarnation: str, upto: int) -> None:
        """Everything of `tp`'s incarnation `incarnation` below `upto` is hardened or
        delivered."""
        mark = self._marks.get(tp)
        if mark is not None and mark.incarnation == incarnation and upto <= mark.upto:
            return
        self._marks[tp] = _Mark(incarnation, upto)
        self._resolve(tp, lambda w: (AckOutcome.SETTLED
                                     if w.incarnation == incarnation and w.last_offset < upto
                                     else None))

    def _observed(self, tp: TopicPartition, incarnation: str, upto: int, before: int) -> None:
        """Redis says the partition is in `incarnation`, settled below `upto`. Waiters
        registered before the read (serial below `before`) on another incarnation have lost
        their records; a later one may belong to an incarnation the read predates."""
        self.settled(tp, incarnation, upto)
        self._resolve(tp, lambda w: (AckOutcome.LOST
                                     if w.incarnation != incarnation and w.serial < before
                                     else None))

    def _resolve(self, tp: TopicPartition,
                 outcome_of: Callable[[_Waiter], AckOutcome | None]) -> None:
        waiting = self._waiting.get(tp)
        if not waiting:
            return
        still = []
        for waiter in waiting:
            outcome = outcome_of(waiter)
            if outcome is None:
                still.append(waiter)
            elif not waiter.future.done():
                waiter.future.set_result(outcome)
        self._waiting[tp] = still

    async def wait(self, tp: TopicPartition, incarnation: str, last_offset: int,
                   timeout_s: float) -> AckOutcome:
        """Wait until `last_offset` of the partition's `incarnation` is settled, the
        incarnation is gone, or timeout_s passes."""
        mark = self._marks.get(tp)
        if mark is not None and mark.incarnation == incarnation and last_offset < mark.upto:
            return AckOutcome.SETTLED
        self._serial += 1
        waiter = _Waiter(incarnation, last_offset, self._serial,
                         asyncio.get_running_loop().create_future())
        self._waiting[tp].append(waiter)
        self._ensure_poller()
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(waiter.future)
        except TimeoutError:
            self._waiting[tp] = [w for w in self._waiting[tp] if w is not waiter]
            return AckOutcome.TIMED_OUT

    def _ensure_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="kiln-ack-poller")

    async def _poll(self) -> None:
        while any(self._waiting.values()):
            await asyncio.sleep(self._poll_interval_s)
            tps = [tp for tp, w in self._waiting.items() if w]
            before = self._serial + 1
            try:
                states = await self._queue.states(tps)
            except BufferUnavailable as exc:
                log.debug("ack poll failed: %s", exc)
                continue
            for tp, state in zip(tps, states, strict=True):
                self._observed(tp, state.incarnation, state.settled_offset, before)

    async def close(self) -> None:
        if self._poller is not None:
            await stop_task(self._poller)

