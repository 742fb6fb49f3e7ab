"""The adaptive delay on real services: it moves when its inputs move (a subscription
appears, deliveries are timed, senders are added, the consumer stops) and the hardener
follows it. Commits are reported to Kiln's Delivery directly, as the group coordinator does
after each OffsetCommit."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from cli.main import main
from storage.model import TopicPartition
from storage.policy.delay import Binding, DelayDecision
from tests.integration.test_produce_harden import read_hardened
from tests.kiln_harness import RunningKiln, fresh_kiln
from tests.raw_client import RawClient, record_batch

# Refresh period of the delay control (0.25 s) plus the subscription registry's cache (1 s).
_REFRESH_S = 1.5


@pytest.fixture
def adaptive_kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    with fresh_kiln(redis_url, kafka_bootstrap, delay_policy="adaptive",
                    harden_delay_ms=4_000, max_delay_ms=3_500, sender_budget_s=30) as running:
        yield running


def produce(kiln: RunningKiln, topic: str, count: int, client_id: str = "producer") -> int:
    """One batch of `count` records to partition 0; the offset after it."""
    with RawClient(kiln.bootstrap, client_id=client_id) as client:
        answer = client.produce(topic, 0, record_batch([b"v%d" % i for i in range(count)]))
    assert answer.error_code == 0
    return int(answer.base_offset) + count


def decision(kiln: RunningKiln, topic: str) -> DelayDecision:
    async def decide() -> DelayDecision:
        return kiln.app.delay.decision(topic, kiln.app.context.clock_ms())
    return kiln.call(decide())


def commit(kiln: RunningKiln, group: str, topic: str, offset: int) -> None:
    kiln.call(kiln.app.delivery.committed(group, {TopicPartition(topic, 0): offset},
                                          by_member=True))


def buffered(kiln: RunningKiln, topic: str) -> int:
    return kiln.call(kiln.app.queue.state(TopicPartition(topic, 0))).buffered_records


def subscribe(kiln: RunningKiln, topic: str, group: str) -> None:
    """Create `topic` and subscribe `group` to it; wait until the delay control saw it."""
    kiln.call(kiln.app.catalog.lookup(topic, allow_create=True))
    kiln.call(kiln.app.delivery.subscribe(topic, group))
    time.sleep(_REFRESH_S)


def test_unsubscribed_topic_hardens_at_once_subscribed_waits_for_delivery(
        adaptive_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str,
        redis_url: str) -> None:
    kiln = adaptive_kiln
    # Given a topic nobody subscribes to: nothing to wait for, hardened at once
    produce(kiln, unique_topic, 10)
    assert len(read_hardened(kafka_bootstrap, unique_topic, 0, 10, timeout_s=5)) == 10
    assert decision(kiln, unique_topic) == DelayDecision(0, Binding.NO_SUBSCRIPTIONS)

    # When a durable subscription appears, the next records wait the initial delay
    subscribed = unique_topic + "-subscribed"
    subscribe(kiln, subscribed, "readers")
    commit(kiln, "readers", subscribed, 0)
    end = produce(kiln, subscribed, 10)
    assert decision(kiln, subscribed) == DelayDecision(3_500, Binding.MAX_DELAY)
    time.sleep(1.0)
    assert buffered(kiln, subscribed) == 10

    # ... and once a delivery is timed, the delay follows the delivery latency
    commit(kiln, "readers", subscribed, end)
    timed = decision(kiln, subscribed)
    assert timed.binding is Binding.DELIVERY_LATENCY
    assert 1_000 < timed.delay_ms < 3_500
    assert buffered(kiln, subscribed) == 0
    assert read_hardened(kafka_bootstrap, subscribed, 0, 1, timeout_s=1) == []

    # `kiln delay explain` shows the same, from Redis
    time.sleep(1.2)
    result = CliRunner().invoke(main, ["delay", "explain", subscribed, "--json",
                                       "--redis-url", redis_url])
    assert result.exit_code == 0, result.output
    [report] = json.loads(result.output)
    assert report["binding"] == "delivery_latency"
    assert report["inputs"]["has_subscriptions"] is True
    assert report["inputs"]["delivery_latency_ms"] > 900
    assert {c["constraint"] for c in report["candidates"]} >= {
        "delivery_latency", "max_delay", "risk_bytes", "risk_records", "memory", "senders"}


def test_more_senders_shorten_the_delay(adaptive_kiln: RunningKiln, unique_topic: str) -> None:
    kiln = adaptive_kiln
    subscribe(kiln, unique_topic, "readers")
    commit(kiln, "readers", unique_topic, 0)
    end = produce(kiln, unique_topic, 5)
    time.sleep(2.0)
    commit(kiln, "readers", unique_topic, end)
    alone = decision(kiln, unique_topic)

    # When 30 more clients send (30 sender-seconds of budget: 1 s each for 31 senders)
    for i in range(30):
        end = produce(kiln, unique_topic, 1, client_id=f"sender-{i}")
    crowded = decision(kiln, unique_topic)

    assert alone.binding is Binding.DELIVERY_LATENCY
    assert alone.delay_ms > 2_000
    assert crowded == DelayDecision(30_000 // 31, Binding.SENDERS)


def test_a_stopped_consumer_lengthens_the_delay_and_the_hardener_follows(
        adaptive_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    kiln = adaptive_kiln
    subscribe(kiln, unique_topic, "readers")
    commit(kiln, "readers", unique_topic, 0)
    # Given a consumer that delivers within ~100 ms
    for _ in range(5):
        end = produce(kiln, unique_topic, 2)
        time.sleep(0.1)
        commit(kiln, "readers", unique_topic, end)
    steady = decision(kiln, unique_topic)
    assert steady.binding is Binding.DELIVERY_LATENCY
    assert steady.delay_ms < 600

    # When it stops, the waiting record lengthens the delay while it waits ...
    produced_at = time.monotonic()
    produce(kiln, unique_topic, 3)
    delays = []
    for _ in range(4):
        time.sleep(0.5)
        delays.append(decision(kiln, unique_topic).delay_ms)
    assert delays == sorted(delays)
    assert delays[0] > steady.delay_ms
    assert buffered(kiln, unique_topic) == 3  # well past the steady delay, not hardened

    # ... up to max_delay, when the hardener writes it
    records = read_hardened(kafka_bootstrap, unique_topic, 0, 3, timeout_s=10)
    hardened_after = time.monotonic() - produced_at
    assert [r.value for r in records] == [b"v0", b"v1", b"v2"]
    assert decision(kiln, unique_topic).binding is Binding.MAX_DELAY
    assert hardened_after >= 3.0
