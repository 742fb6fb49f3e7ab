"""The delay observer: what one Kiln node observes, with what its peers observe, turned into
each topic's delay.

I/O-free, the clock an argument: the Kiln process (storage.delay_control) and the simulator
in `bench/` feed it the same way. Signals come in as they happen: appends (senders, rates,
when each offset was appended), delivered-mark advances (delivery latency, progress), Kafka
writes (health, write time); amounts read elsewhere (buffered bytes and records, which topics
a delivery can spare a write, pending guarantee acks) are set when they are refreshed.

`decision()` runs on every hardener pass, so it reuses what has not moved. The controller's
ceiling (the smallest cap: rates, amounts, senders, Kafka's write time) is kept per topic
with the observer's `_seq` when it was computed, and the instant until which the clock alone
cannot move it (the end of the rate window's newest bucket, the sender window's next
pruning); every signal that moves one of its inputs bumps `_seq`, and so does a read that
moves a window. What depends on the clock itself (how long the oldest undelivered record has
waited) is settled against it on every call. A decision is the same whether reused or not;
tests/unit/test_adaptive_delay.py replays random signals to check it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from storage.model import TopicPartition
from storage.policy.adaptive import AdaptiveDelay, DelayInputs, DelayLimits
from storage.policy.delay import Binding, DelayDecision, FixedDelay
from storage.policy.signals import AppendTimes, IngressRates, LatencySketch, SenderWindow

# `_Topic.waiting_since_ms` when no record of the topic waits for delivery.
_NOTHING_WAITS = 1 << 62


@dataclass(frozen=True, slots=True)
class PeerSignals:
    """What the other Kiln nodes observe, summed over them (each leads its share of a
    topic's partitions, so each sees its share of the senders, the ingress and the acks
    waiting): added to this node's own figures, every node decides from cluster-wide ones.
    A client writing to partitions of several nodes is a sender on each, so the sum counts
    it once per node: the sender cap then errs towards a shorter delay, never a longer one."""

    senders: Mapping[str, int] = field(default_factory=dict)
    bytes_per_s: float = 0.0
    records_per_s: float = 0.0
    pending_acks: Mapping[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Partition:
    times: AppendTimes = field(default_factory=AppendTimes)
    appended_end: int = 0
    delivered: int = -1          # the delivered mark as last seen here; -1: not seen yet
    progress_ms: int = 0         # when delivery last moved (or had nothing to wait for)

    @property
    def waiting(self) -> bool:
        return self.appended_end > max(self.delivered, 0)


@dataclass(slots=True)
class _Topic:
    adaptive: AdaptiveDelay | None  # None: the fixed policy, whose `decision` never changes
    senders: SenderWindow = field(default_factory=SenderWindow)
    latency: LatencySketch = field(default_factory=LatencySketch)
    partitions: dict[int, _Partition] = field(default_factory=dict)
    decision: DelayDecision | None = None
    # The controller's ceiling, valid while the observer's `_seq` is `ceiling_seq` and the
    # clock is before `ceiling_until_ms`.
    ceiling_ms: float = 0.0
    ceiling_binding: Binding = Binding.MAX_DELAY
    ceiling_seq: int = -1
    ceiling_until_ms: int = 0
    # The earliest `progress_ms` of the partitions where records wait for delivery. Appends
    # can only lower it and keep it exact; a delivery may raise it: then it is `stale` until
    # the next decision looks at every partition again.
    waiting_since_ms: int = _NOTHING_WAITS
    waiting_stale: bool = False


class DelayObserver:
    """Every topic's delay from what was observed; `fixed_delay_ms` set: the fixed policy."""

    def __init__(self, limits: DelayLimits, fixed_delay_ms: int | None = None) -> None:
        self.limits = limits
        self.fixed_delay_ms = fixed_delay_ms
        self._topics: dict[str, _Topic] = {}
        self._ingress = IngressRates()
        self._kafka_ok_ms = 0
        self._kafka_error_ms = 0
        self._kafka_healthy = True
        self._kafka_write_ms = 0.0  # moving average
        self._buffered_bytes = 0
        self._buffered_records = 0
        self._deliverable: frozenset[str] = frozenset()
        self._pending_acks: Mapping[str, int] = {}
        self._peers = PeerSignals()
        self._seq = 0  # bumped whenever an input of a ceiling moves

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
        topic = self._topics.get(tp.topic)
        if topic is None:
            topic = self._topic(tp.topic)
        topic.senders.seen(now_ms, sender)
        self._ingress.add(now_ms, records, nbytes)
        self._seq += 1
        part = topic.partitions.get(tp.partition)
        if part is None:
            part = self._partition(topic, tp.partition, now_ms)
        if part.delivered >= part.appended_end:
            part.progress_ms = now_ms  # nothing was waiting: delivery is not behind
        if next_offset > part.appended_end:
            part.appended_end = next_offset
        part.times.appended(now_ms, next_offset)
        # A partition that waited already keeps its progress_ms: the earliest can only drop.
        if part.progress_ms < topic.waiting_since_ms and part.waiting:
            topic.waiting_since_ms = part.progress_ms

    def delivered(self, tp: TopicPartition, mark: int, now_ms: int) -> None:
        """The partition's delivered mark is `mark`: time the records it passed."""
        topic = self._topics.get(tp.topic)
        if topic is None:
            topic = self._topic(tp.topic)
        part = topic.partitions.get(tp.partition)
        if part is None:
            part = self._partition(topic, tp.partition, now_ms)
        last = part.delivered
        if mark <= last:
            return
        # The oldest and the newest record it passed bound the latencies of the rest; each
        # weighs half, or all when it is the only one (a single record passed, or the mark
        # was not seen here before).
        times = part.times
        newest = times.time_of(mark - 1) if mark > 0 else None
        if last >= 0 and last != mark - 1:
            oldest = times.time_of(last)
            if oldest is None:
                if newest is not None:
                    topic.latency.add(now_ms, max(0, now_ms - newest), 0.5)
            elif newest is None:
                topic.latency.add(now_ms, max(0, now_ms - oldest), 0.5)
            else:
                topic.latency.add_two(now_ms, max(0, now_ms - oldest),
                                      max(0, now_ms - newest), 0.5)
        elif newest is not None:
            topic.latency.add(now_ms, max(0, now_ms - newest), 1.0)
        part.delivered = mark
        part.progress_ms = now_ms
        topic.waiting_stale = True  # it may have been the partition waiting the longest

    def kafka_write(self, write_ms: float, now_ms: int) -> None:
        first = self._kafka_ok_ms == 0
        self._kafka_write_ms = (write_ms if first
                                else 0.8 * self._kafka_write_ms + 0.2 * write_ms)
        self._kafka_ok_ms = now_ms
        self._kafka_healthy = self._kafka_error_ms <= now_ms
        self._seq += 1

    def kafka_failed(self, now_ms: int) -> None:
        self._kafka_error_ms = now_ms
        self._kafka_healthy = now_ms <= self._kafka_ok_ms

    # -- decisions -----------------------------------------------------------------------

    def decision(self, topic_name: str, now_ms: int) -> DelayDecision:
        """How long `topic_name`'s records wait now; cheap enough for every hardener pass."""
        topic = self._topics.get(topic_name)
        if topic is None:
            topic = self._topic(topic_name)
        policy = topic.adaptive
        if policy is None:
            assert topic.decision is not None  # a fixed policy's, set with the topic
            return topic.decision
        if topic.ceiling_seq != self._seq or now_ms >= topic.ceiling_until_ms:
            self._refresh_ceiling(topic_name, topic, policy, now_ms)
        if not self._kafka_healthy:
            decision = policy.held()
        else:
            if topic.waiting_stale:
                topic.waiting_since_ms = _waiting_since(topic)
                topic.waiting_stale = False
            since = topic.waiting_since_ms
            decision = policy.settle(topic_name in self._deliverable, topic.latency.value_ms,
                                     now_ms - since if since < now_ms else 0,
                                     topic.ceiling_ms, topic.ceiling_binding)
        topic.decision = decision
        return decision

    def inputs(self, topic_name: str, now_ms: int) -> DelayInputs:
        return self._inputs(topic_name, self._topic(topic_name), now_ms)

    def _refresh_ceiling(self, topic_name: str, topic: _Topic, policy: AdaptiveDelay,
                         now_ms: int) -> None:
        senders, bytes_per_s, records_per_s = self._read_windows(topic_name, topic, now_ms)
        topic.ceiling_ms, topic.ceiling_binding = policy.ceiling(
            senders, bytes_per_s, records_per_s, self._buffered_bytes, self._buffered_records,
            self._buffered_bytes, self._acks_waiting(topic_name), self._kafka_write_ms)
        topic.ceiling_seq = self._seq
        until = (self._ingress.head + 1) * self._ingress.bucket_ms
        next_prune = topic.senders.next_prune_ms
        topic.ceiling_until_ms = until if until < next_prune else next_prune

    def _read_windows(self, topic_name: str, topic: _Topic, now_ms: int
                      ) -> tuple[int, float, float]:
        """The topic's senders and Kiln's ingress rates now, this node's and its peers'."""
        senders, bytes_per_s, records_per_s = self._own_windows(topic, now_ms)
        peers = self._peers
        return (senders + peers.senders.get(topic_name, 0), bytes_per_s + peers.bytes_per_s,
                records_per_s + peers.records_per_s)

    def _own_windows(self, topic: _Topic, now_ms: int) -> tuple[int, float, float]:
        """The topic's senders and the ingress rates this node sees now. Reading may move
        the windows (a bucket ages out, silent senders are forgotten): every ceiling computed
        before is then stale."""
        ingress = self._ingress
        window = topic.senders
        head, next_prune = ingress.head, window.next_prune_ms
        senders = window.count(now_ms)
        bytes_per_s, records_per_s = ingress.peaks(now_ms)
        if ingress.head != head or window.next_prune_ms != next_prune:
            self._seq += 1
        return senders, bytes_per_s, records_per_s

    def _acks_waiting(self, topic_name: str) -> int:
        return self._pending_acks.get(topic_name, 0) + self._peers.pending_acks.get(topic_name, 0)

    def own_signals(self, topic_name: str, now_ms: int) -> dict[str, Any]:
        """What this node alone observes of `topic_name` (its peers add it up)."""
        senders, bytes_per_s, records_per_s = self._own_windows(self._topic(topic_name), now_ms)
        return {"senders": senders, "bytes_per_s": bytes_per_s, "records_per_s": records_per_s,
                "pending_acks": self._pending_acks.get(topic_name, 0)}

    def _inputs(self, topic_name: str, topic: _Topic, now_ms: int) -> DelayInputs:
        senders, bytes_per_s, records_per_s = self._read_windows(topic_name, topic, now_ms)
        since = _waiting_since(topic)
        return DelayInputs(
            has_subscriptions=topic_name in self._deliverable,
            senders=senders,
            bytes_per_s=bytes_per_s,
            records_per_s=records_per_s,
            at_risk_bytes=self._buffered_bytes,
            at_risk_records=self._buffered_records,
            buffered_bytes=self._buffered_bytes,
            delivery_latency_ms=topic.latency.value_ms,
            undelivered_wait_ms=now_ms - since if since < now_ms else 0,
            pending_acks=self._acks_waiting(topic_name),
            kafka_healthy=self._kafka_healthy,
            kafka_write_ms=self._kafka_write_ms,
        )

    def current(self) -> dict[str, DelayDecision]:
        """The last decision per topic (for metrics)."""
        return {name: t.decision for name, t in self._topics.items() if t.decision is not None}

    def report(self, topic_name: str, now_ms: int) -> dict[str, Any]:
        """The decision for `topic_name` with every input and candidate, as JSON data."""
        topic = self._topic(topic_name)
        decision = self.decision(topic_name, now_ms)
        inputs = self._inputs(topic_name, topic, now_ms)
        candidates: list[dict[str, Any]] = []
        if topic.adaptive is not None:
            candidates = [{"constraint": str(binding), "delay_ms": _round_ms(value)}
                          for value, binding in topic.adaptive.candidates(inputs)]
        return {
            "topic": topic_name, "at_ms": now_ms,
            "policy": self.policy_name, "delay_ms": decision.delay_ms,
            "binding": str(decision.binding), "inputs": asdict(inputs),
            "own": self.own_signals(topic_name, now_ms),
            "candidates": candidates, "limits": asdict(self.limits),
        }

    # -- amounts refreshed elsewhere ----------------------------------------------------

    def buffered(self, nbytes: int, records: int) -> None:
        """What the log queue holds, all processes: acknowledged, not hardened nor delivered."""
        self._buffered_bytes = nbytes
        self._buffered_records = records
        self._seq += 1

    def deliverable(self, topics: frozenset[str], now_ms: int) -> None:
        """The topics where a delivery can spare a write (durable subscriptions exist)."""
        self._deliverable = topics
        for name in topics:
            self._topic(name).latency.decay(now_ms)

    def pending_acks(self, by_topic: Mapping[str, int]) -> None:
        self._pending_acks = by_topic
        self._seq += 1

    def peers(self, signals: PeerSignals) -> None:
        """What the other nodes observe now (storage.delay_control reads their reports)."""
        self._peers = signals
        self._seq += 1

    # -- state ---------------------------------------------------------------------------

    def _topic(self, name: str) -> _Topic:
        topic = self._topics.get(name)
        if topic is None:
            if self.fixed_delay_ms is None:
                topic = _Topic(AdaptiveDelay(self.limits))
            else:
                fixed = FixedDelay(self.fixed_delay_ms)
                topic = _Topic(None, decision=fixed.decide(DelayInputs(False), 0))
            self._topics[name] = topic
        return topic

    @staticmethod
    def _partition(topic: _Topic, partition: int, now_ms: int) -> _Partition:
        part = topic.partitions.get(partition)
        if part is None:
            part = topic.partitions[partition] = _Partition(progress_ms=now_ms)
        return part


def _waiting_since(topic: _Topic) -> int:
    """When delivery last moved on the partition that waits the longest (_NOTHING_WAITS when
    no record waits)."""
    since = _NOTHING_WAITS
    for p in topic.partitions.values():
        if p.progress_ms < since and p.waiting:
            since = p.progress_ms
    return since


def _round_ms(value: float) -> float | None:
    return None if value == float("inf") else round(value, 1)
