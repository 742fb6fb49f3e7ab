"""Drivers for the three third-party producers, the records they send, and a reader of the
hardened topic that goes straight to the Kafka broker (not through Kiln).

Every driver takes the same arguments and returns one `Delivered` per record, in send order:
the partition and offset the client's delivery report or record metadata gave (offset None
for acks=0, where the client is told nothing).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import confluent_kafka
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AioNewTopic
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import NewTopic as ConfluentNewTopic  # type: ignore[attr-defined]
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient
from kafka.admin import NewTopic as KafkaPythonNewTopic
from kafka.protocol.consumer import FetchRequest, FetchResponse

from tests.raw_client import RawClient
from wire.batch import HEADER_SIZE, read_header
from wire.lineage import split_lineage

BASE_TIMESTAMP_MS = 1_700_000_000_000

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class Record:
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class Delivered:
    partition: int
    offset: int | None  # None when the client was not told (acks=0)


@dataclass(frozen=True, slots=True)
class Hardened:
    """One record as read back from the hardened Kafka topic."""

    partition: int
    offset: int  # in Kafka
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    timestamp_ms: int

    @property
    def kiln_offset(self) -> int:
        return split_lineage(self.offset, self.headers)[0]

    @property
    def client_headers(self) -> tuple[Header, ...]:
        return split_lineage(self.offset, self.headers)[1]


def make_records(n: int) -> list[Record]:
    """n records covering what a producer can send: null and empty values, null keys, keys
    that repeat (so a partitioner spreads them), binary values, no headers, several headers,
    repeated header names, binary header values, explicit (non-monotonic) timestamps."""
    records = []
    for i in range(n):
        if i % 7 == 0:
            value: bytes | None = None
        elif i % 7 == 1:
            value = b""
        else:
            value = b"value-%05d:" % i + bytes((i * 31 + j) % 256 for j in range(i % 50))
        # kafka-python refuses a record whose key and value are both null.
        key = None if i % 6 == 5 and value is not None else b"key-%02d" % (i % 17)
        headers: tuple[Header, ...] = ()
        if i % 4:
            headers = (("trace", b"t-%d" % i), ("dup", b"first"), ("dup", b"second"),
                       ("bin", bytes([0, 255, i % 256, 10, 13])))
        # Timestamps step back every tenth record: they are the producer's, not the broker's.
        timestamp = BASE_TIMESTAMP_MS + i * 1000 - (5000 if i % 10 == 9 else 0)
        records.append(Record(key, value, headers, timestamp))
    return records


# --- producers ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProducerCase:
    compression: str  # none, gzip, snappy, lz4, zstd
    acks: int | str  # 0, 1 or "all"
    idempotence: bool


ProduceFn = Callable[[str, str, Sequence[Record], ProducerCase, int | None], list[Delivered]]

# Small batches, so every case sends several batches per partition (and several in flight).
_BATCH_BYTES = 4096
_LINGER_MS = 5


def produce_kafka_python(bootstrap: str, topic: str, records: Sequence[Record],
                         case: ProducerCase, partition: int | None) -> list[Delivered]:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks=case.acks,
        compression_type=None if case.compression == "none" else case.compression,
        enable_idempotence=case.idempotence, linger_ms=_LINGER_MS, batch_size=_BATCH_BYTES,
        request_timeout_ms=20_000,
    )
    try:
        futures = [
            producer.send(topic, key=r.key, value=r.value, headers=list(r.headers),
                          partition=partition, timestamp_ms=r.timestamp_ms)
            for r in records
        ]
        producer.flush(timeout=30)
        metadata = [f.get(timeout=30) for f in futures]
    finally:
        producer.close(timeout=10)
    return [Delivered(m.partition, None if case.acks == 0 else m.offset) for m in metadata]


def produce_aiokafka(bootstrap: str, topic: str, records: Sequence[Record],
                     case: ProducerCase, partition: int | None) -> list[Delivered]:
    async def run() -> list[Delivered]:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks=case.acks,
            compression_type=None if case.compression == "none" else case.compression,
            enable_idempotence=case.idempotence, linger_ms=_LINGER_MS,
            max_batch_size=_BATCH_BYTES, request_timeout_ms=20_000,
        )
        await producer.start()
        try:
            futures = [
                await producer.send(topic, key=r.key, value=r.value, headers=list(r.headers),
                                    partition=partition, timestamp_ms=r.timestamp_ms)
                for r in records
            ]
            metadata = await asyncio.wait_for(asyncio.gather(*futures), 30)
        finally:
            await producer.stop()
        if case.acks == 0:
            # aiokafka resolves acks=0 sends with None instead of record metadata.
            assert partition is not None, "acks=0 cases name the partition"
            return [Delivered(partition, None) for _ in metadata]
        return [Delivered(m.partition, m.offset) for m in metadata]

    return asyncio.run(run())


def produce_confluent(bootstrap: str, topic: str, records: Sequence[Record],
                      case: ProducerCase, partition: int | None) -> list[Delivered]:
    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "acks": str(case.acks),
        "compression.type": case.compression, "enable.idempotence": case.idempotence,
        "linger.ms": _LINGER_MS, "batch.size": _BATCH_BYTES,
        # Bounded, so a producer that cannot deliver fails the test in seconds.
        "message.timeout.ms": 10_000,
    })
    reports: list[tuple[Any, int, int] | None] = [None] * len(records)

    def report(index: int) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, msg: Any) -> None:
            reports[index] = (err, msg.partition(), msg.offset())
        return on_delivery

    for i, r in enumerate(records):
        extra: dict[str, Any] = {} if partition is None else {"partition": partition}
        producer.produce(topic, key=r.key, value=r.value, headers=list(r.headers),
                         timestamp=r.timestamp_ms, on_delivery=report(i), **extra)
        producer.poll(0)
    remaining = producer.flush(30)
    assert remaining == 0, f"{remaining} records still undelivered"
    missing = [i for i, rep in enumerate(reports) if rep is None]
    assert not missing, f"{len(missing)} records without a delivery report"
    done = [rep for rep in reports if rep is not None]
    errors = [(i, rep[0]) for i, rep in enumerate(done) if rep[0] is not None]
    assert not errors, f"{len(errors)} failed deliveries, first: {errors[:3]}"
    return [Delivered(rep[1], None if case.acks == 0 else rep[2]) for rep in done]


PRODUCERS: dict[str, ProduceFn] = {
    "kafka-python": produce_kafka_python,
    "aiokafka": produce_aiokafka,
    "confluent-kafka": produce_confluent,
}


# --- topics through Kiln's admin API -----------------------------------------------------


def create_topic_kafka_python(bootstrap: str, topic: str, partitions: int) -> None:
    with KafkaAdminClient(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([KafkaPythonNewTopic(topic, num_partitions=partitions,
                                                 replication_factor=1)])


def create_topic_aiokafka(bootstrap: str, topic: str, partitions: int) -> None:
    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([AioNewTopic(topic, num_partitions=partitions,
                                                   replication_factor=1)])
        finally:
            await admin.close()

    asyncio.run(run())


def create_topic_confluent(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([ConfluentNewTopic(topic, num_partitions=partitions,
                                                     replication_factor=1)])
    for future in futures.values():
        future.result(15)


CREATE_TOPIC: dict[str, Callable[[str, str, int], None]] = {
    "kafka-python": create_topic_kafka_python,
    "aiokafka": create_topic_aiokafka,
    "confluent-kafka": create_topic_confluent,
}


# --- the hardened topic, read directly from the broker -----------------------------------


def kafka_partition_count(kafka_bootstrap: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    found = admin.list_topics(topic, timeout=10).topics[topic]
    assert found.error is None, found.error
    return len(found.partitions)


def read_hardened(kafka_bootstrap: str, topic: str, partitions: int,
                  timeout_s: float = 20) -> dict[int, list[Hardened]]:
    """Every record of every partition, read from offset 0 to the end (librdkafka reads
    every codec). The end is the high watermark of the Fetch answers (partition EOF), not
    ListOffsets, which tansu answers wrongly."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": kafka_bootstrap, "group.id": f"compat-{uuid.uuid4().hex}",
        "enable.auto.commit": False, "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
    })
    out: dict[int, list[Hardened]] = {p: [] for p in range(partitions)}
    at_end: set[int] = set()
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                         for p in range(partitions)])
        deadline = time.monotonic() + timeout_s
        while len(at_end) < partitions and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                err = msg.error()
                partition = msg.partition()
                assert partition is not None
                if err is not None:
                    if err.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                        at_end.add(partition)
                        continue
                    raise AssertionError(f"reading {topic}: {err}")
                _kind, ts = msg.timestamp()
                headers: Any = msg.headers() or ()
                offset = msg.offset()
                assert offset is not None
                out[partition].append(Hardened(partition, offset, msg.key(), msg.value(),
                                               tuple(headers), ts))
    finally:
        consumer.close()
    assert len(at_end) == partitions, f"end of {topic} not reached: {sorted(at_end)}"
    return out


CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def hardened_codecs(kafka_bootstrap: str, topic: str, partition: int) -> list[int]:
    """The compression codec of each record batch of a partition, from a raw Fetch to the
    broker (client libraries do not show batch attributes)."""
    fetch = FetchRequest[4](
        replica_id=-1, max_wait_ms=10, min_bytes=1, max_bytes=1 << 24, isolation_level=0,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchTopic.FetchPartition(partition=partition, fetch_offset=0,
                                                   partition_max_bytes=1 << 24)])])
    with RawClient(kafka_bootstrap) as client:
        answer = client.request(fetch, 4, FetchResponse).responses[0].partitions[0]
    assert answer.error_code == 0, answer
    data = bytes(answer.records or b"")
    codecs = []
    position = 0
    while position + HEADER_SIZE <= len(data):  # whole v2 batch headers
        header = read_header(data, position)
        codecs.append(header.compression)
        position += header.size
    return codecs


def assert_hardened_with_codec(kafka_bootstrap: str, topic: str, compression: str) -> None:
    """Kiln hardens with the codec of the client's batches (a batch that would not shrink is
    left uncompressed), so this also shows the client really compressed what it sent."""
    codecs = hardened_codecs(kafka_bootstrap, topic, 0)
    assert codecs, "no batch fetched"
    assert set(codecs) <= {0, CODEC_IDS[compression]}, codecs
    if compression != "none":
        assert CODEC_IDS[compression] in codecs, codecs


def expected_by_partition(records: Sequence[Record], delivered: Sequence[Delivered],
                          partitions: int) -> dict[int, list[tuple[Record, int | None]]]:
    out: dict[int, list[tuple[Record, int | None]]] = {p: [] for p in range(partitions)}
    for record, where in zip(records, delivered, strict=True):
        out[where.partition].append((record, where.offset))
    return out


def as_sent(record: Record, kiln_offset: int) -> tuple[Any, ...]:
    """A sent record as the hardened topic must show it, at its Kiln offset."""
    return (kiln_offset, record.key, record.value, record.headers, record.timestamp_ms)


def as_read(record: Hardened) -> tuple[Any, ...]:
    return (record.kiln_offset, record.key, record.value, record.client_headers,
            record.timestamp_ms)
