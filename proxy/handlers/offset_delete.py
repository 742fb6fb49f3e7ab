"""OffsetDelete: delete a group's committed offsets of some partitions, as Kafka does.

Group-level errors come alone (no topics): INVALID_GROUP_ID for the empty id,
GROUP_ID_NOT_FOUND for a group Kiln does not know, NON_EMPTY_GROUP for a group with members
that does not use the consumer protocol. Otherwise each partition is answered: an unknown
topic or partition UNKNOWN_TOPIC_OR_PARTITION, a topic the group's members are subscribed
to GROUP_SUBSCRIBED_TO_TOPIC (its offsets stay), else deleted (also when nothing was
committed there). A durable subscription whose offsets are deleted no longer counts there
until it commits again (storage.delivery.Delivery.offsets_deleted).
"""

from __future__ import annotations

from proxy.context import KilnContext
from storage.errors import coordinator_errors
from storage.model import TopicPartition
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode

_RESP = CLIENT_APIS[ApiKey.OFFSET_DELETE].response
_TOPIC = _RESP.OffsetDeleteResponseTopic
_PARTITION = _TOPIC.OffsetDeleteResponsePartition


async def handle(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    codes: dict[TopicPartition, ErrorCode] = {}
    known: list[TopicPartition] = []
    with coordinator_errors():
        for topic in body.topics:
            for part in topic.partitions:
                tp = TopicPartition(topic.name, part.partition_index)
                if not await ctx.topics.has_partition(tp):
                    codes[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    known.append(tp)
        deletion = await ctx.groups.delete_offsets(body.group_id, known)
        if deletion.error_code is not ErrorCode.NONE:
            return _body(request, deletion.error_code, {})
    for tp in known:
        subscribed = tp.topic in deletion.subscribed_topics
        codes[tp] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC if subscribed else ErrorCode.NONE
    return _body(request, ErrorCode.NONE, codes)


def _body(request: Request, code: ErrorCode, codes: dict[TopicPartition, ErrorCode]
          ) -> Message:
    topics = []
    if codes:
        for topic in request.body.topics:
            topics.append(_TOPIC(name=topic.name, partitions=[
                _PARTITION(partition_index=p.partition_index,
                           error_code=int(codes[TopicPartition(topic.name, p.partition_index)]))
                for p in topic.partitions]))
    return _RESP[request.header.request_api_version](error_code=int(code), throttle_time_ms=0,
                                                     topics=topics)


def error_response(request: Request, code: ErrorCode) -> Message:
    return _body(request, code, {})
