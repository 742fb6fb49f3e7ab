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
- the memory budget, as the risk budget but over everything buffered, and measured against
  the line where storage.budget starts throttling producers rather than against the whole
  budget: past that line the delay would be paid for by producers. Nothing but this cap
  keeps the risk budget, so its steady state leaves half of it for what the rate estimate
  misses; memory past the line is pushed back by Kiln itself (throttled, then refused), so
  the memory cap may run closer to its line (`memory_headroom`);
- pending guarantee acks: producers wait on hardening, so no longer than `max_ack_delay`.

The result is floored at `min_delay`. While Kafka fails, shortening the delay hardens
nothing sooner, and lengthening it would let the risk grow: the last healthy delay is held.

The decision is split in two so that the observer can reuse the costly half: `ceiling()`,
the smallest cap, depends on rates and amounts that move with appends and refreshes;
`settle()`, the wanted delay against that ceiling, depends on the clock (the oldest
undelivered record keeps waiting) and runs on every decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from storage.policy.delay import Binding, DelayDecision

# storage.budget throttles producers once the buffer holds this share of its budget (and
# refuses them at the whole budget); the memory cap keeps below it.
BUFFER_THROTTLE_FROM = 0.8


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
    # Share of each risk budget the steady state may use; the rest absorbs bursts.
    headroom: float = 0.5
    # Share of the memory below the throttle line the steady state may use. More than
    # `headroom`: an overshoot past the line is pushed back by Kiln's own throttle, while
    # nothing but these caps keeps the risk budget. The rest absorbs the growth of the
    # buffer while the short rate window catches up with a rise in ingress.
    memory_headroom: float = 0.8
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
        for name in ("headroom", "memory_headroom"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")


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

    __slots__ = ("_held", "_memory_line", "limits")

    def __init__(self, limits: DelayLimits) -> None:
        self.limits = limits
        self._memory_line = limits.memory_budget_bytes * BUFFER_THROTTLE_FROM
        self._held: DelayDecision | None = None

    def decide(self, inputs: DelayInputs, now_ms: int) -> DelayDecision:
        if not inputs.kafka_healthy:
            return self.held()
        ceiling, binding = self.ceiling(
            inputs.senders, inputs.bytes_per_s, inputs.records_per_s, inputs.at_risk_bytes,
            inputs.at_risk_records, inputs.buffered_bytes, inputs.pending_acks,
            inputs.kafka_write_ms)
        return self.settle(inputs.has_subscriptions, inputs.delivery_latency_ms,
                           inputs.undelivered_wait_ms, ceiling, binding)

    def held(self) -> DelayDecision:
        """While Kafka fails: the last healthy delay (max_delay before any)."""
        held = self._held.delay_ms if self._held is not None else self.limits.max_delay_ms
        return DelayDecision(held, Binding.KAFKA_UNHEALTHY)

    def candidates(self, inputs: DelayInputs) -> list[tuple[float, Binding]]:
        """The wanted delay and every cap on it, each with its name (for explanations)."""
        limits = self.limits
        out = [self._wanted(inputs.has_subscriptions, inputs.delivery_latency_ms,
                            inputs.undelivered_wait_ms),
               (float(limits.max_delay_ms), Binding.MAX_DELAY)]
        write_ms = inputs.kafka_write_ms
        out.append((_budget_cap_ms(limits.risk_budget_bytes, inputs.at_risk_bytes,
                                   inputs.bytes_per_s, limits.headroom, write_ms),
                    Binding.RISK_BYTES))
        out.append((_budget_cap_ms(limits.risk_budget_records, inputs.at_risk_records,
                                   inputs.records_per_s, limits.headroom, write_ms),
                    Binding.RISK_RECORDS))
        if inputs.senders > 0:
            out.append((limits.sender_budget_s * 1000 / inputs.senders, Binding.SENDERS))
        out.append((_budget_cap_ms(self._memory_line, inputs.buffered_bytes,
                                   inputs.bytes_per_s, limits.memory_headroom, write_ms),
                    Binding.MEMORY))
        if inputs.pending_acks > 0:
            out.append((float(limits.max_ack_delay_ms), Binding.GUARANTEE_ACKS))
        return out

    def ceiling(self, senders: int, bytes_per_s: float, records_per_s: float,
                at_risk_bytes: int, at_risk_records: int, buffered_bytes: int,
                pending_acks: int, kafka_write_ms: float) -> tuple[float, Binding]:
        """The smallest cap of `candidates()`, the first of equal ones, on plain arguments
        rather than a DelayInputs (building the frozen inputs cost more than the arithmetic;
        the observer calls this whenever an input moved). Kept equal to `candidates()` by
        tests/unit/test_adaptive_delay.py."""
        limits = self.limits
        delay, binding = float(limits.max_delay_ms), Binding.MAX_DELAY
        cap = _budget_cap_ms(limits.risk_budget_bytes, at_risk_bytes, bytes_per_s,
                             limits.headroom, kafka_write_ms)
        if cap < delay:
            delay, binding = cap, Binding.RISK_BYTES
        cap = _budget_cap_ms(limits.risk_budget_records, at_risk_records, records_per_s,
                             limits.headroom, kafka_write_ms)
        if cap < delay:
            delay, binding = cap, Binding.RISK_RECORDS
        if senders > 0:
            cap = limits.sender_budget_s * 1000 / senders
            if cap < delay:
                delay, binding = cap, Binding.SENDERS
        cap = _budget_cap_ms(self._memory_line, buffered_bytes, bytes_per_s,
                             limits.memory_headroom, kafka_write_ms)
        if cap < delay:
            delay, binding = cap, Binding.MEMORY
        if pending_acks > 0 and limits.max_ack_delay_ms < delay:
            delay, binding = float(limits.max_ack_delay_ms), Binding.GUARANTEE_ACKS
        return delay, binding

    def settle(self, has_subscriptions: bool, delivery_latency_ms: float | None,
               undelivered_wait_ms: int, ceiling: float, ceiling_binding: Binding
               ) -> DelayDecision:
        """The wanted delay (`_wanted`, inlined) under `ceiling()`, floored at min_delay; the
        previous decision object when nothing changed. The wanted delay wins a tie, as it
        comes first in `candidates()`."""
        limits = self.limits
        if not has_subscriptions:
            delay, binding = 0.0, Binding.NO_SUBSCRIPTIONS
        elif delivery_latency_ms is None and undelivered_wait_ms < limits.initial_delay_ms:
            delay, binding = float(limits.initial_delay_ms), Binding.NO_DELIVERY_YET
        else:
            latency = delivery_latency_ms or 0.0
            waited = float(undelivered_wait_ms)
            if waited > latency:
                latency = waited
            delay = latency * limits.latency_margin + limits.latency_margin_ms
            binding = Binding.DELIVERY_LATENCY
        if ceiling < delay:
            delay, binding = ceiling, ceiling_binding
        if delay < limits.min_delay_ms:
            delay, binding = limits.min_delay_ms, Binding.MIN_DELAY
        delay_ms = int(delay)
        last = self._held
        if last is None or last.delay_ms != delay_ms or last.binding is not binding:
            self._held = last = DelayDecision(delay_ms, binding)
        return last

    def _wanted(self, has_subscriptions: bool, delivery_latency_ms: float | None,
                undelivered_wait_ms: int) -> tuple[float, Binding]:
        if not has_subscriptions:
            return 0.0, Binding.NO_SUBSCRIPTIONS
        limits = self.limits
        if delivery_latency_ms is None and undelivered_wait_ms < limits.initial_delay_ms:
            return float(limits.initial_delay_ms), Binding.NO_DELIVERY_YET
        latency = max(delivery_latency_ms or 0.0, float(undelivered_wait_ms))
        return (latency * limits.latency_margin + limits.latency_margin_ms,
                Binding.DELIVERY_LATENCY)
