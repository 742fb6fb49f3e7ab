"""The session fixtures hand out real services: a Redis server and a Kafka-compatible broker.

The broker test reads from the beginning of one assigned partition, without a consumer
group and without ListOffsets "latest" (wrong in tansu 0.6.0), so it depends on no known
tansu defect.
"""

from __future__ import annotations

import time

import pytest
import redis
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

pytestmark = pytest.mark.integration

RECORDS = 10


def test_redis_is_real(redis_client: redis.Redis) -> None:
    assert redis_client.dbsize() == 0, "redis_client must start on an empty database"
    assert redis_client.set("kiln:probe", b"\x00value\xff")
    assert redis_client.get("kiln:probe") == b"\x00value\xff"
    info = redis_client.info("server")
    assert isinstance(info.get("redis_version"), str)
    assert int(str(info["redis_version"]).split(".")[0]) >= 6


def test_broker_is_real(kafka_bootstrap: str, unique_topic: str) -> None:
    with KafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=10_000) as admin:
        admin.create_topics([NewTopic(unique_topic, num_partitions=1, replication_factor=1)])
        assert unique_topic in admin.list_topics()

    sent = [(f"k{i}".encode(), f"value-{i}".encode()) for i in range(RECORDS)]
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=0)
    try:
        futures = [producer.send(unique_topic, key=k, value=v, partition=0) for k, v in sent]
        producer.flush(timeout=10)
        offsets = [f.get(timeout=10).offset for f in futures]
    finally:
        producer.close(timeout=5)
    assert offsets == list(range(RECORDS))

    consumer = KafkaConsumer(
        bootstrap_servers=kafka_bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        request_timeout_ms=10_000,
    )
    received: list[tuple[int, bytes | None, bytes | None]] = []
    try:
        tp = TopicPartition(unique_topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        deadline = time.monotonic() + 20
        while len(received) < RECORDS and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                received.extend((r.offset, r.key, r.value) for r in records)
    finally:
        consumer.close()

    assert len(received) == RECORDS
    assert [(k, v) for _, k, v in received] == sent
    assert [o for o, _, _ in received] == list(range(RECORDS))
