"""The delay simulator's accounting (bench/delay_sim): short runs of a small workload with
everything in it (acks=all producers, a consumer outage, a Kafka failure, a topic nobody
can deliver), checked step by step against what was produced."""

from __future__ import annotations

import dataclasses

import pytest

from bench.delay_sim.engine import Policy, Simulation, simulate
from bench.delay_sim.model import Kafka, Producers, Subscription, Topic, Workload
from bench.delay_sim.report import budgets, run_summary
from storage.policy.adaptive import DelayLimits

POLICIES = [Policy("adaptive"), Policy("fixed 0 ms", 0), Policy("fixed 1 s", 1_000),
            Policy("fixed 10 s", 10_000)]


def small_workload(**changes: object) -> Workload:
    orders = Topic(
        "orders", partitions=3, record_bytes=100,
        producers=Producers(800, senders=6, send_interval_ms=50, guarantee_share=0.5),
        subscriptions=(
            Subscription("billing", max_records_per_s=3_000, processing_ms=100,
                         commit_interval_ms=1_000, outages=((6_000, 11_000),)),
            Subscription("audit", max_records_per_s=3_000, processing_ms=30,
                         commit_interval_ms=300, commit_phase_ms=70),
        ))
    logs = Topic("logs", partitions=1, record_bytes=300,
                 producers=Producers(150, senders=2, send_interval_ms=100, guarantee_share=0.5))
    workload = Workload(
        "small", "accounting test", topics=(orders, logs),
        limits=DelayLimits(max_delay_ms=4_000, initial_delay_ms=500,
                           risk_budget_bytes=200_000, risk_budget_records=5_000,
                           memory_budget_bytes=1_000_000, max_ack_delay_ms=3_000),
        kafka=Kafka(write_latency_ms=40, bytes_per_s=150_000, failures=((14_000, 16_000),),
                    fail_after_ms=300),
        duration_ms=20_000, tail_ms=10_000, seed=7)
    return dataclasses.replace(workload, **changes)


def at_risk_recounted(sim: Simulation) -> int:
    """Acknowledged records neither hardened nor delivered, counted cohort by cohort."""
    total = 0
    for topic in sim.topics:
        for part in topic.partitions:
            begin = 0
            for end, guaranteed in zip(part.ends, part.guaranteed, strict=True):
                if not guaranteed:
                    total += max(0, min(end, part.next) - max(begin, part.settled))
                begin = end
    return total


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_every_record_is_dropped_written_or_still_buffered_at_every_step(
        policy: Policy) -> None:
    sim = Simulation(small_workload(), policy)
    seen = []

    for now in range(0, sim.workload.end_ms, sim.workload.step_ms):
        sim.step(now)
        if now % 250 == 0:
            seen.append(sim.accounting())

    assert seen[-1]["produced"] > 15_000
    for books in seen:
        assert books["produced"] == (books["dropped"] + books["written"] + books["buffered"]
                                     + books["in_flight_freed"])
        assert min(books.values()) >= 0


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_acks_follow_appends_and_at_risk_matches_a_recount(policy: Policy) -> None:
    sim = Simulation(small_workload(), policy)
    recounts = []

    for now in range(0, sim.workload.end_ms, sim.workload.step_ms):
        sim.step(now)
        if now % 100 == 0:
            recounts.append((sum(p.at_risk for t in sim.topics for p in t.partitions),
                             at_risk_recounted(sim)))

    result = sim.result()
    assert result.checks == {"ack_before_append": 0, "negative_at_risk": 0,
                             "negative_buffer": 0}
    assert result.ack_latencies_ms and min(result.ack_latencies_ms) >= 0
    assert all(kept == recounted for kept, recounted in recounts)
    assert all(kept >= 0 for kept, _ in recounts)
    assert result.at_risk_bytes.peak > 0


def test_a_run_is_deterministic_for_its_seed() -> None:
    first = simulate(small_workload(), Policy("adaptive"))
    again = simulate(small_workload(), Policy("adaptive"))
    other_seed = simulate(small_workload(seed=8), Policy("adaptive"))

    summary = run_summary(first, small_workload())
    assert summary == run_summary(again, small_workload())
    assert first.series == again.series and first.delay_series == again.delay_series
    assert first.produced != other_seed.produced


def test_records_nobody_can_deliver_are_all_written_once_settled() -> None:
    result = simulate(small_workload(), Policy("fixed 1 s", 1_000))

    logs = result.per_topic["logs"]
    assert logs["written"] == logs["produced"] > 0
    assert logs["dropped"] == logs["buffered"] == 0
    assert result.buffered_end == 0 and result.acks_pending_end == 0


def test_records_delivered_before_the_delay_are_never_written() -> None:
    always_up = small_workload(topics=(dataclasses.replace(
        small_workload().topics[0],
        subscriptions=(Subscription("fast", max_records_per_s=5_000, processing_ms=20,
                                    commit_interval_ms=200),)),))

    result = simulate(always_up, Policy("fixed 10 s", 10_000))

    assert result.written == 0
    assert result.dropped == result.produced > 0
    assert max(result.ack_latencies_ms) < 1_000


def test_a_kafka_failure_delays_hardening_without_losing_records() -> None:
    failing = small_workload(kafka=Kafka(write_latency_ms=40, bytes_per_s=150_000,
                                         failures=((2_000, 12_000),), fail_after_ms=300))

    result = simulate(failing, Policy("fixed 0 ms", 0))

    assert result.written + result.dropped == result.produced
    # Nothing that waited out the failure was answered before the failure ended.
    assert max(result.ack_latencies_ms) >= 9_000


def test_the_memory_budget_is_kept_only_below_the_throttle_line() -> None:
    """Kiln throttles producers past 80 % of the buffer budget, which the simulated producers
    do not feel: a run above that line has not kept the memory budget."""
    workload = small_workload()
    run = simulate(workload, Policy("fixed 1 s", 1_000))  # its buffer ignores the budget
    peak = run.buffer_bytes.healthy_peak

    def memory_kept(budget_bytes: int) -> bool:
        limits = dataclasses.replace(workload.limits, memory_budget_bytes=budget_bytes)
        [memory] = [b for b in budgets(run, dataclasses.replace(workload, limits=limits))
                    if b.name == "memory"]
        return memory.kept

    assert peak > 0
    assert memory_kept(int(peak / 0.75))          # the peak at 75 % of the budget
    assert not memory_kept(int(peak / 0.9) + 1)   # at 90 %: throttled, never refused
