"""The KIP-848 consumer group protocol (`group.protocol=consumer`) through Kiln, with
librdkafka (confluent-kafka 2.16), and its edges answered as Apache Kafka answers them.

- Members joining and leaving a group while records arrive: server-side assignment,
  incremental rebalances, every record read, commits (OffsetCommit/OffsetFetch v9, under
  the member epoch) at the end of the log; the group listed by type and described
  (ListGroups v5, ConsumerGroupDescribe).
- A member carries on across a Kiln restart (the group's state is in Redis) without
  rejoining.
- The same raw requests sent to Kiln and to Kafka get the same error codes: the two
  protocols on one group id, old OffsetCommit versions from a consumer-protocol member,
  DescribeGroups of a consumer group, an unknown member, a fenced epoch.

The Java client's side is in test_java_client.py (VerifiableConsumer, `--group-protocol
consumer`) and franz-go's in test_franz_go.py.
"""

from __future__ import annotations

import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient
from kafka.protocol.admin import DescribeGroupsRequest, DescribeGroupsResponse
from kafka.protocol.consumer import (
    JoinGroupRequest,
    JoinGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
)

from cli.local_services import free_port
from tests.compat.clients import create_topic_confluent
from tests.compat.conftest import GROUP_SETTINGS
from tests.kiln_harness import RunningKiln, start_kiln, sync_redis
from tests.raw_client import RawClient
from wire.consumer_groups import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
)

PARTITIONS = 4


def kip848_consumer(bootstrap: str, group: str, name: str) -> confluent_kafka.Consumer:
    return confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
        "client.id": name, "auto.offset.reset": "earliest", "enable.auto.commit": False})


def produce(bootstrap: str, topic: str, first: int, count: int) -> None:
    # acks=1: an acks=all record is answered once hardened, and these tests harden late.
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                         "acks": 1})
    for i in range(first, first + count):
        producer.produce(topic, value=b"r-%05d" % i, partition=i % PARTITIONS)
    assert producer.flush(20) == 0


class Reader:
    """Members polling in turn; what each read, by (partition, offset) -> value."""

    def __init__(self) -> None:
        self.read: dict[tuple[int, int], bytes] = {}
        self.duplicates: list[tuple[int, int]] = []

    def poll(self, members: list[confluent_kafka.Consumer]) -> None:
        """Each member polls once, then commits what it read."""
        for member in members:
            for message in member.consume(num_messages=100, timeout=0.1):
                assert message.error() is None, message.error()
                key = (message.partition(), message.offset())
                if key in self.read:
                    self.duplicates.append(key)
                self.read[key] = message.value()
            # Committed after every poll, so a partition that moves goes on from here.
            if member.assignment():
                try:
                    member.commit(asynchronous=False)
                except confluent_kafka.KafkaException as exc:
                    if exc.args[0].code() != confluent_kafka.KafkaError._NO_OFFSET:
                        raise

    def until(self, members: list[confluent_kafka.Consumer], total: int,
              timeout_s: float = 45) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.read) < total and time.monotonic() < deadline:
            self.poll(members)
        assert len(self.read) >= total, f"read {len(self.read)} of {total}"


def wait_assigned(members: list[confluent_kafka.Consumer], reader: Reader,
                  timeout_s: float = 30) -> list[set[int]]:
    """Poll until the members' assignments split every partition between them."""
    deadline = time.monotonic() + timeout_s
    shares: list[set[int]] = []
    while time.monotonic() < deadline:
        shares = [{tp.partition for tp in m.assignment()} for m in members]
        if (all(shares) and set().union(*shares) == set(range(PARTITIONS))
                and sum(map(len, shares)) == PARTITIONS):
            return shares
        reader.poll(members)
    raise AssertionError(f"assignments never settled: {shares}")


@pytest.fixture
def members() -> Iterator[list[confluent_kafka.Consumer]]:
    started: list[confluent_kafka.Consumer] = []
    yield started
    for member in started:
        member.close()


def test_librdkafka_members_join_and_leave_and_every_record_is_read(
        kiln_answering_all: RunningKiln, unique_topic: str,
        members: list[confluent_kafka.Consumer]) -> None:
    kiln = kiln_answering_all
    create_topic_confluent(kiln.bootstrap, unique_topic, PARTITIONS)
    group = f"kip848-{uuid.uuid4().hex[:8]}"
    reader = Reader()
    # Given one member that read what was there
    produce(kiln.bootstrap, unique_topic, 0, 200)
    members.append(kip848_consumer(kiln.bootstrap, group, "m1"))
    members[0].subscribe([unique_topic])
    reader.until(members, 200)
    # When two more join, one at a time, with records arriving in between
    splits = []
    for name in ("m2", "m3"):
        members.append(kip848_consumer(kiln.bootstrap, group, name))
        members[-1].subscribe([unique_topic])
        splits.append(wait_assigned(members, reader))
        produce(kiln.bootstrap, unique_topic, len(reader.read), 100)
        reader.until(members, len(reader.read) + 100)
    # and is described and listed by type while three are in it
    admin = AdminClient({"bootstrap.servers": kiln.bootstrap})
    described = admin.describe_consumer_groups([group])[group].result(timeout=20)
    listed = admin.list_consumer_groups(
        types={confluent_kafka.ConsumerGroupType.CONSUMER}).result(timeout=20)
    # and one leaves
    members.pop(0).close()
    after_leave = wait_assigned(members, reader)
    produce(kiln.bootstrap, unique_topic, len(reader.read), 100)
    reader.until(members, 500)

    # Then each member had a share, the shares moved as members came and went, every
    # record was read, and the commits are the log's end
    assert [len(split) for split in splits] == [2, 3]
    assert len(after_leave) == 2
    assert sorted(reader.read) == sorted(
        (p, o) for p in range(PARTITIONS) for o in range(125))
    assert all(value.startswith(b"r-") for value in reader.read.values())
    committed = members[0].committed(
        [confluent_kafka.TopicPartition(unique_topic, p) for p in range(PARTITIONS)],
        timeout=20)
    assert [tp.offset for tp in committed] == [125] * PARTITIONS
    assert described.group_id == group
    assert str(described.type) == "ConsumerGroupType.CONSUMER"
    assert len(described.members) == 3
    assert sorted(len(m.assignment.topic_partitions) for m in described.members) == [1, 1, 2]
    assert group in {g.group_id for g in listed.valid}


def test_a_member_carries_on_across_a_kiln_restart_without_rejoining(
        redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    # A Redis database of its own: the module's Kiln runs on the session's, and two Kilns on
    # one database are two nodes of one cluster, routing groups and partitions between them.
    redis_url = redis_url.rsplit("/", 1)[0] + "/3"
    sync_redis(redis_url).flushdb()
    settings: dict[str, Any] = {**GROUP_SETTINGS, "listen": f"127.0.0.1:{free_port()}",
                                "harden_delay_ms": 600_000}
    group = f"kip848-{uuid.uuid4().hex[:8]}"
    reader = Reader()
    before = start_kiln(redis_url, kafka_bootstrap, **settings)
    consumer = None
    try:
        create_topic_confluent(before.bootstrap, unique_topic, PARTITIONS)
        produce(before.bootstrap, unique_topic, 0, 40)
        consumer = kip848_consumer(before.bootstrap, group, "m1")
        consumer.subscribe([unique_topic])
        reader.until([consumer], 40)
        epoch_before = before.call(before.app.groups.describe_consumer_group(group))
        assert epoch_before is not None
        member_epoch = next(iter(epoch_before.members.values())).member_epoch
    finally:
        before.stop()
    assert consumer is not None
    # When Kiln restarts on the same address and Redis and more records arrive
    with start_kiln(redis_url, kafka_bootstrap, **settings) as after:
        try:
            produce(after.bootstrap, unique_topic, 40, 40)
            reader.until([consumer], 80)
            group_after = after.call(after.app.groups.describe_consumer_group(group))
            heartbeats = after.app.metrics.value("kiln_requests_total",
                                                 api="ConsumerGroupHeartbeat")
        finally:
            consumer.close()
    # Then it read on, heartbeating to the new Kiln at the epoch it had, as the only member
    assert sorted(reader.read) == sorted((p, o) for p in range(PARTITIONS) for o in range(20))
    assert group_after is not None
    assert [m.member_epoch for m in group_after.members.values()] == [member_epoch]
    assert heartbeats >= 1


# --- the same raw requests to Kiln and to Kafka ---------------------------------------------


class Speaker:
    """Raw requests to one server (flexible header v2), answers decoded."""

    def __init__(self, bootstrap: str) -> None:
        self.client = RawClient(bootstrap, timeout_s=20)

    def call(self, request_cls: Any, response_cls: Any, version: int, **fields: Any) -> Any:
        body = bytes(request_cls[version](**fields).encode())
        self.client._correlation_id += 1
        correlation = self.client._correlation_id
        flexible = request_cls.flexible_version_q(version)
        header = struct.pack(">hhih", request_cls.API_KEY, version, correlation, 4) + b"test"
        self.client.send_frame(header + (b"\x00" if flexible else b"") + body)
        frame = self.client.read_frame()
        assert struct.unpack(">i", frame[:4])[0] == correlation
        # The response header is flexible where the request's is, ApiVersions aside.
        return response_cls[version].decode(frame[5:] if flexible else frame[4:])

    def heartbeat(self, group: str, member: str, epoch: int, topic: str) -> Any:
        joining = epoch == 0
        return self.call(ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse, 1,
                         group_id=group, member_id=member, member_epoch=epoch,
                         rebalance_timeout_ms=30_000 if joining else -1,
                         subscribed_topic_names=[topic] if joining else None,
                         topic_partitions=[] if joining else None)

    def join_classic(self, group: str) -> Any:
        return self.call(JoinGroupRequest, JoinGroupResponse, 5, group_id=group,
                         session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
                         member_id="", group_instance_id="static-1",
                         protocol_type="consumer",
                         protocols=[JoinGroupRequest.JoinGroupRequestProtocol(
                             name="range", metadata=b"")])

    def commit(self, version: int, group: str, member: str, epoch: int, topic: str) -> int:
        topics = [OffsetCommitRequest.OffsetCommitRequestTopic(name=topic, partitions=[
            OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                partition_index=0, committed_offset=0, committed_leader_epoch=-1,
                committed_metadata="")])]
        answer = self.call(OffsetCommitRequest, OffsetCommitResponse, version,
                           group_id=group, generation_id_or_member_epoch=epoch,
                           member_id=member, group_instance_id=None, topics=topics)
        return int(answer.topics[0].partitions[0].error_code)


def edge_codes(speaker: Speaker, topic: str) -> dict[str, object]:
    """The codes one server gives for the edges of the consumer group protocol."""
    codes: dict[str, object] = {}
    group, other = f"e-{uuid.uuid4().hex[:8]}", f"e-{uuid.uuid4().hex[:8]}"
    member = str(uuid.uuid4())
    joined = speaker.heartbeat(group, member, 0, topic)
    for _ in range(100):  # Kafka is the group's coordinator once its offsets topic is loaded
        if joined.error_code not in (14, 15, 16):
            break
        time.sleep(0.2)
        joined = speaker.heartbeat(group, member, 0, topic)
    codes["join"] = joined.error_code
    epoch = joined.member_epoch
    codes["assigned"] = sorted(p for tp in joined.assignment.topic_partitions
                               for p in tp.partitions)
    codes["heartbeat"] = speaker.heartbeat(group, member, epoch, topic).error_code
    codes["fenced"] = speaker.heartbeat(group, member, epoch + 5, topic).error_code
    codes["unknown-member"] = speaker.heartbeat(group, str(uuid.uuid4()), 1, topic).error_code
    codes["classic-join-to-consumer-group"] = speaker.join_classic(group).error_code
    codes["commit-v9"] = speaker.commit(9, group, member, epoch, topic)
    codes["commit-v8-by-consumer-member"] = speaker.commit(8, group, member, epoch, topic)
    codes["commit-stale"] = speaker.commit(9, group, member, epoch + 1, topic)
    codes["commit-outside-group"] = speaker.commit(9, group, "", -1, topic)
    described = speaker.call(DescribeGroupsRequest, DescribeGroupsResponse, 5, groups=[group],
                             include_authorized_operations=False).groups[0]
    codes["describe-groups"] = (described.error_code, described.group_state)
    consumer_described = speaker.call(
        ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, 1,
        group_ids=[group, other], include_authorized_operations=False).groups
    # In Kafka's answer the groups come in the order of its offsets topic's partitions.
    codes["consumer-group-describe"] = sorted(
        (g.group_id == group, g.error_code, g.group_state, len(g.members))
        for g in consumer_described)
    left = speaker.heartbeat(group, member, -1, topic)
    codes["leave"] = (left.error_code, left.member_epoch)
    # A classic group with a member refuses a consumer-protocol member
    speaker.join_classic(other)
    codes["consumer-heartbeat-to-classic-group"] = speaker.heartbeat(
        other, str(uuid.uuid4()), 0, topic).error_code
    return codes


def test_the_protocol_edges_are_answered_as_kafka_answers_them(
        kiln_answering_all: RunningKiln, kafka_bootstrap: str) -> None:
    kiln = kiln_answering_all
    kiln_topic, kafka_topic = (f"e-{uuid.uuid4().hex[:8]}" for _ in range(2))
    create_topic_confluent(kiln.bootstrap, kiln_topic, 2)
    create_topic_confluent(kafka_bootstrap, kafka_topic, 2)

    from_kiln = edge_codes(Speaker(kiln.bootstrap), kiln_topic)
    from_kafka = edge_codes(Speaker(kafka_bootstrap), kafka_topic)

    assert from_kiln == from_kafka
    assert from_kiln["join"] == 0 and from_kiln["assigned"] == [0, 1]
    assert from_kiln["fenced"] == 110  # FENCED_MEMBER_EPOCH
    assert from_kiln["commit-v8-by-consumer-member"] == 35  # UNSUPPORTED_VERSION
