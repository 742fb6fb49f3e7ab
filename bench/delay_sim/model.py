"""What a simulated workload is made of: producers per topic, durable subscriptions and
their consumers, the Kafka behind Kiln, and the budgets Kiln is configured with.

All times are milliseconds of virtual time; rates are per second.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from storage.policy.adaptive import DelayLimits

Window = tuple[int, int]  # [start_ms, end_ms)


def in_windows(windows: tuple[Window, ...], now_ms: int) -> bool:
    return any(start <= now_ms < end for start, end in windows)


@dataclass(frozen=True, slots=True)
class Bursts:
    """The rate is multiplied by `factor` for `length_ms` every `every_ms`, from `first_ms`."""

    factor: float
    length_ms: int
    every_ms: int
    first_ms: int = 0

    def active(self, now_ms: int) -> bool:
        if now_ms < self.first_ms:
            return False
        return (now_ms - self.first_ms) % self.every_ms < self.length_ms


@dataclass(frozen=True, slots=True)
class Producers:
    """`records_per_s` in total from `senders` clients, each sending what it has every
    `send_interval_ms` (linger) to one partition at a time (the sticky partitioner);
    `guarantee_share` of the senders use acks=all (assured_persistent: answered when
    delivered or hardened). Real traffic is not flat: each second the rate is multiplied by
    a factor drawn uniformly from [1 - jitter, 1 + jitter] (seeded, so runs repeat)."""

    records_per_s: float
    senders: int
    send_interval_ms: int = 100
    guarantee_share: float = 0.0
    bursts: Bursts | None = None
    jitter: float = 0.2

    def rate(self, now_ms: int) -> float:
        if self.bursts is not None and self.bursts.active(now_ms):
            return self.records_per_s * self.bursts.factor
        return self.records_per_s


@dataclass(frozen=True, slots=True)
class Subscription:
    """A durable subscription (consumer group) reading through Kiln: it fetches at most
    `max_records_per_s`, a record is processed `processing_ms` after it was fetched, and the
    processed position is committed every `commit_interval_ms` (auto.commit.interval.ms).
    During an outage the consumers are down; they restart from the last commit."""

    group: str
    max_records_per_s: float
    processing_ms: int
    commit_interval_ms: int
    commit_phase_ms: int = 0
    outages: tuple[Window, ...] = ()


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    partitions: int
    record_bytes: int
    producers: Producers
    subscriptions: tuple[Subscription, ...] = ()  # none: nothing can be delivered


@dataclass(frozen=True, slots=True)
class Kafka:
    """The hardened store: a write of B bytes waits for the shared link (`bytes_per_s`),
    then takes `write_latency_ms`; during a failure window a write fails after
    `fail_after_ms`."""

    write_latency_ms: int = 10
    bytes_per_s: float = 200 * 1024 * 1024
    failures: tuple[Window, ...] = ()
    fail_after_ms: int = 1_000


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    description: str
    topics: tuple[Topic, ...]
    limits: DelayLimits
    kafka: Kafka = field(default_factory=Kafka)
    # Producers stop after `duration_ms`; the run goes on for `tail_ms` so every record is
    # delivered or hardened and every policy is judged on the same records.
    duration_ms: int = 600_000
    tail_ms: int = 90_000
    step_ms: int = 10
    seed: int = 1
    why_budgets: str = ""

    @property
    def end_ms(self) -> int:
        return self.duration_ms + self.tail_ms

    def ingress_bytes_per_s(self, now_ms: int) -> float:
        return sum(t.producers.rate(now_ms) * t.record_bytes for t in self.topics)

    def unhealthy_windows(self) -> tuple[Window, ...]:
        """Kafka failure windows, each extended by the time Kafka needs at its throughput
        (less the ingress) to write what piled up meanwhile: budgets are promised only while
        Kafka is healthy, and these stretches are left out of the "kept" verdicts."""
        out = []
        for start, end in self.kafka.failures:
            ingress = sum(self.ingress_bytes_per_s(t) for t in range(start, end, 1_000))
            ingress /= max(1, (end - start) // 1_000)
            spare = self.kafka.bytes_per_s - ingress
            backlog = ingress * (end - start) / 1000
            catch_up_ms = (backlog / spare * 1000 if spare > 0
                           else float(self.end_ms - end))
            out.append((start, end + int(catch_up_ms) + self.kafka.write_latency_ms + 1_000))
        return tuple(out)
