"""Reading partitions to their end with librdkafka, in either isolation level: what the
transaction tests compare (a partition's end is reported by its EOF event)."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

PARTITION_EOF = -191


def read_to_end(bootstrap: str, topic: str, partitions: int, isolation: str, *,
                expected: int | None = None, timeout_s: float = 10
                ) -> dict[int, list[tuple[int, str]]]:
    """Every partition's (offset, value) pairs from offset 0, read until each partition
    reported its end (and `expected` values arrived, when given) or `timeout_s` passed;
    AssertionError if a partition's end was not reached."""
    read = read_messages(bootstrap, topic, partitions, isolation, expected=expected,
                         timeout_s=timeout_s)
    return {p: sorted((m.offset(), m.value().decode()) for m in messages)
            for p, messages in read.items()}


def read_messages(bootstrap: str, topic: str, partitions: int, isolation: str, *,
                  expected: int | None = None, timeout_s: float = 10
                  ) -> dict[int, list[Message]]:
    """As read_to_end, every partition's messages in the order they were read."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "isolation.level": isolation, "enable.auto.commit": False,
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    read: dict[int, list[Message]] = {p: [] for p in range(partitions)}
    ended: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            count = sum(len(v) for v in read.values())
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
            read[message.partition()].append(message)
    finally:
        consumer.close()
    assert len(ended) == partitions, f"the end of partitions {set(read) - ended} not reached"
    return read
