"""The three third-party consumers, in assign mode (no consumer group), reading one partition
through Kiln: every record they return, normalised so that they compare."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import confluent_kafka
import kafka
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AioTopicPartition

BEGINNING = -2  # start from the earliest offset, as a consumer resetting to it does
# How long to keep polling after the expected count, to catch duplicates.
_EXTRA_POLL_S = 0.5


@dataclass(frozen=True, slots=True)
class Consumed:
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int


ConsumeFn = Callable[[str, str, int, int, int, float], list[Consumed]]


def consume_kafka_python(bootstrap: str, topic: str, partition: int, start: int,
                         expected: int, timeout_s: float = 30) -> list[Consumed]:
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                   auto_offset_reset="earliest")
    tp = kafka.TopicPartition(topic, partition)
    consumer.assign([tp])
    if start == BEGINNING:
        consumer.seek_to_beginning(tp)
    else:
        consumer.seek(tp, start)
    out: list[Consumed] = []

    def poll(deadline: float, until: int | None) -> None:
        while time.monotonic() < deadline and (until is None or len(out) < until):
            for batch in consumer.poll(timeout_ms=200).values():
                out.extend(Consumed(r.offset, r.key, r.value, tuple(r.headers), r.timestamp)
                           for r in batch)

    try:
        poll(time.monotonic() + timeout_s, expected)
        poll(time.monotonic() + _EXTRA_POLL_S, None)
    finally:
        consumer.close()
    return out


def consume_aiokafka(bootstrap: str, topic: str, partition: int, start: int, expected: int,
                     timeout_s: float = 30) -> list[Consumed]:
    async def run() -> list[Consumed]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                    auto_offset_reset="earliest")
        await consumer.start()
        tp = AioTopicPartition(topic, partition)
        out: list[Consumed] = []

        async def poll(deadline: float, until: int | None) -> None:
            while time.monotonic() < deadline and (until is None or len(out) < until):
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    out.extend(Consumed(r.offset, r.key, r.value, tuple(r.headers),
                                        r.timestamp) for r in batch)

        try:
            consumer.assign([tp])
            if start == BEGINNING:
                await consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, start)
            await poll(time.monotonic() + timeout_s, expected)
            await poll(time.monotonic() + _EXTRA_POLL_S, None)
        finally:
            await consumer.stop()
        return out

    return asyncio.run(run())


def consume_confluent(bootstrap: str, topic: str, partition: int, start: int, expected: int,
                      timeout_s: float = 30) -> list[Consumed]:
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "kiln-tests-unused",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
    })
    offset = confluent_kafka.OFFSET_BEGINNING if start == BEGINNING else start
    consumer.assign([confluent_kafka.TopicPartition(topic, partition, offset)])
    out: list[Consumed] = []

    def poll(deadline: float, until: int | None) -> None:
        while time.monotonic() < deadline and (until is None or len(out) < until):
            message: Any = consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            out.append(Consumed(message.offset(), message.key(), message.value(),
                                tuple(message.headers() or ()), message.timestamp()[1]))

    try:
        poll(time.monotonic() + timeout_s, expected)
        poll(time.monotonic() + _EXTRA_POLL_S, None)
    finally:
        consumer.close()
    return out


CONSUMERS: dict[str, ConsumeFn] = {
    "kafka-python": consume_kafka_python,
    "aiokafka": consume_aiokafka,
    "confluent-kafka": consume_confluent,
}
