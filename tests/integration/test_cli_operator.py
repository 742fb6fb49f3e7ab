"""`kiln subscriptions` and `kiln status` against a deployment's Redis, as an operator runs
them."""

from __future__ import annotations

import json

from kafka import KafkaProducer

from storage.model import TopicPartition
from tests.integration.test_cli import run_kiln
from tests.kiln_harness import RunningKiln, fresh_kiln


def test_add_list_and_remove_a_durable_subscription(
        kiln: RunningKiln, redis_url: str, unique_topic: str) -> None:
    # Given a topic with 12 records, of which group "billing" committed 5
    producer = KafkaProducer(bootstrap_servers=kiln.bootstrap, acks=1)
    for i in range(12):
        producer.send(unique_topic, value=b"%d" % i, partition=0)
    producer.flush()
    producer.close()

    # When the operator registers it, lists, and removes it
    added = run_kiln("subscriptions", "add", unique_topic, "billing", "--redis-url", redis_url)
    kiln.call(kiln.app.delivery.committed("billing", {TopicPartition(unique_topic, 0): 5},
                                          by_member=True))
    listed = run_kiln("subscriptions", "list", unique_topic, "--json",
                      "--redis-url", redis_url)
    table = run_kiln("subscriptions", "list", "--redis-url", redis_url)
    removed = run_kiln("subscriptions", "remove", unique_topic, "billing",
                       "--redis-url", redis_url)
    again = run_kiln("subscriptions", "remove", unique_topic, "billing",
                     "--redis-url", redis_url)

    # Then each step says what happened, and the listing shows the group's lag
    assert added.returncode == 0, added.stderr
    assert "billing is now a durable subscription" in added.stdout
    rows = json.loads(listed.stdout)
    assert [(r["topic"], r["group"], r["source"], r["lag"]) for r in rows] == [
        (unique_topic, "billing", "operator", 7)]
    assert table.stdout.splitlines()[0].split() == ["TOPIC", "GROUP", "SOURCE", "SINCE",
                                                    "COMMITTED", "LAG"]
    assert removed.returncode == 0 and "no longer" in removed.stdout
    assert again.returncode == 1
    assert "billing is not a durable subscription" in again.stderr


def test_unknown_topic_and_unreachable_redis_are_clear_errors(redis_url: str) -> None:
    unknown = run_kiln("subscriptions", "add", "no-such-topic", "g", "--redis-url", redis_url)
    unreachable = run_kiln("subscriptions", "list", "--redis-url", "redis://127.0.0.1:1/0")

    assert unknown.returncode == 1
    assert "unknown topic 'no-such-topic'" in unknown.stderr
    assert unreachable.returncode == 1
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in unreachable.stderr


def test_status_shows_what_was_dropped_as_delivered_and_what_was_written(
        redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given 10 records, one batch each, of which a durable subscription committed 4
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=60_000) as kiln:
        producer = KafkaProducer(bootstrap_servers=kiln.bootstrap, acks=1)
        for i in range(10):
            producer.send(unique_topic, value=b"%d" % i, partition=0).get(timeout=10)
        producer.close()
        kiln.call(kiln.app.delivery.committed("billing", {TopicPartition(unique_topic, 0): 4},
                                              by_member=True))
        before = run_kiln("status", unique_topic, "--json", "--redis-url", redis_url)

        # When the rest is hardened
        assert kiln.flush()
        after = run_kiln("status", unique_topic, "--json", "--redis-url", redis_url)
        table = run_kiln("status", "--redis-url", redis_url)
        unknown = run_kiln("status", "no-such-topic", "--redis-url", redis_url)

    # Then status tells both moments apart, per partition
    [row] = json.loads(before.stdout)
    assert (row["next"], row["delivered"], row["buffered"], row["dropped"], row["written"],
            row["subscriptions"]) == (10, 4, 6, 4, 0, 1)
    assert row["oldest_s"] is not None
    [row] = json.loads(after.stdout)
    assert (row["hardened"], row["buffered"], row["bytes"], row["dropped"], row["written"],
            row["avoided"], row["oldest_s"]) == (10, 0, 0, 4, 6, "40.0%", None)
    assert table.stdout.split()[:3] == ["TOPIC", "PARTITION", "NEXT"]
    assert unknown.returncode == 1 and "unknown topic 'no-such-topic'" in unknown.stderr
