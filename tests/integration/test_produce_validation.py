"""Produce validation against a running Kiln: a batch that lies about its records changes
nothing, and a client's own `kiln.offset` header never passes for Kiln's lineage."""

from __future__ import annotations

import time

from aiokafka.record._crecords import DefaultRecordBatchBuilder
from kafka.admin import KafkaAdminClient

from storage.model import TopicPartition as KilnTopicPartition
from tests.integration.consumers import BEGINNING, consume_kafka_python
from tests.integration.test_produce_harden import read_hardened
from tests.kiln_harness import RunningKiln, fresh_kiln, start_kiln, sync_redis
from tests.raw_client import RawClient, record_batch
from wire.batch import HEADER, HEADER_SIZE, LOG_OVERHEAD, set_crc
from wire.errors import ErrorCode
from wire.lineage import kiln_offset_header, split_lineage

BOGUS = kiln_offset_header(999_999)


def partition_next_offset(redis_url: str, topic: str, partition: int = 0) -> int:
    raw = sync_redis(redis_url).hget(f"kiln:{{{topic}/{partition}}}:meta", "next")
    return int(raw or 0)


def lying_batch() -> bytes:
    """One 10-byte record under a header claiming 1,000,000, with a valid CRC."""
    record = bytes([18, 0, 0, 0, 1, 6]) + b"abc" + bytes([0])  # length 9, then 9 bytes
    batch = bytearray(HEADER.pack(0, HEADER_SIZE - LOG_OVERHEAD + len(record), -1, 2, 0, 0,
                                  999_999, 1_700_000_000_000, 1_700_000_000_000, -1, -1, -1,
                                  1_000_000)) + record
    set_crc(batch)
    return bytes(batch)


def headed_batch(values: list[bytes]) -> bytes:
    """A batch whose every record carries the client's own (bogus) `kiln.offset` header."""
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 22)
    now = int(time.time() * 1000)
    for i, value in enumerate(values):
        builder.append(i, now, None, value, [("trace", b"t%d" % i), BOGUS])
    return bytes(builder.build())


def test_a_batch_claiming_more_records_than_it_holds_changes_nothing(
        kiln: RunningKiln, redis_url: str, unique_topic: str) -> None:
    with RawClient(kiln.bootstrap) as client:
        # Given a partition holding three records
        first = client.produce(unique_topic, 0, record_batch([b"a", b"b", b"c"]))

        # When a batch claiming 1,000,000 records over 10 bytes of them arrives, then a good one
        lying = client.produce(unique_topic, 0, lying_batch())
        next_after_lie = partition_next_offset(redis_url, unique_topic)
        good = client.produce(unique_topic, 0, record_batch([b"d", b"e"]))

    # Then the lie is refused and moves nothing; the good batch lands right after the first
    assert (first.error_code, first.base_offset) == (0, 0)
    assert (lying.error_code, lying.base_offset) == (ErrorCode.INVALID_RECORD, -1)
    assert next_after_lie == 3
    assert (good.error_code, good.base_offset) == (0, 3)
    consumed = consume_kafka_python(kiln.bootstrap, unique_topic, 0, BEGINNING, 5, 20)
    assert [(c.offset, c.value) for c in consumed] == [
        (0, b"a"), (1, b"b"), (2, b"c"), (3, b"d"), (4, b"e")]


def test_a_corrupt_batch_to_an_unknown_topic_does_not_create_it(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    with RawClient(kiln.bootstrap) as client:
        answer = client.produce(unique_topic, 0, lying_batch())

    assert answer.error_code == ErrorCode.INVALID_RECORD
    assert kiln.call(kiln.app.catalog.lookup(unique_topic, allow_create=False)) is None
    with KafkaAdminClient(bootstrap_servers=kafka_bootstrap) as admin:
        assert unique_topic not in admin.list_topics()


def test_a_clients_own_kiln_offset_header_never_passes_for_kilns_lineage(
        redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given 100 records on a fresh topic, each with a client header kiln.offset = 999999
    # (a batch large enough to be forwarded whole), hardened and trimmed from Redis
    values = [b"mirrored-%d" % i for i in range(100)]
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=600_000) as first:
        with RawClient(first.bootstrap) as client:
            answer = client.produce(unique_topic, 0, headed_batch(values))
        assert (answer.error_code, answer.base_offset) == (0, 0)
        assert first.flush()
        assert first.call(first.app.queue.start_offset(
            KilnTopicPartition(unique_topic, 0))) == 100

        # When they are read back from Kafka and through Kiln (read-through)...
        in_kafka = read_hardened(kafka_bootstrap, unique_topic, 0, 100)
        through_kiln = consume_kafka_python(first.bootstrap, unique_topic, 0, BEGINNING, 100,
                                            30)
    # ...and a restarted Kiln hardens 100 more
    with start_kiln(redis_url, kafka_bootstrap, harden_delay_ms=600_000) as restarted:
        with RawClient(restarted.bootstrap) as client:
            more = client.produce(unique_topic, 0,
                                  record_batch([b"after-%d" % i for i in range(100)]))
        assert restarted.flush()
    everything = read_hardened(kafka_bootstrap, unique_topic, 0, 200)

    # Then (a) Kafka's records name their true Kiln offsets, the client's header kept
    lineage = [split_lineage(r.offset, r.headers) for r in in_kafka]
    assert [offset for offset, _ in lineage] == list(range(100))
    assert all(headers == (("trace", b"t%d" % i), BOGUS)
               for i, (_, headers) in enumerate(lineage))
    # (b) read-through serves them at their true offsets with the client's header intact
    assert [(c.offset, c.value) for c in through_kiln] == list(enumerate(values))
    assert all(c.headers == (("trace", b"t%d" % i), BOGUS)
               for i, c in enumerate(through_kiln))
    # (c) the restarted Kiln resumed right after them: nothing lost, nothing twice
    assert (more.error_code, more.base_offset) == (0, 100)
    assert [split_lineage(r.offset, r.headers)[0] for r in everything] == list(range(200))
    assert [r.value for r in everything] == values + [b"after-%d" % i for i in range(100)]
