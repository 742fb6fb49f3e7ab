"""The adaptive delay controller, I/O-free: literal inputs and timestamps in, a delay and its
binding constraint out; one test per constraint, then the transitions between them."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.model import TopicPartition
from storage.policy.adaptive import AdaptiveDelay, DelayInputs, DelayLimits
from storage.policy.delay import Binding
from storage.policy.observer import DelayObserver

MIB = 1024 * 1024
LIMITS = DelayLimits(min_delay_ms=0, max_delay_ms=60_000, initial_delay_ms=2_000,
                     risk_budget_bytes=64 * MIB, risk_budget_records=1_000_000,
                     sender_budget_s=600, memory_budget_bytes=512 * MIB,
                     max_ack_delay_ms=10_000, headroom=0.5, latency_margin=1.25,
                     latency_margin_ms=100)
SUBSCRIBED = DelayInputs(has_subscriptions=True, delivery_latency_ms=400.0)


def decide(inputs: DelayInputs, limits: DelayLimits = LIMITS) -> tuple[int, Binding]:
    decision = AdaptiveDelay(limits).decide(inputs, now_ms=1_000_000)
    return decision.delay_ms, decision.binding


def test_no_durable_subscription_hardens_at_once() -> None:
    assert decide(DelayInputs(has_subscriptions=False, delivery_latency_ms=400.0)) == (
        0, Binding.NO_SUBSCRIPTIONS)


def test_waits_the_delivery_latency_with_margin() -> None:
    assert decide(SUBSCRIBED) == (400 * 1.25 + 100, Binding.DELIVERY_LATENCY)


def test_before_any_delivery_waits_the_initial_delay() -> None:
    assert decide(DelayInputs(has_subscriptions=True)) == (2_000, Binding.NO_DELIVERY_YET)


def test_an_undelivered_record_waiting_longer_than_the_latency_lengthens_the_wait() -> None:
    inputs = dataclasses.replace(SUBSCRIBED, undelivered_wait_ms=4_000)

    assert decide(inputs) == (4_000 * 1.25 + 100, Binding.DELIVERY_LATENCY)


def test_never_longer_than_max_delay() -> None:
    inputs = dataclasses.replace(SUBSCRIBED, delivery_latency_ms=300_000.0)

    assert decide(inputs) == (60_000, Binding.MAX_DELAY)


def test_risk_bytes_cap_follows_the_ingress_rate() -> None:
    # 32 MiB of headroom at 8 MiB/s: 4 s, less the 200 ms a Kafka write takes.
    inputs = dataclasses.replace(SUBSCRIBED, delivery_latency_ms=20_000.0,
                                 bytes_per_s=8 * MIB, kafka_write_ms=200.0)

    assert decide(inputs) == (3_800, Binding.RISK_BYTES)


def test_risk_cap_shrinks_past_the_headroom_and_is_zero_at_the_budget() -> None:
    base = dataclasses.replace(SUBSCRIBED, delivery_latency_ms=20_000.0, bytes_per_s=8 * MIB)

    assert decide(dataclasses.replace(base, at_risk_bytes=48 * MIB)) == (2_000,
                                                                          Binding.RISK_BYTES)
    assert decide(dataclasses.replace(base, at_risk_bytes=64 * MIB)) == (0, Binding.RISK_BYTES)


def test_risk_records_cap() -> None:
    inputs = dataclasses.replace(SUBSCRIBED, delivery_latency_ms=20_000.0,
                                 records_per_s=100_000.0)

    assert decide(inputs) == (5_000, Binding.RISK_RECORDS)


def test_many_senders_shorten_the_delay() -> None:
    inputs = dataclasses.replace(SUBSCRIBED, delivery_latency_ms=20_000.0, senders=300)

    assert decide(inputs) == (2_000, Binding.SENDERS)


def test_memory_budget_caps_the_delay() -> None:
    limits = dataclasses.replace(LIMITS, memory_budget_bytes=16 * MIB,
                                 risk_budget_bytes=1024 * MIB)
    inputs = dataclasses.replace(SUBSCRIBED, delivery_latency_ms=20_000.0, bytes_per_s=4 * MIB,
                                 buffered_bytes=14 * MIB)

    # 8 MiB headroom at 4 MiB/s is 2 s; 14 of 16 MiB used scales it to a quarter.
    assert decide(inputs, limits) == (500, Binding.MEMORY)


def test_pending_guarantee_acks_bound_the_delay() -> None:
    inputs = dataclasses.replace(SUBSCRIBED, delivery_latency_ms=20_000.0, pending_acks=3)

    assert decide(inputs) == (10_000, Binding.GUARANTEE_ACKS)


def test_min_delay_is_a_floor() -> None:
    limits = dataclasses.replace(LIMITS, min_delay_ms=250)

    assert decide(DelayInputs(has_subscriptions=False), limits) == (250, Binding.MIN_DELAY)


def test_failing_kafka_holds_the_last_healthy_delay() -> None:
    controller = AdaptiveDelay(LIMITS)
    controller.decide(SUBSCRIBED, now_ms=1_000)
    failing = dataclasses.replace(SUBSCRIBED, kafka_healthy=False, delivery_latency_ms=50.0,
                                  at_risk_bytes=64 * MIB, bytes_per_s=8 * MIB)

    held = controller.decide(failing, now_ms=2_000)
    recovered = controller.decide(dataclasses.replace(failing, kafka_healthy=True), 3_000)

    assert (held.delay_ms, held.binding) == (600, Binding.KAFKA_UNHEALTHY)
    assert (recovered.delay_ms, recovered.binding) == (0, Binding.RISK_BYTES)


def test_limits_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="max_delay_ms"):
        DelayLimits(min_delay_ms=10, max_delay_ms=5)
    with pytest.raises(ValueError, match="risk_budget_bytes"):
        DelayLimits(risk_budget_bytes=0)


_inputs = st.builds(
    DelayInputs,
    has_subscriptions=st.booleans(),
    senders=st.integers(0, 5_000),
    bytes_per_s=st.floats(0, 1e9),
    records_per_s=st.floats(0, 1e7),
    at_risk_bytes=st.integers(0, 2**31),
    at_risk_records=st.integers(0, 10**7),
    buffered_bytes=st.integers(0, 2**31),
    delivery_latency_ms=st.one_of(st.none(), st.floats(0, 1e7)),
    undelivered_wait_ms=st.integers(0, 10**7),
    pending_acks=st.integers(0, 100),
    kafka_healthy=st.just(True),
    kafka_write_ms=st.floats(0, 10_000),
)


@given(_inputs)
def test_delay_stays_within_min_and_max(inputs: DelayInputs) -> None:
    limits = dataclasses.replace(LIMITS, min_delay_ms=5)

    delay, _ = decide(inputs, limits)

    assert 5 <= delay <= 60_000


@given(_inputs, st.integers(1, 5_000))
def test_more_senders_never_lengthen_the_delay(inputs: DelayInputs, more: int) -> None:
    crowded = dataclasses.replace(inputs, senders=inputs.senders + more)

    assert decide(crowded)[0] <= decide(inputs)[0]


@given(_inputs)
def test_within_the_risk_headroom_at_steady_state(inputs: DelayInputs) -> None:
    """rate x delay stays within half the risk budget (the headroom) while Kafka is healthy."""
    delay, _ = decide(inputs)

    assert inputs.bytes_per_s * delay / 1000 <= 0.5 * LIMITS.risk_budget_bytes + 1
    assert inputs.records_per_s * delay / 1000 <= 0.5 * LIMITS.risk_budget_records + 1


# -- the observer: signals in, transitions out ------------------------------------------

TP = TopicPartition("orders", 0)


def observer() -> DelayObserver:
    watch = DelayObserver(LIMITS)
    watch.deliverable(frozenset({"orders"}), now_ms=0)
    return watch


def test_observer_times_deliveries_from_append_to_delivered_mark() -> None:
    watch = observer()
    watch.appended(TP, "p1", records=10, nbytes=1_000, next_offset=10, now_ms=1_000)
    watch.appended(TP, "p1", records=10, nbytes=1_000, next_offset=20, now_ms=1_300)

    watch.delivered(TP, 0, now_ms=1_000)  # first sight of the mark
    watch.delivered(TP, 20, now_ms=1_500)

    decision = watch.decision("orders", now_ms=1_500)
    inputs = watch.inputs("orders", now_ms=1_500)
    assert inputs.delivery_latency_ms is not None
    assert 450 <= inputs.delivery_latency_ms <= 550 * 1.1  # the oldest waited 500 ms
    assert decision.binding is Binding.DELIVERY_LATENCY
    assert inputs.undelivered_wait_ms == 0


def test_observer_transitions_no_subscription_latency_outage_recovery() -> None:
    watch = DelayObserver(LIMITS)
    watch.appended(TP, "p1", records=1, nbytes=100, next_offset=1, now_ms=1_000)
    assert watch.decision("orders", 1_000).binding is Binding.NO_SUBSCRIPTIONS

    watch.deliverable(frozenset({"orders"}), now_ms=1_000)
    assert watch.decision("orders", 1_000).binding is Binding.NO_DELIVERY_YET

    watch.delivered(TP, 0, now_ms=1_000)
    watch.delivered(TP, 1, now_ms=1_200)
    steady = watch.decision("orders", 1_200)
    assert steady.binding is Binding.DELIVERY_LATENCY
    assert steady.delay_ms < 500

    # The consumer stops: the oldest undelivered record waits, and the wait grows the delay.
    watch.appended(TP, "p1", records=1, nbytes=100, next_offset=2, now_ms=2_000)
    outage = watch.decision("orders", 32_000)
    assert outage.binding is Binding.DELIVERY_LATENCY
    assert outage.delay_ms == int(30_000 * 1.25 + 100)
    assert watch.decision("orders", 92_000).binding is Binding.MAX_DELAY

    # It comes back and catches up: nothing waits any more; the latency it showed decays.
    watch.delivered(TP, 2, now_ms=93_000)
    after = watch.inputs("orders", 93_000)
    assert after.undelivered_wait_ms == 0
    assert watch.decision("orders", 93_000).binding is Binding.MAX_DELAY  # 91 s latency seen
    watch.deliverable(frozenset({"orders"}), now_ms=93_000 + 20 * 60_000)
    for i in range(20):
        t = 93_000 + 20 * 60_000 + i * 1_000
        watch.appended(TP, "p1", records=1, nbytes=100, next_offset=3 + i, now_ms=t)
        watch.delivered(TP, 3 + i, now_ms=t + 200)
    assert watch.decision("orders", 93_000 + 20 * 60_000 + 20_000).delay_ms < 1_000


def test_observer_counts_distinct_senders_within_the_window() -> None:
    watch = observer()
    for i in range(300):
        watch.appended(TP, ("client", f"/10.0.0.{i}"), records=1, nbytes=100,
                       next_offset=i + 1, now_ms=1_000 + i)
    watch.delivered(TP, 0, now_ms=1_000)
    watch.delivered(TP, 300, now_ms=1_400)

    assert watch.inputs("orders", 1_400).senders == 300
    assert watch.inputs("orders", 60_000).senders == 0


def test_observer_holds_while_kafka_fails_and_follows_again_after() -> None:
    watch = observer()
    watch.kafka_write(30.0, now_ms=1_000)
    before = watch.decision("orders", 1_000)
    watch.kafka_failed(now_ms=2_000)

    assert watch.decision("orders", 2_500).binding is Binding.KAFKA_UNHEALTHY
    assert watch.decision("orders", 2_500).delay_ms == before.delay_ms
    watch.kafka_write(40.0, now_ms=3_000)
    assert watch.decision("orders", 3_000).binding is not Binding.KAFKA_UNHEALTHY


def test_fixed_policy_through_the_observer_reports_fixed() -> None:
    watch = DelayObserver(LIMITS, fixed_delay_ms=750)

    decision = watch.decision("orders", 1_000)
    report = watch.report("orders", 1_000)

    assert (decision.delay_ms, decision.binding) == (750, Binding.FIXED)
    assert report["policy"] == "fixed" and report["candidates"] == []
