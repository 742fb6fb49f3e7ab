"""What the Kafka listener may hold for its clients: bytes of requests being read and
handled, bytes of answers not yet taken by their clients, and connections (in all and per
client address). A client that sends without reading, or keeps frames half-sent, or opens
connections without end costs Kiln a bounded amount, never unbounded memory."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    # Bytes of request frames being read or handled, all connections together (Kafka's
    # queued.max.request.bytes). One frame larger than this is still read, alone.
    max_request_bytes: int = 256 * 1024 * 1024
    # Bytes of answers computed but not yet written to their clients: past the first
    # bound a connection reads no further request; past the second, no connection that
    # owes an answer does, and fetches are answered with less (at least one batch).
    max_answer_bytes_per_connection: int = 16 * 1024 * 1024
    max_answer_bytes: int = 512 * 1024 * 1024
    # A fetch answers at most this much whatever the client asks (Kafka's fetch.max.bytes).
    max_fetch_bytes: int = 55 * 1024 * 1024
    # A frame whose bytes do not all arrive within this is dropped with its connection; a
    # connection with no request for `idle_timeout_s`, or whose client takes none of its
    # answers for as long, is closed (Kafka's connections.max.idle.ms).
    frame_read_timeout_s: float = 30.0
    idle_timeout_s: float = 600.0
    max_connections: int = 4096
    max_connections_per_host: int = 1024


class ByteBudget:
    """Bytes held against a limit; waiters are woken on every release."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._released = asyncio.Event()

    @property
    def over_limit(self) -> bool:
        return self.used >= self.limit

    @property
    def available(self) -> int:
        return max(0, self.limit - self.used)

    async def acquire(self, n: int) -> None:
        """Take `n` bytes, waiting for room; when nothing is held, any `n` is taken."""
        while self.used > 0 and self.used + n > self.limit:
            await self.released()
        self.used += n

    def charge(self, n: int) -> None:
        """Take `n` bytes already held (an answer computed), limit or not."""
        self.used += n

    def release(self, n: int) -> None:
        self.used -= n
        released, self._released = self._released, asyncio.Event()
        released.set()

    async def released(self) -> None:
        await self._released.wait()


class ConnectionSlots:
    """Open connections, in all and per client host."""

    def __init__(self, limits: ListenerLimits) -> None:
        self._limits = limits
        self._by_host: Counter[str] = Counter()
        self.open = 0

    def take(self, host: str) -> str | None:
        """Count a new connection from `host`; or why it is refused (not counted)."""
        if self.open >= self._limits.max_connections:
            return f"{self.open} connections open (max_connections)"
        if self._by_host[host] >= self._limits.max_connections_per_host:
            return f"{self._by_host[host]} connections from {host} (max_connections_per_host)"
        self._by_host[host] += 1
        self.open += 1
        return None

    def give_back(self, host: str) -> None:
        self.open -= 1
        self._by_host[host] -= 1
        if self._by_host[host] <= 0:
            del self._by_host[host]


class ListenerMemory:
    """The two byte budgets every connection of one listener shares."""

    def __init__(self, limits: ListenerLimits) -> None:
        self.limits = limits
        self.requests = ByteBudget(limits.max_request_bytes)
        self.answers = ByteBudget(limits.max_answer_bytes)

    def fetch_bytes(self, asked: int) -> int:
        """How many bytes a fetch may answer with now (KIP-74 still gives one batch)."""
        return max(0, min(asked, self.limits.max_fetch_bytes, self.answers.available))
