"""Metrics of the Kafka-facing edge: Kafka's API names as labels, and request latency per
API (and per acks for Produce)."""

from __future__ import annotations

import asyncio
import time

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
