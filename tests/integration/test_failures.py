"""Two Kiln nodes' producers on one partition, Redis losing its data, Kafka going away: count the
records afterwards."""

from __future__ import annotations

import threading
import time

import confluent_kafka
from kafka import KafkaProducer

from cli.local_services import LocalRedis
from tests.conftest import KafkaRelay
from tests.integration.test_produce_harden import kiln_offset, read_hardened
from tests.kiln_harness import eventually, fresh_kiln, start_kiln, sync_redis
from tests.raw_client import RawClient, record_batch
from wire.errors import ErrorCode


def test_producers_of_two_nodes_reach_the_partition_s_one_leader_and_never_collide(
        redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given two Kiln nodes on one Redis, seeing each other
    first = fresh_kiln(redis_url, kafka_bootstrap, node_id=1)
    second = start_kiln(redis_url, kafka_bootstrap, node_id=2)
    offsets: list[int] = []
    lock = threading.Lock()

    def produce(bootstrap: str, tag: bytes) -> None:
        # a producer that knows only one of them, sending to partition 0
        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": 1,
                                             "linger.ms": 2})

        def delivered(err: object, msg: confluent_kafka.Message) -> None:
            assert err is None, err
            with lock:
                offsets.append(msg.offset())
        for i in range(300):
            producer.produce(unique_topic, tag + b"%d" % i, partition=0, on_delivery=delivered)
            producer.poll(0)
        assert producer.flush(30) == 0

    try:
        assert eventually(lambda: all(len(k.app.membership.live_nodes()) == 2
                                      for k in (first, second)))
        # When both produce at once
        threads = [threading.Thread(target=produce, args=(k.bootstrap, tag))
                   for k, tag in ((first, b"a"), (second, b"b"))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert first.flush() and second.flush()
        records = read_hardened(kafka_bootstrap, unique_topic, 0, 600)
    finally:
        first.stop()
        second.stop()

    # Then every record got an offset of its own, and Kafka holds each once, in offset order
    assert sorted(offsets) == list(range(600))
    assert [kiln_offset(r) for r in records] == list(range(600))
    assert sorted(r.value for r in records) == sorted(
        tag + b"%d" % i for tag in (b"a", b"b") for i in range(300))


def test_after_redis_loses_its_data_offsets_continue_and_nothing_hardened_is_lost(
        redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    store = sync_redis(redis_url)
    store.flushdb()
    before = start_kiln(redis_url, kafka_bootstrap)
    client = RawClient(before.bootstrap)
    client.produce(unique_topic, 0, record_batch([b"old-%d" % i for i in range(10)]))
    client.close()
    assert before.flush()
    before.stop()
    store.flushdb()  # Redis lost everything; Kafka holds what was hardened

    with start_kiln(redis_url, kafka_bootstrap) as after:
        client = RawClient(after.bootstrap)
        answer = client.produce(unique_topic, 0, record_batch([b"new-%d" % i for i in range(5)]))
        client.close()
        assert after.flush()
        records = read_hardened(kafka_bootstrap, unique_topic, 0, 15)

    # (Kiln offset 10 is the abort marker that fenced the lost incarnation's writer)
    assert answer.base_offset == 11
    assert [r.value for r in records] == [b"old-%d" % i for i in range(10)] + [
        b"new-%d" % i for i in range(5)]
    assert [kiln_offset(r) for r in records] == [*range(10), *range(11, 16)]
    assert [r.offset for r in records] == [*range(10), *range(11, 16)]


def test_kafka_outage_buffers_up_to_the_budget_and_loses_nothing(
        redis_url: str, kafka_bootstrap: str, kafka_relay: KafkaRelay, unique_topic: str
        ) -> None:
    with fresh_kiln(redis_url, kafka_relay.bootstrap, harden_delay_ms=50,
                    buffer_budget_bytes=64 * 1024) as running:
        producer = KafkaProducer(bootstrap_servers=running.bootstrap, acks=1, linger_ms=0)
        producer.send(unique_topic, value=b"before", partition=0).get(timeout=10)
        assert running.flush()
        kafka_relay.relay.stop()  # Kafka unreachable

        acknowledged = [b"before"]
        client = RawClient(running.bootstrap)
        refused = None
        for i in range(200):
            value = b"during-%03d-" % i + b"x" * 1000
            answer = client.produce(unique_topic, 0, record_batch([value]))
            if answer.error_code != 0:
                refused = answer.error_code
                break
            acknowledged.append(value)
        client.close()
        kafka_relay.relay.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not running.flush(timeout_s=5):
            time.sleep(0.5)
        records = read_hardened(kafka_bootstrap, unique_topic, 0, len(acknowledged))

    # Then the buffer took records up to its budget, refused the next one retriably, and
    # once Kafka was back every acknowledged record was hardened once, in order
    assert refused == ErrorCode.NOT_ENOUGH_REPLICAS
    assert 40 <= len(acknowledged) <= 70
    assert [r.value for r in records] == acknowledged


def test_redis_outage_gives_retriable_errors_and_kiln_reconnects(
        kafka_bootstrap: str, unique_topic: str) -> None:
    store = LocalRedis().start()
    running = start_kiln(store.url, kafka_bootstrap)
    try:
        client = RawClient(running.bootstrap)
        first = client.produce(unique_topic, 0, record_batch([b"one"]))
        store.kill()

        during = client.produce(unique_topic, 0, record_batch([b"lost"]))
        store.start()  # same port, empty: Redis lost its data
        deadline = time.monotonic() + 20
        after = during
        while after.error_code != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
            after = client.produce(unique_topic, 0, record_batch([b"two"]))
        client.close()
    finally:
        running.stop()
        store.stop()

    assert first.error_code == 0
    assert during.error_code == ErrorCode.NOT_ENOUGH_REPLICAS
    assert after.error_code == 0


def test_a_consumer_assigned_while_redis_is_down_reads_from_its_commit_once_redis_is_back(
        kafka_bootstrap: str, unique_topic: str) -> None:
    """librdkafka gives up on a partition whose committed offset it could not fetch when the
    answer was COORDINATOR_NOT_AVAILABLE (it never asks again); the fault checker found a
    group that read nothing more after two Redis restarts during its rebalance."""
    # Given ten records through Kiln, a group that committed offset 4, and Redis (with its
    # data on disk) down
    store = LocalRedis(extra_args=["--appendonly", "yes", "--appendfsync", "always"]).start()
    running = start_kiln(store.url, kafka_bootstrap, harden_delay_ms=60_000)
    group = f"assigned-{unique_topic}"
    consumer = None
    try:
        producer = confluent_kafka.Producer({"bootstrap.servers": running.bootstrap,
                                             "acks": 1})
        for i in range(10):
            producer.produce(unique_topic, b"r%d" % i, partition=0)
        assert producer.flush(10) == 0
        committer = confluent_kafka.Consumer({"bootstrap.servers": running.bootstrap,
                                              "group.id": group})
        committer.commit(offsets=[confluent_kafka.TopicPartition(unique_topic, 0, 4)],
                         asynchronous=False)
        committer.close()
        store.kill()
        # When a consumer of the group is assigned the partition while Redis is down, and
        # Redis comes back a few seconds later
        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": running.bootstrap, "group.id": group,
            "enable.auto.commit": False, "auto.offset.reset": "latest"})
        consumer.assign([confluent_kafka.TopicPartition(unique_topic, 0)])
        during = consumer.consume(10, 3.0)
        store.start()
        read: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(read) < 6 and time.monotonic() < deadline:
            read += [m.value() for m in consumer.consume(10, 0.5) if m.error() is None]
    finally:
        if consumer is not None:
            consumer.close()
        running.stop()
        store.stop()
    # Then it read nothing while Redis was down, and afterwards every record from its commit
    assert [m for m in during if m.error() is None] == []
    assert read == [b"r%d" % i for i in range(4, 10)]
