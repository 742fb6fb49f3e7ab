"""Producers through Kiln; records read back from the hardened Kafka topic."""

from __future__ import annotations

import time
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from tests.kiln_harness import RunningKiln, start_kiln
from tests.raw_client import RawClient, record_batch
from wire.errors import ErrorCode
from wire.lineage import lineage_offset


def read_hardened(bootstrap: str, topic: str, partition: int, expected: int,
                  timeout_s: float = 20) -> list:
    """Every record of one partition of the Kafka topic, read directly from the broker."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", consumer_timeout_ms=500)
    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    records: list = []
    deadline = time.monotonic() + timeout_s
    while len(records) < expected and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=500).values():
            records.extend(batch)
    # One more poll to catch anything beyond what was expected (duplicates).
    for batch in consumer.poll(timeout_ms=300).values():
        records.extend(batch)
    consumer.close()
    return records


def kiln_offset(record: Any) -> int:
    return lineage_offset(record.headers, record.offset)


def test_kafka_python_records_are_hardened_in_order_with_lineage(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    producer = KafkaProducer(bootstrap_servers=kiln.bootstrap, acks=1, linger_ms=5)
    futures = [producer.send(unique_topic, key=b"k%d" % i, value=b"value-%d" % i,
                             headers=[("source", b"test"), ("n", b"%d" % i)],
                             partition=0, timestamp_ms=1_700_000_000_000 + i)
               for i in range(500)]
    producer.flush()
    offsets = [f.get(timeout=10).offset for f in futures]
    producer.close()

    records = read_hardened(kafka_bootstrap, unique_topic, 0, 500)

    assert offsets == list(range(500))
    assert [r.value for r in records] == [b"value-%d" % i for i in range(500)]
    assert [r.key for r in records] == [b"k%d" % i for i in range(500)]
    assert [r.timestamp for r in records] == [1_700_000_000_000 + i for i in range(500)]
    assert [kiln_offset(r) for r in records] == list(range(500))
    assert records[7].headers[:2] == [("source", b"test"), ("n", b"7")]


def test_records_wait_for_the_delay_before_hardening(
        redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    with start_kiln(redis_url, kafka_bootstrap, harden_delay_ms=60_000) as running:
        producer = KafkaProducer(bootstrap_servers=running.bootstrap, acks=1)
        producer.send(unique_topic, value=b"held", partition=0).get(timeout=10)
        producer.close()

        early = read_hardened(kafka_bootstrap, unique_topic, 0, 1, timeout_s=1.5)
        flushed = running.flush()
        late = read_hardened(kafka_bootstrap, unique_topic, 0, 1)

    assert early == []
    assert flushed
    assert [r.value for r in late] == [b"held"]


def test_acks_all_is_answered_only_once_hardened(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    producer = KafkaProducer(bootstrap_servers=kiln.bootstrap, acks="all")
    metadata = producer.send(unique_topic, value=b"assured", partition=0).get(timeout=20)
    producer.close()

    records = read_hardened(kafka_bootstrap, unique_topic, 0, 1, timeout_s=0.5)

    assert metadata.offset == 0
    assert [r.value for r in records] == [b"assured"]


def test_unknown_topic_refused_when_auto_create_is_off(
        redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    with start_kiln(redis_url, kafka_bootstrap, auto_create_topics=False) as running:
        client = RawClient(running.bootstrap)
        answer = client.produce(unique_topic, 0, record_batch([b"x"]))
        client.close()

    assert answer.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_create_topics_through_kiln_creates_it_in_kafka(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kiln.bootstrap)
    admin.create_topics([NewTopic(unique_topic, num_partitions=3, replication_factor=1)])
    admin.close()

    direct = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    described = direct.describe_topics([unique_topic])
    direct.close()

    assert len(described[0]["partitions"]) == 3
