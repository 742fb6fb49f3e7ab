"""One synchronous interface over the three third-party consumers, so each compatibility test
is written once and run with kafka-python (KafkaConsumer), aiokafka (AIOKafkaConsumer, driven
on its own event loop) and confluent-kafka (librdkafka's Consumer).

Every consumer is configured for short tests: heartbeats every 300 ms, 6 s sessions, short
fetch waits, manual commits only.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import confluent_kafka
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.abc import ConsumerRebalanceListener as AioRebalanceListener
from aiokafka.errors import CommitFailedError as AioCommitFailed
from aiokafka.errors import KafkaError as AioKafkaError
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener as KpRebalanceListener
from kafka.errors import KafkaError as KpKafkaError

T = TypeVar("T")

SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 300
FETCH_WAIT_MS = 100


@dataclass(frozen=True, slots=True)
class Consumed:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


class Consumer(Protocol):
    # How many times partitions were assigned to this consumer (group mode): records read
    # between two assignments come from one continuous read of each partition.
    assignments: int

    def assign(self, topic: str, partitions: list[int]) -> None: ...
    def subscribe(self, topic: str) -> None: ...
    def seek(self, topic: str, partition: int, offset: int) -> None: ...
    def poll(self, timeout_s: float, max_records: int = 500) -> list[Consumed]: ...
    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int | None: ...
    def commit(self) -> bool: ...
    def committed(self, topic: str, partitions: list[int]) -> dict[int, int | None]: ...
    def close(self) -> None: ...


# --- kafka-python ------------------------------------------------------------------------


class KafkaPythonConsumer:
    def __init__(self, bootstrap: str, group: str | None, reset: str, client_id: str) -> None:
        self.assignments = 0
        self._consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, client_id=client_id,
            enable_auto_commit=False, auto_offset_reset=reset,
            session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
            fetch_max_wait_ms=FETCH_WAIT_MS)

    def assign(self, topic: str, partitions: list[int]) -> None:
        self._consumer.assign([KpTopicPartition(topic, p) for p in partitions])

    def subscribe(self, topic: str) -> None:
        outer = self

        class Listener(KpRebalanceListener):  # type: ignore[misc]
            def on_partitions_revoked(self, revoked: Any) -> None:
                pass

            def on_partitions_assigned(self, assigned: Any) -> None:
                outer.assignments += 1

        self._consumer.subscribe([topic], listener=Listener())

    def seek(self, topic: str, partition: int, offset: int) -> None:
        self._consumer.seek(KpTopicPartition(topic, partition), offset)

    def poll(self, timeout_s: float, max_records: int = 500) -> list[Consumed]:
        batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        return [Consumed(r.partition, r.offset, r.key, r.value, r.timestamp)
                for records in batches.values() for r in records]

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        tp = KpTopicPartition(topic, partition)
        found = self._consumer.offsets_for_times({tp: timestamp_ms})[tp]
        return None if found is None else int(found.offset)

    def commit(self) -> bool:
        try:
            self._consumer.commit()
        except KpKafkaError:
            return False  # a rebalance started: the next owner reads these again
        return True

    def committed(self, topic: str, partitions: list[int]) -> dict[int, int | None]:
        return {p: self._consumer.committed(KpTopicPartition(topic, p)) for p in partitions}

    def close(self) -> None:
        self._consumer.close()


# --- aiokafka ----------------------------------------------------------------------------


class AiokafkaConsumer:
    """AIOKafkaConsumer on an event loop of its own, run for the duration of each call (its
    heartbeats and fetches progress while a call runs; tests keep calling poll)."""

    def __init__(self, bootstrap: str, group: str | None, reset: str, client_id: str) -> None:
        self.assignments = 0
        self._loop = asyncio.new_event_loop()

        async def start() -> AIOKafkaConsumer:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=bootstrap, group_id=group, client_id=client_id,
                enable_auto_commit=False, auto_offset_reset=reset,
                session_timeout_ms=SESSION_TIMEOUT_MS,
                heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS, fetch_max_wait_ms=FETCH_WAIT_MS)
            await consumer.start()
            return consumer

        self._consumer = self._run(start())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(coro)

    def _on_loop(self, call: Callable[[], T]) -> T:
        """Methods that are not coroutines still expect to run inside the loop."""
        async def inside() -> T:
            return call()

        return self._run(inside())

    def assign(self, topic: str, partitions: list[int]) -> None:
        self._on_loop(lambda: self._consumer.assign(
            [AioTopicPartition(topic, p) for p in partitions]))

    def subscribe(self, topic: str) -> None:
        outer = self

        class Listener(AioRebalanceListener):  # type: ignore[misc]
            def on_partitions_revoked(self, revoked: Any) -> None:
                pass

            def on_partitions_assigned(self, assigned: Any) -> None:
                outer.assignments += 1

        self._on_loop(lambda: self._consumer.subscribe([topic], listener=Listener()))

    def seek(self, topic: str, partition: int, offset: int) -> None:
        self._on_loop(lambda: self._consumer.seek(AioTopicPartition(topic, partition), offset))

    def poll(self, timeout_s: float, max_records: int = 500) -> list[Consumed]:
        batches = self._run(self._consumer.getmany(timeout_ms=int(timeout_s * 1000),
                                                   max_records=max_records))
        return [Consumed(r.partition, r.offset, r.key, r.value, r.timestamp)
                for records in batches.values() for r in records]

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        tp = AioTopicPartition(topic, partition)
        found = self._run(self._consumer.offsets_for_times({tp: timestamp_ms}))[tp]
        return None if found is None else int(found.offset)

    def commit(self) -> bool:
        try:
            self._run(self._consumer.commit())
        except (AioCommitFailed, AioKafkaError):
            return False
        return True

    def committed(self, topic: str, partitions: list[int]) -> dict[int, int | None]:
        return {p: self._run(self._consumer.committed(AioTopicPartition(topic, p)))
                for p in partitions}

    def close(self) -> None:
        try:
            self._run(self._consumer.stop())
        finally:
            self._loop.close()


# --- confluent-kafka ---------------------------------------------------------------------


class ConfluentConsumer:
    def __init__(self, bootstrap: str, group: str | None, reset: str, client_id: str) -> None:
        self.assignments = 0
        # librdkafka always needs a group id; an unused one has nothing committed.
        self._consumer = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap, "group.id": group or f"unused-{uuid.uuid4().hex}",
            "client.id": client_id, "enable.auto.commit": False, "auto.offset.reset": reset,
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS, "fetch.wait.max.ms": FETCH_WAIT_MS,
        })

    def assign(self, topic: str, partitions: list[int]) -> None:
        self._consumer.assign([confluent_kafka.TopicPartition(topic, p) for p in partitions])

    def subscribe(self, topic: str) -> None:
        def on_assign(consumer: Any, partitions: Any) -> None:
            self.assignments += 1

        self._consumer.subscribe([topic], on_assign=on_assign)

    def seek(self, topic: str, partition: int, offset: int) -> None:
        self._consumer.seek(confluent_kafka.TopicPartition(topic, partition, offset))

    def poll(self, timeout_s: float, max_records: int = 500) -> list[Consumed]:
        out = []
        for message in self._consumer.consume(max_records, timeout_s):
            error = message.error()
            if error is not None:
                if error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    continue
                raise AssertionError(f"consumer error: {error}")
            partition, offset = message.partition(), message.offset()
            assert partition is not None and offset is not None
            out.append(Consumed(partition, offset, message.key(), message.value(),
                                message.timestamp()[1]))
        return out

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        found = self._consumer.offsets_for_times(
            [confluent_kafka.TopicPartition(topic, partition, timestamp_ms)], timeout=10)[0]
        assert found.error is None, found.error
        return None if found.offset < 0 else int(found.offset)

    def commit(self) -> bool:
        try:
            self._consumer.commit(asynchronous=False)
        except confluent_kafka.KafkaException:
            return False  # nothing consumed since the last commit, or a rebalance started
        return True

    def committed(self, topic: str, partitions: list[int]) -> dict[int, int | None]:
        found = self._consumer.committed(
            [confluent_kafka.TopicPartition(topic, p) for p in partitions], timeout=10)
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in found}

    def close(self) -> None:
        self._consumer.close()


CONSUMERS: dict[str, type[KafkaPythonConsumer | AiokafkaConsumer | ConfluentConsumer]] = {
    "kafka-python": KafkaPythonConsumer,
    "aiokafka": AiokafkaConsumer,
    "confluent-kafka": ConfluentConsumer,
}


def open_consumer(client: str, bootstrap: str, *, group: str | None = None,
                  reset: str = "earliest", client_id: str = "compat") -> Consumer:
    consumer: Consumer = CONSUMERS[client](bootstrap, group, reset, client_id)
    return consumer
