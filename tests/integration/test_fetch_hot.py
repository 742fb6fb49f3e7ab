"""Consumers reading the log queue through Kiln (the hot tier; read-through from Kafka comes
with the delivery issue)."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from tests.kiln_harness import RunningKiln


def test_kafka_python_reads_what_was_produced_in_order(slow_kiln: RunningKiln,
                                                       unique_topic: str) -> None:
    producer = KafkaProducer(bootstrap_servers=slow_kiln.bootstrap, acks=1, linger_ms=5)
    for i in range(300):
        producer.send(unique_topic, key=b"k%d" % i, value=b"v%d" % i, partition=0)
    producer.flush()
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=slow_kiln.bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=3000)
    tp = TopicPartition(unique_topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 120)

    records = [r for r in consumer]
    consumer.close()

    assert [r.offset for r in records] == list(range(120, 300))
    assert [r.value for r in records] == [b"v%d" % i for i in range(120, 300)]
    assert records[0].key == b"k120"


def test_confluent_consumer_reads_from_beginning_with_every_codec(slow_kiln: RunningKiln,
                                                                   unique_topic: str) -> None:
    producer = Producer({"bootstrap.servers": slow_kiln.bootstrap, "linger.ms": 5,
                         "compression.type": "zstd"})
    for i in range(200):
        producer.produce(unique_topic, value=b"z%d" % i, partition=0)
    producer.flush(10)
    consumer = Consumer({"bootstrap.servers": slow_kiln.bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([CTopicPartition(unique_topic, 0, -2)])  # OFFSET_BEGINNING

    values = []
    deadline = time.monotonic() + 15
    while len(values) < 200 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            values.append((message.offset(), message.value()))
    consumer.close()

    assert values == [(i, b"z%d" % i) for i in range(200)]


def test_long_poll_returns_as_soon_as_a_record_arrives(slow_kiln: RunningKiln,
                                                       unique_topic: str) -> None:
    producer = KafkaProducer(bootstrap_servers=slow_kiln.bootstrap, acks=1)
    producer.send(unique_topic, value=b"first", partition=0).get(timeout=10)
    consumer = KafkaConsumer(bootstrap_servers=slow_kiln.bootstrap, enable_auto_commit=False,
                             fetch_max_wait_ms=5000)
    tp = TopicPartition(unique_topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 1)
    threading.Timer(0.5, lambda: producer.send(unique_topic, value=b"second",
                                               partition=0)).start()

    got = []
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=1000).values():
            got.extend(batch)
    consumer.close()
    producer.close()

    assert [(r.offset, r.value) for r in got] == [(1, b"second")]
