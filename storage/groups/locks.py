"""One asyncio lock per group id, kept only while someone holds or waits for it.

Any client can name any group id; a lock created per name and never freed would let a client
grow Kiln's memory by naming groups. A lock here lives exactly as long as it has users.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class _Entry:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class KeyedLocks:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        # Counted before waiting: a waiter keeps the lock alive, so whoever holds it now
        # cannot free it out from under the waiter (the two would then run at once).
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[key]

    def held(self, key: str) -> bool:
        """Whether someone holds or waits for `key`'s lock."""
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
