"""The buffer budget: how many bytes the log queue may hold before producers are pushed back.

The total is summed from every partition's counters in Redis (so it covers all Kiln
processes) on a short period; appends in between are added locally.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from storage.catalog import Catalog
from storage.errors import BufferFull, StorageError
from storage.log_queue import LogQueue
from storage.model import TopicPartition
from storage.policy.adaptive import BUFFER_THROTTLE_FROM
from storage.tasks import stop_task

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BudgetDecision:
    throttle_time_ms: int
    reject: bool


def budget_decision(buffered_bytes: int, budget_bytes: int, incoming_bytes: int,
                    throttle_from: float = BUFFER_THROTTLE_FROM,
                    max_throttle_ms: int = 1000) -> BudgetDecision:
    """Throttle producers as the buffer fills past `throttle_from`, refuse past the budget."""
    if budget_bytes <= 0:
        return BudgetDecision(0, False)
    if buffered_bytes + incoming_bytes > budget_bytes:
        return BudgetDecision(max_throttle_ms, True)
    fill = buffered_bytes / budget_bytes
    if fill <= throttle_from:
        return BudgetDecision(0, False)
    share = (fill - throttle_from) / (1.0 - throttle_from)
    return BudgetDecision(int(share * max_throttle_ms), False)


class BufferBudget:
    def __init__(self, queue: LogQueue, catalog: Catalog, budget_bytes: int,
                 refresh_s: float = 0.25) -> None:
        self._queue = queue
        self._catalog = catalog
        self.budget_bytes = budget_bytes
        self._refresh_s = refresh_s
        self.buffered_bytes = 0
        self.buffered_records = 0
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._refresh_loop(), name="kiln-budget")

    async def stop(self) -> None:
        self._stopped = True
        if self._task is not None:
            await stop_task(self._task)

    def admit(self, incoming_bytes: int) -> int:
        """Throttle time (ms) for a produce of `incoming_bytes`; raises BufferFull."""
        decision = budget_decision(self.buffered_bytes, self.budget_bytes, incoming_bytes)
        if decision.reject:
            raise BufferFull(f"{self.buffered_bytes} of {self.budget_bytes} bytes buffered")
        self.buffered_bytes += incoming_bytes
        return decision.throttle_time_ms

    async def refresh(self) -> None:
        topics = await self._catalog.all()
        tps = [TopicPartition(t.name, p) for t in topics.values() for p in range(t.partitions)]
        states = await self._queue.states(tps) if tps else []
        self.buffered_bytes = sum(s.buffered_bytes for s in states)
        self.buffered_records = sum(s.buffered_records for s in states)

    async def _refresh_loop(self) -> None:
        while not self._stopped:
            try:
                await self.refresh()
            except StorageError as exc:
                log.debug("budget refresh failed: %s", exc)
            await asyncio.sleep(self._refresh_s)
