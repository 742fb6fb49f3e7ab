"""The delay observer: what one Kiln process observes, turned into each topic's delay.

I/O-free, the clock an argument: the Kiln process (storage.delay_control) and the simulator
in `bench/` feed it the same way. Signals come in as they happen: appends (senders, rates,
when each offset was appended), delivered-mark advances (delivery latency, progress), Kafka
writes (health, write time); amounts read elsewhere (buffered bytes and records, which topics
a delivery can spare a write, pending guarantee acks) are set when they are refreshed.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from storage.model import TopicPartition
from storage.policy.adaptive import AdaptiveDelay, DelayInputs, DelayLimits
from storage.policy.delay import DelayDecision, DelayPolicy, FixedDelay
from storage.policy.signals import AppendTimes, LatencySketch, RateWindow, SenderWindow


@dataclass
class _Partition:
    times: AppendTimes = field(default_factory=AppendTimes)
    appended_end: int = 0
    delivered: int = -1          # the delivered mark as last seen here; -1: not seen yet
    progress_ms: int = 0         # when delivery last moved (or had nothing to wait for)


@dataclass
class _Topic:
    policy: DelayPolicy
    senders: SenderWindow = field(default_factory=SenderWindow)
    latency: LatencySketch = field(default_factory=LatencySketch)
    partitions: dict[int, _Partition] = field(default_factory=dict)
    decision: DelayDecision | None = None
    inputs: DelayInputs | None = None


@dataclass
class _Kafka:
    last_ok_ms: int = 0
    last_error_ms: int = 0
    write_ms: float = 0.0  # moving average

    @property
    def healthy(self) -> bool:
        return self.last_error_ms <= self.last_ok_ms


class DelayObserver:
    """Every topic's delay from what was observed; `fixed_delay_ms` set: the fixed policy."""

    def __init__(self, limits: DelayLimits, fixed_delay_ms: int | None = None) -> None:
        self.limits = limits
        self.fixed_delay_ms = fixed_delay_ms
        self._topics: dict[str, _Topic] = {}
        self._bytes_in = RateWindow()
        self._records_in = RateWindow()
        self._kafka = _Kafka()
        self._buffered_bytes = 0
        self._buffered_records = 0
        self._deliverable: frozenset[str] = frozenset()
        self._pending_acks: Mapping[str, int] = {}

    @property
    def policy_name(self) -> str:
        return "adaptive" if self.fixed_delay_ms is None else "fixed"

    @property
    def topics(self) -> list[str]:
        return list(self._topics)

    # -- signals -------------------------------------------------------------------------

    def appended(self, tp: TopicPartition, sender: Hashable, records: int, nbytes: int,
                 next_offset: int, now_ms: int) -> None:
        """`records` (`nbytes`) from `sender` were appended; offsets below `next_offset`."""
        topic = self._topic(tp.topic)
        topic.senders.seen(now_ms, sender)
        self._bytes_in.add(now_ms, nbytes)
        self._records_in.add(now_ms, records)
        part = self._partition(topic, tp.partition, now_ms)
        if part.delivered >= part.appended_end:
            part.progress_ms = now_ms  # nothing was waiting: delivery is not behind
        part.appended_end = max(part.appended_end, next_offset)
        part.times.appended(now_ms, next_offset)

    def delivered(self, tp: TopicPartition, mark: int, now_ms: int) -> None:
        """The partition's delivered mark is `mark`: time the records it passed."""
        topic = self._topic(tp.topic)
        part = self._partition(topic, tp.partition, now_ms)
        if mark <= part.delivered:
            return
        # The oldest and the newest record it passed bound the latencies of the rest.
        offsets = {o for o in (part.delivered, mark - 1) if 0 <= o < mark}
        for offset in offsets:
            appended_ms = part.times.time_of(offset)
            if appended_ms is not None:
                topic.latency.add(now_ms, max(0, now_ms - appended_ms), 1 / len(offsets))
        part.delivered = mark
        part.progress_ms = now_ms

    def kafka_write(self, write_ms: float, now_ms: int) -> None:
        kafka = self._kafka
        first = kafka.last_ok_ms == 0
        kafka.write_ms = write_ms if first else 0.8 * kafka.write_ms + 0.2 * write_ms
        kafka.last_ok_ms = now_ms

    def kafka_failed(self, now_ms: int) -> None:
        self._kafka.last_error_ms = now_ms

    # -- decisions -----------------------------------------------------------------------

    def decision(self, topic_name: str, now_ms: int) -> DelayDecision:
        """How long `topic_name`'s records wait now; cheap enough for every hardener tick."""
        topic = self._topic(topic_name)
        inputs = self._inputs(topic_name, topic, now_ms)
        topic.inputs = inputs
        topic.decision = topic.policy.decide(inputs, now_ms)
        return topic.decision

    def inputs(self, topic_name: str, now_ms: int) -> DelayInputs:
        return self._inputs(topic_name, self._topic(topic_name), now_ms)

    def _inputs(self, topic_name: str, topic: _Topic, now_ms: int) -> DelayInputs:
        oldest = now_ms  # when delivery last moved on the partition that waits the longest
        for p in topic.partitions.values():
            if p.progress_ms < oldest and p.appended_end > max(p.delivered, 0):
                oldest = p.progress_ms
        return DelayInputs(
            has_subscriptions=topic_name in self._deliverable,
            senders=topic.senders.count(now_ms),
            bytes_per_s=self._bytes_in.peak_per_second(now_ms),
            records_per_s=self._records_in.peak_per_second(now_ms),
            at_risk_bytes=self._buffered_bytes,
            at_risk_records=self._buffered_records,
            buffered_bytes=self._buffered_bytes,
            delivery_latency_ms=topic.latency.value_ms,
            undelivered_wait_ms=now_ms - oldest,
            pending_acks=self._pending_acks.get(topic_name, 0),
            kafka_healthy=self._kafka.healthy,
            kafka_write_ms=self._kafka.write_ms,
        )

    def current(self) -> dict[str, DelayDecision]:
        """The last decision per topic (for metrics)."""
        return {name: t.decision for name, t in self._topics.items() if t.decision is not None}

    def report(self, topic_name: str, now_ms: int) -> dict[str, Any]:
        """The decision for `topic_name` with every input and candidate, as JSON data."""
        topic = self._topic(topic_name)
        decision = self.decision(topic_name, now_ms)
        inputs = topic.inputs or self.inputs(topic_name, now_ms)
        candidates: list[dict[str, Any]] = []
        if isinstance(topic.policy, AdaptiveDelay):
            candidates = [{"constraint": str(binding), "delay_ms": _round_ms(value)}
                          for value, binding in topic.policy.candidates(inputs)]
        return {
            "topic": topic_name, "at_ms": now_ms,
            "policy": self.policy_name, "delay_ms": decision.delay_ms,
            "binding": str(decision.binding), "inputs": asdict(inputs),
            "candidates": candidates, "limits": asdict(self.limits),
        }

    # -- amounts refreshed elsewhere ----------------------------------------------------

    def buffered(self, nbytes: int, records: int) -> None:
        """What the log queue holds, all processes: acknowledged, not hardened nor delivered."""
        self._buffered_bytes = nbytes
        self._buffered_records = records

    def deliverable(self, topics: frozenset[str], now_ms: int) -> None:
        """The topics where a delivery can spare a write (durable subscriptions exist)."""
        self._deliverable = topics
        for name in topics:
            self._topic(name).latency.decay(now_ms)

    def pending_acks(self, by_topic: Mapping[str, int]) -> None:
        self._pending_acks = by_topic

    # -- state ---------------------------------------------------------------------------

    def _topic(self, name: str) -> _Topic:
        topic = self._topics.get(name)
        if topic is None:
            policy: DelayPolicy = (AdaptiveDelay(self.limits) if self.fixed_delay_ms is None
                                   else FixedDelay(self.fixed_delay_ms))
            topic = self._topics[name] = _Topic(policy)
        return topic

    @staticmethod
    def _partition(topic: _Topic, partition: int, now_ms: int) -> _Partition:
        part = topic.partitions.get(partition)
        if part is None:
            part = topic.partitions[partition] = _Partition(progress_ms=now_ms)
        return part


def _round_ms(value: float) -> float | None:
    return None if value == float("inf") else round(value, 1)
