"""Metrics of the Kafka-facing edge: request latency per API (and per acks for Produce),
and a collector over the counters connections and dispatch already keep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.context import ServerCounters
from storage.observability.metrics import KilnMetrics
from wire.apis import ApiKey, Request

# Kafka's own names (as in its RequestMetrics): API_VERSIONS -> ApiVersions.
API_LABELS = {key.name: key.name.title().replace("_", "") for key in ApiKey}
_ACKS_LABELS = {0: "0", 1: "1", -1: "all"}


def observe_request(metrics: KilnMetrics, request: Request,
                    answer: asyncio.Future[bytes | None], started: float) -> None:
    """Observe the request's latency when `answer` is ready (later, for deferred answers);
    an answer cancelled because its connection closed is not observed."""
    api = API_LABELS[request.spec.api_key.name]
    acks = (_ACKS_LABELS.get(request.body.acks, "invalid")
            if request.spec.api_key == ApiKey.PRODUCE else None)

    def done(future: asyncio.Future[bytes | None]) -> None:
        if future.cancelled():
            return
        elapsed = time.perf_counter() - started
        metrics.answered(api, elapsed)
        if acks is not None:
            metrics.produce_answered(acks, elapsed)

    if answer.done():
        done(answer)
    else:
        answer.add_done_callback(done)


class ServerCountersCollector(Collector):
    def __init__(self, counters: ServerCounters) -> None:
        self._counters = counters

    def collect(self) -> Iterator[Metric]:
        c = self._counters
        requests = CounterMetricFamily("kiln_requests", "Client requests by API",
                                       labels=["api"])
        for name, count in sorted(c.requests_by_api.items()):
            requests.add_metric([API_LABELS.get(name, name)], count)
        yield requests
        yield GaugeMetricFamily("kiln_connections_open", "Kafka client connections open",
                                value=c.connections)
        yield CounterMetricFamily("kiln_malformed_frames",
                                  "Connections closed for a frame Kiln could not take",
                                  value=c.malformed_frames)
