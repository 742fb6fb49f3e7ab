"""The adaptive delay across nodes: each node sees the senders of the partitions it leads,
publishes that share, and decides from its own share plus its peers'."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from storage.clock import wall_clock_ms
from storage.policy.adaptive import DelayInputs
from tests.cluster.conftest import running_nodes
from tests.kiln_harness import RunningKiln, eventually

PARTITIONS = 12


@pytest.fixture
def adaptive_pair(redis_url: str, kafka_bootstrap: str) -> Iterator[list[RunningKiln]]:
    """Two nodes with the default (adaptive) delay policy, by node id."""
    with running_nodes(redis_url, kafka_bootstrap, nodes=2, delay_policy="adaptive") as nodes:
        yield nodes


def inputs(kiln: RunningKiln, topic: str) -> DelayInputs:
    """What the node decides the topic's delay from (read on the node's own loop)."""
    async def read() -> DelayInputs:
        return kiln.app.delay.inputs(topic, wall_clock_ms())
    return kiln.call(read())


def own(kiln: RunningKiln, topic: str) -> dict[str, Any]:
    """What the node alone sees of the topic."""
    async def read() -> dict[str, Any]:
        return kiln.app.delay.own_signals(topic, wall_clock_ms())
    return kiln.call(read())


def test_every_node_counts_the_senders_its_peers_see(adaptive_pair: list[RunningKiln],
                                                      unique_topic: str) -> None:
    # Given two nodes and a topic, and one producer per node, each writing only to the
    # partitions that node leads
    first = adaptive_pair[0]
    admin = AdminClient({"bootstrap.servers": first.bootstrap})
    admin.create_topics([NewTopic(unique_topic, PARTITIONS, 1)])[unique_topic].result(30)
    partitions = admin.list_topics(unique_topic, timeout=10).topics[unique_topic].partitions
    led = {k.app.node_id: [p for p, meta in partitions.items()
                           if meta.leader == k.app.node_id] for k in adaptive_pair}
    assert all(led.values())

    # When each producer sends to its node's partitions
    for kiln in adaptive_pair:
        producer = Producer({"bootstrap.servers": kiln.bootstrap, "acks": 1,
                             "client.id": f"sender-of-node-{kiln.app.node_id}"})
        for i in range(50):
            producer.produce(unique_topic, b"v", partition=led[kiln.app.node_id][i % len(
                led[kiln.app.node_id])])
        assert producer.flush(30) == 0

    # Then each node saw one sender itself, and decides from both once it read its peer's
    # report (published every second)
    assert all(own(kiln, unique_topic)["senders"] == 1 for kiln in adaptive_pair)
    assert eventually(lambda: all(inputs(k, unique_topic).senders == 2 for k in adaptive_pair),
                      timeout_s=10)
    # and the ingress rate it decides from is more than its own
    for kiln in adaptive_pair:
        assert inputs(kiln, unique_topic).records_per_s > own(kiln, unique_topic)[
            "records_per_s"] > 0


def test_a_stopped_peer_no_longer_counts(adaptive_pair: list[RunningKiln],
                                         unique_topic: str) -> None:
    # Given two nodes, and two producers each writing to every partition: each node sees
    # both (a client writing through two nodes counts twice in the sum: the sender cap errs
    # towards a shorter delay)
    first, second = adaptive_pair
    admin = AdminClient({"bootstrap.servers": first.bootstrap})
    admin.create_topics([NewTopic(unique_topic, PARTITIONS, 1)])[unique_topic].result(30)
    for kiln in adaptive_pair:
        producer = Producer({"bootstrap.servers": kiln.bootstrap, "acks": 1,
                             "client.id": f"sender-{kiln.app.node_id}"})
        for i in range(PARTITIONS * 4):
            producer.produce(unique_topic, b"v", partition=i % PARTITIONS)
        assert producer.flush(30) == 0
    assert eventually(lambda: inputs(first, unique_topic).senders == 4, timeout_s=10)

    # When the second node stops
    adaptive_pair.remove(second)
    second.stop()

    # Then the first decides from what it sees itself again
    assert eventually(lambda: inputs(first, unique_topic).senders == 2, timeout_s=10)

