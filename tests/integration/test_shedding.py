"""Under memory pressure the levels that promise nothing past a crash give their room up, in
order: best_effort first, then express; reliable and persistent records are never shed."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from storage.model import TopicPartition
from tests.kiln_harness import RunningKiln, eventually, fresh_kiln
from tests.raw_client import RawClient, record_batch

KB = 1024
BUDGET = 2000 * KB
VALUE = b"v" * (100 * KB)


@pytest.fixture
def small_kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=600_000,
                    buffer_budget_bytes=BUDGET) as running:
        yield running


def create(bootstrap: str, topic: str, level: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, 1, 1, config={"kiln.reliability": level})])
    for future in futures.values():
        future.result(30)


def buffered(kiln: RunningKiln, topic: str) -> int:
    return kiln.call(kiln.app.queue.state(TopicPartition(topic, 0))).buffered_records



def produce(client: RawClient, topic: str, records: int) -> None:
    for _ in range(records):
        assert client.produce(topic, 0, record_batch([VALUE])).error_code == 0


def test_best_effort_then_express_are_shed_as_the_buffer_fills(
        small_kiln: RunningKiln, unique_topic: str) -> None:
    kiln = small_kiln
    reliable, express, best_effort = (f"{unique_topic}-{level}" for level in
                                      ("reliable", "express", "best-effort"))
    create(kiln.bootstrap, reliable, "reliable_persistent")
    create(kiln.bootstrap, express, "express")
    create(kiln.bootstrap, best_effort, "best_effort")
    with RawClient(kiln.bootstrap) as client:
        # Given a buffer 85 % full: 12 reliable, 3 express and 2 best_effort records of 100 KB
        produce(client, reliable, 12)
        produce(client, express, 3)
        produce(client, best_effort, 2)

        # Then the best_effort records are dropped long before their delay, nothing else
        best_effort_shed = eventually(lambda: buffered(kiln, best_effort) == 0)
        time.sleep(1.5)
        after_first = (buffered(kiln, reliable), buffered(kiln, express))

        # When 3 more reliable records fill it to 90 %
        produce(client, reliable, 3)

        # Then the express records go too, and the reliable ones all stay
        express_shed = eventually(lambda: buffered(kiln, express) == 0)
        time.sleep(1.5)
        reliable_left = buffered(kiln, reliable)

    assert best_effort_shed
    assert after_first == (12, 3)
    assert express_shed
    assert reliable_left == 15
