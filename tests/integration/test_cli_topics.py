"""`kiln topics list|create|describe|alter` against a deployment's Redis and Kafka, as an
operator runs them (the `kiln` executable, real services)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from storage import redis_pool
from storage.model import Reliability, TopicPartition
from storage.topics import CACHE_TTL_S, TopicRegistry
from tests.integration.test_cli import run_kiln
from tests.kiln_harness import RunningKiln


def stores(redis_url: str, kafka_bootstrap: str) -> list[str]:
    return ["--redis-url", redis_url, "--kafka-bootstrap", kafka_bootstrap]


def kafka_partitions(bootstrap: str, topic: str) -> int | None:
    """The partition count of the Kafka topic; None when Kafka has no such topic (asked
    without the auto-creation a consumer's metadata request may cause)."""
    with KafkaAdminClient(bootstrap_servers=bootstrap) as admin:
        if topic not in admin.list_topics():
            return None
        [described] = admin.describe_topics([topic])
        return len(described["partitions"])


def produce(kiln: RunningKiln, topic: str, per_partition: dict[int, int]) -> None:
    producer = KafkaProducer(bootstrap_servers=kiln.bootstrap, acks=1)
    for partition, count in per_partition.items():
        for i in range(count):
            producer.send(topic, value=b"v%d" % i, partition=partition).get(timeout=10)
    producer.close()


def test_create_makes_the_topic_in_kafka_and_kiln_with_its_policies(
        redis_client: redis.Redis, redis_url: str, kafka_bootstrap: str,
        unique_topic: str) -> None:
    # When the operator creates a topic with 3 partitions and every policy set
    created = run_kiln("topics", "create", unique_topic, "--partitions", "3",
                       "--reliability", "express", "--max-reliability", "reliable_persistent",
                       "--no-producer-override", "--harden", "all", "--no-auto-subscribe",
                       "--topic-config", "retention.ms=86400000", "--json",
                       *stores(redis_url, kafka_bootstrap))

    # Then Kafka has it with the same partitions, and Kiln with the policies
    assert created.returncode == 0, created.stderr
    row = json.loads(created.stdout)
    assert {k: v for k, v in row.items() if k != "topic_id"} == {
        "name": unique_topic, "partitions": 3, "reliability": "express",
        "max_reliability": "reliable_persistent", "producer_override": False,
        "harden": "all", "auto_subscribe": False, "buffered": None, "subscriptions": None}
    assert kafka_partitions(kafka_bootstrap, unique_topic) == 3
    stored = json.loads(redis_client.hget("kiln:topics", unique_topic) or b"{}")
    assert (stored["partitions"], stored["reliability"], stored["harden"],
            stored["topic_id"]) == (3, "express", "all", row["topic_id"])


def test_create_takes_default_partitions_and_prints_a_table(
        redis_client: redis.Redis, redis_url: str, kafka_bootstrap: str,
        unique_topic: str) -> None:
    created = run_kiln("topics", "create", unique_topic, *stores(redis_url, kafka_bootstrap),
                       env={"KILN_DEFAULT_PARTITIONS": "2"})

    assert created.returncode == 0, created.stderr
    lines = created.stdout.splitlines()
    assert lines[0] == f"created topic {unique_topic} with 2 partition(s) in Kafka and Kiln"
    assert lines[1].split() == ["NAME", "PARTITIONS", "RELIABILITY", "MAX_RELIABILITY",
                                "PRODUCER_OVERRIDE", "HARDEN", "AUTO_SUBSCRIBE"]
    assert lines[2].split() == [unique_topic, "2", "reliable_persistent",
                                "assured_persistent", "true", "survivors", "true"]
    assert kafka_partitions(kafka_bootstrap, unique_topic) == 2


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--reliability", "sometimes"], 1,
     "kiln.reliability: unknown reliability 'sometimes' (one of best_effort, express, "
     "reliable_nonpersistent, reliable_persistent, assured_persistent)"),
    (["--harden", "later"], 1,
     "kiln.harden: unknown harden policy 'later' (one of survivors, all, never)"),
    (["--reliability", "assured_persistent", "--max-reliability", "express"], 1,
     "kiln.reliability assured_persistent is above kiln.max.reliability express"),
    (["-c", "kiln.auto.subscribe=maybe"], 1,
     "kiln.auto.subscribe: expected true or false, got 'maybe'"),
    (["-c", "kiln.colour=red"], 1, "unknown topic config 'kiln.colour'"),
    (["-c", "retention.ms"], 2, "--topic-config: expected KEY=VALUE, got 'retention.ms'"),
    (["-c", "kiln.harden=never", "--harden", "all"], 2,
     "kiln.harden given twice, as never and all"),
    (["--partitions", "0"], 1, "0 partitions: a topic needs at least one"),
])
def test_a_bad_value_is_named_and_nothing_is_created(
        redis_client: redis.Redis, redis_url: str, kafka_bootstrap: str, unique_topic: str,
        args: list[str], code: int, message: str) -> None:
    result = run_kiln("topics", "create", unique_topic, *args,
                      *stores(redis_url, kafka_bootstrap))

    assert (result.returncode, result.stdout) == (code, "")
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert redis_client.hget("kiln:topics", unique_topic) is None
    assert kafka_partitions(kafka_bootstrap, unique_topic) is None


def test_an_existing_topic_is_an_error_unless_if_not_exists(
        redis_client: redis.Redis, redis_url: str, kafka_bootstrap: str,
        unique_topic: str) -> None:
    # Given a topic created with 2 partitions
    first = run_kiln("topics", "create", unique_topic, "--partitions", "2",
                     *stores(redis_url, kafka_bootstrap))

    # When it is created again, plainly and with --if-not-exists
    again = run_kiln("topics", "create", unique_topic, "--partitions", "4",
                     *stores(redis_url, kafka_bootstrap))
    tolerated = run_kiln("topics", "create", unique_topic, "--if-not-exists", "--harden",
                         "never", *stores(redis_url, kafka_bootstrap))

    # Then the first is refused, the second says so, and the topic is as it was
    assert first.returncode == 0, first.stderr
    assert again.returncode == 1
    assert f"topic '{unique_topic}' already exists" in again.stderr
    assert tolerated.returncode == 0
    assert f"topic {unique_topic} already exists; left unchanged" in tolerated.stdout
    stored = json.loads(redis_client.hget("kiln:topics", unique_topic) or b"{}")
    assert (stored["partitions"], stored["harden"]) == (2, "survivors")


def test_a_topic_only_kafka_has_is_adopted_not_created_again(
        redis_client: redis.Redis, redis_url: str, kafka_bootstrap: str,
        unique_topic: str) -> None:
    # Given a Kafka topic with 2 partitions and 3 records that Kiln has never seen
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(unique_topic, 2, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks=1)
    for i in range(3):
        producer.send(unique_topic, value=b"old-%d" % i, partition=0).get(timeout=10)
    producer.close()

    # When the operator creates it through Kiln
    result = run_kiln("topics", "create", unique_topic, "--partitions", "5",
                      *stores(redis_url, kafka_bootstrap))
    described = run_kiln("topics", "describe", unique_topic, "--json",
                         *stores(redis_url, kafka_bootstrap))

    # Then it is refused as existing, and Kiln adopted it: Kafka's partitions, and Kiln
    # offsets that continue after the records Kafka holds
    assert result.returncode == 1
    assert (f"topic '{unique_topic}' already exists in Kafka (2 partitions); Kiln has "
            "adopted it") in result.stderr
    topic = json.loads(described.stdout)
    assert topic["partitions"] == 2
    assert [(p["partition"], p["next"], p["kafka_end"]) for p in topic["partition_states"]] == [
        (0, 3, 3), (1, 0, 0)]


def test_unreachable_kafka_is_a_clear_error_and_creates_nothing(
        redis_client: redis.Redis, redis_url: str, unique_topic: str) -> None:
    result = run_kiln("topics", "create", unique_topic, "--redis-url", redis_url,
                      "--kafka-bootstrap", "127.0.0.1:1")

    assert result.returncode == 1
    assert "cannot reach Kafka at 127.0.0.1:1" in result.stderr
    assert "Traceback" not in result.stderr
    assert redis_client.hget("kiln:topics", unique_topic) is None


def test_list_shows_policies_buffered_records_and_subscriptions(
        slow_kiln: RunningKiln, redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given two topics: one with 3 + 2 records buffered and a durable subscription
    other = unique_topic + "-b"
    for name, harden in ((unique_topic, "all"), (other, "never")):
        created = run_kiln("topics", "create", name, "--partitions", "2", "--harden", harden,
                           *stores(redis_url, kafka_bootstrap))
        assert created.returncode == 0, created.stderr
    produce(slow_kiln, unique_topic, {0: 3, 1: 2})
    slow_kiln.call(slow_kiln.app.delivery.subscribe(unique_topic, "billing"))

    # When the operator lists them
    listed = run_kiln("topics", "list", "--json", "--redis-url", redis_url)
    table = run_kiln("topics", "list", "--redis-url", redis_url)

    # Then both show, with their policies and what is buffered (the running Kiln may also
    # have adopted other tests' topics from the session's Kafka)
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert {unique_topic, other} <= set(rows)
    assert (rows[unique_topic]["harden"], rows[unique_topic]["buffered"],
            rows[unique_topic]["subscriptions"]) == ("all", 5, 1)
    assert (rows[other]["harden"], rows[other]["buffered"],
            rows[other]["subscriptions"]) == ("never", 0, 0)
    assert set(rows[other]) == {"name", "topic_id", "partitions", "reliability",
                                "max_reliability", "producer_override", "harden",
                                "auto_subscribe", "buffered", "subscriptions"}
    lines = [line.split() for line in table.stdout.splitlines()]
    assert lines[0] == ["NAME", "PARTITIONS", "RELIABILITY", "MAX_RELIABILITY",
                        "PRODUCER_OVERRIDE", "HARDEN", "AUTO_SUBSCRIBE", "BUFFERED",
                        "SUBSCRIPTIONS"]
    assert [unique_topic, "2", "reliable_persistent", "assured_persistent", "true", "all",
            "true", "5", "1"] in lines


def test_list_of_an_empty_deployment(redis_client: redis.Redis, redis_url: str) -> None:
    table = run_kiln("topics", "list", "--redis-url", redis_url)
    listed = run_kiln("topics", "list", "--json", "--redis-url", redis_url)

    assert (table.returncode, table.stdout) == (0, "no topics\n")
    assert json.loads(listed.stdout) == []


def test_describe_shows_each_partition_in_both_tiers_and_the_subscriptions(
        slow_kiln: RunningKiln, redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given 4 records hardened and 2 more buffered in partition 0, 1 in partition 1, and a
    # durable subscription that committed 1 of partition 0
    created = run_kiln("topics", "create", unique_topic, "--partitions", "2",
                       *stores(redis_url, kafka_bootstrap))
    assert created.returncode == 0, created.stderr
    produce(slow_kiln, unique_topic, {0: 4})
    assert slow_kiln.flush()
    produce(slow_kiln, unique_topic, {0: 2, 1: 1})
    slow_kiln.call(slow_kiln.app.delivery.committed(
        "billing", {TopicPartition(unique_topic, 0): 5}, by_member=True))

    # When the operator describes the topic
    described = run_kiln("topics", "describe", unique_topic, "--json",
                         *stores(redis_url, kafka_bootstrap))
    table = run_kiln("topics", "describe", unique_topic, *stores(redis_url, kafka_bootstrap))

    # Then every partition shows its marks, what is buffered and Kafka's end offset
    assert described.returncode == 0, described.stderr
    topic = json.loads(described.stdout)
    assert (topic["name"], topic["partitions"], topic["reliability"], topic["harden"],
            topic["buffered"], topic["subscriptions"]) == (
        unique_topic, 2, "reliable_persistent", "survivors", 2, 1)
    assert topic["kafka"] == {"reachable": True, "partitions": 2, "error": None}
    # (offset 4 was delivered, and dropped, by the commit at 5)
    assert [(p["partition"], p["next"], p["hardened"], p["delivered"], p["buffered"],
             p["kafka_end"]) for p in topic["partition_states"]] == [
        (0, 6, 4, 5, 1, 4), (1, 1, 0, 0, 1, 0)]
    assert [(s["group"], s["source"], s["lag"]) for s in topic["durable_subscriptions"]] == [
        ("billing", "auto", 1)]
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["name:", unique_topic]
    assert "kafka:             2 partition(s)" in lines
    assert ["PARTITION", "NEXT", "HARDENED", "DELIVERED", "BUFFERED", "BYTES", "OLDEST_S",
            "KAFKA_END"] in [line.split() for line in lines]
    assert ["GROUP", "SOURCE", "SINCE", "COMMITTED", "LAG"] in [line.split() for line in lines]


def test_describe_without_kafka_still_shows_kiln(
        slow_kiln: RunningKiln, redis_url: str, unique_topic: str) -> None:
    produce(slow_kiln, unique_topic, {0: 2})

    described = run_kiln("topics", "describe", unique_topic, "--json", "--redis-url",
                         redis_url, "--kafka-bootstrap", "127.0.0.1:1")

    assert described.returncode == 0, described.stderr
    topic = json.loads(described.stdout)
    assert topic["kafka"]["reachable"] is False
    assert "cannot connect to 127.0.0.1:1" in topic["kafka"]["error"]
    assert [(p["buffered"], p["kafka_end"]) for p in topic["partition_states"]] == [(2, None)]


def test_describe_of_an_unknown_topic(redis_client: redis.Redis, redis_url: str) -> None:
    result = run_kiln("topics", "describe", "no-such-topic", "--redis-url", redis_url)

    assert result.returncode == 1
    assert "unknown topic 'no-such-topic'" in result.stderr


def test_alter_is_applied_by_a_running_kiln_within_the_cache_time(
        slow_kiln: RunningKiln, redis_url: str, unique_topic: str) -> None:
    # Given a topic whose records are buffered as reliable_persistent
    produce(slow_kiln, unique_topic, {0: 1})

    # When the operator makes express the topic's level
    altered = run_kiln("topics", "alter", unique_topic, "--reliability", "express",
                       "--harden", "never", "--redis-url", redis_url)
    time.sleep(CACHE_TTL_S + 0.2)
    produce(slow_kiln, unique_topic, {0: 1})

    # Then it says what changed, and the running Kiln stores the next record as express
    assert altered.returncode == 0, altered.stderr
    lines = altered.stdout.splitlines()
    assert lines[:4] == ["kiln.harden: survivors -> never",
                         "kiln.max.reliability: assured_persistent -> reliable_nonpersistent",
                         "kiln.reliability: reliable_persistent -> express",
                         "running Kiln processes apply it within 1 s"]
    batches = slow_kiln.call(
        slow_kiln.app.queue.read(TopicPartition(unique_topic, 0), 1 << 20)).batches
    assert [b.reliability for b in batches] == [Reliability.RELIABLE_PERSISTENT,
                                                Reliability.EXPRESS]


def test_a_registry_that_cached_a_topic_sees_an_alter_within_its_ttl(
        redis_client: redis.Redis, redis_url: str, kafka_bootstrap: str,
        unique_topic: str) -> None:
    # Given a registry (as in a running Kiln) that has the topic cached
    created = run_kiln("topics", "create", unique_topic, *stores(redis_url, kafka_bootstrap))
    assert created.returncode == 0, created.stderr

    async def harden_policy(registry: TopicRegistry) -> str:
        config = await registry.get(unique_topic)
        assert config is not None
        return config.harden.value

    async def seen_before_and_after_alter() -> tuple[str, str]:
        client = redis_pool.connect(redis_url, max_connections=2)
        registry = TopicRegistry(client, ttl_s=0.3)
        try:
            before = await harden_policy(registry)
            # When the operator alters it, and the registry is asked again after its TTL
            altered = run_kiln("topics", "alter", unique_topic, "--harden", "all",
                               "--redis-url", redis_url)
            assert altered.returncode == 0, altered.stderr
            await asyncio.sleep(0.4)
            return before, await harden_policy(registry)
        finally:
            await redis_pool.close(client)

    before, after = asyncio.run(seen_before_and_after_alter())

    # Then it serves the new policy
    assert (before, after) == ("survivors", "all")


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--reliability", "sometimes"], 1, "kiln.reliability: unknown reliability 'sometimes'"),
    (["--max-reliability", "best_effort"], 1,
     "kiln.reliability reliable_persistent is above kiln.max.reliability best_effort"),
    (["--partitions", "1"], 1, "Topic already has 1 partition(s)."),
    (["--partitions", "4", "--harden", "later"], 1,
     "kiln.harden: unknown harden policy 'later'"),
    ([], 2, "nothing to change: give one or more of --reliability, --max-reliability, "
            "--producer-override, --harden, --auto-subscribe, --partitions"),
])
def test_a_refused_alter_names_the_problem_and_changes_nothing(
        redis_client: redis.Redis, redis_url: str, kafka_bootstrap: str, unique_topic: str,
        args: list[str], code: int, message: str) -> None:
    created = run_kiln("topics", "create", unique_topic, "--partitions", "1",
                       *stores(redis_url, kafka_bootstrap))
    assert created.returncode == 0, created.stderr
    before = redis_client.hget("kiln:topics", unique_topic)

    result = run_kiln("topics", "alter", unique_topic, *args,
                      *stores(redis_url, kafka_bootstrap))

    assert result.returncode == code
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert redis_client.hget("kiln:topics", unique_topic) == before
    assert kafka_partitions(kafka_bootstrap, unique_topic) == 1


def test_alter_of_an_unknown_topic(redis_client: redis.Redis, redis_url: str) -> None:
    result = run_kiln("topics", "alter", "no-such-topic", "--harden", "all",
                      "--redis-url", redis_url)

    assert result.returncode == 1
    assert "unknown topic 'no-such-topic'" in result.stderr
    assert redis_client.hget("kiln:topics", "no-such-topic") is None


def test_alter_partitions_adds_them_in_kafka_and_kiln(
        redis_client: redis.Redis, redis_url: str, kafka_bootstrap: str,
        unique_topic: str) -> None:
    # Given a topic with 2 partitions
    created = run_kiln("topics", "create", unique_topic, "--partitions", "2",
                       *stores(redis_url, kafka_bootstrap))
    assert created.returncode == 0, created.stderr

    # When the operator grows it to 5
    altered = run_kiln("topics", "alter", unique_topic, "--partitions", "5",
                       *stores(redis_url, kafka_bootstrap))

    # Then it says so, and Kafka and Kiln both have 5, the new ones started at offset 0
    assert altered.returncode == 0, altered.stderr
    assert altered.stdout.splitlines()[0] == "partitions: 2 -> 5 (in Kafka and Kiln)"
    assert kafka_partitions(kafka_bootstrap, unique_topic) == 5
    stored = json.loads(redis_client.hget("kiln:topics", unique_topic) or b"{}")
    assert stored["partitions"] == 5
    assert [redis_client.hget(f"kiln:{{{unique_topic}/{p}}}:meta", "next")
            for p in range(2, 5)] == [b"0", b"0", b"0"]


def test_delete_removes_the_topic_and_what_kiln_buffered_for_it(
        slow_kiln: RunningKiln, redis_client: redis.Redis, redis_url: str,
        kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a 2-partition topic with 3 + 1 records buffered and a durable subscription
    created = run_kiln("topics", "create", unique_topic, "--partitions", "2",
                       *stores(redis_url, kafka_bootstrap))
    assert created.returncode == 0, created.stderr
    produce(slow_kiln, unique_topic, {0: 3, 1: 1})
    slow_kiln.call(slow_kiln.app.delivery.subscribe(unique_topic, "billing"))

    # When the operator deletes it (and then again)
    deleted = run_kiln("topics", "delete", unique_topic, "--json",
                       *stores(redis_url, kafka_bootstrap))
    again = run_kiln("topics", "delete", unique_topic, *stores(redis_url, kafka_bootstrap))

    # Then it reports what went, Kafka and Redis hold nothing of it, and the second
    # deletion names the topic as unknown
    assert deleted.returncode == 0, deleted.stderr
    assert json.loads(deleted.stdout) == {
        "name": unique_topic, "partitions": 2, "in_kiln": True, "in_kafka": True,
        "buffered_records": 4, "durable_subscriptions": ["billing"]}
    assert kafka_partitions(kafka_bootstrap, unique_topic) is None
    assert list(redis_client.scan_iter(f"kiln:{{{unique_topic}/*")) == []
    assert redis_client.hget("kiln:topics", unique_topic) is None
    assert redis_client.hget("kiln:subscriptions", f"{unique_topic}/billing") is None
    assert again.returncode == 1
    assert f"unknown topic '{unique_topic}': neither Kiln nor Kafka has it" in again.stderr
