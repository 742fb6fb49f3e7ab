"""The buffer budget: how many bytes the log queue may hold before producers are pushed back.

The total is summed from every partition's counters in Redis (so it covers all Kiln
processes) on a short period; appends in between are added locally.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from storage.catalog import Catalog
from storage.errors import BufferFull, BufferUnavailable, StorageError
from storage.log_queue import LogQueue
from storage.model import TopicPartition
from storage.policy.adaptive import BUFFER_THROTTLE_FROM
from storage.redis_eviction import eviction_risk
from storage.tasks import stop_task

log = logging.getLogger(__name__)

# Redis's eviction policy is checked every this many refreshes (about every 5 s).
_EVICTION_CHECK_EVERY = 20


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
        # Set while Redis may evict keys (storage.redis_eviction): nothing is admitted.
        self.eviction_risk: str | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._refresh_loop(), name="kiln-budget")

    async def stop(self) -> None:
        self._stopped = True
        if self._task is not None:
            await stop_task(self._task)

    @property
    def fill(self) -> float:
        """How full the buffer is, 0..1 (0 without a budget)."""
        if self.budget_bytes <= 0:
            return 0.0
        return min(1.0, self.buffered_bytes / self.budget_bytes)

    def admit(self, incoming_bytes: int) -> int:
        """Throttle time (ms) for a produce of `incoming_bytes`; raises BufferFull, or
        BufferUnavailable while Redis may evict what it is given."""
        if self.eviction_risk is not None:
            raise BufferUnavailable(self.eviction_risk)
        decision = budget_decision(self.buffered_bytes, self.budget_bytes, incoming_bytes)
        if decision.reject:
            raise BufferFull(f"{self.buffered_bytes} of {self.budget_bytes} bytes buffered")
        self.buffered_bytes += incoming_bytes
        return decision.throttle_time_ms

    async def refresh(self) -> None:
        # Registered topics only: adopting the Kafka topics Kiln has not seen yet (fencing
        # and reading each partition's tail) can take a while on a large cluster, and they
        # hold nothing in the log queue before they are adopted.
        topics = await self._catalog.registry.all()
        tps = [TopicPartition(t.name, p) for t in topics.values() for p in range(t.partitions)]
        states = await self._queue.states(tps) if tps else []
        self.buffered_bytes = sum(s.buffered_bytes for s in states)
        self.buffered_records = sum(s.buffered_records for s in states)

    async def _refresh_loop(self) -> None:
        rounds = 0
        while not self._stopped:
            try:
                await self.refresh()
                if rounds % _EVICTION_CHECK_EVERY == 0:
                    await self._check_eviction()
            except StorageError as exc:
                log.debug("budget refresh failed: %s", exc)
            rounds += 1
            await asyncio.sleep(self._refresh_s)

    async def _check_eviction(self) -> None:
        risk = await eviction_risk(self._queue.redis)
        if risk != self.eviction_risk:
            if risk is not None:
                log.error("refusing records: %s", risk)
            else:
                log.info("Redis no longer evicts keys: accepting records again")
        self.eviction_risk = risk
