"""Metadata: the live Kiln nodes are the brokers, each partition led by the node it is
placed on (storage/leadership.py), its only replica; the controller is the lowest node id.
A partition whose leader stopped heartbeating (silent, not yet dead) is reported offline."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from proxy.context import KilnContext
from storage.model import TopicPartition
from storage.topics import TopicConfig, validate_topic_name
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode, KafkaError

_RESP = CLIENT_APIS[ApiKey.METADATA].response
_TOPIC = _RESP.MetadataResponseTopic
_PARTITION = _TOPIC.MetadataResponsePartition
_BROKER = _RESP.MetadataResponseBroker
_ZERO_UUID = uuid.UUID(int=0)


@dataclass(frozen=True, slots=True)
class _Leaders:
    """Which nodes may be named as leaders in this answer, decided once per request: the
    brokers it lists (a node that joined while the request was handled, say while a topic
    was created, is not among them, and a client told of a leader it has no address for
    cannot send to it) and are not silent."""

    listed: frozenset[int]
    silent: frozenset[int]

    def can_lead(self, node: int) -> bool:
        return node in self.listed and node not in self.silent


def _leaders(ctx: KilnContext, brokers: dict[int, tuple[str, int]]) -> _Leaders:
    return _Leaders(frozenset(brokers), frozenset(
        n.node_id for n in ctx.cluster.brokers() if ctx.cluster.silent(n.node_id)))


def _topic_entry(ctx: KilnContext, config: TopicConfig, leaders: _Leaders) -> Message:
    partitions = []
    for p in range(config.partitions):
        node = ctx.cluster.leader(TopicPartition(config.name, p))
        if not leaders.can_lead(node):
            # As Kafka reports an offline partition: clients ask again soon, and find the
            # node that takes it over as soon as the silent one is declared dead (or the
            # new node among the brokers).
            partitions.append(_PARTITION(
                error_code=int(ErrorCode.LEADER_NOT_AVAILABLE), partition_index=p,
                leader_id=-1, leader_epoch=0, replica_nodes=[node], isr_nodes=[],
                offline_replicas=[node]))
            continue
        partitions.append(_PARTITION(
            error_code=0, partition_index=p, leader_id=node, leader_epoch=0,
            replica_nodes=[node], isr_nodes=[node], offline_replicas=[]))
    return _TOPIC(error_code=0, name=config.name, topic_id=config.uuid, is_internal=False,
                  partitions=partitions)


def _error_entry(name: str | None, topic_id: uuid.UUID | None, code: ErrorCode) -> Message:
    return _TOPIC(error_code=int(code), name=name, topic_id=topic_id or _ZERO_UUID,
                  is_internal=False, partitions=[])


async def _requested(ctx: KilnContext, request: Request, leaders: _Leaders) -> list[Message]:
    body = request.body
    version = request.header.request_api_version
    if body.topics is None or (version == 0 and not body.topics):
        return [_topic_entry(ctx, c, leaders) for c in (await ctx.topics.all()).values()]
    allow_create = True if version < 4 else bool(body.allow_auto_topic_creation)
    entries = []
    by_id: dict[uuid.UUID, TopicConfig] | None = None
    for wanted in body.topics:
        name = wanted.name
        if name is None:
            if by_id is None:
                by_id = {c.uuid: c for c in (await ctx.topics.all()).values()}
            found = by_id.get(wanted.topic_id)
            missing = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            entries.append(_topic_entry(ctx, found, leaders) if found else
                           _error_entry(None, wanted.topic_id, missing))
            continue
        try:
            # As Kafka: a name no topic can have is INVALID_TOPIC_EXCEPTION, whether or not
            # the client asked for creation (not UNKNOWN_TOPIC_OR_PARTITION, to be retried).
            validate_topic_name(name)
            config = await ctx.topics.lookup(name, allow_create=allow_create)
        except KafkaError as exc:
            entries.append(_error_entry(name, None, exc.error_code))
            continue
        entries.append(_topic_entry(ctx, config, leaders) if config else
                       _error_entry(name, None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
    return entries


async def handle(ctx: KilnContext, request: Request) -> Message:
    brokers = ctx.brokers()
    return _RESP[request.header.request_api_version](
        throttle_time_ms=0,
        brokers=[_BROKER(node_id=node, host=host, port=port, rack=None)
                 for node, (host, port) in brokers.items()],
        cluster_id=ctx.settings.cluster_id,
        controller_id=min(brokers),
        topics=await _requested(ctx, request, _leaders(ctx, brokers)),
    )
