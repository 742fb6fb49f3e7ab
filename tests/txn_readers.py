"""Reading partitions to their end with librdkafka, in either isolation level: what the
transaction tests compare (a partition's end is reported by its EOF event)."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaException, TopicPartition

PARTITION_EOF = -191


def read_to_end(bootstrap: str, topic: str, partitions: int, isolation: str, *,
                expected: int | None = None, timeout_s: float = 10
                ) -> dict[int, list[tuple[int, str]]]:
    """Every partition's (offset, value) pairs from offset 0, read until each partition
    reported its end (and `expected` values arrived, when given) or `timeout_s` passed;
    AssertionError if a partition's end was not reached."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "isolation.level": isolation, "enable.auto.commit": False,
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: dict[int, list[tuple[int, str]]] = {p: [] for p in range(partitions)}
    ended: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            count = sum(len(v) for v in values.values())
            if len(ended) == partitions and (expected is None or count >= expected):
                break
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                if message.error().code() == PARTITION_EOF:
                    ended.add(message.partition())
                    continue
                raise KafkaException(message.error())
            ended.discard(message.partition())
            values[message.partition()].append((message.offset(), message.value().decode()))
    finally:
        consumer.close()
    assert len(ended) == partitions, f"the end of partitions {set(values) - ended} not reached"
    return {p: sorted(v) for p, v in values.items()}
