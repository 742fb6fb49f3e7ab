"""ConsumerGroupHeartbeat and ConsumerGroupDescribe: the KIP-848 consumer group protocol
(`group.protocol=consumer`), coordinated by storage/groups/consumer_group.

A heartbeat is answered at once: the member learns its assignment (by topic id) from the
answers to its heartbeats, never by waiting for the others. Subscriptions are resolved
against the topics as Metadata lists them (same names, same topic ids): the ones named in
the group's subscriptions, or every one while a member subscribes by regex.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from proxy.context import KilnContext
from proxy.peer import CLIENT_HOST
from storage.errors import NotCoordinator, coordinator_errors
from storage.groups.assignors import Assignment
from storage.groups.consumer_group import ConsumerGroup
from storage.groups.consumer_model import ConsumerHeartbeat, HeartbeatResult, TopicMetadata
from storage.topics import TopicConfig
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode, KafkaError

_HEARTBEAT = CLIENT_APIS[ApiKey.CONSUMER_GROUP_HEARTBEAT].response
_DESCRIBE = CLIENT_APIS[ApiKey.CONSUMER_GROUP_DESCRIBE].response
_DESCRIBED = _DESCRIBE.DescribedGroup
# ConsumerGroupDescribe v1's member type: this member speaks the consumer protocol.
_CONSUMER_MEMBER = 1


def _metadata(config: TopicConfig) -> TopicMetadata:
    return TopicMetadata(config.uuid, config.partitions)


async def _topics(ctx: KilnContext) -> dict[str, TopicMetadata]:
    return {name: _metadata(config) for name, config in (await ctx.topics.all()).items()}


class _CatalogTopics:
    """The topics a heartbeat needs, from the catalog: named ones one by one (its cache),
    every one (a Redis read of the registry) only for regex subscriptions."""

    def __init__(self, ctx: KilnContext) -> None:
        self._ctx = ctx

    async def named(self, names: Iterable[str]) -> dict[str, TopicMetadata]:
        found = {}
        for name in names:
            try:
                config = await self._ctx.topics.lookup(name, allow_create=False)
            except KafkaError:
                continue  # a name no topic can have subscribes to nothing
            if config is not None:
                found[name] = _metadata(config)
        return found

    async def every(self) -> dict[str, TopicMetadata]:
        return await _topics(self._ctx)


# --- ConsumerGroupHeartbeat ----------------------------------------------------------------


async def heartbeat(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    version = request.header.request_api_version
    if version >= 1 and not body.member_id:
        # From v1 the client names itself (KIP-1082).
        return _heartbeat_body(version, HeartbeatResult(ErrorCode.INVALID_REQUEST,
                                                        "MemberId can't be empty."))
    owned = None if body.topic_partitions is None else {
        tp.topic_id: frozenset(tp.partitions) for tp in body.topic_partitions}
    names = body.subscribed_topic_names
    beat = ConsumerHeartbeat(
        group_id=body.group_id, member_id=body.member_id, member_epoch=body.member_epoch,
        instance_id=body.instance_id, rack_id=body.rack_id,
        rebalance_timeout_ms=body.rebalance_timeout_ms,
        subscribed_topic_names=None if names is None else tuple(names),
        subscribed_topic_regex=body.subscribed_topic_regex if version >= 1 else None,
        server_assignor=body.server_assignor, owned=owned,
        client_id=request.header.client_id or "", client_host=CLIENT_HOST.get())
    with coordinator_errors():
        result = await ctx.groups.consumer_heartbeat(beat, _CatalogTopics(ctx))
    return _heartbeat_body(version, result)


def _heartbeat_body(version: int, result: HeartbeatResult) -> Message:
    assignment = None
    if result.assignment is not None:
        assignment = _HEARTBEAT.Assignment(topic_partitions=[
            _HEARTBEAT.Assignment.TopicPartitions(topic_id=topic_id, partitions=sorted(ps))
            for topic_id, ps in result.assignment.items()])
    return _HEARTBEAT[version](
        throttle_time_ms=0, error_code=int(result.error_code),
        error_message=result.error_message, member_id=result.member_id,
        member_epoch=result.member_epoch, heartbeat_interval_ms=result.heartbeat_interval_ms,
        assignment=assignment)


def heartbeat_error(request: Request, code: ErrorCode) -> Message:
    return _heartbeat_body(request.header.request_api_version, HeartbeatResult(code))


# --- ConsumerGroupDescribe -------------------------------------------------------------------


async def describe(ctx: KilnContext, request: Request) -> Message:
    version = request.header.request_api_version
    described = []
    with coordinator_errors():
        topics = await _topics(ctx)
        for group_id in request.body.group_ids:
            try:
                group = await ctx.groups.describe_consumer_group(group_id)
            except NotCoordinator as exc:  # each group is answered for by its coordinator
                described.append(_not_found(group_id, exc.error_code, exc.message))
                continue
            described.append(_not_found(group_id) if group is None
                             else _described(group, topics))
    return _DESCRIBE[version](throttle_time_ms=0, groups=described)


def _described(group: ConsumerGroup, topics: Mapping[str, TopicMetadata]) -> Message:
    members = [
        _DESCRIBED.Member(
            member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id,
            member_epoch=m.member_epoch, client_id=m.client_id, client_host=m.client_host,
            subscribed_topic_names=list(m.subscribed_topic_names),
            # Kafka answers an empty string, not null, for a member without a regex.
            subscribed_topic_regex=m.subscribed_topic_regex or "",
            assignment=_assignment(m.assigned, topics),
            target_assignment=_assignment(summary.target, topics),
            member_type=_CONSUMER_MEMBER)
        for summary in group.describe_members() for m in (summary.member,)]
    return _DESCRIBED(error_code=0, error_message=None, group_id=group.group_id,
                      group_state=group.state.value, group_epoch=group.group_epoch,
                      assignment_epoch=group.assignment_epoch,
                      assignor_name=group.assignor_name, members=members)


def _assignment(assigned: Assignment, topics: Mapping[str, TopicMetadata]) -> Any:
    return _DESCRIBED.Member.Assignment(topic_partitions=[
        _DESCRIBED.Member.Assignment.TopicPartitions(
            topic_id=topics[name].topic_id, topic_name=name, partitions=sorted(ps))
        for name, ps in sorted(assigned.items()) if name in topics])


def _not_found(group_id: str, code: ErrorCode = ErrorCode.GROUP_ID_NOT_FOUND,
               message: str | None = None) -> Message:
    return _DESCRIBED(error_code=int(code),
                      error_message=message or f"Group {group_id} not found.",
                      group_id=group_id, group_state="", group_epoch=0, assignment_epoch=0,
                      assignor_name="", members=[])


def describe_error(request: Request, code: ErrorCode) -> Message:
    return _DESCRIBE[request.header.request_api_version](
        throttle_time_ms=0,
        groups=[_not_found(g, code, code.name) for g in request.body.group_ids])
