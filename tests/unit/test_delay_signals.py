"""The live signals the delay controller reads, with a literal clock."""

from __future__ import annotations

import pytest

from storage.policy.signals import AppendTimes, LatencySketch, RateWindow, SenderWindow


def test_rate_window_short_and_long_rates() -> None:
    rates = RateWindow(bucket_ms=100, short_ms=1_000, long_ms=10_000)
    for t in range(0, 10_000, 100):
        rates.add(t, 100)  # 1000/s for 10 s

    short, long = rates.per_second(9_999)
    assert short == pytest.approx(1_000)
    assert long == pytest.approx(1_000)


def test_rate_window_feels_a_burst_at_once_and_forgets_it_slowly() -> None:
    rates = RateWindow(bucket_ms=100, short_ms=1_000, long_ms=10_000)
    for t in range(0, 1_000, 100):
        rates.add(t, 1_000)  # 10 000/s for one second

    assert rates.peak_per_second(999) == pytest.approx(10_000)
    assert rates.peak_per_second(5_000) == pytest.approx(1_000)  # 10 000 over 10 s
    assert rates.peak_per_second(11_000) == 0


def test_rate_window_skips_a_long_silence() -> None:
    rates = RateWindow()
    rates.add(0, 500)
    rates.add(3_600_000, 100)

    assert rates.per_second(3_600_000)[1] == pytest.approx(10)


def test_sender_window_forgets_silent_senders() -> None:
    senders = SenderWindow(window_ms=10_000)
    senders.seen(0, "a")
    senders.seen(5_000, "b")
    senders.seen(5_000, "b")

    assert senders.count(5_000) == 2
    assert senders.count(12_000) == 1
    assert senders.count(20_000) == 0


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
