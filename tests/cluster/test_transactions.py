"""Transactions on a cluster of Kiln nodes: a transactional id's coordinator is one node,
the partitions of its transaction are led by all of them, and the coordinator keeps nothing
in memory that a transaction needs (its state is in Redis): when the coordinating node stops
in the middle of a transaction, the next node takes the producer's requests over and the
transaction commits whole."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from storage.model import TopicPartition as KilnPartition
from tests.cluster.conftest import running_nodes
from tests.kiln_harness import RunningKiln
from tests.txn_readers import read_to_end

PARTITIONS = 6


@pytest.fixture
def txn_cluster(redis_url: str, kafka_bootstrap: str) -> Iterator[list[RunningKiln]]:
    with running_nodes(redis_url, kafka_bootstrap, transactions_enabled=True,
                       harden_delay_ms=600_000) as nodes:
        yield nodes


def bootstrap(nodes: list[RunningKiln]) -> str:
    return ",".join(k.bootstrap for k in nodes)


def make_topic(nodes: list[RunningKiln], topic: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap(nodes)})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    return topic


def read_committed(nodes: list[RunningKiln], topic: str, expected: int,
                   timeout_s: float = 20) -> list[str]:
    read = read_to_end(bootstrap(nodes), topic, PARTITIONS, "read_committed",
                       expected=expected, timeout_s=timeout_s)
    return sorted(value for values in read.values() for _, value in values)


def coordinator_of(nodes: list[RunningKiln], transactional_id: str) -> RunningKiln:
    node_id = nodes[0].app.leadership.transaction_coordinator(transactional_id)
    return next(k for k in nodes if k.app.node_id == node_id)


def led_by_every_node(nodes: list[RunningKiln], prefix: str) -> str:
    """A topic name whose partitions are led by every node (placement hashes the name)."""
    for i in range(100):
        name = f"{prefix}-{i}"
        if {nodes[0].app.leadership.leader(KilnPartition(name, p))
                for p in range(PARTITIONS)} == {k.app.node_id for k in nodes}:
            return name
    raise AssertionError("no topic name spreads its partitions over every node")


def test_transactions_span_partitions_led_by_every_node(
        txn_cluster: list[RunningKiln], unique_topic: str, kafka_bootstrap: str) -> None:
    topic = make_topic(txn_cluster, led_by_every_node(txn_cluster, unique_topic))
    leaders = {txn_cluster[0].app.leadership.leader(KilnPartition(topic, p))
               for p in range(PARTITIONS)}
    # Given transactional producers whose ids different nodes coordinate
    ids = [f"tx-{uuid.uuid4().hex[:8]}" for _ in range(12)]
    by_node = {coordinator_of(txn_cluster, tid).app.node_id: tid for tid in ids}
    sent: list[str] = []
    for node_id, tid in sorted(by_node.items()):
        producer = Producer({"bootstrap.servers": bootstrap(txn_cluster),
                             "transactional.id": tid, "linger.ms": 5})
        producer.init_transactions(30)
        # When each commits a transaction over every partition, then aborts one
        for commit in (True, False):
            producer.begin_transaction()
            values = [f"{node_id}-{commit}-{p}" for p in range(PARTITIONS)]
            for p, value in enumerate(values):
                producer.produce(topic, value.encode(), partition=p)
            producer.flush(30)
            if commit:
                producer.commit_transaction(30)
                sent += values
            else:
                producer.abort_transaction(30)
    # Then a read_committed reader sees exactly the committed transactions
    assert leaders == {k.app.node_id for k in txn_cluster}
    assert len(by_node) == len(txn_cluster)
    assert read_committed(txn_cluster, topic, len(sent)) == sorted(sent)
    # ... and so does one of Kafka: each commit (assured: acks=all) was answered once one
    # node's hardening lane had written it, whichever nodes led its partitions
    lanes = [k.app.node_id for k in txn_cluster if k.app.lane and k.app.lane.leading]
    assert len(lanes) == 1
    in_kafka = read_to_end(kafka_bootstrap, topic, PARTITIONS, "read_committed",
                           expected=len(sent))
    assert sorted(v for values in in_kafka.values() for _, v in values) == sorted(sent)


def test_a_transaction_commits_whole_when_its_coordinator_stops_midway(
        txn_cluster: list[RunningKiln], unique_topic: str) -> None:
    topic = make_topic(txn_cluster, unique_topic)
    tid = f"tx-{uuid.uuid4().hex[:8]}"
    coordinator = coordinator_of(txn_cluster, tid)
    others = [k for k in txn_cluster if k is not coordinator]
    producer = Producer({"bootstrap.servers": bootstrap(others), "transactional.id": tid,
                         "linger.ms": 5})
    producer.init_transactions(30)
    # Given a transaction with records in every partition
    producer.begin_transaction()
    for p in range(PARTITIONS):
        producer.produce(topic, f"before-{p}".encode(), partition=p)
    producer.flush(30)

    # When its coordinator node stops, and the producer goes on and commits
    coordinator.stop()
    txn_cluster.remove(coordinator)
    for p in range(PARTITIONS):
        producer.produce(topic, f"after-{p}".encode(), partition=p)
    producer.flush(60)
    producer.commit_transaction(60)

    # Then every record of it is read committed, through the remaining nodes
    expected = sorted([f"before-{p}" for p in range(PARTITIONS)]
                      + [f"after-{p}" for p in range(PARTITIONS)])
    assert read_committed(txn_cluster, topic, len(expected)) == expected
