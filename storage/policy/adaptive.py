"""The adaptive delay controller (DESIGN §4): observations in, a delay and its reason out.

The delay a topic wants is how long its records take to be delivered: a high quantile of the
observed delivery latency (append -> every durable subscription committed past it), or the
time the oldest undelivered record has waited if that is longer, times a margin. A topic
nobody can deliver (no durable subscription) wants no delay at all: hardening at once, still
in batches, gains the same and risks nothing.

That wish is then capped, each cap named so the binding one can be reported:

- `max_delay`;
- the risk budget: bytes and records acknowledged but not yet hardened. At the observed
  ingress rate (the higher of a short and a long window, so a burst is felt at once) a delay
  `d` puts about `rate * d` at risk, so `d <= headroom * budget / rate`, less the time a
  Kafka write takes. Past the headroom the cap shrinks linearly to 0 at the budget, which
  catches what a rate estimate misses (a burst, a slow Kafka);
- the sender-seconds budget: a crash exposes every sender of the last `d`; more senders,
  shorter delay (never longer);
- the memory budget, as the risk budget but over everything buffered;
- pending guarantee acks: producers wait on hardening, so no longer than `max_ack_delay`.

The result is floored at `min_delay`. While Kafka fails, shortening the delay hardens
nothing sooner, and lengthening it would let the risk grow: the last healthy delay is held.
"""

from __future__ import annotations

from dataclasses import dataclass

from storage.policy.delay import Binding, DelayDecision


@dataclass(frozen=True, slots=True)
class DelayLimits:
    min_delay_ms: int = 0
    max_delay_ms: int = 60_000
    # Before any delivery was timed on a subscribed topic.
    initial_delay_ms: int = 2_000
    risk_budget_bytes: int = 64 * 1024 * 1024
    risk_budget_records: int = 1_000_000
    # A crash may expose each sender of the last `delay`: senders * delay stays below this.
    sender_budget_s: float = 600.0
    memory_budget_bytes: int = 512 * 1024 * 1024
    max_ack_delay_ms: int = 10_000
    # Share of each budget the steady state may use; the rest absorbs bursts.
    headroom: float = 0.5
    # The wanted delay: latency * margin + margin_ms.
    latency_margin: float = 1.25
    latency_margin_ms: int = 100

    def __post_init__(self) -> None:
        if self.min_delay_ms < 0:
            raise ValueError(f"min_delay_ms must be >= 0, got {self.min_delay_ms}")
        if self.max_delay_ms < self.min_delay_ms:
            raise ValueError(f"max_delay_ms ({self.max_delay_ms}) must be >= min_delay_ms "
                             f"({self.min_delay_ms})")
        for name in ("risk_budget_bytes", "risk_budget_records", "memory_budget_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.sender_budget_s <= 0:
            raise ValueError(f"sender_budget_s must be > 0, got {self.sender_budget_s}")
        if not 0 < self.headroom <= 1:
            raise ValueError(f"headroom must be in (0, 1], got {self.headroom}")


@dataclass(frozen=True, slots=True)
class DelayInputs:
    """What the controller observes for one topic (rates and budgets are Kiln-wide: the
    budgets are shared by all topics)."""

    has_subscriptions: bool
    senders: int = 0                       # distinct sending clients of the topic, last window
    bytes_per_s: float = 0.0               # ingress, all topics
    records_per_s: float = 0.0
    at_risk_bytes: int = 0                 # acknowledged, not yet hardened (nor delivered)
    at_risk_records: int = 0
    buffered_bytes: int = 0                # everything the log queue holds
    delivery_latency_ms: float | None = None  # the topic's high quantile; None: none timed
    undelivered_wait_ms: int = 0           # how long the oldest undelivered record waits
    pending_acks: int = 0                  # guarantee acks waiting for hardening
    kafka_healthy: bool = True
    kafka_write_ms: float = 0.0            # recent time to write a batch to Kafka


def _budget_cap_ms(budget: float, used: float, per_second: float, headroom: float,
                   write_ms: float) -> float:
    """The longest delay that keeps `per_second * delay` within `headroom * budget` (less the
    write time), scaled down linearly to 0 as `used` goes from there to the whole budget."""
    fill = used / budget
    if per_second <= 0:
        return float("inf") if fill < 1 else 0.0
    cap = headroom * budget / per_second * 1000
    if fill > headroom:
        cap *= max(0.0, (1.0 - fill) / (1.0 - headroom)) if headroom < 1 else 0.0
    return max(0.0, cap - write_ms)


class AdaptiveDelay:
    """One topic's controller; it remembers only its last healthy decision."""

    __slots__ = ("_held", "limits")

    def __init__(self, limits: DelayLimits) -> None:
        self.limits = limits
        self._held: DelayDecision | None = None

    def decide(self, inputs: DelayInputs, now_ms: int) -> DelayDecision:
        if not inputs.kafka_healthy:
            held = self._held.delay_ms if self._held is not None else self.limits.max_delay_ms
            return DelayDecision(held, Binding.KAFKA_UNHEALTHY)
        delay, binding = self._binding_cap(inputs)
        if delay < self.limits.min_delay_ms:
            delay, binding = self.limits.min_delay_ms, Binding.MIN_DELAY
        last = self._held
        if last is None or last.delay_ms != int(delay) or last.binding is not binding:
            self._held = last = DelayDecision(int(delay), binding)
        return last

    def candidates(self, inputs: DelayInputs) -> list[tuple[float, Binding]]:
        """The wanted delay and every cap on it, each with its name (for explanations)."""
        limits = self.limits
        out = [self._wanted(inputs), (float(limits.max_delay_ms), Binding.MAX_DELAY)]
        write_ms = inputs.kafka_write_ms
        out.append((_budget_cap_ms(limits.risk_budget_bytes, inputs.at_risk_bytes,
                                   inputs.bytes_per_s, limits.headroom, write_ms),
                    Binding.RISK_BYTES))
        out.append((_budget_cap_ms(limits.risk_budget_records, inputs.at_risk_records,
                                   inputs.records_per_s, limits.headroom, write_ms),
                    Binding.RISK_RECORDS))
        if inputs.senders > 0:
            out.append((limits.sender_budget_s * 1000 / inputs.senders, Binding.SENDERS))
        out.append((_budget_cap_ms(limits.memory_budget_bytes, inputs.buffered_bytes,
                                   inputs.bytes_per_s, limits.headroom, write_ms),
                    Binding.MEMORY))
        if inputs.pending_acks > 0:
            out.append((float(limits.max_ack_delay_ms), Binding.GUARANTEE_ACKS))
        return out

    def _binding_cap(self, inputs: DelayInputs) -> tuple[float, Binding]:
        """min(candidates(inputs)), the first of equal ones, without building the list: this
        runs on every hardener pass."""
        limits = self.limits
        delay, binding = self._wanted(inputs)
        if limits.max_delay_ms < delay:
            delay, binding = float(limits.max_delay_ms), Binding.MAX_DELAY
        write_ms = inputs.kafka_write_ms
        cap = _budget_cap_ms(limits.risk_budget_bytes, inputs.at_risk_bytes,
                             inputs.bytes_per_s, limits.headroom, write_ms)
        if cap < delay:
            delay, binding = cap, Binding.RISK_BYTES
        cap = _budget_cap_ms(limits.risk_budget_records, inputs.at_risk_records,
                             inputs.records_per_s, limits.headroom, write_ms)
        if cap < delay:
            delay, binding = cap, Binding.RISK_RECORDS
        if inputs.senders > 0:
            cap = limits.sender_budget_s * 1000 / inputs.senders
            if cap < delay:
                delay, binding = cap, Binding.SENDERS
        cap = _budget_cap_ms(limits.memory_budget_bytes, inputs.buffered_bytes,
                             inputs.bytes_per_s, limits.headroom, write_ms)
        if cap < delay:
            delay, binding = cap, Binding.MEMORY
        if inputs.pending_acks > 0 and limits.max_ack_delay_ms < delay:
            delay, binding = float(limits.max_ack_delay_ms), Binding.GUARANTEE_ACKS
        return delay, binding

    def _wanted(self, inputs: DelayInputs) -> tuple[float, Binding]:
        if not inputs.has_subscriptions:
            return 0.0, Binding.NO_SUBSCRIPTIONS
        limits = self.limits
        if inputs.delivery_latency_ms is None and (inputs.undelivered_wait_ms
                                                   < limits.initial_delay_ms):
            return float(limits.initial_delay_ms), Binding.NO_DELIVERY_YET
        latency = max(inputs.delivery_latency_ms or 0.0, float(inputs.undelivered_wait_ms))
        return (latency * limits.latency_margin + limits.latency_margin_ms,
                Binding.DELIVERY_LATENCY)


def _by_value(candidate: tuple[float, Binding]) -> float:
    return candidate[0]
