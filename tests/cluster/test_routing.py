"""Clients routed across Kiln nodes as across Kafka brokers: every node tells the same brokers
and leaders, requests for a partition (or a group) sent to another node are refused with the
code that makes clients look again, and ordinary clients bootstrapped at one node use all."""

from __future__ import annotations

import json
import uuid
from collections import Counter, defaultdict
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as TopicPartition_
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import (
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from cli.main import main
from storage.leadership import lease_key
from storage.model import TopicPartition
from tests.kiln_harness import RunningKiln, eventually, sync_redis
from tests.raw_client import RawClient, record_batch
from wire.errors import ErrorCode

# Enough that each of three nodes leads some partition whatever the topic's name (placement
# hashes it): one leads none in 3 * (2/3)^24 of names, about one in 50,000.
PARTITIONS = 24


@pytest.fixture
def topic(kiln_cluster: list[RunningKiln], unique_topic: str) -> str:
    """A topic created through node 0."""
    admin = AdminClient({"bootstrap.servers": kiln_cluster[0].bootstrap})
    admin.create_topics([NewTopic(unique_topic, PARTITIONS, 1)],
                        operation_timeout=30)[unique_topic].result(30)
    return unique_topic


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return {p.id: p.leader for p in meta.topics[topic].partitions.values()}


def brokers(bootstrap: str) -> dict[int, str]:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return {b.id: f"{b.host}:{b.port}" for b in meta.brokers.values()}


def by_id(nodes: list[RunningKiln]) -> dict[int, RunningKiln]:
    return {k.app.node_id: k for k in nodes}


def fetch(client: RawClient, topic: str, partition: int) -> Any:
    request = FetchRequest[11](
        replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
        session_id=0, session_epoch=-1, rack_id="", forgotten_topics_data=[],
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchTopic.FetchPartition(
                partition=partition, current_leader_epoch=-1, fetch_offset=0,
                log_start_offset=-1, partition_max_bytes=1 << 20)])])
    return client.request(request, 11, FetchResponse).responses[0].partitions[0]


def latest_offset(client: RawClient, topic: str, partition: int) -> Any:
    topics = ListOffsetsRequest.ListOffsetsTopic
    request = ListOffsetsRequest[5](
        replica_id=-1, isolation_level=0,
        topics=[topics(name=topic, partitions=[topics.ListOffsetsPartition(
            partition_index=partition, current_leader_epoch=-1, timestamp=-1)])])
    return client.request(request, 5, ListOffsetsResponse).topics[0].partitions[0]


def test_every_node_tells_every_node_and_the_same_leader_for_each_partition(
        kiln_cluster: list[RunningKiln], topic: str) -> None:
    # Given three nodes and a topic created through one of them

    # When each node is asked for the cluster's metadata
    told = [(brokers(k.bootstrap), leaders(k.bootstrap, topic)) for k in kiln_cluster]

    # Then each lists every node at the address it is reached at
    expected = {k.app.node_id: k.bootstrap for k in kiln_cluster}
    assert all(listed == expected for listed, _ in told)
    # and names the same leader for every partition, every node leading some of them
    placements = [placement for _, placement in told]
    assert placements[0] == placements[1] == placements[2]
    assert sorted(placements[0]) == list(range(PARTITIONS))
    assert set(placements[0].values()) == set(expected)


def test_kiln_nodes_shows_what_each_node_leads_as_clients_are_told(
        kiln_cluster: list[RunningKiln], topic: str, redis_url: str) -> None:
    # Given three nodes, a topic and a group with committed offsets
    group = "counted-group"
    consumer = Consumer({"bootstrap.servers": kiln_cluster[0].bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition_(topic, 0, 0)], asynchronous=False)
    finally:
        consumer.close()

    # When an operator lists the nodes
    result = CliRunner().invoke(main, ["nodes", "--json", "--redis-url", redis_url])

    # Then each live node shows as many partitions as Metadata names it the leader of (the
    # Kafka topics the brokers stand for are Kiln's too), and the group's coordinator one
    assert result.exit_code == 0, result.output
    rows = {row["node_id"]: row for row in json.loads(result.output)}
    led = Counter(leaders(kiln_cluster[0].bootstrap, topic).values())
    assert {n: rows[n]["partitions"] for n in rows} == {n: led[n] for n in rows}
    [coordinator] = {node for _, node, _ in find_coordinators(kiln_cluster[1].bootstrap,
                                                              [group]).values()}
    assert {n: rows[n]["groups"] for n in rows} == {n: int(n == coordinator) for n in rows}


def test_kiln_nodes_shows_the_ingress_each_node_took(kiln_cluster: list[RunningKiln],
                                                    topic: str, redis_url: str) -> None:
    # Given three nodes, and a producer given node 0 writing to partitions that node 1
    # leads only
    led_by_1 = [p for p, node in leaders(kiln_cluster[0].bootstrap, topic).items() if node == 1]
    producer = Producer({"bootstrap.servers": kiln_cluster[0].bootstrap, "linger.ms": 5})
    for i in range(600):
        producer.produce(topic, value=b"v%04d" % i, partition=led_by_1[i % len(led_by_1)])
    assert producer.flush(30) == 0

    # When an operator lists the nodes (once the nodes published what they saw)
    def rows() -> dict[int, dict[str, Any]]:
        result = CliRunner().invoke(main, ["nodes", "--json", "--redis-url", redis_url])
        assert result.exit_code == 0, result.output
        return {row["node_id"]: row for row in json.loads(result.output)}

    assert eventually(lambda: (rows()[1]["in_rec_s"] or 0) > 0, 10)
    listed = rows()

    # Then node 1 shows records and bytes coming in, the nodes that took none show none
    # (0, or empty while a node has published no report on the new topic yet)
    assert listed[1]["in_rec_s"] > 0 and listed[1]["in_mb_s"] >= 0, listed[1]
    assert [listed[n]["in_rec_s"] or 0 for n in (0, 2)] == [0, 0], listed


def test_a_partition_s_requests_sent_to_another_node_are_refused_and_store_nothing(
        kiln_cluster: list[RunningKiln], topic: str) -> None:
    # Given a topic, and one of its partitions with its leader and a node that does not lead it
    placement = leaders(kiln_cluster[0].bootstrap, topic)
    nodes = by_id(kiln_cluster)
    partition, leader = next(iter(placement.items()))
    other = next(k for node_id, k in nodes.items() if node_id != leader)

    # When a record is produced to it, and it is fetched and its end asked for, at the other
    with RawClient(other.bootstrap) as client:
        produced = client.produce(topic, partition, record_batch([b"misrouted"]))
        fetched = fetch(client, topic, partition)
        end = latest_offset(client, topic, partition)

    # Then each is refused as a Kafka broker refuses a partition it does not lead
    assert produced.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert fetched.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert end.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    # and the leader stores what is sent to it, the misrouted record not before it
    with RawClient(nodes[leader].bootstrap) as client:
        accepted = client.produce(topic, partition, record_batch([b"routed"]))
        read = fetch(client, topic, partition)
    assert (accepted.error_code, accepted.base_offset) == (ErrorCode.NONE, 0)
    assert read.error_code == ErrorCode.NONE and read.high_watermark == 1
    assert b"routed" in read.records and b"misrouted" not in read.records


def test_clients_bootstrapped_at_one_node_produce_and_consume_through_every_node(
        kiln_cluster: list[RunningKiln], topic: str, redis_url: str) -> None:
    # Given a topic, a producer that knows only node 0 and a group consumer that knows only
    # node 2
    producer = Producer({"bootstrap.servers": kiln_cluster[0].bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5})
    sent: dict[int, list[bytes]] = defaultdict(list)
    failures: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(str(err))
        else:
            sent[msg.partition()].append(msg.value())

    # When 100 records are produced to each partition
    for i in range(PARTITIONS * 100):
        producer.produce(topic, value=f"r{i}".encode(), partition=i % PARTITIONS,
                         on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert failures == []

    # Then each partition's records went to its leader, every node leading some
    store = sync_redis(redis_url)
    holders = {p: int(store.get(lease_key(TopicPartition(topic, p))).split()[1])
               for p in range(PARTITIONS)}
    assert holders == leaders(kiln_cluster[1].bootstrap, topic)
    assert set(holders.values()) == {0, 1, 2}
    # and the consumer reads every record once, in order per partition
    consumer = Consumer({"bootstrap.servers": kiln_cluster[2].bootstrap,
                         "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: dict[int, list[bytes]] = defaultdict(list)
    try:
        def all_read() -> bool:
            for msg in consumer.consume(500, timeout=0.5):
                assert msg.error() is None, msg.error()
                got[msg.partition()].append(msg.value())
            return sum(map(len, got.values())) == PARTITIONS * 100
        assert eventually(all_read, timeout_s=60)
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert got == sent


def find_coordinators(bootstrap: str, groups: list[str]) -> dict[str, tuple[int, int, str]]:
    """(error code, node id, address) of each group's coordinator, as `bootstrap` tells."""
    with RawClient(bootstrap) as client:
        answer = client.request(FindCoordinatorRequest[4](key_type=0, coordinator_keys=groups),
                                4, FindCoordinatorResponse)
    return {c.key: (c.error_code, c.node_id, f"{c.host}:{c.port}") for c in answer.coordinators}


def join_request(group: str) -> Any:
    protocol = JoinGroupRequest.JoinGroupRequestProtocol
    return JoinGroupRequest[5](group_id=group, session_timeout_ms=10_000,
                               rebalance_timeout_ms=10_000, member_id="",
                               group_instance_id=None, protocol_type="consumer",
                               protocols=[protocol(name="range", metadata=b"")])


def test_a_group_is_coordinated_by_one_node_and_refused_by_the_others(
        kiln_cluster: list[RunningKiln]) -> None:
    # Given three nodes
    group = "routed-group"

    # When each is asked who coordinates a group
    coordinators = [find_coordinators(k.bootstrap, [group])[group] for k in kiln_cluster]

    # Then all name the same node, at its address
    assert len(set(coordinators)) == 1
    code, coordinator, address = coordinators[0]
    nodes = by_id(kiln_cluster)
    assert code == ErrorCode.NONE and address == nodes[coordinator].bootstrap
    # and a member joining through another node is told to look again, through it not
    join = join_request(group)
    other = next(k for node_id, k in nodes.items() if node_id != coordinator)
    with RawClient(other.bootstrap) as client:
        refused = client.request(join, 5, JoinGroupResponse)
    with RawClient(nodes[coordinator].bootstrap) as client:
        accepted = client.request(join, 5, JoinGroupResponse)
    assert refused.error_code == ErrorCode.NOT_COORDINATOR
    assert accepted.error_code == ErrorCode.MEMBER_ID_REQUIRED


def test_describe_groups_answers_each_group_where_it_is_coordinated(
        kiln_cluster: list[RunningKiln]) -> None:
    # Given groups coordinated by different nodes
    groups = [f"described-{i}" for i in range(12)]
    coordinated = find_coordinators(kiln_cluster[0].bootstrap, groups)
    node = kiln_cluster[0].app.node_id
    here = [g for g in groups if coordinated[g][1] == node]
    elsewhere = [g for g in groups if coordinated[g][1] != node]
    assert here and elsewhere

    # When one node is asked to describe them all
    with RawClient(kiln_cluster[0].bootstrap) as client:
        answer = client.request(DescribeGroupsRequest[3](groups=groups,
                                                         include_authorized_operations=False),
                                3, DescribeGroupsResponse)

    # Then it describes its own (unknown ones are Dead, as Kafka says) and sends the client
    # to the coordinator for each of the others
    codes = {g.group_id: g.error_code for g in answer.groups}
    assert codes == {g: ErrorCode.NONE if g in here else ErrorCode.NOT_COORDINATOR
                     for g in groups}


def test_each_node_lists_the_groups_it_coordinates(kiln_cluster: list[RunningKiln],
                                                   topic: str) -> None:
    # Given groups with committed offsets, committed through one node's clients
    groups = [f"listed-{i}" for i in range(9)]
    for group in groups:
        consumer = Consumer({"bootstrap.servers": kiln_cluster[0].bootstrap, "group.id": group})
        try:
            consumer.commit(offsets=[TopicPartition_(topic, 0, 0)], asynchronous=False)
        finally:
            consumer.close()
    coordinated = find_coordinators(kiln_cluster[1].bootstrap, groups)

    # When each node lists its groups
    listed = {}
    for kiln in kiln_cluster:
        with RawClient(kiln.bootstrap) as client:
            answer = client.request(ListGroupsRequest[2](), 2, ListGroupsResponse)
        listed[kiln.app.node_id] = {g.group_id for g in answer.groups}

    # Then each lists those it coordinates, as Kafka's brokers do (admin clients ask them all)
    assert listed == {node: {g for g in groups if coordinated[g][1] == node}
                      for node in listed}


def test_when_a_node_leaves_its_partitions_and_groups_move_to_the_others(
        kiln_cluster: list[RunningKiln], topic: str) -> None:
    # Given a topic with records in every partition
    placement = leaders(kiln_cluster[0].bootstrap, topic)
    nodes = by_id(kiln_cluster)
    for partition, leader in placement.items():
        with RawClient(nodes[leader].bootstrap) as client:
            assert client.produce(topic, partition, record_batch([b"before"])).error_code == 0

    # and groups some of which node 1 coordinates
    groups = [f"group-{i}" for i in range(24)]
    coordinated = find_coordinators(nodes[0].bootstrap, groups)
    on_node_1 = [g for g, (_, node, _) in coordinated.items() if node == 1]
    assert on_node_1

    # When node 1 shuts down
    leaving = nodes.pop(1)
    kiln_cluster.remove(leaving)
    leaving.stop()

    # Then the others name only themselves, and lead node 1's partitions now
    remaining = nodes[0].bootstrap
    assert eventually(lambda: all({n.node_id for n in k.app.membership.live_nodes()} == {0, 2}
                                  for k in kiln_cluster))
    assert all(set(brokers(k.bootstrap)) == {0, 2} for k in kiln_cluster)
    moved = leaders(remaining, topic)
    assert set(moved.values()) <= {0, 2}
    # (the partitions that stayed did not move)
    assert all(moved[p] == leader for p, leader in placement.items() if leader != 1)
    # and each takes records for them after what the partition held
    for partition, leader in moved.items():
        with RawClient(nodes[leader].bootstrap) as client:
            answer = client.produce(topic, partition, record_batch([b"after"]))
        assert (answer.error_code, answer.base_offset) == (ErrorCode.NONE, 1)
    # and its groups are coordinated by the others, the rest where they were
    after = find_coordinators(remaining, groups)
    assert all(after[g][1] in (0, 2) for g in on_node_1)
    assert all(after[g] == coordinated[g] for g in groups if g not in on_node_1)
    for group in on_node_1:
        with RawClient(after[group][2]) as client:
            joined = client.request(join_request(group), 5, JoinGroupResponse)
        assert joined.error_code == ErrorCode.MEMBER_ID_REQUIRED
