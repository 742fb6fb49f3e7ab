"""Stopping background tasks without hanging shutdown."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)


async def stop_task(task: asyncio.Task[Any], grace_s: float = 5.0) -> None:
    """Cancel `task` and wait for it, at most `grace_s`.

    Client libraries sometimes swallow a cancellation that lands inside them; the loops
    here also check a stop flag, and shutdown must not hang whatever happens inside.
    """
    if task.done():
        return
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=grace_s)
    while not done:
        log.warning("task %s did not stop within %.1fs; cancelling again", task.get_name(),
                    grace_s)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=grace_s)
