"""Live signals the delay controller reads, kept in memory and I/O-free (the clock is an
argument everywhere), so the simulator in `bench/` drives the very same code with a virtual
clock.

- `RateWindow`: records or bytes per second over a short and a long window.
- `SenderWindow`: distinct sending clients seen within a window.
- `LatencySketch`: a decaying log-bucket histogram of delivery latency and its high quantile.
- `AppendTimes`: when each offset range of a partition was appended (to time deliveries).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Hashable


class RateWindow:
    """Amounts added per time bucket, summed over the last `long_ms` (and `short_ms`).
    Both sums are kept up to date as buckets age out, so reading a rate is O(1)."""

    __slots__ = ("_bucket_ms", "_buckets", "_head", "_long_total", "_short_buckets",
                 "_short_total")

    def __init__(self, bucket_ms: int = 100, short_ms: int = 1_000, long_ms: int = 10_000
                 ) -> None:
        if bucket_ms <= 0 or short_ms < bucket_ms or long_ms < short_ms:
            raise ValueError("need 0 < bucket_ms <= short_ms <= long_ms")
        self._bucket_ms = bucket_ms
        self._short_buckets = short_ms // bucket_ms
        self._buckets = [0.0] * (long_ms // bucket_ms)
        self._head = -1  # index (time // bucket_ms) of the newest bucket
        self._long_total = 0.0
        self._short_total = 0.0

    def add(self, now_ms: int, amount: float) -> None:
        if now_ms // self._bucket_ms != self._head:
            self._advance(now_ms)
        self._buckets[self._head % len(self._buckets)] += amount
        self._long_total += amount
        self._short_total += amount

    def per_second(self, now_ms: int) -> tuple[float, float]:
        """(rate over the short window, rate over the long window), per second."""
        self._advance(now_ms)
        return (max(0.0, self._short_total) * 1000 / (self._short_buckets * self._bucket_ms),
                max(0.0, self._long_total) * 1000 / (len(self._buckets) * self._bucket_ms))

    def peak_per_second(self, now_ms: int) -> float:
        """The higher of the two rates: reacts to a burst at once, forgets it slowly."""
        short, long = self.per_second(now_ms)
        return max(short, long)

    def _advance(self, now_ms: int) -> None:
        index = now_ms // self._bucket_ms
        if self._head < 0:
            self._head = index
            return
        if index <= self._head:
            return
        buckets = self._buckets
        size = len(buckets)
        short = self._short_buckets
        head = self._head
        for i in range(head + 1, min(index, head + size) + 1):
            if i - head <= short:  # bucket i - short leaves the short window
                self._short_total -= buckets[(i - short) % size]
            slot = i % size
            self._long_total -= buckets[slot]
            buckets[slot] = 0.0
        if index - head >= short:
            self._short_total = 0.0
        if index - head >= size:
            self._long_total = 0.0
        self._head = index


class SenderWindow:
    """How many distinct senders were seen in the last `window_ms`."""

    __slots__ = ("_last_seen", "_pruned_at", "_window_ms")

    def __init__(self, window_ms: int = 10_000) -> None:
        self._window_ms = window_ms
        self._last_seen: dict[Hashable, int] = {}
        self._pruned_at = 0

    def seen(self, now_ms: int, sender: Hashable) -> None:
        self._last_seen[sender] = now_ms

    def count(self, now_ms: int) -> int:
        if now_ms - self._pruned_at >= self._window_ms // 10:
            horizon = now_ms - self._window_ms
            self._last_seen = {s: t for s, t in self._last_seen.items() if t > horizon}
            self._pruned_at = now_ms
        return len(self._last_seen)


class LatencySketch:
    """A histogram of latencies in buckets growing by `ratio`, whose weights halve every
    `half_life_ms`, so a high quantile follows the recent past. Adding is O(1) plus a
    quantile refresh that scans down from the highest bucket ever used (a high quantile is
    a few buckets below it); reading the quantile is O(1)."""

    __slots__ = ("_counts", "_decayed_at", "_half_life_ms", "_log_ratio", "_quantile",
                 "_top", "_total", "_value_ms", "weight")

    def __init__(self, quantile: float = 0.999, ratio: float = 1.1,
                 max_ms: float = 3_600_000, half_life_ms: int = 60_000) -> None:
        if not 0 < quantile <= 1:
            raise ValueError(f"quantile must be in (0, 1], got {quantile}")
        self._quantile = quantile
        self._log_ratio = math.log(ratio)
        self._counts = [0.0] * (int(math.log(max_ms) / self._log_ratio) + 2)
        self._top = 0  # every bucket above this one is empty
        self._half_life_ms = half_life_ms
        self._decayed_at: int | None = None
        self._total = 0.0
        self._value_ms: float | None = None
        self.weight = 0.0  # samples counted, after decay

    @property
    def value_ms(self) -> float | None:
        """The configured quantile (each bucket's upper bound); None before any sample."""
        return self._value_ms

    def add(self, now_ms: int, latency_ms: float, weight: float = 1.0) -> None:
        self._decay(now_ms)
        index = 0 if latency_ms < 1 else min(len(self._counts) - 1,
                                             int(math.log(latency_ms) / self._log_ratio) + 1)
        self._counts[index] += weight
        if index > self._top:
            self._top = index
        self._total += weight
        self._refresh()

    def decay(self, now_ms: int) -> None:
        self._decay(now_ms)
        self._refresh()

    def _decay(self, now_ms: int) -> None:
        if self._decayed_at is None:
            self._decayed_at = now_ms
            return
        halvings = (now_ms - self._decayed_at) // self._half_life_ms
        if halvings <= 0:
            return
        factor = 0.5 ** min(halvings, 64)
        self._counts = [c * factor for c in self._counts]
        self._total *= factor
        self._decayed_at += halvings * self._half_life_ms

    def _refresh(self) -> None:
        self.weight = self._total
        if self._total < 1e-6:
            self._value_ms = None
            return
        allowed_above = self._total * (1 - self._quantile)
        above = 0.0
        for index in range(self._top, -1, -1):
            above += self._counts[index]
            if above > allowed_above + 1e-9:
                self._value_ms = math.exp(index * self._log_ratio) if index else 1.0
                return
        self._value_ms = 1.0


class AppendTimes:
    """When each offset of a partition was appended, at `resolution_ms`, for the last
    `capacity` distinct instants or more: enough to time a delivery from its offsets."""

    __slots__ = ("_capacity", "_ends", "_forgot", "_resolution_ms", "_times")

    def __init__(self, capacity: int = 65_536, resolution_ms: int = 10) -> None:
        self._capacity = capacity
        self._resolution_ms = resolution_ms
        self._ends: list[int] = []   # offsets below this one were appended ...
        self._times: list[int] = []  # ... by this instant
        self._forgot = False

    def appended(self, now_ms: int, next_offset: int) -> None:
        """Offsets below `next_offset` have been appended by `now_ms`."""
        if self._ends and next_offset <= self._ends[-1]:
            return  # a concurrent append finished later; its range is already timed
        if self._times and now_ms - self._times[-1] < self._resolution_ms:
            self._ends[-1] = next_offset
            return
        self._ends.append(next_offset)
        self._times.append(now_ms)
        if len(self._ends) > 2 * self._capacity:
            del self._ends[:self._capacity]
            del self._times[:self._capacity]
            self._forgot = True

    def time_of(self, offset: int) -> int | None:
        """The instant `offset` was appended (at the resolution); None if unknown here."""
        index = bisect_right(self._ends, offset)
        if index >= len(self._ends) or (index == 0 and self._forgot):
            return None
        return self._times[index]
