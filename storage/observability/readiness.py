"""Readiness: does every store Kiln needs answer right now?

Each check is an adapter call that raises a StorageError when its store does not answer
(a Redis PING, a Kafka Metadata request for no topics). Checks run concurrently with a short
timeout, and an answer is reused for `cache_s`, shared by concurrent probes, so however
often an orchestrator probes, the stores see at most one check per period.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from storage.errors import StorageError

Check = Callable[[], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class ReadinessReport:
    failures: Mapping[str, str]  # dependency -> why it is not ready

    @property
    def ready(self) -> bool:
        return not self.failures


class Readiness:
    def __init__(self, checks: Mapping[str, Check], *, timeout_s: float = 2.0,
                 cache_s: float = 1.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._checks = dict(checks)
        self._timeout_s = timeout_s
        self._cache_s = cache_s
        self._monotonic = monotonic
        self._last: ReadinessReport | None = None
        self._last_at = float("-inf")
        self._running: asyncio.Task[ReadinessReport] | None = None

    @property
    def names(self) -> list[str]:
        return list(self._checks)

    async def report(self) -> ReadinessReport:
        if self._last is not None and self._monotonic() - self._last_at < self._cache_s:
            return self._last
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self._probe(), name="kiln-readiness")
        # Shielded: a probe whose client hangs up must not cancel the others' answer.
        return await asyncio.shield(self._running)

    async def close(self) -> None:
        if self._running is not None and not self._running.done():
            self._running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._running

    async def _probe(self) -> ReadinessReport:
        names = list(self._checks)
        reasons = await asyncio.gather(*(self._check(self._checks[n]) for n in names))
        report = ReadinessReport({n: r for n, r in zip(names, reasons, strict=True)
                                  if r is not None})
        self._last, self._last_at = report, self._monotonic()
        return report

    async def _check(self, check: Check) -> str | None:
        try:
            async with asyncio.timeout(self._timeout_s):
                await check()
        except TimeoutError:
            return f"no answer within {self._timeout_s:g}s"
        except StorageError as exc:
            return exc.message
        return None
