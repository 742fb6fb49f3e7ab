"""The live signals the delay controller reads, with a literal clock."""

from __future__ import annotations

import pytest

from storage.policy.signals import AppendTimes, IngressRates, LatencySketch, SenderWindow


def test_ingress_rates_short_and_long_windows() -> None:
    rates = IngressRates(bucket_ms=100, short_ms=1_000, long_ms=10_000)
    for t in range(0, 10_000, 100):
        rates.add(t, 100, 25_600)  # 1000 records/s, 256 000 bytes/s, for 10 s

    assert rates.records_per_second(9_999) == pytest.approx((1_000, 1_000))
    assert rates.bytes_per_second(9_999) == pytest.approx((256_000, 256_000))


def test_ingress_rates_feel_a_burst_at_once_and_forget_it_slowly() -> None:
    rates = IngressRates(bucket_ms=100, short_ms=1_000, long_ms=10_000)
    for t in range(0, 1_000, 100):
        rates.add(t, 1_000, 2_000)  # 10 000 records/s (20 000 bytes/s) for one second

    assert rates.peaks(999) == pytest.approx((20_000, 10_000))
    assert rates.peaks(5_000) == pytest.approx((2_000, 1_000))  # over the 10 s window
    assert rates.peaks(11_000) == (0, 0)


def test_ingress_rates_skip_a_long_silence() -> None:
    rates = IngressRates()
    rates.add(0, 500, 1_000)
    rates.add(3_600_000, 100, 300)

    assert rates.records_per_second(3_600_000)[1] == pytest.approx(10)
    assert rates.bytes_per_second(3_600_000)[1] == pytest.approx(30)


def test_ingress_rates_read_within_the_newest_bucket_leave_it_as_it_is() -> None:
    rates = IngressRates(bucket_ms=100, short_ms=1_000, long_ms=10_000)
    rates.add(1_050, 10, 100)

    first = rates.peaks(1_060)
    again = rates.peaks(1_099)
    earlier = rates.peaks(1_000)   # a clock that stepped back: nothing moves
    head = rates.head
    turned = rates.peaks(1_100)    # the next bucket

    assert first == again == earlier == (100, 10)  # bytes/s, records/s over 1 s
    assert head == 10 and rates.head == 11
    assert turned == (100, 10)  # the bucket of 1 050 is still in the short window


def test_sender_window_forgets_silent_senders() -> None:
    senders = SenderWindow(window_ms=10_000)
    senders.seen(0, "a")
    senders.seen(5_000, "b")
    senders.seen(5_000, "b")

    assert senders.count(5_000) == 2
    assert senders.count(12_000) == 1
    assert senders.count(20_000) == 0


def test_sender_window_prunes_at_most_every_tenth_of_the_window() -> None:
    senders = SenderWindow(window_ms=10_000)
    senders.seen(0, "a")
    senders.seen(500, "b")

    assert senders.count(10_000) == 1       # pruned: "a" left the window
    assert senders.next_prune_ms == 11_000
    assert senders.count(10_900) == 1       # "b" left too, but no pruning before 11 000
    assert senders.count(11_000) == 0


def test_latency_sketch_high_quantile_within_a_bucket() -> None:
    sketch = LatencySketch(quantile=0.99, ratio=1.1)
    for i in range(1, 1001):
        sketch.add(0, float(i))

    assert sketch.value_ms is not None
    assert 990 / 1.1 <= sketch.value_ms <= 990 * 1.1


def test_latency_sketch_decays_old_samples() -> None:
    sketch = LatencySketch(quantile=0.999, half_life_ms=1_000)
    sketch.add(0, 50_000.0)
    for t in range(20_000, 21_000, 10):
        sketch.add(t, 100.0)

    assert sketch.value_ms is not None and sketch.value_ms < 200


def test_latency_sketch_two_samples_at_once_as_two_adds() -> None:
    one_by_one = LatencySketch(quantile=0.9, half_life_ms=1_000)
    both = LatencySketch(quantile=0.9, half_life_ms=1_000)
    for t in range(0, 5_000, 100):
        one_by_one.add(t, 10.0 + t, 0.5)
        one_by_one.add(t, 30.0 + t, 0.5)
        both.add_two(t, 10.0 + t, 30.0 + t, 0.5)

    assert both.value_ms == one_by_one.value_ms
    assert both.weight == one_by_one.weight


def test_latency_sketch_empty_has_no_value() -> None:
    assert LatencySketch().value_ms is None


def test_append_times_answers_the_instant_an_offset_was_appended() -> None:
    times = AppendTimes(capacity=4, resolution_ms=10)
    times.appended(1_000, 5)    # offsets 0..4
    times.appended(1_005, 8)    # same 10 ms slot: 5..7 join it
    times.appended(2_000, 12)   # 8..11
    times.appended(1_990, 9)    # a concurrent append finishing late: already covered

    assert [times.time_of(o) for o in (0, 7, 8, 11)] == [1_000, 1_000, 2_000, 2_000]
    assert times.time_of(12) is None


def test_append_times_forgets_the_oldest_beyond_capacity() -> None:
    times = AppendTimes(capacity=2, resolution_ms=1)
    for i in range(1, 7):
        times.appended(i * 10, i)

    assert times.time_of(0) is None
    assert times.time_of(5) == 60
