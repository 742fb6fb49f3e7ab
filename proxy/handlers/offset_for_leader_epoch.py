"""OffsetForLeaderEpoch: where a leader epoch ends, for consumers that detect truncation.

Kiln's epoch model: every partition has one leader epoch, 0, from its first offset on (the
epoch Metadata and ListOffsets report). So, as Kafka's leader answers from its epoch cache:
epoch 0 ends at the partition's end (the next offset); an epoch Kiln never had ends nowhere
(-1, -1) when it is above 0 or undefined (-1), and at the partition's start when it is below
every epoch Kiln had. A client's current leader epoch other than 0 is refused as Kafka
refuses a stale or future one (FENCED_LEADER_EPOCH below, UNKNOWN_LEADER_EPOCH above).

Truncation after Redis lost a partition (storage.appender.PartitionStarts restarts its offsets
where Kafka's Kiln records end): a consumer validating a position past the new end learns
the end offset and resets to it, as after an unclean leader election. Once new records
have taken the lost offsets again, the epoch (always 0) cannot tell them apart, so a
consumer that read the lost records sees no truncation then (docs: reliability, Redis loss).
"""

from __future__ import annotations

from proxy.context import KilnContext
from storage.model import TopicPartition
from storage.tiered_log import KILN_LEADER_EPOCH
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode, KafkaError

_RESP = CLIENT_APIS[ApiKey.OFFSET_FOR_LEADER_EPOCH].response
_TOPIC = _RESP.OffsetForLeaderTopicResult
_PARTITION = _TOPIC.EpochEndOffset

_NO_EPOCH = -1  # Kafka's UNDEFINED_EPOCH: also "no current epoch to check" in requests
_NO_OFFSET = -1


def check_current_leader_epoch(current: int) -> None:
    """Refuse a client's current leader epoch as Kafka's leader does (-1: no check)."""
    if current in (_NO_EPOCH, KILN_LEADER_EPOCH):
        return
    if current < KILN_LEADER_EPOCH:
        raise KafkaError(ErrorCode.FENCED_LEADER_EPOCH, f"leader epoch {current}")
    raise KafkaError(ErrorCode.UNKNOWN_LEADER_EPOCH, f"leader epoch {current}")


async def _end_of_epoch(ctx: KilnContext, tp: TopicPartition, current: int,
                        epoch: int) -> tuple[int, int]:
    """(leader epoch, end offset) for one partition; raises KafkaError."""
    await ctx.check_partition(tp)
    check_current_leader_epoch(current)
    if epoch == _NO_EPOCH or epoch > KILN_LEADER_EPOCH:
        return _NO_EPOCH, _NO_OFFSET
    # After Redis lost the partition, its end is where Kafka's records end: that is what a
    # consumer detecting truncation must be told.
    if epoch == KILN_LEADER_EPOCH:
        return epoch, await ctx.log.next_offset(tp)
    # Below every epoch Kiln had: Kafka answers the start of its first epoch, which moves up
    # with the log start.
    return epoch, await ctx.log.log_start(tp)


async def handle(ctx: KilnContext, request: Request) -> Message:
    topics = []
    for topic in request.body.topics:
        partitions = []
        for part in topic.partitions:
            tp = TopicPartition(topic.topic, part.partition)
            try:
                epoch, end = await _end_of_epoch(ctx, tp, part.current_leader_epoch,
                                                 part.leader_epoch)
                code = ErrorCode.NONE
            except KafkaError as exc:
                epoch, end, code = _NO_EPOCH, _NO_OFFSET, exc.error_code
            partitions.append(_PARTITION(error_code=int(code), partition=part.partition,
                                         leader_epoch=epoch, end_offset=end))
        topics.append(_TOPIC(topic=topic.topic, partitions=partitions))
    return _RESP[request.header.request_api_version](throttle_time_ms=0, topics=topics)
