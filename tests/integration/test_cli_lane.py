"""`kiln transactions lane`: what an operator sees of the hardening lane, through Redis only,
while a committed transaction waits in the log queue and after `kiln flush` hardened it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.test_cli import run_kiln
from tests.kiln_harness import RunningKiln, fresh_kiln

# Kiln's delay never expires during a test: only `kiln flush` hardens.
HARDEN_DELAY_MS = 30 * 60 * 1000
TOPIC_PARTITIONS = 3
TOUCHED = (0, 1)  # the partitions the transaction has records in
COLUMNS = ("LANE", "NODE", "PARTITIONS", "AWAITING", "ASSURED_AWAITING", "LAGGING")


@pytest.fixture
def lane_kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=HARDEN_DELAY_MS) as running:
        yield running


def commit_transaction(kiln: RunningKiln, topic: str) -> None:
    """One committed transaction with records in TOUCHED of a topic capped at
    reliable_persistent: not assured, so its commit does not wait for the lane."""
    admin = AdminClient({"bootstrap.servers": kiln.bootstrap})
    admin.create_topics([NewTopic(topic, TOPIC_PARTITIONS, 1, config={
        "kiln.max.reliability": "reliable_persistent"})])[topic].result(60)
    producer = confluent_kafka.Producer({"bootstrap.servers": kiln.bootstrap,
                                         "transactional.id": f"lane-{topic}"})
    producer.init_transactions(60)
    producer.begin_transaction()
    for partition in TOUCHED:
        producer.produce(topic, b"v%d" % partition, partition=partition)
    producer.commit_transaction(60)


def lane_row(redis_url: str, ready: Callable[[dict[str, Any]], bool],
             timeout_s: float = 60) -> dict[str, Any]:
    """The lane's row once `ready` holds, or the last one read: the lane takes its lease,
    and a commit is listed, a moment after Kiln answered."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = run_kiln("transactions", "lane", "--json", "--redis-url", redis_url,
                          timeout=60)
        assert result.returncode == 0, result.stderr
        rows: list[dict[str, Any]] = json.loads(result.stdout)
        [row] = rows
        if ready(row) or time.monotonic() > deadline:
            return row
        time.sleep(0.2)


def test_lane_shows_a_commit_it_has_not_hardened(lane_kiln: RunningKiln, redis_url: str,
                                                 unique_topic: str) -> None:
    commit_transaction(lane_kiln, unique_topic)

    row = lane_row(redis_url, lambda r: r["node"] is not None and r["awaiting"] == 1)

    assert row == {"lane": "default", "node": lane_kiln.app.node_id,
                   "partitions": len(TOUCHED), "awaiting": 1, "assured_awaiting": 0,
                   "lagging": len(TOUCHED)}


def test_lane_awaits_nothing_once_flushed(lane_kiln: RunningKiln, redis_url: str,
                                          unique_topic: str) -> None:
    commit_transaction(lane_kiln, unique_topic)
    assert lane_row(redis_url, lambda r: r["awaiting"] == 1)["awaiting"] == 1

    flushed = run_kiln("flush", unique_topic, "--timeout", "90", "--redis-url", redis_url,
                       timeout=120)

    assert flushed.returncode == 0, flushed.stderr
    # The lane forgets what it decided just after the hardened marks advance.
    row = lane_row(redis_url, lambda r: r["awaiting"] == 0 and r["lagging"] == 0)
    assert row == {"lane": "default", "node": lane_kiln.app.node_id,
                   "partitions": len(TOUCHED), "awaiting": 0, "assured_awaiting": 0,
                   "lagging": 0}


def test_lane_table_names_its_columns(lane_kiln: RunningKiln, redis_url: str,
                                      unique_topic: str) -> None:
    commit_transaction(lane_kiln, unique_topic)
    lane_row(redis_url, lambda r: r["node"] is not None and r["awaiting"] == 1)

    result = run_kiln("transactions", "lane", "--redis-url", redis_url, timeout=60)

    assert result.returncode == 0, result.stderr
    header, line = result.stdout.splitlines()
    assert header.split() == list(COLUMNS)
    assert line.split() == ["default", str(lane_kiln.app.node_id), str(len(TOUCHED)), "1",
                            "0", str(len(TOUCHED))]
