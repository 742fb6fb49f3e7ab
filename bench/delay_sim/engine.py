"""The simulation: a workload replayed against the real delay observer on a virtual clock.

Records move in cohorts (one per producer send), never one object per record, and the clock
advances in fixed steps (10 ms by default), so a ten-minute workload runs in seconds. Per
step, in this order:

1. Kafka writes whose time has come complete (`kafka_write`) or fail (`kafka_failed`);
2. producers send: each send is one append (offsets assigned, append time kept) and one
   `DelayObserver.appended(...)` call, as the produce handler makes (what `BufferBudget.admit`
   adds at once is left out: nothing reads the budget before step 4 recounts it);
3. consumers fetch, process and commit; each commit moves the partition's delivered mark
   (the minimum over the durable subscriptions), drops what it passed from the log queue
   and calls `DelayObserver.delivered(...)`, as storage.delivery does;
4. every 250 ms the buffer budget re-reads the real buffered amounts and the delay control
   refresh runs (`deliverable`, `buffered`, `pending_acks`, a decision per topic), as
   storage.budget and storage.delay_control do;
5. every partition's hardener task whose wait is over runs one pass, as storage.hardener
   does: it waits until the oldest buffered record is due under `decision(topic)` (at most
   `IDLE_MS`, or until woken by an append when the queue was empty), then writes the due,
   undelivered prefix to Kafka (up to `READ_LIMIT_BYTES`) and, once written, trims it,
   advances the hardened mark and answers the guarantee acks it settles; after a failure it
   backs off 50 ms, doubling, up to 5 s.

At risk: acknowledged records (every record but the acks=all ones, whose producers are
still waiting) that are neither hardened (written *and* confirmed) nor delivered.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field

from bench.delay_sim.model import Subscription, Topic, Workload, in_windows
from storage.model import TopicPartition
from storage.policy.adaptive import BUFFER_THROTTLE_FROM
from storage.policy.observer import DelayObserver

IDLE_MS = 1_000                  # HardenerSettings.lease_ms / 4: the longest idle wait
READ_LIMIT_BYTES = 16 * 1024 * 1024  # HardenerSettings.read_limit_bytes
REFRESH_MS = 250                 # BufferBudget and DelayControl refresh periods
MAX_BACKOFF_MS = 5_000
SAMPLE_MS = 1_000                # resolution of the time series kept for plots


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    fixed_delay_ms: int | None = None  # None: adaptive
    # The adaptive policy with another DelayLimits.headroom or memory_headroom (same
    # budgets): for comparison, never counted in the targets.
    headroom: float | None = None
    memory_headroom: float | None = None

    @staticmethod
    def all() -> tuple[Policy, ...]:
        fixed = [Policy(f"fixed {_ms_label(ms)}", ms) for ms in (0, 100, 1_000, 10_000, 60_000)]
        return (Policy("adaptive"), *fixed)

    @staticmethod
    def extras() -> tuple[Policy, ...]:
        return (Policy("adaptive headroom 0.8", headroom=0.8),
                Policy("adaptive memory headroom 0.5", memory_headroom=0.5),
                Policy("adaptive memory headroom 0.9", memory_headroom=0.9))


def _ms_label(ms: int) -> str:
    return f"{ms // 1000} s" if ms >= 1000 else f"{ms} ms"


@dataclass(slots=True)
class _Write:
    start: int
    end: int
    began_ms: int
    done_ms: int
    ok: bool


@dataclass(slots=True)
class _Partition:
    tp: TopicPartition
    index: int
    next: int = 0        # offsets below were appended
    start: int = 0       # first offset still in the log queue
    delivered: int = 0   # every durable subscription committed past what is below
    hardened: int = 0    # written to Kafka (or dropped as delivered) below this
    settled: int = 0     # max(hardened, delivered): guarantee acks below are answered
    at_risk: int = 0     # acknowledged records in [settled, next)
    oldest_ms: int = 0   # append time of the record at `settled` (if settled < next)
    # One entry per send (cohort): exclusive end offset, append time, acks=all or not, and
    # the acks=all records below the end.
    ends: list[int] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    guaranteed: list[bool] = field(default_factory=list)
    guaranteed_below: list[int] = field(default_factory=list)
    waiters: deque[tuple[int, int]] = field(default_factory=deque)  # (last offset, sent at)
    write: _Write | None = None
    wake_ms: float = 0.0
    idle_empty: bool = False
    backoff_ms: int = 0

    def guaranteed_before(self, offset: int) -> int:
        index = bisect_right(self.ends, offset)
        if index >= len(self.ends):
            return self.guaranteed_below[-1] if self.ends else 0
        below = self.guaranteed_below[index]
        return below - (self.ends[index] - offset) if self.guaranteed[index] else below

    def time_of(self, offset: int) -> int:
        return self.times[bisect_right(self.ends, offset)]


@dataclass(slots=True)
class _Group:
    spec: Subscription
    positions: list[int]
    credit: list[float]
    committed: list[int]      # -1: not committed on that partition yet
    processed: list[int]
    history: deque[tuple[int, list[int]]] = field(default_factory=deque)
    next_commit_ms: int = 0
    down: bool = False


@dataclass(slots=True)
class _Topic:
    spec: Topic
    partitions: list[_Partition]
    groups: list[_Group]
    sender_ids: list[tuple[str, str]]
    guarantee: list[bool]
    by_slot: list[list[int]]       # senders sending in each step of the send interval
    sent: list[int]
    sends: list[int]
    acked_senders: int
    rng: random.Random
    noise: float = 1.0             # this second's rate factor (Producers.jitter)
    intended: float = 0.0          # records the producers wanted to send so far
    produced: int = 0
    written: int = 0
    dropped: int = 0
    pending_acks: int = 0


@dataclass(slots=True)
class _Peak:
    """Peak and time-average of a quantity; `healthy_peak` leaves out Kafka's unhealthy
    stretches (budgets are promised only while Kafka is healthy)."""

    peak: float = 0.0
    healthy_peak: float = 0.0
    total: float = 0.0
    samples: int = 0

    def add(self, value: float, healthy: bool, producing: bool) -> None:
        if value > self.peak:
            self.peak = value
        if healthy and value > self.healthy_peak:
            self.healthy_peak = value
        if producing:
            self.total += value
            self.samples += 1

    @property
    def mean(self) -> float:
        return self.total / self.samples if self.samples else 0.0


@dataclass
class RunResult:
    workload: str
    policy: str
    fixed_delay_ms: int | None
    produced: int
    written: int
    dropped: int
    buffered_end: int
    per_topic: dict[str, dict[str, int]]
    at_risk_bytes: _Peak
    at_risk_records: _Peak
    buffer_bytes: _Peak
    sender_seconds: _Peak
    throttled_ms: int
    ack_latencies_ms: list[int]
    acks_pending_end: int
    binding_share: dict[str, dict[str, float]]
    series: dict[str, list[float]]
    delay_series: dict[str, list[int]]
    decisions: int
    appends: int
    checks: dict[str, int]


class Simulation:
    def __init__(self, workload: Workload, policy: Policy) -> None:
        self.workload = workload
        self.policy = policy
        limits = workload.limits
        if policy.headroom is not None:
            limits = dataclasses.replace(limits, headroom=policy.headroom)
        if policy.memory_headroom is not None:
            limits = dataclasses.replace(limits, memory_headroom=policy.memory_headroom)
        self.observer = DelayObserver(limits, fixed_delay_ms=policy.fixed_delay_ms)
        self.topics = [self._topic_state(t) for t in workload.topics]
        self._writes: list[tuple[int, int, _Partition, _Topic]] = []
        self._write_seq = 0
        self._link_free_ms = 0.0
        self._unhealthy = workload.unhealthy_windows()
        self.decisions = 0
        self.appends = 0
        self.ack_latencies: list[int] = []
        self.at_risk_bytes = _Peak()
        self.at_risk_records = _Peak()
        self.buffer_bytes = _Peak()
        self.sender_seconds = _Peak()
        self.throttled_ms = 0
        self._bindings: dict[str, dict[str, int]] = {t.spec.name: {} for t in self.topics}
        self.series: dict[str, list[float]] = {
            "t_s": [], "at_risk_bytes": [], "buffer_bytes": [], "written": [], "produced": []}
        self.delay_series: dict[str, list[int]] = {t.spec.name: [] for t in self.topics}
        self._second_risk = 0.0
        self._second_buffer = 0.0
        # Invariants, counted so tests can assert them: an ack before its append, an at-risk
        # or buffered amount below zero.
        self.checks = {"ack_before_append": 0, "negative_at_risk": 0, "negative_buffer": 0}

    # -- set-up ---------------------------------------------------------------------------

    def _topic_state(self, spec: Topic) -> _Topic:
        producers = spec.producers
        step = self.workload.step_ms
        if producers.send_interval_ms % step:
            raise ValueError(f"{spec.name}: send interval must be a multiple of {step} ms")
        slots = producers.send_interval_ms // step
        by_slot: list[list[int]] = [[] for _ in range(slots)]
        guarantee = []
        for i in range(producers.senders):
            by_slot[i * slots // producers.senders].append(i)
            # Spread acks=all senders evenly among the others.
            share = producers.guarantee_share
            guarantee.append(math.floor((i + 1) * share) > math.floor(i * share))
        parts = [_Partition(TopicPartition(spec.name, p), p) for p in range(spec.partitions)]
        groups = [_Group(sub, positions=[0] * spec.partitions, credit=[0.0] * spec.partitions,
                         committed=[-1] * spec.partitions, processed=[0] * spec.partitions,
                         next_commit_ms=sub.commit_phase_ms + sub.commit_interval_ms)
                  for sub in spec.subscriptions]
        return _Topic(spec, parts, groups,
                      sender_ids=[(f"{spec.name}-producer-{i}", f"/10.{i // 250}.{i % 250}.7")
                                  for i in range(producers.senders)],
                      guarantee=guarantee, by_slot=by_slot, sent=[0] * producers.senders,
                      sends=[0] * producers.senders,
                      acked_senders=producers.senders - sum(guarantee),
                      rng=random.Random(f"{self.workload.seed}:{spec.name}"))

    # -- the run --------------------------------------------------------------------------

    def run(self) -> RunResult:
        workload = self.workload
        now = 0
        while now < workload.end_ms:
            self.step(now)
            now += workload.step_ms
        return self.result()

    def step(self, now: int) -> None:
        self._complete_writes(now)
        producing = now < self.workload.duration_ms
        if producing:
            self._produce(now)
        self._consume(now)
        if now % REFRESH_MS == 0:
            self._refresh(now, producing)
        for topic in self.topics:
            for part in topic.partitions:
                if part.write is None and part.wake_ms <= now:
                    self._harden_pass(topic, part, now)
        self._measure(now, producing)

    # -- producers ------------------------------------------------------------------------

    def _produce(self, now: int) -> None:
        step = self.workload.step_ms
        for topic in self.topics:
            producers = topic.spec.producers
            if now % 1000 == 0 and producers.jitter:
                topic.noise = topic.rng.uniform(1 - producers.jitter, 1 + producers.jitter)
            topic.intended += producers.rate(now) * topic.noise * step / 1000
            slot = (now % producers.send_interval_ms) // step
            share = topic.intended / producers.senders
            for sender in topic.by_slot[slot]:
                count = int(share) - topic.sent[sender]
                if count <= 0:
                    continue
                topic.sent[sender] += count
                part = topic.partitions[(sender + topic.sends[sender]) % len(topic.partitions)]
                topic.sends[sender] += 1
                self._append(topic, part, sender, count, now)

    def _append(self, topic: _Topic, part: _Partition, sender: int, count: int,
                now: int) -> None:
        nbytes = count * topic.spec.record_bytes
        guaranteed = topic.guarantee[sender]
        if part.settled == part.next:
            part.oldest_ms = now
        part.next += count
        part.ends.append(part.next)
        part.times.append(now)
        part.guaranteed.append(guaranteed)
        below = part.guaranteed_below[-1] if part.guaranteed_below else 0
        part.guaranteed_below.append(below + count if guaranteed else below)
        if guaranteed:
            part.waiters.append((part.next - 1, now))
            topic.pending_acks += 1
        else:
            part.at_risk += count
        topic.produced += count
        self.appends += 1
        self.observer.appended(part.tp, topic.sender_ids[sender], count, nbytes, part.next,
                               now)
        if part.idle_empty:  # Hardener.appended wakes a task that found the queue empty
            part.idle_empty = False
            part.wake_ms = now

    # -- consumers and delivery -------------------------------------------------------------

    def _consume(self, now: int) -> None:
        step = self.workload.step_ms
        for topic in self.topics:
            for group in topic.groups:
                spec = group.spec
                if in_windows(spec.outages, now):
                    if not group.down:  # the consumers die; they will resume from commits
                        group.down = True
                        group.positions = [max(0, c) for c in group.committed]
                        group.processed = list(group.positions)
                        group.history.clear()
                    continue
                if group.down:
                    group.down = False
                    group.next_commit_ms = now + spec.commit_interval_ms
                share = spec.max_records_per_s / len(topic.partitions) * step / 1000
                for part in topic.partitions:
                    i = part.index
                    credit = min(group.credit[i] + share, max(2 * share, 1.0))
                    take = min(int(credit), part.next - group.positions[i])
                    group.positions[i] += take
                    group.credit[i] = credit - take
                group.history.append((now, list(group.positions)))
                horizon = now - spec.processing_ms
                while group.history and group.history[0][0] <= horizon:
                    group.processed = group.history.popleft()[1]
                if now >= group.next_commit_ms:
                    group.next_commit_ms += spec.commit_interval_ms
                    self._commit(topic, group, now)

    def _commit(self, topic: _Topic, group: _Group, now: int) -> None:
        for part in topic.partitions:
            group.committed[part.index] = group.processed[part.index]
            mark = min(g.committed[part.index] for g in topic.groups)
            if mark > part.delivered:
                part.delivered = mark
                if mark > part.start:
                    # Delivered records leave the log queue at once (LogQueue.deliver); those
                    # a running write already carries still count as written when it ends.
                    overlap = 0
                    if part.write is not None:
                        overlap = max(0, min(mark, part.write.end)
                                      - max(part.start, part.write.start))
                    topic.dropped += mark - part.start - overlap
                    part.start = mark
                self._settle(topic, part, max(part.hardened, mark), now)
            self.observer.delivered(part.tp, part.delivered, now)

    def _settle(self, topic: _Topic, part: _Partition, upto: int, now: int) -> None:
        if upto <= part.settled:
            return
        records = upto - part.settled
        guaranteed = part.guaranteed_before(upto) - part.guaranteed_before(part.settled)
        part.at_risk -= records - guaranteed
        part.settled = upto
        if upto < part.next:
            part.oldest_ms = part.time_of(upto)
        waiters = part.waiters
        while waiters and waiters[0][0] < upto:
            _, sent_ms = waiters.popleft()
            topic.pending_acks -= 1
            if now < sent_ms:
                self.checks["ack_before_append"] += 1
            self.ack_latencies.append(now - sent_ms)

    # -- Kiln's refresh loops -----------------------------------------------------------------

    def _refresh(self, now: int, producing: bool) -> None:
        # BufferBudget.refresh: the real amounts, summed over the partitions.
        budget_bytes = sum((p.next - p.start) * t.spec.record_bytes
                           for t in self.topics for p in t.partitions)
        budget_records = sum(p.next - p.start for t in self.topics for p in t.partitions)
        # DelayControl.refresh
        observer = self.observer
        observer.deliverable(frozenset(t.spec.name for t in self.topics if t.spec.subscriptions),
                             now)
        observer.buffered(budget_bytes, budget_records)
        observer.pending_acks({t.spec.name: t.pending_acks for t in self.topics
                               if t.pending_acks})
        for topic in self.topics:
            decision = observer.decision(topic.spec.name, now)
            self.decisions += 1
            if producing:
                counts = self._bindings[topic.spec.name]
                counts[decision.binding.value] = counts.get(decision.binding.value, 0) + 1

    # -- the hardener -----------------------------------------------------------------------

    def _harden_pass(self, topic: _Topic, part: _Partition, now: int) -> None:
        if part.start >= part.next:
            part.idle_empty = True
            part.wake_ms = math.inf
            return
        decision = self.observer.decision(topic.spec.name, now)
        self.decisions += 1
        due_before = decision.due_before(now)
        first = bisect_right(part.ends, part.start)
        oldest_ms = part.times[first]
        if oldest_ms > due_before:
            part.wake_ms = now + min(oldest_ms - due_before, IDLE_MS)
            return
        last = bisect_right(part.times, due_before, lo=first)
        upto = min(part.ends[last - 1],
                   part.start + max(1, READ_LIMIT_BYTES // topic.spec.record_bytes))
        self._start_write(topic, part, part.start, upto, now)

    def _start_write(self, topic: _Topic, part: _Partition, start: int, end: int,
                     now: int) -> None:
        kafka = self.workload.kafka
        if in_windows(kafka.failures, now):
            done, ok = now + kafka.fail_after_ms, False
        else:
            nbytes = (end - start) * topic.spec.record_bytes
            begin = max(float(now), self._link_free_ms)
            self._link_free_ms = begin + nbytes / kafka.bytes_per_s * 1000
            done, ok = math.ceil(self._link_free_ms) + kafka.write_latency_ms, True
        part.write = _Write(start, end, now, done, ok)
        part.wake_ms = math.inf
        self._write_seq += 1
        heapq.heappush(self._writes, (done, self._write_seq, part, topic))

    def _complete_writes(self, now: int) -> None:
        while self._writes and self._writes[0][0] <= now:
            _, _, part, topic = heapq.heappop(self._writes)
            write = part.write
            assert write is not None
            part.write = None
            if write.ok:
                self.observer.kafka_write(float(write.done_ms - write.began_ms), now)
                topic.written += write.end - write.start
                part.hardened = max(part.hardened, write.end)
                part.start = max(part.start, write.end)
                self._settle(topic, part, max(part.hardened, part.delivered), now)
                part.backoff_ms = 0
                part.wake_ms = now
            else:
                self.observer.kafka_failed(now)
                # What a delivery freed during the failed write will never be written.
                topic.dropped += max(0, min(part.start, write.end) - write.start)
                part.backoff_ms = min(MAX_BACKOFF_MS, max(50, part.backoff_ms * 2))
                part.wake_ms = now + part.backoff_ms

    # -- measurements -----------------------------------------------------------------------

    def _measure(self, now: int, producing: bool) -> None:
        risk_records = 0
        risk_bytes = 0
        buffered = 0
        worst_sender_s = 0.0
        for topic in self.topics:
            size = topic.spec.record_bytes
            oldest: int | None = None
            for part in topic.partitions:
                risk_records += part.at_risk
                risk_bytes += part.at_risk * size
                buffered += (part.next - part.start) * size
                if part.settled < part.next and (oldest is None or part.oldest_ms < oldest):
                    oldest = part.oldest_ms
            if oldest is not None:
                worst_sender_s = max(worst_sender_s, self._sender_seconds(topic, now - oldest))
        if risk_records < 0:
            self.checks["negative_at_risk"] += 1
        if buffered < 0:
            self.checks["negative_buffer"] += 1
        healthy = not in_windows(self._unhealthy, now)
        self.at_risk_bytes.add(risk_bytes, healthy, producing)
        self.at_risk_records.add(risk_records, healthy, producing)
        self.buffer_bytes.add(buffered, healthy, producing)
        self.sender_seconds.add(worst_sender_s, healthy, producing)
        if buffered > BUFFER_THROTTLE_FROM * self.workload.limits.memory_budget_bytes:
            self.throttled_ms += self.workload.step_ms
        self._second_risk = max(self._second_risk, risk_bytes)
        self._second_buffer = max(self._second_buffer, buffered)
        if (now + self.workload.step_ms) % SAMPLE_MS == 0:
            self._sample(now)

    def _sender_seconds(self, topic: _Topic, age_ms: int) -> float:
        """Sum over the acknowledged senders of how long each has had data at risk, when
        the oldest record at risk is `age_ms` old: each sender sends every `interval`, at
        evenly spread phases, so it is exposed from its first send after that record."""
        interval = topic.spec.producers.send_interval_ms
        reach = min(age_ms, interval)
        return topic.acked_senders / interval * (age_ms * reach - reach * reach / 2) / 1000

    def _sample(self, now: int) -> None:
        series = self.series
        series["t_s"].append((now + self.workload.step_ms) / 1000)
        series["at_risk_bytes"].append(self._second_risk)
        series["buffer_bytes"].append(self._second_buffer)
        series["written"].append(sum(t.written for t in self.topics))
        series["produced"].append(sum(t.produced for t in self.topics))
        self._second_risk = 0.0
        self._second_buffer = 0.0
        current = self.observer.current()
        for topic in self.topics:
            decision = current.get(topic.spec.name)
            self.delay_series[topic.spec.name].append(
                decision.delay_ms if decision is not None else 0)

    # -- accounting -----------------------------------------------------------------------

    def accounting(self) -> dict[str, int]:
        """Every produced record is dropped as delivered, written, still buffered, or carried
        by a running write after a delivery removed it from the log queue."""
        return {
            "produced": sum(t.produced for t in self.topics),
            "written": sum(t.written for t in self.topics),
            "dropped": sum(t.dropped for t in self.topics),
            "buffered": sum(p.next - p.start for t in self.topics for p in t.partitions),
            "in_flight_freed": self.in_flight_freed(),
        }

    def in_flight_freed(self) -> int:
        """Records a running write carries that a delivery already removed from the log
        queue: neither buffered nor yet written."""
        total = 0
        for topic in self.topics:
            for part in topic.partitions:
                if part.write is not None:
                    total += max(0, min(part.start, part.write.end) - part.write.start)
        return total

    def result(self) -> RunResult:
        bindings = {}
        for name, counts in self._bindings.items():
            total = sum(counts.values()) or 1
            bindings[name] = {k: round(v / total, 4) for k, v in sorted(counts.items())}
        per_topic = {t.spec.name: {"produced": t.produced, "written": t.written,
                                   "dropped": t.dropped,
                                   "buffered": sum(p.next - p.start for p in t.partitions)}
                     for t in self.topics}
        return RunResult(
            workload=self.workload.name, policy=self.policy.name,
            fixed_delay_ms=self.policy.fixed_delay_ms,
            produced=sum(t.produced for t in self.topics),
            written=sum(t.written for t in self.topics),
            dropped=sum(t.dropped for t in self.topics),
            buffered_end=sum(v["buffered"] for v in per_topic.values()),
            per_topic=per_topic,
            at_risk_bytes=self.at_risk_bytes, at_risk_records=self.at_risk_records,
            buffer_bytes=self.buffer_bytes, sender_seconds=self.sender_seconds,
            throttled_ms=self.throttled_ms,
            ack_latencies_ms=self.ack_latencies,
            acks_pending_end=sum(t.pending_acks for t in self.topics),
            binding_share=bindings, series=self.series, delay_series=self.delay_series,
            decisions=self.decisions, appends=self.appends, checks=dict(self.checks),
        )


def simulate(workload: Workload, policy: Policy) -> RunResult:
    return Simulation(workload, policy).run()
