"""Crash points for fault tests: named places in the transaction coordinator and the
hardening lane where a test can make Kiln die as `kill -9` would, at a moment a random
kill rarely hits (between two writes that only make sense together).

Armed from the setting `crash_at` ("name" or "name:n", the n-th time the point is
reached; empty, the default: never), set by tests through KILN_CRASH_AT. The process
writes one line naming the point to stderr and ends with `os._exit`: no cleanup, no
flush, no lease released.
"""

from __future__ import annotations

import os

CRASH_EXIT_CODE = 86  # tells a crash point's exit apart from a signal's

_armed: tuple[str, int] | None = None
_reached = 0


def parse_crash_at(spec: str) -> tuple[str, int] | None:
    """("name", n) of "name" or "name:n"; None for ""; ValueError otherwise."""
    if not spec:
        return None
    name, _, nth = spec.partition(":")
    if not name or (nth and not nth.isdigit()) or (nth and int(nth) < 1):
        raise ValueError(f"expected NAME or NAME:N with N >= 1, got {spec!r}")
    return name, int(nth) if nth else 1


def arm(spec: str) -> None:
    """Arm the point `spec` names ("name" or "name:n"); "" disarms."""
    global _armed, _reached
    _armed = parse_crash_at(spec)
    _reached = 0


def crash_point(name: str) -> None:
    """End the process here when this is the armed point's n-th passage."""
    global _reached
    if _armed is None or _armed[0] != name:
        return
    _reached += 1
    if _reached == _armed[1]:
        os.write(2, f"kiln: crash point {name} reached ({_reached})\n".encode())
        os._exit(CRASH_EXIT_CODE)
