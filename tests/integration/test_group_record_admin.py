"""Groups, offsets and records administered through Kiln with real admin clients
(confluent-kafka's AdminClient, kafka-python's KafkaAdminClient) and raw requests: ListOffsets
(the largest timestamp, the tiered-storage queries), OffsetForLeaderEpoch, DeleteGroups,
OffsetDelete and DeleteRecords. Each test checks what Kiln holds (Redis) and what Kafka
holds afterwards, and answers to bad input against Apache Kafka's answer to the same request.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka import TopicPartition as ConfluentPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from kafka import TopicPartition as KafkaPartition
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
)
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)

from storage.log_queue import PartitionState
from storage.model import TopicPartition
from tests.compat.clients import read_hardened
from tests.integration.test_delivery import auto_subscribed_then_empty
from tests.integration.test_delivery import commit as member_commit
from tests.integration.test_groups import commit as commit_over_the_wire
from tests.integration.test_groups import fetch_offsets
from tests.kiln_harness import RunningKiln, eventually, fresh_kiln, start_kiln, sync_redis
from tests.raw_client import RawClient, record_batch
from wire.errors import ErrorCode as E

BASE_TIMESTAMP_MS = 1_700_000_000_000


def produce(bootstrap: str, topic: str, count: int, timestamps: list[int] | None = None,
            first: int = 0) -> None:
    """`count` records to partition 0, one batch each, acks=1 (answered on append)."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": 1,
                                         "linger.ms": 0})
    for i in range(count):
        producer.produce(topic, value=b"v%d" % (first + i), partition=0,
                         timestamp=0 if timestamps is None else timestamps[i])
        assert producer.flush(15) == 0


def state(kiln: RunningKiln, topic: str) -> PartitionState:
    return kiln.call(kiln.app.queue.state(TopicPartition(topic, 0)))


def hardened_offsets(kafka_bootstrap: str, topic: str) -> list[int]:
    """The Kiln offsets of the records Kafka holds in partition 0."""
    return [r.kiln_offset for r in read_hardened(kafka_bootstrap, topic, 1)[0]]


def kafka_log_start(kafka_bootstrap: str, topic: str) -> int:
    return list_offset(kafka_bootstrap, topic, OffsetSpec.earliest())[0]


def list_offset(bootstrap: str, topic: str, spec: OffsetSpec) -> tuple[int, int]:
    """(offset, timestamp) of partition 0, asked with confluent-kafka's AdminClient."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = ConfluentPartition(topic, 0)
    found = admin.list_offsets({tp: spec})[tp].result(30)
    return int(found.offset), int(found.timestamp)


def consume_from_start(bootstrap: str, topic: str, expected: int) -> list[tuple[int, bytes]]:
    """(offset, value) of the records a consumer reading partition 0 from its start gets."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:6]}",
        "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    got: list[tuple[int, bytes]] = []
    try:
        consumer.assign([ConfluentPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)])
        deadline = time.monotonic() + 20
        while len(got) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                got.append((int(message.offset() or 0), bytes(message.value() or b"")))
        for message in consumer.consume(100, 0.5):  # anything beyond what was expected
            if message.error() is None:
                got.append((int(message.offset() or 0), bytes(message.value() or b"")))
    finally:
        consumer.close()
    return got


def raw(bootstrap: str, request: Any, version: int, response: Any) -> Any:
    with RawClient(bootstrap) as client:
        return client.request(request, version, response)


# --- ListOffsets ----------------------------------------------------------------------------


@pytest.mark.parametrize(("hardened", "buffered", "expected"), [
    ([0, 9000, 1000], [2000, 3000], (1, 9000)),  # the largest timestamp is in Kafka
    ([0, 1000, 2000], [3000, 9000, 500], (4, 9000)),  # ... in the log queue
    ([0, 9000, 1000], [9000, 500], (1, 9000)),  # on a tie, the first record
], ids=["in-kafka", "in-redis", "tie"])
def test_max_timestamp_is_the_record_with_the_largest_timestamp_in_either_tier(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str, hardened: list[int],
        buffered: list[int], expected: tuple[int, int]) -> None:
    # Given records hardened to Kafka and records still in the log queue, one batch each
    produce(slow_kiln.bootstrap, unique_topic, len(hardened),
            [BASE_TIMESTAMP_MS + t for t in hardened])
    assert slow_kiln.flush()
    produce(slow_kiln.bootstrap, unique_topic, len(buffered),
            [BASE_TIMESTAMP_MS + t for t in buffered], first=len(hardened))
    # When an admin client asks Kiln for the offset of the largest timestamp
    found = list_offset(slow_kiln.bootstrap, unique_topic, OffsetSpec.max_timestamp())
    # Then it is the record holding it, across both tiers (Kafka holds only the hardened
    # ones, and answers as Kiln does for those)
    assert found == (expected[0], BASE_TIMESTAMP_MS + expected[1])
    assert state(slow_kiln, unique_topic).buffered_records == len(buffered)
    in_kafka = list_offset(kafka_bootstrap, unique_topic, OffsetSpec.max_timestamp())
    assert in_kafka == (hardened.index(max(hardened)), BASE_TIMESTAMP_MS + max(hardened))


def list_offsets_request(version: int, topic: str, timestamp: int, partition: int = 0,
                         current_leader_epoch: int = -1) -> Any:
    topics = ListOffsetsRequest.ListOffsetsTopic
    return ListOffsetsRequest[version](
        replica_id=-1, isolation_level=0, timeout_ms=10_000,
        topics=[topics(name=topic, partitions=[topics.ListOffsetsPartition(
            partition_index=partition, current_leader_epoch=current_leader_epoch,
            timestamp=timestamp)])])


def list_offsets_answer(bootstrap: str, version: int, topic: str, timestamp: int,
                        **kwargs: int) -> tuple[int, int, int, int]:
    """(error code, offset, timestamp, leader epoch) of partition 0 (epoch -1 before v4)."""
    answer = raw(bootstrap, list_offsets_request(version, topic, timestamp, **kwargs), version,
                 ListOffsetsResponse).topics[0].partitions[0]
    return (answer.error_code, answer.offset, answer.timestamp,
            answer.leader_epoch if version >= 4 else -1)


def test_every_timestamp_query_is_answered_as_kafka_answers_it(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given five records hardened to Kafka with the same offsets as in Kiln
    produce(kiln.bootstrap, unique_topic, 5,
            [BASE_TIMESTAMP_MS + t for t in (0, 4000, 1000, 3000, 2000)])
    assert kiln.flush()
    queries = [(version, timestamp) for version in (1, 6, 7, 8, 9, 10, 11)
               for timestamp in (-1, -2, -3, -4, -5, -6, -7, BASE_TIMESTAMP_MS + 2500,
                                 BASE_TIMESTAMP_MS + 9000)]
    # When each version asks each query, of Kiln and of Kafka
    through_kiln = [list_offsets_answer(kiln.bootstrap, v, unique_topic, t) for v, t in queries]
    from_kafka = [list_offsets_answer(kafka_bootstrap, v, unique_topic, t) for v, t in queries]
    # Then Kiln answers exactly as Kafka: MAX_TIMESTAMP (-3, v7+), EARLIEST_LOCAL (-4, v8+),
    # the tiered-storage queries with no offset (-5 from v9, -6 from v11), UNSUPPORTED_VERSION
    # for what a version does not know
    assert dict(zip(queries, through_kiln, strict=True)) == dict(
        zip(queries, from_kafka, strict=True))
    assert dict(zip(queries, through_kiln, strict=True))[(11, -3)] == (
        0, 1, BASE_TIMESTAMP_MS + 4000, 0)
    assert {answer[0] for (v, t), answer in zip(queries, through_kiln, strict=True)
            if t == -7} == {E.UNSUPPORTED_VERSION}


def test_list_offsets_checks_the_current_leader_epoch_as_kafka_does(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a partition with records, in Kiln and in Kafka
    produce(kiln.bootstrap, unique_topic, 2)
    assert kiln.flush()
    epochs = [-1, 0, 1, -2]
    # When ListOffsets names each current leader epoch
    through_kiln = [list_offsets_answer(kiln.bootstrap, 7, unique_topic, -1,
                                        current_leader_epoch=e) for e in epochs]
    from_kafka = [list_offsets_answer(kafka_bootstrap, 7, unique_topic, -1,
                                      current_leader_epoch=e) for e in epochs]
    # Then the epoch Kiln reports (0) and "no epoch" pass, the others are refused as Kafka
    # refuses them
    assert through_kiln == from_kafka
    assert [a[0] for a in through_kiln] == [0, 0, E.UNKNOWN_LEADER_EPOCH,
                                            E.FENCED_LEADER_EPOCH]


# --- OffsetForLeaderEpoch -------------------------------------------------------------------


def end_of_epoch(bootstrap: str, version: int, topic: str,
                 asked: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """(error code, leader epoch, end offset) for each (partition, current epoch, epoch)."""
    topics = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    request = OffsetForLeaderEpochRequest[version](replica_id=-1, topics=[topics(
        topic=topic, partitions=[topics.OffsetForLeaderPartition(
            partition=p, current_leader_epoch=current, leader_epoch=epoch)
            for p, current, epoch in asked])])
    answer = raw(bootstrap, request, version, OffsetForLeaderEpochResponse)
    return [(p.error_code, p.leader_epoch, p.end_offset) for p in answer.topics[0].partitions]


@pytest.mark.parametrize("version", [2, 3, 4])
def test_offset_for_leader_epoch_answers_as_kafka_for_the_same_partition(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str, version: int) -> None:
    # Given seven records, hardened to Kafka with the same offsets as in Kiln
    produce(kiln.bootstrap, unique_topic, 7)
    assert kiln.flush()
    asked = [(0, -1, 0), (0, 0, 0), (0, -1, 1), (0, -1, -1), (0, -1, -5), (0, 1, 0),
             (0, -2, 0), (0, 3, 3), (9, -1, 0)]
    # When a consumer asks where each leader epoch ends, of Kiln and of Kafka
    through_kiln = end_of_epoch(kiln.bootstrap, version, unique_topic, asked)
    from_kafka = end_of_epoch(kafka_bootstrap, version, unique_topic, asked)
    # Then Kiln answers as Kafka: epoch 0 ends at the end (7), an epoch above 0 or undefined
    # nowhere, one below 0 at the log start; a stale or future current epoch is refused,
    # an unknown partition too
    assert through_kiln == from_kafka
    assert through_kiln == [
        (0, 0, 7), (0, 0, 7), (0, -1, -1), (0, -1, -1), (0, -5, 0),
        (E.UNKNOWN_LEADER_EPOCH, -1, -1), (E.FENCED_LEADER_EPOCH, -1, -1),
        (E.UNKNOWN_LEADER_EPOCH, -1, -1), (E.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)]


def test_after_redis_lost_a_partition_epoch_0_ends_where_kafka_records_end(
        redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a consumer that read up to offset 8 of a partition whose first five records
    # were hardened, and then Redis lost everything
    store = sync_redis(redis_url)
    store.flushdb()
    with start_kiln(redis_url, kafka_bootstrap, harden_delay_ms=600_000) as before:
        produce(before.bootstrap, unique_topic, 5)
        assert before.flush()
        produce(before.bootstrap, unique_topic, 3, first=5)
        read_up_to = len(consume_from_start(before.bootstrap, unique_topic, 8))
    store.flushdb()
    with start_kiln(redis_url, kafka_bootstrap, harden_delay_ms=600_000) as after:
        # When the consumer validates its position of epoch 0 (as after a leader change)
        [answer] = end_of_epoch(after.bootstrap, 4, unique_topic, [(0, 0, 0)])
        # Then it learns that epoch 0 ends before its position: the records it read past
        # Kafka's end are gone (truncation), and the partition goes on from there (offset
        # 5 went to the abort marker that fenced the lost incarnation's writer)
        assert read_up_to == 8
        assert answer == (0, 0, 6)
        assert list_offset(after.bootstrap, unique_topic, OffsetSpec.latest())[0] == 6


# --- DeleteGroups ---------------------------------------------------------------------------


def group_keys(redis_url: str, group: str) -> list[bytes]:
    store = sync_redis(redis_url)
    return sorted(store.keys(f"kiln:group:{{{group}}}:*"))


def live_member(bootstrap: str, group: str, topic: str) -> confluent_kafka.Consumer:
    """A consumer of `group` subscribed to `topic`, with its partitions assigned."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    consumer.subscribe([topic])
    deadline = time.monotonic() + 20
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.2)
    assert consumer.assignment()
    return consumer


def delete_groups_confluent(bootstrap: str, groups: list[str]) -> dict[str, int]:
    """Each group's outcome: 0, or the Kafka error code the admin client reports."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    outcomes = {}
    for group, future in admin.delete_consumer_groups(groups, request_timeout=15).items():
        try:
            future.result(30)
            outcomes[group] = 0
        except confluent_kafka.KafkaException as exc:
            outcomes[group] = int(exc.args[0].code())
    return outcomes


def test_delete_groups_deletes_an_empty_group_and_refuses_others_as_kafka(
        kiln: RunningKiln, redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a group without members that committed offsets, a group with a live member,
    # and a group nobody ever used
    produce(kiln.bootstrap, unique_topic, 3)
    empty, busy, unknown = (f"g-{uuid.uuid4().hex[:8]}" for _ in range(3))
    with RawClient(kiln.bootstrap) as client:
        assert commit_over_the_wire(client, empty, {(unique_topic, 0): 2}) == {
            (unique_topic, 0): 0}
    stored_before = group_keys(redis_url, empty)
    with live_member(kiln.bootstrap, busy, unique_topic):
        # When an admin client deletes all three
        outcomes = delete_groups_confluent(kiln.bootstrap, [empty, busy, unknown])
    # Then the empty group is gone from Kiln (its metadata and offsets in Redis, its listing),
    # the others are refused with Kafka's codes (Kafka answers an unknown group alike)
    assert outcomes == {empty: 0, busy: E.NON_EMPTY_GROUP, unknown: E.GROUP_ID_NOT_FOUND}
    assert len(stored_before) == 3  # meta, offsets, revision
    assert group_keys(redis_url, empty) == []
    admin = AdminClient({"bootstrap.servers": kiln.bootstrap})
    listed = {g.group_id for g in admin.list_consumer_groups().result(30).valid}
    assert empty not in listed and busy in listed
    with RawClient(kiln.bootstrap) as client:
        assert fetch_offsets(client, empty, None) == {}
    assert delete_groups_confluent(kafka_bootstrap, [unknown]) == {
        unknown: E.GROUP_ID_NOT_FOUND}
    # (Kiln keeps groups to itself: Kafka never heard of them)
    assert delete_groups_confluent(kafka_bootstrap, [empty]) == {
        empty: E.GROUP_ID_NOT_FOUND}


def test_delete_groups_answers_each_named_group_once_as_kafka(
        kiln: RunningKiln, kafka_bootstrap: str) -> None:
    # When a DeleteGroups request names an unknown group twice, and the empty group id
    names = ["nobody", "nobody", ""]
    answers = [raw(bootstrap, DeleteGroupsRequest[2](groups_names=names), 2,
                   DeleteGroupsResponse).results for bootstrap in (kiln.bootstrap,
                                                                   kafka_bootstrap)]
    # Then Kiln answers each once, as Kafka does
    through_kiln, from_kafka = ({(r.group_id, r.error_code) for r in results}
                                for results in answers)
    assert through_kiln == from_kafka == {("nobody", E.GROUP_ID_NOT_FOUND),
                                          ("", E.GROUP_ID_NOT_FOUND)}
    assert len(answers[0]) == 2


def test_a_deleted_group_stops_holding_records_it_had_subscribed_itself(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given ten buffered records and two groups that subscribed themselves by committing as
    # members: "fast" read all ten, "slow" only three, and its consumers are gone
    produce(slow_kiln.bootstrap, unique_topic, 10)
    with RawClient(slow_kiln.bootstrap) as client:
        for group in ("fast", "slow"):
            auto_subscribed_then_empty(client, group, unique_topic)
    member_commit(slow_kiln, "fast", unique_topic, 10)
    member_commit(slow_kiln, "slow", unique_topic, 3)
    held = state(slow_kiln, unique_topic)
    # When kafka-python's admin client deletes the slow group
    with KafkaAdminClient(bootstrap_servers=slow_kiln.bootstrap) as admin:
        outcome = admin.delete_groups(["slow"])
    # Then it no longer counts: the records only it had not read are delivered to the rest
    # and dropped, never written to Kafka; the fast group stays subscribed
    assert outcome == {"slow": "OK"}
    assert (held.delivered_offset, held.buffered_records) == (3, 7)
    after = state(slow_kiln, unique_topic)
    assert (after.delivered_offset, after.buffered_records, after.delivered_records) == (
        10, 0, 10)
    subscriptions = slow_kiln.call(slow_kiln.app.delivery.subscriptions())
    assert set(subscriptions[unique_topic]) == {"fast"}
    assert slow_kiln.flush()
    assert hardened_offsets(kafka_bootstrap, unique_topic) == []


def test_a_deleted_group_an_operator_registered_stays_subscribed_without_its_commits(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given ten buffered records, a group an operator registered as a durable subscription
    # that committed 3 (standalone), and another that read them all
    produce(slow_kiln.bootstrap, unique_topic, 10)
    slow_kiln.call(slow_kiln.app.delivery.subscribe(unique_topic, "audit"))
    slow_kiln.call(slow_kiln.app.delivery.subscribe(unique_topic, "billing"))
    with RawClient(slow_kiln.bootstrap) as client:
        for group, offset in (("audit", 3), ("billing", 10)):
            assert commit_over_the_wire(client, group, {(unique_topic, 0): offset}) == {
                (unique_topic, 0): 0}
    # When the audit group is deleted
    outcome = delete_groups_confluent(slow_kiln.bootstrap, ["audit"])
    # Then it stays a durable subscription (the operator registered it), but its commit went
    # with the group: nothing more is delivered until it commits again, and the records it
    # had not read stay, to be hardened
    assert outcome == {"audit": 0}
    subscriptions = slow_kiln.call(slow_kiln.app.delivery.subscriptions())
    assert set(subscriptions[unique_topic]) == {"audit", "billing"}
    commits = slow_kiln.call(slow_kiln.app.queue.commits([TopicPartition(unique_topic, 0)]))
    assert commits == [{"billing": 10}]
    after = state(slow_kiln, unique_topic)
    assert (after.delivered_offset, after.buffered_records) == (3, 7)
    assert slow_kiln.flush()
    assert hardened_offsets(kafka_bootstrap, unique_topic) == list(range(3, 10))


# --- OffsetDelete ---------------------------------------------------------------------------


def test_offset_delete_deletes_offsets_of_topics_the_group_is_not_subscribed_to(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a group whose offsets on two topics an admin client set while it was empty,
    # and which then got a live member subscribed to the first
    other = f"{unique_topic}-other"
    for topic in (unique_topic, other):
        produce(kiln.bootstrap, topic, 2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kiln.bootstrap})
    altered = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, [
        ConfluentPartition(unique_topic, 0, 1), ConfluentPartition(other, 0, 2)])])
    assert altered[group].result(30).group_id == group
    with live_member(kiln.bootstrap, group, unique_topic):
        # When kafka-python's admin client deletes the group's offsets of both topics
        with KafkaAdminClient(bootstrap_servers=kiln.bootstrap) as admin:
            outcome = admin.delete_group_offsets(group, [KafkaPartition(unique_topic, 0),
                                                         KafkaPartition(other, 0)])
        with RawClient(kiln.bootstrap) as client:
            left = fetch_offsets(client, group, None)
    # Then the offset of the topic the member reads stays (GROUP_SUBSCRIBED_TO_TOPIC), the
    # other is gone
    assert {(tp.topic, error.errno) for tp, error in outcome.items()} == {
        (unique_topic, E.GROUP_SUBSCRIBED_TO_TOPIC), (other, 0)}
    assert left == {(unique_topic, 0): (1, "")}


def offset_delete(bootstrap: str, group: str, partitions: list[tuple[str, int]]
                  ) -> tuple[int, set[tuple[str, int, int]]]:
    topics = OffsetDeleteRequest.OffsetDeleteRequestTopic
    names = dict.fromkeys(name for name, _ in partitions)
    request = OffsetDeleteRequest[0](group_id=group, topics=[
        topics(name=name, partitions=[topics.OffsetDeleteRequestPartition(partition_index=p)
                                      for n, p in partitions if n == name])
        for name in names])
    answer = raw(bootstrap, request, 0, OffsetDeleteResponse)
    return answer.error_code, {(t.name, p.partition_index, p.error_code)
                               for t in answer.topics for p in t.partitions}


def test_offset_delete_errors_are_kafkas(kiln: RunningKiln, kafka_bootstrap: str,
                                         unique_topic: str) -> None:
    # Given the same topic in Kiln and in Kafka, and a group with offsets in each
    produce(kiln.bootstrap, unique_topic, 2)
    assert kiln.flush()
    group = f"g-{uuid.uuid4().hex[:8]}"
    for bootstrap in (kiln.bootstrap, kafka_bootstrap):
        with RawClient(bootstrap) as client:
            commit_over_the_wire(client, group, {(unique_topic, 0): 1})
    asked = [(unique_topic, 0), (unique_topic, 7), ("no-such-topic", 0)]
    # When OffsetDelete names an unknown group, the empty group id, and the group with an
    # unknown topic and partition besides its own
    cases = [("nobody", asked), ("", asked), (group, asked)]
    through_kiln = [offset_delete(kiln.bootstrap, g, p) for g, p in cases]
    from_kafka = [offset_delete(kafka_bootstrap, g, p) for g, p in cases]
    # Then Kiln answers as Kafka
    assert through_kiln == from_kafka == [
        (E.GROUP_ID_NOT_FOUND, set()), (E.INVALID_GROUP_ID, set()),
        (0, {(unique_topic, 0, 0), (unique_topic, 7, E.UNKNOWN_TOPIC_OR_PARTITION),
             ("no-such-topic", 0, E.UNKNOWN_TOPIC_OR_PARTITION)})]


def test_deleting_a_durable_groups_offsets_stops_them_counting_until_it_commits_again(
        slow_kiln: RunningKiln, unique_topic: str) -> None:
    # Given ten buffered records and two operator-registered subscriptions at 10 and 4
    produce(slow_kiln.bootstrap, unique_topic, 10)
    for group in ("audit", "billing"):
        slow_kiln.call(slow_kiln.app.delivery.subscribe(unique_topic, group))
    with RawClient(slow_kiln.bootstrap) as client:
        commit_over_the_wire(client, "billing", {(unique_topic, 0): 10})
        commit_over_the_wire(client, "audit", {(unique_topic, 0): 4})
        # When audit's offsets are deleted, and billing commits again
        code, outcome = offset_delete(slow_kiln.bootstrap, "audit", [(unique_topic, 0)])
        commit_over_the_wire(client, "billing", {(unique_topic, 0): 10})
        held = state(slow_kiln, unique_topic)
        # ... until audit commits again
        commit_over_the_wire(client, "audit", {(unique_topic, 0): 8})
    # Then nothing more was delivered while audit had no offset, and its new commit counts
    assert (code, outcome) == (0, {(unique_topic, 0, 0)})
    assert (held.delivered_offset, held.buffered_records) == (4, 6)
    after = state(slow_kiln, unique_topic)
    assert (after.delivered_offset, after.buffered_records) == (8, 2)


# --- DeleteRecords --------------------------------------------------------------------------


def delete_records_confluent(bootstrap: str, topic: str, offset: int) -> int:
    """The low watermark confluent-kafka's AdminClient reports for partition 0."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = ConfluentPartition(topic, 0, offset)
    return int(admin.delete_records([tp], request_timeout=30)[tp].result(60).low_watermark)


def fetch_at(bootstrap: str, topic: str, offset: int) -> tuple[int, int, int]:
    """(error code, log start offset, high watermark) of a Fetch of partition 0."""
    fetch = FetchRequest[11](
        replica_id=-1, max_wait_ms=10, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
        session_id=0, session_epoch=-1, rack_id="", forgotten_topics_data=[],
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchTopic.FetchPartition(
                partition=0, current_leader_epoch=-1, fetch_offset=offset,
                log_start_offset=-1, partition_max_bytes=1 << 20)])])
    part = raw(bootstrap, fetch, 11, FetchResponse).responses[0].partitions[0]
    return part.error_code, part.log_start_offset, part.high_watermark


def test_delete_records_held_only_in_redis(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given ten records, one batch each, all in the log queue
    produce(slow_kiln.bootstrap, unique_topic, 10)
    # When an admin client deletes the records below offset 4
    low_watermark = delete_records_confluent(slow_kiln.bootstrap, unique_topic, 4)
    # Then the partition starts at 4 for every reader, a fetch below it is out of range as
    # in Kafka (an answer without offsets), the four batches left Redis without being
    # hardened, and only the six left ever reach Kafka
    assert low_watermark == 4
    assert list_offset(slow_kiln.bootstrap, unique_topic, OffsetSpec.earliest())[0] == 4
    assert fetch_at(slow_kiln.bootstrap, unique_topic, 2) == (E.OFFSET_OUT_OF_RANGE, -1, -1)
    after = state(slow_kiln, unique_topic)
    assert (after.buffered_records, after.deleted_offset, after.deleted_records,
            after.hardened_records) == (6, 4, 4, 0)
    assert [offset for offset, _ in consume_from_start(slow_kiln.bootstrap, unique_topic,
                                                       6)] == list(range(4, 10))
    assert slow_kiln.flush()
    assert hardened_offsets(kafka_bootstrap, unique_topic) == list(range(4, 10))


def test_delete_records_held_only_in_kafka(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given ten records, all hardened to Kafka and gone from the log queue
    produce(kiln.bootstrap, unique_topic, 10)
    assert kiln.flush()
    # When kafka-python's admin client deletes the records below offset 4
    with KafkaAdminClient(bootstrap_servers=kiln.bootstrap) as admin:
        answer = admin.delete_records({KafkaPartition(unique_topic, 0): 4})
    # Then Kiln and Kafka both start at 4, and a consumer reading from the start through
    # Kiln gets the six records left
    assert {tp.partition: result["low_watermark"] for tp, result in answer.items()} == {0: 4}
    assert kafka_log_start(kafka_bootstrap, unique_topic) == 4
    assert hardened_offsets(kafka_bootstrap, unique_topic) == list(range(4, 10))
    assert consume_from_start(kiln.bootstrap, unique_topic, 6) == [
        (i, b"v%d" % i) for i in range(4, 10)]


def test_delete_records_across_both_tiers_and_into_a_batch(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given five records hardened to Kafka, then one batch of ten records (offsets 5-14)
    # in the log queue
    produce(slow_kiln.bootstrap, unique_topic, 5)
    assert slow_kiln.flush()
    with RawClient(slow_kiln.bootstrap) as client:
        assert client.produce(unique_topic, 0, record_batch(
            [b"b%d" % i for i in range(10)])).error_code == 0
    # When the records below offset 8 are deleted
    low_watermark = delete_records_confluent(slow_kiln.bootstrap, unique_topic, 8)
    # Then Kafka holds none of the first five, the batch stays whole in Redis but readers
    # start at 8, and once hardened Kafka holds only offsets 8-14
    assert low_watermark == 8
    assert hardened_offsets(kafka_bootstrap, unique_topic) == []
    assert state(slow_kiln, unique_topic).buffered_records == 10
    assert consume_from_start(slow_kiln.bootstrap, unique_topic, 7) == [
        (5 + i, b"b%d" % i) for i in range(3, 10)]
    assert slow_kiln.flush()
    assert hardened_offsets(kafka_bootstrap, unique_topic) == list(range(8, 15))
    assert list_offset(slow_kiln.bootstrap, unique_topic, OffsetSpec.earliest())[0] == 8


def delete_records_answer(bootstrap: str, topic: str, partition: int, offset: int
                          ) -> tuple[int, int]:
    """(error code, low watermark) of DeleteRecords v2 for one partition."""
    topics = DeleteRecordsRequest.DeleteRecordsTopic
    request = DeleteRecordsRequest[2](timeout_ms=30_000, topics=[topics(
        name=topic, partitions=[topics.DeleteRecordsPartition(partition_index=partition,
                                                              offset=offset)])])
    answer = raw(bootstrap, request, 2, DeleteRecordsResponse).topics[0].partitions[0]
    return answer.error_code, answer.low_watermark


def test_delete_records_to_the_high_watermark_and_refusals_as_kafka(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given six records, hardened to Kafka with the same offsets
    produce(kiln.bootstrap, unique_topic, 6)
    assert kiln.flush()
    # When DeleteRecords asks for offsets past the end, below 0, an unknown partition, then
    # -1 (the high watermark), and then an offset below the new start
    refusals = [(0, 7), (0, -5), (3, 1)]
    through_kiln = [delete_records_answer(kiln.bootstrap, unique_topic, p, o)
                    for p, o in refusals]
    from_kafka = [delete_records_answer(kafka_bootstrap, unique_topic, p, o)
                  for p, o in refusals]
    to_end = delete_records_answer(kiln.bootstrap, unique_topic, 0, -1)
    below_start = delete_records_answer(kiln.bootstrap, unique_topic, 0, 2)
    # Then the refusals are Kafka's, -1 deletes everything in both tiers, and asking below
    # the start changes nothing and answers the start
    assert through_kiln == from_kafka == [(E.OFFSET_OUT_OF_RANGE, -1),
                                          (E.OFFSET_OUT_OF_RANGE, -1),
                                          (E.UNKNOWN_TOPIC_OR_PARTITION, -1)]
    assert to_end == (0, 6)
    assert below_start == (0, 6)
    assert kafka_log_start(kafka_bootstrap, unique_topic) == 6
    produce(kiln.bootstrap, unique_topic, 2, first=6)
    assert consume_from_start(kiln.bootstrap, unique_topic, 2) == [(6, b"v6"), (7, b"v7")]


def test_an_assured_producer_waiting_for_deleted_records_is_answered_success(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given an acks=all producer whose three records wait to be hardened (10 minute delay)
    produce(slow_kiln.bootstrap, unique_topic, 1)
    producer = confluent_kafka.Producer({"bootstrap.servers": slow_kiln.bootstrap,
                                         "acks": "all", "linger.ms": 0})
    reports: list[tuple[object, int]] = []
    for i in range(3):
        producer.produce(unique_topic, value=b"assured-%d" % i, partition=0,
                         on_delivery=lambda err, msg: reports.append((err, msg.offset())))
    producer.poll(0)
    assert eventually(lambda: state(slow_kiln, unique_topic).next_offset == 4)
    producer.poll(0.5)
    waiting = list(reports)
    # When the operator deletes every record of the partition
    low_watermark = delete_records_confluent(slow_kiln.bootstrap, unique_topic, -1)
    assert producer.flush(10) == 0
    # Then the producer is told its records were stored (their fate was the operator's to
    # decide), and none of them is ever hardened
    assert waiting == []
    assert low_watermark == 4
    assert sorted(reports) == [(None, 1), (None, 2), (None, 3)]
    assert slow_kiln.flush()
    assert hardened_offsets(kafka_bootstrap, unique_topic) == []


def test_deleted_records_stay_deleted_after_kiln_restarts(
        redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given six buffered records of which those below 3 were deleted
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=600_000) as before:
        produce(before.bootstrap, unique_topic, 6)
        assert delete_records_confluent(before.bootstrap, unique_topic, 3) == 3
    # When Kiln starts again on the same Redis and hardens everything
    with start_kiln(redis_url, kafka_bootstrap, harden_delay_ms=600_000) as after:
        earliest = list_offset(after.bootstrap, unique_topic, OffsetSpec.earliest())[0]
        assert after.flush()
        read = consume_from_start(after.bootstrap, unique_topic, 3)
    # Then the partition still starts at 3, and Kafka never got the deleted records
    assert earliest == 3
    assert read == [(i, b"v%d" % i) for i in range(3, 6)]
    assert hardened_offsets(kafka_bootstrap, unique_topic) == [3, 4, 5]
