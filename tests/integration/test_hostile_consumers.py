"""Hostile or absurd consumer-side requests (commits, fetches, joins) get clear error codes
and leave stored records intact."""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer import OffsetCommitRequest, OffsetCommitResponse

from storage.model import TopicPartition
from tests.integration.test_groups import commit, fetch_offsets, join
from tests.integration.test_read_through import offsets_of, raw_fetch
from tests.kiln_harness import RunningKiln
from tests.raw_client import RawClient, record_batch
from wire.errors import ErrorCode

MAX_OFFSET = 2**63 - 1


def commit_with_metadata(client: RawClient, group: str, topic: str, metadata: str) -> int:
    part = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
        partition_index=0, committed_offset=1, committed_leader_epoch=-1,
        committed_metadata=metadata)
    answer: Any = client.request(OffsetCommitRequest[8](
        group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
        topics=[OffsetCommitRequest.OffsetCommitRequestTopic(name=topic, partitions=[part])]),
        8, OffsetCommitResponse)
    return int(answer.topics[0].partitions[0].error_code)


def test_absurd_commits_deliver_nothing_that_was_not_produced(
        kiln: RunningKiln, unique_topic: str) -> None:
    # Given 5 records and a durable subscription that commits the largest offset there is
    with RawClient(kiln.bootstrap) as client:
        client.produce(unique_topic, 0, record_batch([b"a"] * 5))
        kiln.call(kiln.app.delivery.subscribe(unique_topic, "absurd"))
        huge = commit(client, "absurd", {(unique_topic, 0): MAX_OFFSET})

        # When 5 more are produced, and the group then commits a negative offset
        client.produce(unique_topic, 0, record_batch([b"b"] * 5))
        negative = commit(client, "absurd", {(unique_topic, 0): -7})
        oversized = commit_with_metadata(client, "absurd", unique_topic, "m" * 5000)
        dropped, read = raw_fetch(client, unique_topic, [(0, 0)], 1 << 20)[0], raw_fetch(
            client, unique_topic, [(0, 5)], 1 << 20)[0]
        stored = fetch_offsets(client, "absurd", [(unique_topic, 0)])
    state = kiln.call(kiln.app.queue.state(TopicPartition(unique_topic, 0)))

    # Then only the 5 records that existed at the first commit count as delivered (gone,
    # so offset 0 is now out of range, answered without offsets as by Kafka), the later
    # ones stay buffered and readable, and oversized metadata is refused
    assert huge == {(unique_topic, 0): 0}
    assert negative == {(unique_topic, 0): 0}
    assert oversized == ErrorCode.OFFSET_METADATA_TOO_LARGE
    assert stored == {(unique_topic, 0): (-7, "at -7")}
    assert (state.delivered_offset, state.buffered_records, state.next_offset) == (5, 5, 10)
    assert (dropped.error_code, dropped.log_start_offset) == (ErrorCode.OFFSET_OUT_OF_RANGE, -1)
    assert offsets_of(read.records) == [5, 6, 7, 8, 9]


def test_fetches_outside_the_log_are_out_of_range_and_change_nothing(
        kiln: RunningKiln, unique_topic: str) -> None:
    with RawClient(kiln.bootstrap) as client:
        client.produce(unique_topic, 0, record_batch([b"x"] * 3))
        below, above, unknown = raw_fetch(client, unique_topic, [(0, -5), (0, MAX_OFFSET),
                                                                 (7, 0)], 1 << 20)
        after = raw_fetch(client, unique_topic, [(0, 0)], 1 << 20)[0]

    # Kafka answers an out-of-range fetch without offsets (-1): clients reset by ListOffsets
    assert (below.error_code, below.log_start_offset) == (ErrorCode.OFFSET_OUT_OF_RANGE, -1)
    assert (above.error_code, above.high_watermark) == (ErrorCode.OFFSET_OUT_OF_RANGE, -1)
    assert unknown.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert offsets_of(after.records) == [0, 1, 2]


def test_a_join_with_an_empty_group_id_is_refused(kiln: RunningKiln) -> None:
    with RawClient(kiln.bootstrap) as client:
        answer = join(client, "")
        still_serving = join(client, "a-real-group")

    assert answer.error_code == ErrorCode.INVALID_GROUP_ID
    assert still_serving.error_code == ErrorCode.MEMBER_ID_REQUIRED


def test_commits_under_the_empty_group_id_never_hold_records_back(
        kiln: RunningKiln, unique_topic: str) -> None:
    # Given records, a durable subscription that read them all, and commits by group ""
    with RawClient(kiln.bootstrap) as client:
        client.produce(unique_topic, 0, record_batch([b"x"] * 4))
        kiln.call(kiln.app.delivery.subscribe(unique_topic, "reader"))
        anonymous = commit(client, "", {(unique_topic, 0): 0})
        reader = commit(client, "reader", {(unique_topic, 0): 4})
    subscriptions = kiln.call(kiln.app.delivery.subscriptions())
    state = kiln.call(kiln.app.queue.state(TopicPartition(unique_topic, 0)))

    # Then only the real group counts, and what it read is delivered
    assert (anonymous, reader) == ({(unique_topic, 0): 0}, {(unique_topic, 0): 0})
    assert sorted(subscriptions[unique_topic]) == ["reader"]
    assert (state.delivered_offset, state.buffered_records) == (4, 0)
