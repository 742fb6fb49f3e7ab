"""The adaptive delay controller, I/O-free: literal inputs and timestamps in, a delay and its
binding constraint out; one test per constraint, then the transitions between them."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.model import TopicPartition
from storage.policy.adaptive import (
    AdaptiveDelay,
    DelayInputs,
    DelayLimits,
)
from storage.policy.delay import Binding, DelayDecision
from storage.policy.observer import DelayObserver, PeerSignals

MIB = 1024 * 1024
LIMITS = DelayLimits(min_delay_ms=0, max_delay_ms=60_000, initial_delay_ms=2_000,
                     risk_budget_bytes=64 * MIB, risk_budget_records=1_000_000,
                     sender_budget_s=600, memory_budget_bytes=512 * MIB,
                     max_ack_delay_ms=10_000, headroom=0.5, memory_headroom=0.8,
                     latency_margin=1.25, latency_margin_ms=100)
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


def test_memory_cap_keeps_the_buffer_below_the_throttle_line() -> None:
    # A 20 MiB buffer budget throttles producers from 16 MiB; the steady state may use 0.8
    # of that, 12.8 MiB: 3.2 s at 4 MiB/s. Past it the cap shrinks to 0 at the line.
    limits = dataclasses.replace(LIMITS, memory_budget_bytes=20 * MIB,
                                 risk_budget_bytes=1024 * MIB)
    base = dataclasses.replace(SUBSCRIBED, delivery_latency_ms=20_000.0, bytes_per_s=4 * MIB)

    assert decide(base, limits) == (3_200, Binding.MEMORY)
    assert decide(dataclasses.replace(base, buffered_bytes=15 * MIB), limits) == (
        1_000, Binding.MEMORY)
    assert decide(dataclasses.replace(base, buffered_bytes=16 * MIB), limits) == (
        0, Binding.MEMORY)


def test_memory_headroom_is_its_own_and_the_risk_headroom_leaves_memory_alone() -> None:
    limits = dataclasses.replace(LIMITS, memory_budget_bytes=20 * MIB,
                                 risk_budget_bytes=1024 * MIB, memory_headroom=0.5, headroom=1.0)
    inputs = dataclasses.replace(SUBSCRIBED, delivery_latency_ms=20_000.0, bytes_per_s=4 * MIB)

    # Half of the 16 MiB below the throttle line at 4 MiB/s.
    assert decide(inputs, limits) == (2_000, Binding.MEMORY)


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
    with pytest.raises(ValueError, match="memory_headroom"):
        DelayLimits(memory_headroom=0)


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


@given(_inputs)
def test_within_the_memory_headroom_below_the_throttle_line(inputs: DelayInputs) -> None:
    """rate x delay stays within 0.8 of the memory below the throttle line (80 %)."""
    delay, _ = decide(inputs)

    assert inputs.bytes_per_s * delay / 1000 <= 0.8 * 0.8 * LIMITS.memory_budget_bytes + 1


_limits = st.builds(
    DelayLimits,
    min_delay_ms=st.integers(0, 2_000),
    max_delay_ms=st.integers(2_000, 120_000),
    initial_delay_ms=st.integers(0, 5_000),
    risk_budget_bytes=st.integers(1, 2**31),
    risk_budget_records=st.integers(1, 10**7),
    sender_budget_s=st.floats(0.001, 10_000),
    memory_budget_bytes=st.integers(1, 2**32),
    max_ack_delay_ms=st.integers(0, 60_000),
    headroom=st.sampled_from([0.1, 0.5, 0.8, 1.0]),
    memory_headroom=st.sampled_from([0.1, 0.5, 0.8, 1.0]),
)


@given(_inputs, _limits)
def test_the_decision_is_the_smallest_candidate_floored_at_min_delay(
        inputs: DelayInputs, limits: DelayLimits) -> None:
    """decide() computes its minimum in place, on plain values; candidates() lists every
    value with the reference formulas: the two agree exactly, the first of equal ones
    binding."""
    value, binding = min(AdaptiveDelay(limits).candidates(inputs), key=lambda c: c[0])
    if value < limits.min_delay_ms:
        value, binding = limits.min_delay_ms, Binding.MIN_DELAY

    assert decide(inputs, limits) == (int(value), binding)


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


def test_observer_decides_from_its_own_and_its_peers_figures_and_reports_its_own() -> None:
    # Given a node that sees 300 senders of a topic, and peers that see 900 more and hold two
    # acks waiting on it
    watch = observer()
    for i in range(300):
        watch.appended(TP, ("client", f"/10.0.0.{i}"), records=1, nbytes=100,
                       next_offset=i + 1, now_ms=1_000 + i)
    alone = watch.decision("orders", 1_400)
    own_rates = watch.inputs("orders", 1_400)

    # When it hears of its peers
    watch.peers(PeerSignals(senders={"orders": 900}, bytes_per_s=1e6, records_per_s=1e4,
                            pending_acks={"orders": 2}))

    # Then its inputs are the cluster's, and the delay is decided from them: 1,200 senders
    # leave 600 s / 1,200 = 500 ms (alone, 2 s)
    inputs = watch.inputs("orders", 1_400)
    assert inputs.senders == 1_200 and inputs.pending_acks == 2
    assert inputs.bytes_per_s == own_rates.bytes_per_s + 1e6
    assert inputs.records_per_s == own_rates.records_per_s + 1e4
    together = watch.decision("orders", 1_400)
    assert (alone.delay_ms, together.delay_ms) == (2_000, 500)
    assert together.binding is Binding.SENDERS
    # and what it publishes for its peers is its own share only
    own = watch.report("orders", 1_400)["own"]
    assert (own["senders"], own["pending_acks"]) == (300, 0)
    assert own["bytes_per_s"] == own_rates.bytes_per_s


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


# -- the observer reuses what has not moved ---------------------------------------------

def timed_observer(latency_ms: int) -> DelayObserver:
    """`orders` subscribed, one delivery timed at `latency_ms`; nothing else appended."""
    watch = observer()
    watch.appended(TP, "p0", records=1, nbytes=100, next_offset=1, now_ms=0)
    watch.delivered(TP, 0, now_ms=0)
    watch.delivered(TP, 1, now_ms=latency_ms)
    return watch


def test_a_reused_ceiling_still_follows_the_clock_for_a_waiting_record() -> None:
    watch = observer()
    watch.appended(TP, "p1", records=10, nbytes=1_000, next_offset=10, now_ms=1_000)
    watch.delivered(TP, 0, now_ms=1_000)

    # Same rate bucket (100 ms), nothing observed in between: only the wait moved.
    first = watch.decision("orders", 5_000)
    later = watch.decision("orders", 5_050)

    assert first == DelayDecision(int(4_000 * 1.25 + 100), Binding.DELIVERY_LATENCY)
    assert later == DelayDecision(int(4_050 * 1.25 + 100), Binding.DELIVERY_LATENCY)


def test_an_append_at_the_same_instant_moves_the_ceiling() -> None:
    watch = timed_observer(latency_ms=20_000)
    watch.appended(TP, "p1", records=1_000, nbytes=8 * MIB, next_offset=1_001, now_ms=20_000)
    before = watch.decision("orders", 20_000)

    watch.appended(TP, "p1", records=1_000, nbytes=8 * MIB, next_offset=2_001, now_ms=20_000)
    after = watch.decision("orders", 20_000)

    # 32 MiB of risk headroom at 8 MiB/s, then at 16 MiB/s.
    assert before == DelayDecision(4_000, Binding.RISK_BYTES)
    assert after == DelayDecision(2_000, Binding.RISK_BYTES)


def test_the_rate_window_turning_moves_the_ceiling_with_no_signal() -> None:
    watch = timed_observer(latency_ms=20_000)
    watch.appended(TP, "p1", records=1_000, nbytes=8 * MIB, next_offset=1_001, now_ms=20_000)

    in_the_short_window = watch.decision("orders", 20_999)
    out_of_it = watch.decision("orders", 21_000)  # the bucket of 20 000 leaves the 1 s window

    assert in_the_short_window == DelayDecision(4_000, Binding.RISK_BYTES)
    # 8 MiB over the 10 s window: 0.8 MiB/s, a 40 s cap; the delivery latency binds again.
    assert out_of_it.binding is Binding.DELIVERY_LATENCY
    assert 25_000 <= out_of_it.delay_ms < 40_000


def crowded_observer() -> DelayObserver:
    """300 senders appending one record each from 20 000 ms on, all delivered at 20 400."""
    watch = timed_observer(latency_ms=20_000)
    for i in range(300):
        watch.appended(TP, f"client-{i}", records=1, nbytes=100, next_offset=2 + i,
                       now_ms=20_000 + i)
    watch.delivered(TP, 301, now_ms=20_400)
    return watch


def test_senders_forgotten_by_the_clock_alone_lift_the_sender_cap() -> None:
    watch = crowded_observer()

    crowded = watch.decision("orders", 29_000)
    alone = watch.decision("orders", 30_400)  # every sender silent for 10 s

    assert crowded == DelayDecision(600_000 // 300, Binding.SENDERS)  # p0 (at 0) forgotten
    assert alone.binding is Binding.DELIVERY_LATENCY


def test_senders_forgotten_before_the_rate_bucket_turns_are_forgotten_at_once() -> None:
    watch = crowded_observer()

    pruned = watch.decision("orders", 29_950)      # the sender window prunes: next 30 950
    not_yet = watch.decision("orders", 30_940)     # all silent 10 s, but no pruning yet
    forgotten = watch.decision("orders", 30_960)   # pruning, in the same rate bucket

    assert pruned == not_yet == DelayDecision(600_000 // 300, Binding.SENDERS)
    assert forgotten.binding is Binding.DELIVERY_LATENCY


@pytest.mark.parametrize("reader", ["another topic's decision", "inputs read for a report"])
def test_a_window_moved_by_a_read_is_seen_when_the_clock_steps_back(reader: str) -> None:
    watch = timed_observer(latency_ms=20_000)
    watch.appended(TP, "p1", records=1_000, nbytes=8 * MIB, next_offset=1_001, now_ms=20_000)
    watch.delivered(TP, 1_001, now_ms=20_000)

    before = watch.decision("orders", 20_950)
    # Either read turns the rate window at 21 050: the bucket of 20 000 leaves it.
    if reader == "another topic's decision":
        watch.decision("other", 21_050)
    else:
        watch.inputs("orders", 21_050)
    stepped_back = watch.decision("orders", 20_960)

    assert before == DelayDecision(4_000, Binding.RISK_BYTES)
    assert stepped_back.binding is Binding.DELIVERY_LATENCY


def test_refreshed_amounts_move_the_ceiling() -> None:
    watch = timed_observer(latency_ms=20_000)
    watch.appended(TP, "p1", records=1_000, nbytes=8 * MIB, next_offset=1_001, now_ms=20_000)
    calm = watch.decision("orders", 20_010)

    watch.buffered(48 * MIB, 1_000)  # half-way from the headroom to the risk budget
    full = watch.decision("orders", 20_010)
    watch.pending_acks({"orders": 2})
    watch.buffered(0, 0)
    acks = watch.decision("orders", 20_010)

    assert calm == DelayDecision(4_000, Binding.RISK_BYTES)
    assert full == DelayDecision(2_000, Binding.RISK_BYTES)
    assert acks == DelayDecision(4_000, Binding.RISK_BYTES)  # 10 s ack deadline: not binding


class Replay:
    """Two observers that hear the same signals: `watch` decides as Kiln does, reusing what
    did not move; the inputs of `twin` are rebuilt and decided afresh at every decision."""

    def __init__(self) -> None:
        # Memory binds before the risk bytes (20.5 MiB steady below its throttle line, 24
        # MiB of risk), many senders before either, a stopped consumer before max_delay.
        self.limits = DelayLimits(initial_delay_ms=500, max_delay_ms=20_000,
                                  risk_budget_bytes=48 * MIB, risk_budget_records=200_000,
                                  sender_budget_s=60, memory_budget_bytes=32 * MIB,
                                  max_ack_delay_ms=8_000)
        self.watch, self.twin = DelayObserver(self.limits), DelayObserver(self.limits)
        self.fresh = {name: AdaptiveDelay(self.limits) for name in ("t0", "t1")}
        self.ends: dict[tuple[int, int], int] = {}
        self.marks: dict[tuple[int, int], int] = {}
        self.now = 1_000
        self.bindings: set[Binding] = set()

    def step(self, event: tuple[Any, ...]) -> None:
        kind, args = event[0], event[1:]
        both = (self.watch, self.twin)
        if kind == "clock":
            self.now = max(0, self.now + args[0])
        elif kind == "append":
            t, p, sender, records, nbytes = args
            self.ends[t, p] = self.ends.get((t, p), 0) + records
            for w in both:
                w.appended(TopicPartition(f"t{t}", p), f"s{sender}", records, nbytes,
                           self.ends[t, p], self.now)
        elif kind == "deliver":
            t, p, by = args
            mark = min(self.ends.get((t, p), 0), self.marks.get((t, p), -1) + by)
            self.marks[t, p] = mark
            for w in both:
                w.delivered(TopicPartition(f"t{t}", p), mark, self.now)
        elif kind == "buffered":
            for w in both:
                w.buffered(args[0], args[1])
        elif kind == "acks":
            for w in both:
                w.pending_acks({f"t{args[0]}": args[1]})
        elif kind == "kafka_ok":
            for w in both:
                w.kafka_write(args[0], self.now)
        elif kind == "kafka_failed":
            for w in both:
                w.kafka_failed(self.now)
        elif kind == "deliverable":
            for w in both:
                w.deliverable(frozenset(f"t{t}" for t in args[0]), self.now)
        elif kind == "report":  # as storage.delay_control publishes: it reads the inputs
            name = f"t{args[0]}"
            report = self.watch.report(name, self.now)
            inputs = self.twin.inputs(name, self.now)
            fresh = self.fresh[name].decide(inputs, self.now)
            assert (report["delay_ms"], report["binding"]) == (fresh.delay_ms, fresh.binding)
            assert report["inputs"] == dataclasses.asdict(inputs)
        else:
            name = f"t{args[0]}"
            reused = self.watch.decision(name, self.now)
            fresh = self.fresh[name].decide(self.twin.inputs(name, self.now), self.now)
            assert reused == fresh, (self.now, event)
            self.bindings.add(reused.binding)


_events = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(0, 1), st.integers(0, 2), st.integers(0, 40),
              st.integers(1, 2_000), st.integers(1, 4 * MIB)),
    st.tuples(st.just("deliver"), st.integers(0, 1), st.integers(0, 2), st.integers(0, 3_000)),
    st.tuples(st.just("buffered"), st.integers(0, 80 * MIB), st.integers(0, 300_000)),
    st.tuples(st.just("acks"), st.integers(0, 1), st.integers(0, 3)),
    st.tuples(st.just("kafka_ok"), st.floats(0, 2_000)),
    st.tuples(st.just("kafka_failed")),
    st.tuples(st.just("deliverable"), st.sets(st.integers(0, 1))),
    st.tuples(st.just("decide"), st.integers(0, 1)),
    st.tuples(st.just("report"), st.integers(0, 1)),
    st.tuples(st.just("clock"), st.integers(-300, 12_000)),
), max_size=120)


@settings(max_examples=300, deadline=None)
@given(_events)
def test_reused_decisions_equal_decisions_from_fresh_inputs(
        events: list[tuple[Any, ...]]) -> None:
    replay = Replay()
    for event in events:
        replay.step(event)


def _random_event(rng: random.Random) -> tuple[Any, ...]:
    roll = rng.random()
    if roll < 0.35:
        return ("append", rng.randrange(2), rng.randrange(3), rng.randrange(60),
                rng.randint(1, 300), rng.randint(100, rng.choice([64, 2_048]) * 1024))
    if roll < 0.63:
        return ("decide", rng.randrange(2))
    if roll < 0.65:
        return ("report", rng.randrange(2))
    if roll < 0.82:
        step = rng.choice([rng.randint(0, 40), rng.randint(0, 400), rng.randint(-250, 0),
                           rng.randint(2_000, 12_000)])
        return ("clock", step)
    if roll < 0.92:
        return ("deliver", rng.randrange(2), rng.randrange(3), rng.randint(0, 1_500))
    if roll < 0.95:
        return ("buffered", rng.randint(0, 30 * MIB), rng.randint(0, 250_000))
    if roll < 0.98:
        return ("kafka_ok", rng.uniform(0, 1_500))
    if roll < 0.985:
        return ("acks", rng.randrange(2), rng.randrange(3))
    if roll < 0.995:
        return ("deliverable", {t for t in range(2) if rng.random() < 0.8})
    return ("kafka_failed",)


@pytest.mark.parametrize("seed", range(12))
def test_reused_decisions_equal_fresh_ones_over_long_random_runs(seed: int) -> None:
    replay = Replay()
    replay.step(("deliverable", {0, 1}))
    rng = random.Random(seed)

    for _ in range(4_000):
        replay.step(_random_event(rng))

    # The runs reach the constraints the reuse could get wrong.
    assert {Binding.DELIVERY_LATENCY, Binding.MAX_DELAY, Binding.RISK_RECORDS, Binding.SENDERS,
            Binding.MEMORY, Binding.KAFKA_UNHEALTHY} <= replay.bindings
