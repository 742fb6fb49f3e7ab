"""Metrics and readiness without a network: what is rendered from what was recorded, the
at-risk rule per topic policy, and readiness checks, timeouts and caching."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from storage.errors import BufferUnavailable, HardenedStoreUnavailable
from storage.hardener import HardenerCounters
from storage.log_queue import PartitionState
from storage.model import Reliability, StoredBatch
from storage.observability.buffer import at_risk_share, topic_buffer
from storage.observability.metrics import KilnMetrics
from storage.observability.readiness import Readiness
from storage.topics import HardenPolicy, TopicConfig


def samples(metrics: KilnMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = asyncio.run(metrics.render()).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_appends_are_counted_per_topic_and_level() -> None:
    metrics = KilnMetrics()

    metrics.appended("orders", Reliability.RELIABLE_PERSISTENT, 10, 1000)
    metrics.appended("orders", Reliability.RELIABLE_PERSISTENT, 5, 400)
    metrics.appended("orders", Reliability.BEST_EFFORT, 1, 70)

    got = samples(metrics)
    rp = (("reliability", "reliable_persistent"), ("topic", "orders"))
    assert got[("kiln_records_in_total", rp)] == 15
    assert got[("kiln_bytes_in_total", rp)] == 1400
    assert got[("kiln_records_in_total", (("reliability", "best_effort"),
                                          ("topic", "orders")))] == 1


def test_hardener_counters_and_write_latencies_are_read_from_the_hardener() -> None:
    metrics = KilnMetrics()
    counters = HardenerCounters(records_hardened=7, bytes_hardened=900, batches_written=2,
                                errors=1, per_topic_records={"orders": 7})
    metrics.watch_hardener(counters)
    assert counters.on_written is not None

    counters.on_written("orders", [batch(appended_ms=1_000), batch(appended_ms=2_500)], 3_000)

    got = samples(metrics)
    assert got[("kiln_hardened_records_total", (("topic", "orders"),))] == 7
    assert got[("kiln_hardened_bytes_total", ())] == 900
    assert got[("kiln_harden_errors_total", ())] == 1
    topic = (("topic", "orders"),)
    assert got[("kiln_harden_latency_seconds_count", topic)] == 2
    assert got[("kiln_harden_latency_seconds_sum", topic)] == 2.5
    assert got[("kiln_harden_latency_seconds_bucket", (("le", "0.5"), ("topic", "orders")))] == 1


def test_the_delay_source_gives_each_topic_its_delay_and_binding_constraint() -> None:
    metrics = KilnMetrics()

    metrics.set_delay_source(lambda: {"orders": (2_000, "fixed"), "audit": (0, "no_subscriptions")})

    got = samples(metrics)
    assert got[("kiln_harden_delay_seconds", (("topic", "orders"),))] == 2.0
    assert got[("kiln_harden_delay_seconds", (("topic", "audit"),))] == 0.0
    assert got[("kiln_harden_delay_binding", (("constraint", "fixed"), ("topic", "orders")))] == 1
    assert got[("kiln_harden_delay_binding",
                (("constraint", "no_subscriptions"), ("topic", "audit")))] == 1


def test_storage_failures_are_counted_against_their_store() -> None:
    metrics = KilnMetrics()

    metrics.failed(BufferUnavailable("down"), "request")
    metrics.failed(HardenedStoreUnavailable("down"), "request")
    metrics.failed(HardenedStoreUnavailable("down"), "request")
    metrics.failed(ValueError("not a store"), "request")

    got = samples(metrics)
    assert got[("kiln_redis_errors_total", (("source", "request"),))] == 1
    assert got[("kiln_kafka_errors_total", (("source", "request"),))] == 2


def test_two_apps_in_one_process_have_registries_of_their_own() -> None:
    first, second = KilnMetrics(), KilnMetrics()

    first.appended("orders", Reliability.EXPRESS, 3, 30)

    assert ("kiln_records_in_total", (("reliability", "express"), ("topic", "orders"))) \
        not in samples(second)


# --- at risk: buffered records Kiln has promised to harden ---------------------------------


def config(**changes: Any) -> TopicConfig:
    return dataclasses.replace(TopicConfig("orders", 2, str(uuid.UUID(int=1))), **changes)


@pytest.mark.parametrize(("changes", "at_risk"), [
    ({}, True),  # reliable_persistent, producers may ask assured
    ({"reliability": Reliability.EXPRESS, "producer_override": False}, False),
    ({"reliability": Reliability.EXPRESS,
      "max_reliability": Reliability.RELIABLE_NONPERSISTENT}, False),
    ({"reliability": Reliability.EXPRESS}, True),  # acks=all raises it: an upper bound
    ({"harden": HardenPolicy.NEVER}, False),
    ({"harden": HardenPolicy.ALL}, True),
])
def test_at_risk_follows_the_levels_a_topic_can_get(changes: dict[str, Any],
                                                     at_risk: bool) -> None:
    assert at_risk_share(config(**changes)) is at_risk


def test_a_topic_buffer_sums_its_partitions() -> None:
    states = [PartitionState(next_offset=10, hardened_offset=4, buffered_bytes=600,
                             buffered_records=6, delivered_records=2, delivered_bytes=200),
              PartitionState(next_offset=0, hardened_offset=0, buffered_bytes=0,
                             buffered_records=0)]

    got = topic_buffer(config(), states, [9_000, None], now_ms=10_000)

    assert (got.records, got.bytes, got.oldest_age_ms) == (6, 600, 1_000)
    assert (got.at_risk_records, got.at_risk_bytes) == (6, 600)
    assert (got.delivered_records, got.delivered_bytes) == (2, 200)


# --- readiness -------------------------------------------------------------------------------


def counting(outcome: Callable[[], None] | None = None, sleep_s: float = 0.0
             ) -> tuple[list[int], Callable[[], Awaitable[None]]]:
    calls: list[int] = []

    async def check() -> None:
        calls.append(1)
        await asyncio.sleep(sleep_s)
        if outcome is not None:
            outcome()
    return calls, check


def kafka_down() -> None:
    raise HardenedStoreUnavailable("cannot connect to 127.0.0.1:9093")


def test_readiness_names_the_store_that_fails() -> None:
    _, redis_ok = counting()
    _, kafka = counting(kafka_down)
    readiness = Readiness({"redis": redis_ok, "kafka": kafka})

    report = asyncio.run(readiness.report())

    assert not report.ready
    assert report.failures == {
        "kafka": "hardened store unavailable: cannot connect to 127.0.0.1:9093"}


def test_a_store_that_does_not_answer_in_time_is_not_ready() -> None:
    _, slow = counting(sleep_s=5)
    readiness = Readiness({"kafka": slow}, timeout_s=0.05)

    report = asyncio.run(readiness.report())

    assert report.failures == {"kafka": "no answer within 0.05s"}


def test_answers_are_reused_for_the_cache_period() -> None:
    now = [100.0]
    calls, check = counting()
    readiness = Readiness({"redis": check}, cache_s=1.0,
                          monotonic=lambda: now[0])

    async def probes() -> None:
        await asyncio.gather(*(readiness.report() for _ in range(5)))  # concurrent: one check
        now[0] = 100.5
        await readiness.report()  # cached
        now[0] = 101.5
        await readiness.report()  # expired: checked again

    asyncio.run(probes())

    assert len(calls) == 2


def batch(appended_ms: int) -> StoredBatch:
    return StoredBatch(base_offset=0, record_count=1, append_time_ms=appended_ms,
                       reliability=Reliability.RELIABLE_PERSISTENT, data=b"")
