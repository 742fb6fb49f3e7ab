"""Write avoidance with real consumer groups: each client's commits through Kiln make the
records delivered, so they leave the log queue without ever being written to Kafka.
Run with kafka-python, aiokafka and confluent-kafka."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from storage.model import TopicPartition
from tests.compat.consumers import CONSUMERS, Consumed, open_consumer
from tests.compat.test_consumers import produce
from tests.integration.test_produce_harden import read_hardened
from tests.kiln_harness import RunningKiln, fresh_kiln

DELAY_MS = 60_000  # never expires during a test: only delivery or a flush moves records


@pytest.fixture
def kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=DELAY_MS,
                    group_initial_rebalance_delay_ms=100,
                    group_min_session_timeout_ms=1000) as running:
        yield running


def read_until(consumer: object, count: int, timeout_s: float = 30) -> list[Consumed]:
    records: list[Consumed] = []
    deadline = time.monotonic() + timeout_s
    while len(records) < count and time.monotonic() < deadline:
        records.extend(consumer.poll(0.5))  # type: ignore[attr-defined]
    return records


@pytest.mark.parametrize("client", list(CONSUMERS))
def test_records_a_group_has_committed_never_reach_kafka(
        client: str, kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given 300 records in Kiln and a consumer group reading them
    produce(kiln.bootstrap, unique_topic, [b"v%d" % i for i in range(300)])
    consumer = open_consumer(client, kiln.bootstrap, group=f"readers-{client}")
    consumer.subscribe(unique_topic)

    # When it has read and committed everything, and the rest is hardened
    records = read_until(consumer, 300)
    committed = consumer.commit()
    consumer.close()
    flushed = kiln.flush()
    state = kiln.call(kiln.app.queue.state(TopicPartition(unique_topic, 0)))

    # Then it read every record once, in order, and none was written to Kafka
    assert committed
    assert [r.offset for r in records] == list(range(300))
    assert [r.value for r in records] == [b"v%d" % i for i in range(300)]
    assert flushed
    assert (state.delivered_records, state.hardened_records) == (300, 0)
    assert read_hardened(kafka_bootstrap, unique_topic, 0, 0, timeout_s=1) == []


@pytest.mark.parametrize("client", list(CONSUMERS))
def test_a_group_away_longer_than_the_delay_reads_on_through_kafka(
        client: str, kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a group that read and committed the first 100 records, then stopped
    produce(kiln.bootstrap, unique_topic, [b"v%d" % i for i in range(100)])
    group = f"away-{client}"
    first = open_consumer(client, kiln.bootstrap, group=group)
    first.subscribe(unique_topic)
    early = read_until(first, 100)
    assert first.commit()
    first.close()

    # When 200 more are produced and hardened while it is away, then 50 more stay hot
    produce(kiln.bootstrap, unique_topic, [b"v%d" % i for i in range(100, 300)])
    assert kiln.flush()
    produce(kiln.bootstrap, unique_topic, [b"v%d" % i for i in range(300, 350)])
    back = open_consumer(client, kiln.bootstrap, group=group)
    back.subscribe(unique_topic)
    later = read_until(back, 250)
    extra = back.poll(1.0)
    back.close()

    # Then it reads one continuous log from its commit: 200 from Kafka, 50 from Redis,
    # in order, once; and Kafka holds only what it missed
    assert [r.offset for r in early] == list(range(100))
    assert [r.offset for r in later] == list(range(100, 350))
    assert [r.value for r in later] == [b"v%d" % i for i in range(100, 350)]
    assert extra == []
    hardened = read_hardened(kafka_bootstrap, unique_topic, 0, 200)
    assert [r.value for r in hardened] == [b"v%d" % i for i in range(100, 300)]
