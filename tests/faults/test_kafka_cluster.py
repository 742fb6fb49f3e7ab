"""Kafka itself breaks under Kiln: a three-broker KRaft cluster (topics replicated three
ways, min.insync.replicas 2) loses the leader of the partition Kiln is hardening, and later
every broker at once; each comes back on what it wrote to disk. Producers write through Kiln
all along; afterwards the hardened topic must hold every acknowledged record once, in order
(DESIGN §6: "Kafka unreachable ... no acknowledged record lost").
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator

import pytest

from cli.local_kafka import LocalKafka, LocalKafkaCluster, start_together
from storage.kafka.client import KafkaClient
from tests.faults.records import ProducerLoop, read_partition
from tests.faults.test_kill9 import PRODUCER_MODES, assert_exactly_once_in_order
from tests.kiln_harness import RunningKiln, fresh_kiln


@pytest.fixture(scope="module")
def kafka_cluster() -> Iterator[LocalKafkaCluster]:
    cluster = LocalKafkaCluster(3).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def partition_leader(cluster: LocalKafkaCluster, topic: str) -> LocalKafka:
    async def ask() -> int:
        client = KafkaClient(cluster.bootstrap, client_id="kiln-test")
        await client.start()
        try:
            meta = await client.metadata([topic])
            return meta.topics[topic].partitions[0].leader_id
        finally:
            await client.close()

    leader = asyncio.run(ask())
    return next(node for node in cluster.nodes if node.node_id == leader)


@pytest.fixture
def kiln_on_cluster(redis_url: str, kafka_cluster: LocalKafkaCluster
                    ) -> Iterator[RunningKiln]:
    with fresh_kiln(redis_url, kafka_cluster.bootstrap, harden_delay_ms=200) as running:
        yield running


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", list(PRODUCER_MODES))
def test_losing_the_partition_leader_mid_hardening_loses_and_duplicates_nothing(
        kiln_on_cluster: RunningKiln, kafka_cluster: LocalKafkaCluster, unique_topic: str,
        rng: random.Random, mode: str) -> None:
    kiln = kiln_on_cluster
    # Given a producer writing through Kiln, whose records are hardened as they come
    producer = ProducerLoop({"bootstrap.servers": kiln.bootstrap, **PRODUCER_MODES[mode]},
                            unique_topic, rate=1000)
    producer.start()
    try:
        assert producer.wait_for_acks(500, 30, fail_fast=True), producer.deliveries.failed
        leader = partition_leader(kafka_cluster, unique_topic)

        # When the partition's leader is SIGKILLed mid-stream, stays away a while, and
        # comes back on its disk
        time.sleep(rng.uniform(0.0, 1.0))
        leader.kill()
        acked_at_kill = producer.deliveries.counts()[0]
        time.sleep(rng.uniform(3.0, 6.0))
        leader.start()
        assert producer.wait_for_acks(acked_at_kill + 1000, 60), "no progress after"
    finally:
        undelivered = producer.stop(flush_timeout_s=120)
    assert kiln.flush(timeout_s=60)

    # Then every acknowledged record is in Kafka once, in order
    hardened = read_partition(kafka_cluster.bootstrap, unique_topic, timeout_s=60)
    print(f"leader {leader.node_id} killed after {acked_at_kill} acks; sent {producer.sent}, "
          f"acked {len(producer.deliveries.acked)}, hardened {len(hardened)}")
    assert undelivered == 0
    assert_exactly_once_in_order(hardened, producer.deliveries, producer.sent,
                                 idempotent=mode == "idempotent-acks-all")


@pytest.mark.timeout(300)
def test_every_broker_restarting_at_once_mid_hardening_loses_and_duplicates_nothing(
        kiln_on_cluster: RunningKiln, kafka_cluster: LocalKafkaCluster, unique_topic: str
        ) -> None:
    kiln = kiln_on_cluster
    # Given an idempotent acks=all producer writing through Kiln
    producer = ProducerLoop({"bootstrap.servers": kiln.bootstrap,
                             **PRODUCER_MODES["idempotent-acks-all"]}, unique_topic, rate=1000)
    producer.start()
    try:
        assert producer.wait_for_acks(500, 30, fail_fast=True), producer.deliveries.failed

        # When all three brokers are SIGKILLed together and started again on their disks
        for node in kafka_cluster.nodes:
            node.kill()
        acked_at_kill = producer.deliveries.counts()[0]
        time.sleep(2)
        start_together(kafka_cluster.nodes)
        assert producer.wait_for_acks(acked_at_kill + 1000, 90), "no progress after"
    finally:
        undelivered = producer.stop(flush_timeout_s=120)
    assert kiln.flush(timeout_s=60)

    # Then nothing acknowledged was lost (Kafka's disks, Kiln's Redis) and nothing doubled
    hardened = read_partition(kafka_cluster.bootstrap, unique_topic, timeout_s=60)
    assert undelivered == 0
    assert_exactly_once_in_order(hardened, producer.deliveries, producer.sent, idempotent=True)
