"""Kiln on a real Redis Cluster (three masters, each with a replica, made by `redis-cli
--cluster create`; cli/local_redis_cluster.py), as DESIGN.md's log queue is meant to run at
scale:

- three Kiln nodes on the cluster serve an ordinary client's produce and group consume on
  every partition, harden everything once, and their keys are spread over all masters;
  the CLI reads the cluster too (`kiln nodes`, `kiln delay explain`, whose reports are
  found by SCAN over every master);
- a master SIGKILLed while one producer per reliability level writes (its replica takes
  over): what each level's acknowledged records survive, as the Sentinel failover test
  counts it (an assured record is never lost);
- a master SIGKILLed under three `kiln serve` nodes and an idempotent acks=all producer
  over six partitions: every acknowledged record once, in order, in Kafka;
- the integration tests of the log queue, groups, delivery, hardening and topic admin,
  run again in a session whose Redis is the cluster.

Every script and transaction Kiln runs must keep to one hash slot: the cluster refuses any
that does not (CROSSSLOT), so every test here would fail on one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from cli.local_redis_cluster import LocalRedisCluster
from cli.local_services import LocalRedis
from cli.main import main
from storage.log_queue import partition_key
from storage.model import TopicPartition
from tests.cluster.conftest import running_nodes
from tests.cluster.takeover_support import (
    PARTITIONS,
    SpreadLoop,
    assert_nothing_lost_or_duplicated,
    read_topic,
    running_cluster,
)
from tests.cluster.test_clients import produce_to_every_node_and_read_through_a_group
from tests.cluster.test_clients import topic as topic
from tests.conftest import _unavailable
from tests.faults.test_redis_durability import LEVELS, levels_through_a_fault, write_result
from tests.kiln_harness import RunningKiln, eventually

WARM_UP_ACKS = 600
AFTER_FAULT_S = 3
HARDENED_WITHIN_S = 60


def start_redis_cluster() -> LocalRedisCluster:
    cluster = LocalRedisCluster()
    try:
        return cluster.start()
    except Exception as exc:
        _unavailable("Redis Cluster (local redis-server, redis-cli)", str(exc))


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    """A Redis Cluster for the tests that do not kill its servers."""
    cluster = start_redis_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def kiln_on_redis_cluster(redis_cluster: LocalRedisCluster,
                          kafka_bootstrap: str) -> Iterator[list[RunningKiln]]:
    """Three in-process Kiln nodes on the (emptied) Redis Cluster, by node id."""
    with running_nodes(redis_cluster.url, kafka_bootstrap) as nodes:
        yield nodes


def keys_per_master(cluster: LocalRedisCluster) -> dict[int, int]:
    masters = {n.port for n in cluster.nodes() if n.master}
    return {port: int(redis.Redis(port=port).dbsize()) for port in sorted(masters)}


def master_of_most(cluster: LocalRedisCluster, keys: list[str]) -> LocalRedis:
    """The master of the slots of most of `keys`."""
    masters = Counter(cluster.master_of(key).port for key in keys)
    return cluster.server_at(masters.most_common(1)[0][0])


def test_kiln_nodes_on_a_redis_cluster_serve_a_client_and_spread_their_keys_over_every_master(
        kiln_on_redis_cluster: list[RunningKiln], redis_cluster: LocalRedisCluster,
        kafka_bootstrap: str, topic: str) -> None:
    # Given three Kiln nodes on a Redis Cluster of three masters
    # When kafka-python, given one node, produces to every partition of a 12-partition
    # topic, and a member of a group coordinated by another node reads them and commits
    # Then (asserted inside) every record is read once, in order, the commits are the ends,
    # and Kafka holds every record once after hardening
    produce_to_every_node_and_read_through_a_group(kiln_on_redis_cluster, kafka_bootstrap,
                                                   topic, "kafka-python")

    # and every master holds some of Kiln's keys
    spread = keys_per_master(redis_cluster)
    assert len(spread) == 3 and all(n > 0 for n in spread.values()), spread
    # and the CLI, given the cluster, lists the nodes and the delay decisions of the topic
    runner = CliRunner()
    listed = runner.invoke(main, ["nodes", "--json", "--redis-url", redis_cluster.url])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)
    assert sorted(r["node_id"] for r in rows if r["state"] == "live") == [
        k.app.node_id for k in kiln_on_redis_cluster]
    assert sum(r["partitions"] for r in rows) >= 12
    explained = runner.invoke(main, ["delay", "explain", topic, "--json",
                                     "--redis-url", redis_cluster.url])
    assert explained.exit_code == 0, explained.output
    assert {r["topic"] for r in json.loads(explained.output)} == {topic}


def level_topics_on_one_master(cluster: LocalRedisCluster, prefix: str) -> str:
    """A topic prefix whose per-level topics' partitions (as levels_through_a_fault names
    them) all live on one master, so that killing it strikes every level."""
    for attempt in range(5000):
        candidate = f"{prefix}-{attempt}"
        keys = [partition_key(TopicPartition(f"{candidate}-{level}", 0), "log")
                for level in LEVELS]
        if len({cluster.master_of(key).port for key in keys}) == 1:
            return candidate
    raise AssertionError("no prefix found")  # (1/3)^4 per attempt: never


def test_what_each_level_survives_a_redis_cluster_master_failover(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    # Given a Redis Cluster whose replicas are in sync, and one topic per level whose
    # partition lives on one master
    cluster = start_redis_cluster()
    try:
        prefix = level_topics_on_one_master(cluster, unique_topic)
        victim = cluster.master_of(partition_key(
            TopicPartition(f"{prefix}-assured_persistent", 0), "log"))

        def kill_master() -> None:
            victim.kill()

        # When that master is SIGKILLed while a producer per level writes through Kiln, and
        # its replica takes over
        rows = levels_through_a_fault(cluster.url, kafka_bootstrap, prefix, kill_master)
        promoted = cluster.master_of(partition_key(
            TopicPartition(f"{prefix}-assured_persistent", 0), "log"))
    finally:
        cluster.stop()
    write_result(tmp_path, "redis-cluster-failover", ["--cluster-enabled", "yes"], rows)

    # Then another server is the master of those slots, an assured record is never lost,
    # and every level was answered again after the failover
    assert promoted.port != victim.port
    assert {row["level"]: row["lost"] for row in rows}["assured_persistent"] == 0
    assert all(row["acknowledged_after_kill"] > 0 for row in rows), rows


def test_a_redis_master_killed_under_a_kiln_cluster_loses_and_duplicates_nothing(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    cluster_of_redis = start_redis_cluster()
    topic = f"t-{uuid.uuid4().hex[:8]}"
    try:
        with running_cluster(cluster_of_redis.url, kafka_bootstrap, tmp_path) as kiln:
            # Given three `kiln serve` nodes on a Redis Cluster, a six-partition topic and
            # an idempotent acks=all producer writing to every partition through all three
            kiln.create_topic(topic)
            victim = master_of_most(cluster_of_redis, [
                partition_key(TopicPartition(topic, p), "log") for p in range(PARTITIONS)])
            producer = SpreadLoop(kiln.bootstrap, topic)
            producer.start()
            try:
                assert producer.wait_for_acks(WARM_UP_ACKS, 30, fail_fast=True), (
                    f"nothing delivered: {producer.error}\n{kiln.log_tails()}")

                # When the Redis master of most of its partitions is killed -9 mid-stream,
                # its replica takes over, and the producer goes on
                killed_at = time.monotonic()
                victim.kill()
                sent_at_kill = producer.sent
                cluster_of_redis.wait_healthy(30)
                failover_s = time.monotonic() - killed_at
                acked_at_failover = producer.deliveries.counts()[0]
                assert producer.wait_for_acks(acked_at_failover + WARM_UP_ACKS, 60), (
                    f"no progress after the failover:\n{kiln.log_tails()}")
                time.sleep(AFTER_FAULT_S)
            finally:
                undelivered = producer.stop(flush_timeout_s=60)
            hardened_in_time = eventually(lambda: kiln.hardened_everything(topic),
                                          HARDENED_WITHIN_S)
            logs = kiln.log_tails()
        hardened = read_topic(kafka_bootstrap, topic)
    finally:
        cluster_of_redis.stop()

    # Then Kafka holds every record once, in send order per partition, at the offset its
    # producer was told (increasing: a partition the failed master held starts again in
    # Redis past the fencing marker Kiln writes to Kafka first, one offset per restart)
    skipped = {p: records[-1].kiln_offset + 1 - len(records) for p, records in hardened.items()
               if records}
    print(f"failover took {failover_s:.2f} s; sent {producer.sent}, {sent_at_kill} before "
          f"the kill; Kiln offsets skipped per partition {skipped}")
    assert producer.sent > sent_at_kill > WARM_UP_ACKS
    assert_nothing_lost_or_duplicated(producer, undelivered, hardened_in_time, hardened, logs,
                                      consecutive=False)
    assert hardened[0][0].kiln_offset == 0 and all(n <= 3 for n in skipped.values()), skipped


# The integration modules that exercise the log queue's scripts, the group store, delivery,
# hardening, deletion, the CLI, transactions and their hardening: run again, unchanged, with
# the Redis Cluster as the session's Redis (and this session's Kafka).
ON_REDIS_CLUSTER = [
    "tests/integration/test_produce_harden.py",
    "tests/integration/test_produce_validation.py",
    "tests/integration/test_log_queue_promises.py",
    "tests/integration/test_fetch_hot.py",
    "tests/integration/test_read_answers.py",
    "tests/integration/test_read_through.py",
    "tests/integration/test_groups.py",
    "tests/integration/test_delivery.py",
    "tests/integration/test_nonpersistent_held.py",
    "tests/integration/test_topic_admin.py",
    "tests/integration/test_cli_flush_drain.py",
    "tests/integration/test_transactions.py",
    "tests/integration/test_hardening_lane.py",
]


@pytest.mark.timeout(1800)
def test_the_integration_tests_of_the_log_queue_pass_on_a_redis_cluster(
        redis_cluster: LocalRedisCluster, kafka_bootstrap: str) -> None:
    # Given the Redis Cluster and this session's Kafka as the services of a test session
    env = {**os.environ, "KILN_TEST_REDIS_URL": redis_cluster.url,
           "KILN_TEST_KAFKA_BOOTSTRAP": kafka_bootstrap, "KILN_REQUIRE_SERVICES": "1"}
    # When the integration modules run in it
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          *ON_REDIS_CLUSTER], cwd=Path(__file__).parents[2], env=env,
                         capture_output=True, text=True, timeout=1700, check=False)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr
    print(f"on the Redis Cluster: {summary}")

    # Then every test passed (the ones that need a relay in front of a Kafka this session
    # started skip there: they run in the main session)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
