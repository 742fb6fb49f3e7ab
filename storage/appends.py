"""Wake-ups when a partition receives records: for long-polling fetches and the hardener.

Appends made by this process wake waiters at once; appends by other Kiln processes are
seen by the fetch's own re-check at the end of a short interval."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Iterable

from storage.model import TopicPartition


class AppendSignals:
    def __init__(self) -> None:
        self._events: dict[TopicPartition, set[asyncio.Event]] = defaultdict(set)
        self._listeners: list[Callable[[TopicPartition], None]] = []

    def add_listener(self, listener: Callable[[TopicPartition], None]) -> None:
        """Call `listener` on every append (the hardener wakes idle partitions with it)."""
        self._listeners.append(listener)

    def appended(self, tp: TopicPartition) -> None:
        for event in self._events.get(tp, ()):
            event.set()
        for listener in self._listeners:
            listener(tp)

    async def wait(self, tps: Iterable[TopicPartition], timeout_s: float) -> bool:
        """True when one of `tps` received records before timeout_s passed."""
        event = asyncio.Event()
        watched = list(tps)
        for tp in watched:
            self._events[tp].add(event)
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
            return True
        except TimeoutError:
            return False
        finally:
            for tp in watched:
                self._events[tp].discard(event)
                if not self._events[tp]:
                    del self._events[tp]
