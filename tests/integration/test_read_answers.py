"""What Fetch and ListOffsets answer besides the records, and where a read by time lands, as
Apache Kafka answers them (tests/compat/test_conformance.py compares the two directly)."""

from __future__ import annotations

from typing import Any

from kafka.protocol.admin import DeleteRecordsRequest, DeleteRecordsResponse
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)

from storage.model import TopicPartition
from tests.kiln_harness import RunningKiln
from tests.raw_client import RawClient, record_batch
from wire.batch import CODEC_GZIP, split_batches
from wire.errors import ErrorCode
from wire.records import decode_records

FIRST_TIMESTAMP = 1_700_000_000_000  # record i of a raw_client batch: FIRST_TIMESTAMP + i
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


def fetch(client: RawClient, topic: str, offset: int, version: int = 12,
          isolation_level: int = READ_UNCOMMITTED) -> Any:
    """Partition 0's answer to a sessionless fetch from `offset` that does not wait."""
    wanted = FetchRequest.FetchTopic
    request = FetchRequest[version](
        replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
        isolation_level=isolation_level, session_id=0, session_epoch=-1, rack_id="",
        forgotten_topics_data=[], topics=[wanted(topic=topic, partitions=[
            wanted.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=offset,
                                  last_fetched_epoch=-1, log_start_offset=-1,
                                  partition_max_bytes=1 << 20)])])
    return client.request(request, version, FetchResponse).responses[0].partitions[0]


def offset_for_time(client: RawClient, topic: str, timestamp: int) -> tuple[int, int, int]:
    """(offset, timestamp, leader epoch) of ListOffsets v8 for partition 0."""
    wanted = ListOffsetsRequest.ListOffsetsTopic
    request = ListOffsetsRequest[8](
        replica_id=-1, isolation_level=READ_UNCOMMITTED, topics=[wanted(name=topic, partitions=[
            wanted.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1,
                                        timestamp=timestamp)])])
    part = client.request(request, 8, ListOffsetsResponse).topics[0].partitions[0]
    assert part.error_code == ErrorCode.NONE, part
    return part.offset, part.timestamp, part.leader_epoch


def produce(client: RawClient, topic: str, count: int, codec: int = 0) -> int:
    """One batch of `count` records; its base offset."""
    answer = client.produce(topic, 0, record_batch([b"v%d" % i for i in range(count)],
                                                   codec=codec))
    assert answer.error_code == ErrorCode.NONE, answer
    return int(answer.base_offset)


def test_a_fetch_from_kafka_goes_on_into_redis_and_every_batch_has_kilns_leader_epoch(
        slow_kiln: RunningKiln, unique_topic: str) -> None:
    # Given offsets 0-2 hardened into Kafka and 3-5 still in Redis, a batch each
    client = RawClient(slow_kiln.bootstrap)
    produce(client, unique_topic, 3)
    assert slow_kiln.flush()
    produce(client, unique_topic, 3)

    # When a consumer fetches from 1 (inside the hardened batch) and from 4 (in Redis)
    from_kafka, from_redis = fetch(client, unique_topic, 1), fetch(client, unique_topic, 4)
    client.close()

    # Then the first answer holds both tiers' records, from 1 on, and every batch served
    # carries leader epoch 0 (the one Metadata names) under a valid CRC
    assert [r.offset for r in decode_records(from_kafka.records)] == [1, 2, 3, 4, 5]
    assert [r.offset for r in decode_records(from_redis.records)] == [3, 4, 5]
    for answer in (from_kafka, from_redis):
        assert {h.partition_leader_epoch for h, _ in split_batches(answer.records)} == {0}
        assert (answer.high_watermark, answer.log_start_offset) == (6, 0)


def test_aborted_transactions_are_null_unless_read_committed(
        slow_kiln: RunningKiln, unique_topic: str) -> None:
    # Given a topic with a record
    client = RawClient(slow_kiln.bootstrap)
    produce(client, unique_topic, 1)

    # When it is fetched read_uncommitted (v4, v12) and read_committed, and an unknown
    # topic is fetched
    uncommitted = [fetch(client, unique_topic, 0, version=v) for v in (4, 12)]
    committed = fetch(client, unique_topic, 0, isolation_level=READ_COMMITTED)
    unknown = fetch(client, unique_topic + "-none", 0)
    client.close()

    # Then there is no list for read_uncommitted, an empty one otherwise, as from Kafka
    assert [a.aborted_transactions for a in uncommitted] == [None, None]
    assert committed.aborted_transactions == []
    assert (unknown.error_code, unknown.aborted_transactions) == (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, [])


def test_a_fetch_past_the_end_answers_no_offsets(slow_kiln: RunningKiln,
                                                 unique_topic: str) -> None:
    # Given a topic with a record
    client = RawClient(slow_kiln.bootstrap)
    produce(client, unique_topic, 1)

    # When offset 10 is fetched
    answers = [fetch(client, unique_topic, 10, version=v) for v in (4, 12)]
    client.close()

    # Then the partition answers OFFSET_OUT_OF_RANGE with -1 for every offset, as Kafka
    for answer in answers:
        assert answer.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
        assert (answer.high_watermark, answer.last_stable_offset) == (-1, -1)
        assert answer.aborted_transactions is None
    assert answers[1].log_start_offset == -1


def test_the_log_start_stays_in_kafka_when_the_records_move_there(
        slow_kiln: RunningKiln, unique_topic: str) -> None:
    # Given 3 records in Redis, and Kiln having seen that Kafka holds none of them
    client = RawClient(slow_kiln.bootstrap)
    produce(client, unique_topic, 3)
    before = fetch(client, unique_topic, 3)
    tp = TopicPartition(unique_topic, 0)
    assert slow_kiln.call(slow_kiln.app.cold.earliest(tp)) is None

    # When they are hardened into Kafka and a consumer at the end fetches again
    assert slow_kiln.flush()
    after = fetch(client, unique_topic, 3)
    client.close()

    # Then the log start is still 0: the records are there, in Kafka
    assert (before.log_start_offset, before.high_watermark) == (0, 3)
    assert (after.log_start_offset, after.high_watermark) == (0, 3)


def test_a_time_inside_a_batch_in_redis_finds_the_record_at_or_after_it(
        slow_kiln: RunningKiln, unique_topic: str) -> None:
    # Given one gzip batch at offsets 0-3 in Redis, stamped T..T+3
    client = RawClient(slow_kiln.bootstrap)
    produce(client, unique_topic, 4, codec=CODEC_GZIP)

    # When the offsets for T+1 and T+3 are asked
    found = [offset_for_time(client, unique_topic, FIRST_TIMESTAMP + d) for d in (1, 3)]
    client.close()

    # Then each is the record stamped so, not the batch's first with its max timestamp
    assert found == [(1, FIRST_TIMESTAMP + 1, 0), (3, FIRST_TIMESTAMP + 3, 0)]


def test_a_time_below_the_deleted_mark_finds_the_first_record_kept(
        slow_kiln: RunningKiln, unique_topic: str) -> None:
    # Given one batch at offsets 0-3 in Redis (T..T+3), records below 2 deleted
    client = RawClient(slow_kiln.bootstrap)
    produce(client, unique_topic, 4)
    wanted = DeleteRecordsRequest.DeleteRecordsTopic
    deleted = client.request(DeleteRecordsRequest[2](timeout_ms=10_000, topics=[wanted(
        name=unique_topic, partitions=[wanted.DeleteRecordsPartition(partition_index=0,
                                                                    offset=2)])]),
        2, DeleteRecordsResponse)
    assert deleted.topics[0].partitions[0].error_code == ErrorCode.NONE, deleted

    # When the offset for T+1 is asked
    found = offset_for_time(client, unique_topic, FIRST_TIMESTAMP + 1)
    client.close()

    # Then it is the first record kept, with its own timestamp, as Kafka answers
    assert found == (2, FIRST_TIMESTAMP + 2, 0)
