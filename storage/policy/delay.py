"""The hardening delay. A fixed delay for now; the adaptive controller replaces it later.

I/O-free: the caller passes `now_ms` and gets a decision carrying its binding constraint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from storage.model import StoredBatch


@dataclass(frozen=True, slots=True)
class DelayDecision:
    delay_ms: int
    binding_constraint: str

    def due_before(self, now_ms: int) -> int:
        """Records appended at or before this instant have waited out the delay."""
        return now_ms - self.delay_ms


@dataclass(frozen=True, slots=True)
class FixedDelay:
    delay_ms: int

    def __post_init__(self) -> None:
        if self.delay_ms < 0:
            raise ValueError(f"harden delay must be >= 0 ms, got {self.delay_ms}")

    def decide(self, now_ms: int) -> DelayDecision:
        return DelayDecision(self.delay_ms, "fixed")


def due_prefix(batches: Sequence[StoredBatch], due_before_ms: int) -> list[StoredBatch]:
    """The oldest batches whose delay has expired; stops at the first that has not, so
    hardening never overtakes a record that must still wait."""
    out = []
    for batch in batches:
        if batch.append_time_ms > due_before_ms:
            break
        out.append(batch)
    return out
