"""Kiln's Prometheus metrics: one registry per Kiln app (several apps can share a test
process), the instruments the request path records into, and the collectors that read the
rest when scraped.

The request path pays a counter increment and up to two histogram observations per request
and two counter increments per partition appended (record counts come from batch headers),
all lock-free and well under a microsecond each (storage.observability.instruments); the
log queue is read from Redis at scrape time only, at most once per snapshot period.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.process_collector import ProcessCollector

from storage.errors import (
    BufferUnavailable,
    Fenced,
    HardenedStoreRejected,
    HardenedStoreUnavailable,
)
from storage.hardener import HardenerCounters
from storage.model import Reliability, StoredBatch
from storage.observability.buffer import BufferSnapshot
from storage.observability.collectors import (
    BufferCollector,
    DelayCollector,
    DelaySource,
    HardenerCollector,
)
from storage.observability.instruments import CounterFamily, HistogramFamily

# From an append answered in well under a millisecond to an assured ack held for the delay.
_REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0, 30.0, 60.0)
# Append -> in Kafka: the delay (seconds) plus the write, up to a long Kafka outage.
_HARDEN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                   900.0)


_LEVELS = {level: level.name.lower() for level in Reliability}


def _no_delays() -> dict[str, tuple[int, str]]:
    return {}


class KilnMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self._records_in = CounterFamily(
            "kiln_records_in", "Records appended to the log queue, by topic and reliability "
            "level", ["topic", "reliability"])
        self._bytes_in = CounterFamily(
            "kiln_bytes_in", "Record batch bytes appended to the log queue, by topic and "
            "reliability level", ["topic", "reliability"])
        self._produce_latency = HistogramFamily(
            "kiln_produce_latency_seconds", "Produce requests, from decoded to answered "
            "(acks=all: until hardened or delivered)", ["acks"], _REQUEST_BUCKETS)
        self._request_latency = HistogramFamily(
            "kiln_request_latency_seconds", "Client requests, from decoded to answered, by "
            "API", ["api"], _REQUEST_BUCKETS)
        self._requests = CounterFamily("kiln_requests", "Client requests by API", ["api"])
        self._connections = CounterFamily("kiln_connections_accepted",
                                          "Kafka client connections accepted")
        self._connections_open = Gauge("kiln_connections_open", "Kafka client connections open",
                                       registry=self.registry)
        self._malformed_frames = CounterFamily(
            "kiln_malformed_frames", "Connections closed for a frame Kiln could not take")
        self._malformed_frames.inc(0)  # exposed, as 0, before the first one
        self._harden_latency = HistogramFamily(
            "kiln_harden_latency_seconds", "From append to written to Kafka, one observation "
            "per client record batch", ["topic"], _HARDEN_BUCKETS)
        self._redis_errors = CounterFamily(
            "kiln_redis_errors", "Redis failures: requests answered with an error because "
            "Redis failed (source=request), buffer reads for a scrape (source=metrics)",
            ["source"])
        self._kafka_errors = CounterFamily(
            "kiln_kafka_errors", "Kafka failures that failed a client request "
            "(source=request); hardening failures are kiln_harden_errors_total", ["source"])
        self._transactions_ended = CounterFamily(
            "kiln_transactions_ended", "Kafka transactions ended by this node's coordinator, "
            "by result (commit, abort) and cause (end_txn: the producer's EndTxn; fenced: a "
            "new instance of the producer; timeout; resumed: a decision found half done)",
            ["result", "cause"])
        self.event_loop_lag = Gauge(
            "kiln_event_loop_lag_seconds", "How late the event loop last ran a timer",
            registry=self.registry)
        for family in (self._records_in, self._bytes_in, self._produce_latency,
                       self._request_latency, self._requests, self._connections,
                       self._malformed_frames, self._harden_latency, self._redis_errors,
                       self._kafka_errors, self._transactions_ended):
            self.registry.register(family)
        self._buffer: BufferSnapshot | None = None
        self._delays = DelayCollector(_no_delays)
        self.registry.register(self._delays)

    # --- recorded by the request path and the hardener ---------------------------------------

    def appended(self, topic: str, level: Reliability, records: int, size: int) -> None:
        key = (topic, _LEVELS[level])
        self._records_in.values[key] += records
        self._bytes_in.values[key] += size

    def connection_opened(self) -> None:
        self._connections.inc()
        self._connections_open.inc()

    def connection_closed(self) -> None:
        self._connections_open.dec()

    def malformed_frame(self) -> None:
        """A connection is closed for a frame Kiln could not take."""
        self._malformed_frames.inc()

    def requested(self, api: str) -> None:
        self._requests.inc(1, (api,))

    def answered(self, api: str, seconds: float) -> None:
        self._request_latency.child(api).observe(seconds)

    def produce_answered(self, acks: str, seconds: float) -> None:
        self._produce_latency.child(acks).observe(seconds)

    def hardened(self, topic: str, batches: Sequence[StoredBatch], now_ms: int) -> None:
        """HardenerCounters.on_written: `batches` were just written to Kafka."""
        histogram = self._harden_latency.child(topic)
        for batch in batches:
            histogram.observe(max(0, now_ms - batch.append_time_ms) / 1000)

    def transaction_ended(self, committed: bool, cause: str) -> None:
        self._transactions_ended.inc(1, ("commit" if committed else "abort", cause))

    def failed(self, exc: BaseException, source: str) -> None:
        """Count `exc` against the store it came from, if it is a storage failure."""
        if isinstance(exc, BufferUnavailable):
            self._redis_errors.inc(1, (source,))
        elif isinstance(exc, HardenedStoreUnavailable | HardenedStoreRejected | Fenced):
            self._kafka_errors.inc(1, (source,))

    # --- read at scrape time -----------------------------------------------------------------

    def value(self, name: str, **labels: str) -> float:
        """One sample's current value as scraped (0 while it has none), for tests and tools."""
        return self.registry.get_sample_value(name, labels) or 0.0

    def watch_hardener(self, counters: HardenerCounters) -> None:
        self.registry.register(HardenerCollector(counters))
        counters.on_written = self.hardened

    def watch_buffer(self, snapshot: BufferSnapshot) -> None:
        self._buffer = snapshot
        self.registry.register(BufferCollector(snapshot))

    def set_delay_source(self, source: DelaySource) -> None:
        """`source()` gives each topic's current delay (ms) and its binding constraint;
        called at every scrape (the delay controller can replace it at any time)."""
        self._delays.source = source

    async def render(self) -> bytes:
        """The exposition text; reads the log queue first (at most once per snapshot
        period). A Redis failure leaves the buffer metrics out and is counted."""
        if self._buffer is not None:
            try:
                await self._buffer.refresh()
            except BufferUnavailable as exc:
                self.failed(exc, "metrics")
        return generate_latest(self.registry)
