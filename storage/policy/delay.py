"""The hardening delay: how long a record waits in the log queue before it is hardened.

Two policies answer the same question, I/O-free (the caller passes the time and what it
observed): `FixedDelay`, a constant, and `AdaptiveDelay` (storage.policy.adaptive), which
computes it from live signals. Every decision carries its binding constraint: the reason
the delay is what it is, for metrics and `kiln delay explain`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from storage.model import StoredBatch

if TYPE_CHECKING:
    from storage.policy.adaptive import DelayInputs


class Binding(StrEnum):
    """Why the delay is what it is."""

    FIXED = "fixed"                          # the fixed policy
    NO_SUBSCRIPTIONS = "no_subscriptions"    # nothing can be delivered: harden at once
    DELIVERY_LATENCY = "delivery_latency"    # waiting for the observed delivery latency
    NO_DELIVERY_YET = "no_delivery_yet"      # subscribed, no delivery timed yet: initial wait
    MAX_DELAY = "max_delay"                  # the configured ceiling
    MIN_DELAY = "min_delay"                  # the configured floor
    RISK_BYTES = "risk_bytes"                # acknowledged, unhardened bytes budget
    RISK_RECORDS = "risk_records"            # acknowledged, unhardened records budget
    SENDERS = "senders"                      # many senders exposed: sender-seconds budget
    MEMORY = "memory"                        # the buffer's memory budget
    GUARANTEE_ACKS = "guarantee_acks"        # producers wait for hardening: ack deadline
    KAFKA_UNHEALTHY = "kafka_unhealthy"      # hardening fails: hold the last delay


@dataclass(frozen=True, slots=True)
class DelayDecision:
    delay_ms: int
    binding: Binding

    def due_before(self, now_ms: int) -> int:
        """Records appended at or before this instant have waited out the delay."""
        return now_ms - self.delay_ms


@dataclass(frozen=True, slots=True)
class FixedDelay:
    delay_ms: int

    def __post_init__(self) -> None:
        if self.delay_ms < 0:
            raise ValueError(f"harden delay must be >= 0 ms, got {self.delay_ms}")

    def decide(self, inputs: DelayInputs, now_ms: int) -> DelayDecision:
        return DelayDecision(self.delay_ms, Binding.FIXED)


def due_prefix(batches: Sequence[StoredBatch], due_before_ms: int,
               shed: Callable[[StoredBatch], bool] = lambda _: False) -> list[StoredBatch]:
    """The oldest batches whose delay has expired (or that are being shed to make room);
    stops at the first that must still wait, so hardening never overtakes it."""
    out = []
    for batch in batches:
        if batch.append_time_ms > due_before_ms and not shed(batch):
            break
        out.append(batch)
    return out
