"""Metadata never names a leader that its own broker list leaves out: a node that joins
while a request is handled (say while the topic it asks for is created) is not among the
brokers the answer lists, so its partitions are reported without a leader (the client asks
again) rather than led by a node the client has no address for (kafka-python's sender
thread fails on such a leader, again and again)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, cast

from kafka.protocol.metadata import MetadataRequest

from proxy.context import KilnContext, ServerSettings
from proxy.handlers import metadata
from storage.model import TopicPartition
from storage.nodes import KilnNode
from storage.topics import TopicConfig
from wire.apis import CLIENT_APIS, ApiKey, Request
from wire.errors import ErrorCode
from wire.header import RequestHeader


def node(node_id: int) -> KilnNode:
    return KilnNode(node_id=node_id, host="127.0.0.1", port=9092 + node_id, http="", pid=1,
                    incarnation=f"i{node_id}", started_ms=0, renewed_ms=0,
                    expires_ms=2**62)


class JoiningCluster:
    """Node 0 alone, until node 1 joins; the newest node wins every placement."""

    def __init__(self) -> None:
        self.live = [node(0)]

    def brokers(self) -> list[KilnNode]:
        return list(self.live)

    def leader(self, tp: TopicPartition) -> int:
        return max(n.node_id for n in self.live)

    def silent(self, node_id: int) -> bool:
        return False


class TopicsCreatedWhileNodeJoins:
    def __init__(self, cluster: JoiningCluster) -> None:
        self._cluster = cluster

    async def lookup(self, name: str, *, allow_create: bool) -> TopicConfig:
        await asyncio.sleep(0)
        self._cluster.live.append(node(1))  # node 1 joins while the topic is created
        return TopicConfig(name, 1, str(uuid.uuid4()))


def test_a_node_that_joined_during_the_request_is_not_named_leader() -> None:
    cluster = JoiningCluster()
    ctx = KilnContext(settings=ServerSettings(node_id=0, advertised_host="127.0.0.1",
                                              advertised_port=9092),
                      log=cast(Any, None), topics=cast(Any, TopicsCreatedWhileNodeJoins(cluster)),
                      groups=cast(Any, None), cluster=cast(Any, cluster),
                      producer_ids=cast(Any, None), topic_configs=cast(Any, None),
                      broker_configs=cast(Any, None))
    wanted = MetadataRequest.MetadataRequestTopic(name="orders", topic_id=uuid.UUID(int=0))
    body = MetadataRequest[9](topics=[wanted], allow_auto_topic_creation=True,
                              include_topic_authorized_operations=False)
    request = Request(RequestHeader(ApiKey.METADATA, 9, 1, "test"),
                      CLIENT_APIS[ApiKey.METADATA], body)

    answer = asyncio.run(metadata.handle(ctx, request))

    partition = answer.topics[0].partitions[0]
    assert [b.node_id for b in answer.brokers] == [0]
    assert (partition.error_code, partition.leader_id) == (ErrorCode.LEADER_NOT_AVAILABLE, -1)
