"""DeleteRecords: move partitions' log start offsets up, in both tiers (storage.record_deletion).

Answered per partition as Kafka answers: the low watermark (the partition's first offset
through Kiln, what ListOffsets EARLIEST now says), UNKNOWN_TOPIC_OR_PARTITION,
OFFSET_OUT_OF_RANGE for an offset below 0 (other than -1, the high watermark) or past the
high watermark, POLICY_VIOLATION where Kafka refuses deletions (compacted topics). When
Kafka cannot be reached the partition answers the cold tier's retriable error: what was
done in Redis stays done, and asking again finishes the deletion in Kafka.
"""

from __future__ import annotations

from proxy.context import KilnContext
from storage.model import TopicPartition
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode, KafkaError

_RESP = CLIENT_APIS[ApiKey.DELETE_RECORDS].response
_TOPIC = _RESP.DeleteRecordsTopicResult
_PARTITION = _TOPIC.DeleteRecordsPartitionResult
_NO_WATERMARK = -1


async def _delete(ctx: KilnContext, tp: TopicPartition, offset: int) -> int:
    """The partition's low watermark after the deletion; raises KafkaError."""
    await ctx.check_partition(tp)
    return await ctx.log.delete_records(tp, offset)


async def handle(ctx: KilnContext, request: Request) -> Message:
    # A partition named twice is deleted once, up to the last offset named (Kafka keeps the
    # request's partitions in a map).
    wanted: dict[TopicPartition, int] = {}
    for topic in request.body.topics:
        for part in topic.partitions:
            wanted[TopicPartition(topic.name, part.partition_index)] = part.offset
    answers: dict[TopicPartition, tuple[int, ErrorCode]] = {}
    for tp, offset in wanted.items():
        try:
            answers[tp] = (await _delete(ctx, tp, offset), ErrorCode.NONE)
        except KafkaError as exc:
            answers[tp] = (_NO_WATERMARK, exc.error_code)
    return _body(request, answers)


def _body(request: Request, answers: dict[TopicPartition, tuple[int, ErrorCode]]) -> Message:
    topics: dict[str, list[Message]] = {}
    for tp, (low_watermark, code) in answers.items():
        topics.setdefault(tp.topic, []).append(_PARTITION(
            partition_index=tp.partition, low_watermark=low_watermark, error_code=int(code)))
    return _RESP[request.header.request_api_version](
        throttle_time_ms=0,
        topics=[_TOPIC(name=name, partitions=partitions) for name, partitions in topics.items()])


def error_response(request: Request, code: ErrorCode) -> Message:
    return _body(request, {TopicPartition(t.name, p.partition_index): (_NO_WATERMARK, code)
                           for t in request.body.topics for p in t.partitions})
