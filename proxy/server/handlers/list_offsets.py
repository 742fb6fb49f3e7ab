"""ListOffsets over both tiers: latest (the log queue's next offset), earliest (the hardened
Kafka topic's first Kiln offset when it holds any record), and by timestamp."""

from __future__ import annotations

from proxy.protocol.apis import CLIENT_APIS, ApiKey, Message, Request
from proxy.protocol.errors import ErrorCode, KafkaError
from proxy.server.context import KilnContext
from proxy.server.tiered_reads import COLD_TIER_UNAVAILABLE, earliest_offset, offset_for_timestamp
from storage.errors import HardenedStoreUnavailable
from storage.model import TopicPartition

_RESP = CLIENT_APIS[ApiKey.LIST_OFFSETS].response
_TOPIC = _RESP.ListOffsetsTopicResponse
_PARTITION = _TOPIC.ListOffsetsPartitionResponse
LATEST = -1
EARLIEST = -2


async def _offset(ctx: KilnContext, tp: TopicPartition, timestamp: int) -> tuple[int, int]:
    """(offset, timestamp) for one partition; raises KafkaError."""
    config = await ctx.catalog.lookup(tp.topic, allow_create=False)
    if config is None or not 0 <= tp.partition < config.partitions:
        raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, tp.topic)
    if timestamp == LATEST:
        return (await ctx.queue.state(tp)).next_offset, -1
    if timestamp < 0 and timestamp != EARLIEST:
        raise KafkaError(ErrorCode.INVALID_REQUEST, f"timestamp {timestamp}")
    try:
        if timestamp == EARLIEST:
            return await earliest_offset(ctx, tp), -1
        found = await offset_for_timestamp(ctx, tp, timestamp)
    except HardenedStoreUnavailable as exc:
        raise KafkaError(COLD_TIER_UNAVAILABLE, exc.message) from exc
    return found if found is not None else (-1, -1)


async def handle(ctx: KilnContext, request: Request) -> Message:
    topics = []
    for topic in request.body.topics:
        partitions = []
        for part in topic.partitions:
            tp = TopicPartition(topic.name, part.partition_index)
            try:
                offset, timestamp = await _offset(ctx, tp, part.timestamp)
                code = ErrorCode.NONE
            except KafkaError as exc:
                offset, timestamp, code = -1, -1, exc.error_code
            partitions.append(_PARTITION(partition_index=part.partition_index,
                                         error_code=int(code), timestamp=timestamp,
                                         offset=offset, leader_epoch=0))
        topics.append(_TOPIC(name=topic.name, partitions=partitions))
    return _RESP[request.header.request_api_version](throttle_time_ms=0, topics=topics)
