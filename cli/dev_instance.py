"""What a running `kiln dev` started, written where every other `kiln` command looks.

`kiln dev` starts its Redis and broker on ports picked at start, so `kiln status` in a
second terminal could not guess them. While it runs, `kiln dev` keeps a small JSON file
(its pid, Redis URL and Kafka bootstrap); the settings loader takes those as defaults for
any command whose own flags, variables or file do not say otherwise. A file whose process
is gone is ignored, and removed by the next `kiln dev`.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

# What a command takes from the running dev instance (lowest precedence but the defaults).
SHARED_SETTINGS = ("redis_url", "kafka_bootstrap")


def state_file(state_home: Path) -> Path:
    return state_home / "kiln" / "dev.json"


def announce(path: Path, values: dict[str, str]) -> None:
    """Record this process's instance (atomically: readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps({"pid": os.getpid(), **values}))
    partial.replace(path)


def withdraw(path: Path) -> None:
    """Remove the record, if it is this process's."""
    with contextlib.suppress(OSError, ValueError):
        if int(json.loads(path.read_text())["pid"]) == os.getpid():
            path.unlink()


def running(path: Path) -> dict[str, str]:
    """The settings a running dev instance shares; empty when none runs."""
    try:
        record = json.loads(path.read_text())
        pid = int(record["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    if not _alive(pid):
        return {}
    return {key: str(record[key]) for key in SHARED_SETTINGS if key in record}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True
