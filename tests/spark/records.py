"""What the Spark tests write and expect: records whose value names their place in the send
order, and whose key, partition and timestamp follow from it; written straight to a broker
or through Kiln by a producer thread."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import confluent_kafka
from confluent_kafka.admin import AdminClient, NewTopic

from storage.errors import HardenedStoreUnavailable
from storage.hardened_store import Fence, HardenedPartitionWriter
from storage.kafka.client import KafkaClient
from tests.faults.records import ProducerLoop, seq_of, value_of

__all__ = ["BASE_TIMESTAMP_MS", "KeyedProducerLoop", "Sent", "create_topic", "end_offsets",
           "key_of", "kiln_fence", "produce_records", "seq_of", "timestamp_of", "value_of"]

BASE_TIMESTAMP_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
STEP_MS = 10  # record time advances 10 ms per record
KEYS = 4


def key_of(seq: int) -> bytes:
    return b"key-%d" % (seq % KEYS)


def timestamp_of(seq: int) -> int:
    return BASE_TIMESTAMP_MS + seq * STEP_MS


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)],
                                      operation_timeout=10).values():
        future.result(timeout=15)


@dataclass(frozen=True, slots=True)
class Sent:
    """One record to write straight to the broker."""

    partition: int
    value: bytes
    key: bytes | None = None
    headers: Sequence[tuple[str, bytes | None]] = ()
    timestamp_ms: int | None = None


def produce_records(bootstrap: str, topic: str, records: Sequence[Sent]) -> list[int]:
    """Write records in order (one in flight at a time, so they land in that order) and
    return the Kafka offset each got."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                         "linger.ms": 0, "log_level": 3,
                                         "max.in.flight.requests.per.connection": 1})
    offsets: list[int] = [-1] * len(records)
    errors: list[str] = []

    def report(index: int) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                offsets[index] = msg.offset()
        return on_delivery

    for i, record in enumerate(records):
        kwargs: dict[str, Any] = {"partition": record.partition, "value": record.value,
                                  "key": record.key, "headers": list(record.headers),
                                  "on_delivery": report(i)}
        if record.timestamp_ms is not None:
            kwargs["timestamp"] = record.timestamp_ms
        producer.produce(topic, **kwargs)
    assert producer.flush(30) == 0, "records not delivered in 30 s"
    assert not errors, errors
    return offsets


def kiln_fence(bootstrap: str, topic: str, partition: int) -> None:
    """What a Kiln process does when it takes a partition over from one that may still be
    writing: its writer's recovery fences at the partition's leader, with an empty
    transaction aborted at once. The abort marker takes one Kafka offset and holds no
    record."""
    async def fence() -> None:
        client = KafkaClient(bootstrap, client_id="spark-tests-fence")
        deadline = time.monotonic() + 60
        try:
            while True:
                try:
                    writer = HardenedPartitionWriter(client, topic, partition)
                    await writer.recover(Fence.AT_LEADER)
                    return
                except HardenedStoreUnavailable:
                    # A new broker's transaction log can take longer to load than the
                    # client's own retries wait; Kiln's hardener tries again too.
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
        finally:
            await client.close()

    asyncio.run(fence())


def end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    """Each partition's high watermark (markers included)."""
    with confluent_kafka.Consumer({"bootstrap.servers": bootstrap,
                                   "group.id": "spark-tests-ends", "log_level": 3}) as consumer:
        return [consumer.get_watermark_offsets(
            confluent_kafka.TopicPartition(topic, p), timeout=15)[1]
            for p in range(partitions)]


class KeyedProducerLoop(ProducerLoop):
    """An idempotent confluent-kafka producer (acks=all, retrying for two minutes) sending
    record `seq` with value_of(seq), key_of(seq) and timestamp_of(seq) to partition
    seq % partitions, at about `rate` records/s, until `stop()`."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: int = 300) -> None:
        super().__init__({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5, "message.timeout.ms": 120_000, "request.timeout.ms": 30_000,
            "retry.backoff.ms": 50, "retry.backoff.max.ms": 500, "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500, "log_level": 3,
        }, topic, rate, name="spark-test-producer")
        self.partitions = partitions

    def _send(self, seq: int, on_delivery: Callable[[Any, Any], None]) -> None:
        self.producer.produce(self.topic, value=value_of(seq), key=key_of(seq),
                              partition=seq % self.partitions, timestamp=timestamp_of(seq),
                              on_delivery=on_delivery)

    @property
    def acked(self) -> dict[int, tuple[int, int]]:
        """seq -> (partition, offset the producer was given)."""
        with self.deliveries.lock:
            return {seq: (seq % self.partitions, offset)
                    for seq, offset in self.deliveries.acked.items()}

    @property
    def failed(self) -> dict[int, str]:
        with self.deliveries.lock:
            return dict(self.deliveries.failed)

    def acked_count(self) -> int:
        return self.deliveries.counts()[0]
