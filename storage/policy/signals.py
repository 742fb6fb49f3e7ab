"""Live signals the delay controller reads, kept in memory and I/O-free (the clock is an
argument everywhere), so the simulator in `bench/` drives the very same code with a virtual
clock.

- `IngressRates`: records and bytes per second over a short and a long window.
- `SenderWindow`: distinct sending clients seen within a window.
- `LatencySketch`: a decaying log-bucket histogram of delivery latency and its high quantile.
- `AppendTimes`: when each offset range of a partition was appended (to time deliveries).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Hashable


class IngressRates:
    """Records and bytes added per time bucket, summed over the last `long_ms` (and
    `short_ms`). The sums are kept up to date as buckets age out, so reading a rate is O(1);
    records and bytes share their buckets, as every append brings both.

    Reading moves the window to the reader's bucket (`head`), as adding does: rates read
    again with the same `head` and nothing added in between are the same rates."""

    __slots__ = ("_bytes", "_long_bytes", "_long_records", "_long_span_ms", "_records",
                 "_short_buckets", "_short_bytes", "_short_records", "_short_span_ms",
                 "bucket_ms", "head")

    def __init__(self, bucket_ms: int = 100, short_ms: int = 1_000, long_ms: int = 10_000
                 ) -> None:
        if bucket_ms <= 0 or short_ms < bucket_ms or long_ms < short_ms:
            raise ValueError("need 0 < bucket_ms <= short_ms <= long_ms")
        self.bucket_ms = bucket_ms
        self._short_buckets = short_ms // bucket_ms
        self._records = [0.0] * (long_ms // bucket_ms)
        self._bytes = [0.0] * (long_ms // bucket_ms)
        self._short_span_ms = self._short_buckets * bucket_ms
        self._long_span_ms = len(self._records) * bucket_ms
        self.head = -1  # index (time // bucket_ms) of the newest bucket
        self._short_records = self._long_records = 0.0
        self._short_bytes = self._long_bytes = 0.0

    def add(self, now_ms: int, records: float, nbytes: float) -> None:
        if now_ms // self.bucket_ms != self.head:
            self._advance(now_ms)
        slot = self.head % len(self._records)
        self._records[slot] += records
        self._long_records += records
        self._short_records += records
        self._bytes[slot] += nbytes
        self._long_bytes += nbytes
        self._short_bytes += nbytes

    def records_per_second(self, now_ms: int) -> tuple[float, float]:
        """(records/s over the short window, over the long window)."""
        self._advance(now_ms)
        return self._rates(self._short_records, self._long_records)

    def bytes_per_second(self, now_ms: int) -> tuple[float, float]:
        """(bytes/s over the short window, over the long window)."""
        self._advance(now_ms)
        return self._rates(self._short_bytes, self._long_bytes)

    def peaks(self, now_ms: int) -> tuple[float, float]:
        """(bytes/s, records/s), each the higher of its two windows: a burst is felt at once
        and forgotten slowly."""
        self._advance(now_ms)
        return (max(self._rates(self._short_bytes, self._long_bytes)),
                max(self._rates(self._short_records, self._long_records)))

    def _rates(self, short_total: float, long_total: float) -> tuple[float, float]:
        return (max(0.0, short_total) * 1000 / self._short_span_ms,
                max(0.0, long_total) * 1000 / self._long_span_ms)

    def _advance(self, now_ms: int) -> None:
        index = now_ms // self.bucket_ms
        if self.head < 0:
            self.head = index
            return
        if index <= self.head:
            return
        records, nbytes = self._records, self._bytes
        size = len(records)
        short = self._short_buckets
        head = self.head
        for i in range(head + 1, min(index, head + size) + 1):
            if i - head <= short:  # bucket i - short leaves the short window
                leaving = (i - short) % size
                self._short_records -= records[leaving]
                self._short_bytes -= nbytes[leaving]
            slot = i % size
            self._long_records -= records[slot]
            self._long_bytes -= nbytes[slot]
            records[slot] = nbytes[slot] = 0.0
        if index - head >= short:
            self._short_records = self._short_bytes = 0.0
        if index - head >= size:
            self._long_records = self._long_bytes = 0.0
        self.head = index


class SenderWindow:
    """How many distinct senders were seen in the last `window_ms`. Silent senders are
    forgotten when counting, at most every tenth of the window (`next_prune_ms`): until then
    the count changes only as senders are seen."""

    __slots__ = ("_last_seen", "_window_ms", "next_prune_ms")

    def __init__(self, window_ms: int = 10_000) -> None:
        self._window_ms = window_ms
        self._last_seen: dict[Hashable, int] = {}
        self.next_prune_ms = window_ms // 10

    def seen(self, now_ms: int, sender: Hashable) -> None:
        self._last_seen[sender] = now_ms

    def count(self, now_ms: int) -> int:
        if now_ms >= self.next_prune_ms:
            horizon = now_ms - self._window_ms
            self._last_seen = {s: t for s, t in self._last_seen.items() if t > horizon}
            self.next_prune_ms = now_ms + self._window_ms // 10
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
        self._put(latency_ms, weight)
        self._refresh()

    def add_two(self, now_ms: int, first_ms: float, second_ms: float, weight: float) -> None:
        """Two samples, one quantile refresh: what `add` twice leaves, at half the cost."""
        self._decay(now_ms)
        self._put(first_ms, weight)
        self._put(second_ms, weight)
        self._refresh()

    def _put(self, latency_ms: float, weight: float) -> None:
        index = 0 if latency_ms < 1 else min(len(self._counts) - 1,
                                             int(math.log(latency_ms) / self._log_ratio) + 1)
        self._counts[index] += weight
        if index > self._top:
            self._top = index
        self._total += weight

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
