"""Consumers reading through Kiln read one continuous log: what was hardened and trimmed from
Redis is read back from Kafka, in Kiln offsets, then the log queue, without a seam."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from aiokafka.record._crecords import DefaultRecordBatchBuilder
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)

from storage.errors import COLD_TIER_UNAVAILABLE
from storage.kafka.client import KafkaClient
from storage.model import Reliability
from storage.model import TopicPartition as KilnTopicPartition
from tests.compat.clients import ProducerCase, Record, make_records, produce_kafka_python
from tests.conftest import KafkaRelay
from tests.integration.consumers import (
    BEGINNING,
    CONSUMERS,
    Consumed,
    consume_aiokafka,
    consume_confluent,
    consume_kafka_python,
)
from tests.kiln_harness import RunningKiln, fresh_kiln, start_kiln, sync_redis
from tests.raw_client import RawClient
from wire.errors import ErrorCode
from wire.lineage import kiln_offset_header
from wire.records import decode_records

ACKS_1 = ProducerCase("none", 1, idempotence=False)
EARLIEST = -2




def produce(kiln: RunningKiln, topic: str, records: Sequence[Record], partition: int = 0
            ) -> list[int]:
    """Produce through Kiln with acks=1; the offsets the producer was told."""
    delivered = produce_kafka_python(kiln.bootstrap, topic, records, ACKS_1, partition)
    return [d.offset for d in delivered if d.offset is not None]


def as_consumed(records: Sequence[Record], offsets: Sequence[int]) -> list[Consumed]:
    return [Consumed(o, r.key, r.value, r.headers, r.timestamp_ms)
            for r, o in zip(records, offsets, strict=True)]


def hot_start(kiln: RunningKiln, topic: str, partition: int = 0) -> int:
    return kiln.call(kiln.app.queue.start_offset(KilnTopicPartition(topic, partition)))


def set_reliability(kiln: RunningKiln, topic: str, level: Reliability) -> None:
    async def update() -> None:
        config = await kiln.app.catalog.lookup(topic, allow_create=False)
        assert config is not None
        await kiln.app.catalog.registry.update(dataclasses.replace(config, reliability=level))
    kiln.call(update())


@pytest.mark.parametrize("client", CONSUMERS)
def test_every_client_reads_everything_hardened_from_the_earliest_offset(
        slow_kiln: RunningKiln, unique_topic: str, client: str) -> None:
    # Given 600 records produced through Kiln, then hardened and trimmed from Redis
    records = make_records(600)
    offsets = produce(slow_kiln, unique_topic, records)
    assert slow_kiln.flush()
    assert hot_start(slow_kiln, unique_topic) == 600

    # When a consumer reads the partition from its earliest offset
    consumed = CONSUMERS[client](slow_kiln.bootstrap, unique_topic, 0, BEGINNING, 600, 30)

    # Then it gets every record once, in order, at the offset its producer was told
    assert offsets == list(range(600))
    assert consumed == as_consumed(records, offsets)


@pytest.mark.parametrize("client", CONSUMERS)
def test_every_client_reads_across_gaps_of_records_that_were_never_hardened(
        slow_kiln: RunningKiln, unique_topic: str, client: str) -> None:
    # Given 100 records of which a durable subscription read the first 30 (dropped when
    # delivered), 100 that were never meant to be hardened, then 100 more
    first, transient, last = make_records(300)[:100], make_records(100), make_records(100)
    offsets = produce(slow_kiln, unique_topic, first)
    slow_kiln.call(slow_kiln.app.delivery.committed(
        "readers", {KilnTopicPartition(unique_topic, 0): 30}, by_member=True))
    set_reliability(slow_kiln, unique_topic, Reliability.EXPRESS)
    produce(slow_kiln, unique_topic, transient)
    set_reliability(slow_kiln, unique_topic, Reliability.RELIABLE_PERSISTENT)
    offsets += produce(slow_kiln, unique_topic, last)
    assert slow_kiln.flush()
    assert hot_start(slow_kiln, unique_topic) == 300

    # When a consumer reads from the earliest offset
    consumed = CONSUMERS[client](slow_kiln.bootstrap, unique_topic, 0, BEGINNING, 170, 30)

    # Then it reads over both gaps, as over a compacted topic: 30..99 and 200..299
    assert offsets == [*range(100), *range(200, 300)]
    assert consumed == as_consumed(first[30:] + last, offsets[30:])


def test_a_log_half_in_kafka_half_in_redis_reads_straight_through(
        slow_kiln: RunningKiln, unique_topic: str) -> None:
    # Given 300 records hardened and trimmed, and 300 more still in the log queue
    records = make_records(600)
    offsets = produce(slow_kiln, unique_topic, records[:300])
    assert slow_kiln.flush()
    offsets += produce(slow_kiln, unique_topic, records[300:])
    assert hot_start(slow_kiln, unique_topic) == 300

    # When a consumer reads from the earliest offset
    consumed = consume_kafka_python(slow_kiln.bootstrap, unique_topic, 0, BEGINNING, 600)

    # Then it reads one log, cold then hot, without a seam
    assert offsets == list(range(600))
    assert consumed == as_consumed(records, offsets)


def test_a_consumer_reading_while_records_are_hardened_under_it_misses_nothing(
        redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a Kiln that hardens after 20 ms, 500 records already hardened, and a consumer
    # that reads from the beginning in small fetches
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=20) as kiln:
        records = make_records(2000)
        offsets = produce(kiln, unique_topic, records[:500])
        assert kiln.flush()
        reader = ThreadPoolExecutor(1).submit(read_slowly, kiln.bootstrap, unique_topic, 2000)

        # When 1500 more are produced in bursts while the hardener moves records from Redis
        # to Kafka under the consumer
        for start in range(500, 2000, 50):
            offsets += produce(kiln, unique_topic, records[start:start + 50])
            time.sleep(0.02)
        consumed = reader.result(timeout=120)
        cold = kiln.app.cold.counters

    # Then it read every record once, in order, from Kafka first, whichever tier each one
    # came from
    assert offsets == list(range(2000))
    assert cold.records >= 500
    assert consumed == as_consumed(records, offsets)


def test_a_seek_into_the_middle_of_the_hardened_records_starts_there(
        slow_kiln: RunningKiln, unique_topic: str) -> None:
    # Given 1000 records hardened and trimmed
    records = make_records(1000)
    offsets = produce(slow_kiln, unique_topic, records)
    assert slow_kiln.flush()

    # When a consumer starts at offset 637
    consumed = consume_confluent(slow_kiln.bootstrap, unique_topic, 0, 637, 363, 30)

    # Then it reads 637..999, nothing before
    assert consumed == as_consumed(records[637:], offsets[637:])


def test_list_offsets_sees_both_tiers(slow_kiln: RunningKiln, unique_topic: str) -> None:
    # Given 100 records hardened (stamped T0 + i s), then 100 in Redis, one batch each
    # (stamped T1 + i s; T1 is in the past: Kafka refuses timestamps over an hour ahead)
    t0, t1 = 1_700_000_000_000, 1_750_000_000_000
    cold = [Record(None, b"cold-%d" % i, (), t0 + i * 1000) for i in range(100)]
    produce(slow_kiln, unique_topic, cold)
    assert slow_kiln.flush()
    producer = KafkaProducer(bootstrap_servers=slow_kiln.bootstrap, acks=1, linger_ms=0)
    for i in range(100):
        producer.send(unique_topic, value=b"hot-%d" % i, partition=0,
                      timestamp_ms=t1 + i * 1000).get(timeout=10)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=slow_kiln.bootstrap)
    tp = TopicPartition(unique_topic, 0)

    # When the earliest, latest and by-time offsets are asked for
    earliest = consumer.beginning_offsets([tp])[tp]
    latest = consumer.end_offsets([tp])[tp]
    times = {ts: consumer.offsets_for_times({tp: ts})[tp]
             for ts in (t0 - 1, t0 + 50_500, t1 - 1, t1 + 10_000, t1 + 10_000_000)}
    consumer.close()

    # Then the earliest is in Kafka, the latest in Redis, and times fall in either
    assert (earliest, latest) == (0, 200)
    found = {ts: None if v is None else (v.offset, v.timestamp) for ts, v in times.items()}
    assert found == {t0 - 1: (0, t0), t0 + 50_500: (51, t0 + 51_000),
                     t1 - 1: (100, t1), t1 + 10_000: (110, t1 + 10_000),
                     t1 + 10_000_000: None}


def test_a_fetch_mixing_tiers_keeps_to_its_byte_limit(
        slow_kiln: RunningKiln, unique_topic: str) -> None:
    # Given partition 0 in Kafka and partition 1 in Redis, 300 records each
    create_topic(slow_kiln, unique_topic, 2)
    records = make_records(300)
    produce(slow_kiln, unique_topic, records, partition=0)
    assert slow_kiln.flush()
    produce(slow_kiln, unique_topic, records, partition=1)
    client = RawClient(slow_kiln.bootstrap)

    # When one fetch asks for both, in either order, with 2000 bytes in all
    cold_first = raw_fetch(client, unique_topic, [(0, 0), (1, 0)], max_bytes=2000)
    hot_first = raw_fetch(client, unique_topic, [(1, 0), (0, 0)], max_bytes=2000)
    client.close()

    # Then the first partition gets what fits (at least one batch), the other nothing
    # once the limit is used up (KIP-74)
    assert all(p.error_code == 0 for p in cold_first + hot_first)
    assert 0 < len(cold_first[0].records) <= 2000
    assert offsets_of(cold_first[0].records)[0] == 0
    assert offsets_of(hot_first[0].records)[0] == 0
    assert (cold_first[1].records, hot_first[1].records) == (b"", b"")
    assert cold_first[0].log_start_offset == 0
    assert (cold_first[0].high_watermark, hot_first[0].high_watermark) == (300, 300)


def test_a_topic_kiln_adopted_reads_records_from_before_kiln_at_their_kafka_offsets(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a Kafka topic with 10 records from another producer, then Kiln's records with
    # Kiln offsets 20, 21 and 25, adopted by Kiln, which appends 5 more
    asyncio.run(write_to_kafka(kafka_bootstrap, unique_topic, [[None] * 10, [20, 21, 25]]))
    producer = KafkaProducer(bootstrap_servers=slow_kiln.bootstrap, acks=1)
    told = [producer.send(unique_topic, value=b"new-%d" % i, partition=0).get(timeout=10)
            .offset for i in range(5)]
    producer.close()

    # When a consumer reads from the earliest offset
    consumed = consume_aiokafka(slow_kiln.bootstrap, unique_topic, 0, BEGINNING, 18)

    # Then the older records come at their Kafka offsets, Kiln's at theirs, headers gone
    assert told == [26, 27, 28, 29, 30]
    assert [(c.offset, c.value, c.headers) for c in consumed] == [
        *((i, b"kafka-%d" % i, ()) for i in range(10)),
        *((k, b"kiln-%d" % k, ()) for k in (20, 21, 25)),
        *((26 + i, b"new-%d" % i, ()) for i in range(5)),
    ]


@pytest.mark.parametrize("client", CONSUMERS)
def test_while_kafka_is_unreachable_cold_reads_fail_retriably_and_resume_after(
        redis_url: str, unique_topic: str, client: str, kafka_relay: KafkaRelay) -> None:
    # Given a topic whose partition 0 is hardened and partition 1 in Redis, with Kiln
    # reaching Kafka through a relay that can be cut
    sync_redis(redis_url).flushdb()
    relay = kafka_relay.relay
    with start_kiln(redis_url, kafka_relay.bootstrap, harden_delay_ms=600_000) as kiln:
        create_topic(kiln, unique_topic, 2)
        records = make_records(300)
        offsets = produce(kiln, unique_topic, records, partition=0)
        assert kiln.flush()
        produce(kiln, unique_topic, records[:50], partition=1)

        # When Kafka goes away while a consumer starts reading partition 0 from the
        # beginning, and comes back 3 s later
        relay.stop()
        client_during = RawClient(kiln.bootstrap)
        during = raw_fetch(client_during, unique_topic, [(0, 0), (1, 0)], max_bytes=1 << 20)
        earliest_during = raw_list_offsets(client_during, unique_topic, 0, EARLIEST)
        client_during.close()
        reader = ThreadPoolExecutor(1).submit(CONSUMERS[client], kiln.bootstrap, unique_topic,
                                              0, BEGINNING, 300, 60)
        time.sleep(3)
        relay.start()
        consumed = reader.result(timeout=90)

    # Then the hardened partition answers a retriable error, the other one its records,
    # and the consumer, having waited without failing, reads everything once, in order
    assert COLD_TIER_UNAVAILABLE is ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert during[0].error_code == COLD_TIER_UNAVAILABLE
    assert (during[1].error_code, len(offsets_of(during[1].records))) == (0, 50)
    assert earliest_during == (COLD_TIER_UNAVAILABLE, -1)
    assert consumed == as_consumed(records, offsets)


# --- helpers ---------------------------------------------------------------------------------


def read_slowly(bootstrap: str, topic: str, expected: int) -> list[Consumed]:
    """kafka-python from the beginning, about one producer batch per fetch."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", max_partition_fetch_bytes=2048)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    out: list[Consumed] = []
    deadline = time.monotonic() + 60
    while len(out) < expected and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=200).values():
            out.extend(Consumed(r.offset, r.key, r.value, tuple(r.headers), r.timestamp)
                       for r in batch)
    for batch in consumer.poll(timeout_ms=500).values():  # anything beyond: duplicates
        out.extend(Consumed(r.offset, r.key, r.value, tuple(r.headers), r.timestamp)
                   for r in batch)
    consumer.close()
    return out


def create_topic(kiln: RunningKiln, topic: str, partitions: int) -> None:
    kiln.call(kiln.app.catalog.create(topic, partitions, require_kafka=True))


async def write_to_kafka(bootstrap: str, topic: str,
                         batches: Sequence[Sequence[int | None]]) -> None:
    """Batches written straight to Kafka; each record carries the given Kiln offset, or
    none (as a producer other than Kiln writes)."""
    client = KafkaClient(bootstrap)
    await client.create_topic(topic, 1)
    kafka_offset = 0
    for kiln_offsets in batches:
        builder: Any = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
        for i, kiln in enumerate(kiln_offsets):
            if kiln is None:
                value, headers = b"kafka-%d" % kafka_offset, []
            else:
                value, headers = b"kiln-%d" % kiln, [kiln_offset_header(kiln)]
            builder.append(i, 1_700_000_000_000, None, value, headers)
            kafka_offset += 1
        await client.produce(topic, 0, bytes(builder.build()))
    await client.close()


def raw_fetch(client: RawClient, topic: str, wanted: Sequence[tuple[int, int]],
              max_bytes: int) -> list[Any]:
    """One Fetch v11 for (partition, offset) pairs, in that order; their answers."""
    request = FetchRequest[11](
        replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=max_bytes, isolation_level=0,
        session_id=0, session_epoch=-1, rack_id="", forgotten_topics_data=[],
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchTopic.FetchPartition(
                partition=p, current_leader_epoch=-1, fetch_offset=o, log_start_offset=-1,
                partition_max_bytes=1 << 20)
            for p, o in wanted])])
    answer = client.request(request, 11, FetchResponse)
    by_partition = {p.partition_index: p for p in answer.responses[0].partitions}
    return [by_partition[p] for p, _ in wanted]


def raw_list_offsets(client: RawClient, topic: str, partition: int, timestamp: int
                     ) -> tuple[int, int]:
    request = ListOffsetsRequest[4](
        replica_id=-1, isolation_level=0,
        topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
            ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                partition_index=partition, current_leader_epoch=-1, timestamp=timestamp)])])
    part = client.request(request, 4, ListOffsetsResponse).topics[0].partitions[0]
    return part.error_code, part.offset


def offsets_of(records: bytes | None) -> list[int]:
    return [r.offset for r in decode_records(records or b"")]


