"""ListOffsets over both tiers, as Apache Kafka answers it without tiered storage.

- LATEST (-1): the log queue's next offset; for a read_committed consumer (v2+), the last
  stable offset (the first record of the oldest open transaction), as Kafka answers.
- EARLIEST (-2), and EARLIEST_LOCAL (-4, v8+): the partition's log start, the first Kiln
  offset either tier holds (never below what DeleteRecords deleted). Kiln has no remote
  tier in Kafka's sense: its hardened topic is part of the one log clients read, so, as a
  Kafka without tiered storage answers, the local log start is the log start.
- MAX_TIMESTAMP (-3, v7+, KIP-734): the record with the largest timestamp in either tier.
- LATEST_TIERED (-5, v9+) and EARLIEST_PENDING_UPLOAD (-6, v11+): no tiered storage, no
  such offset: -1 (no error), as Kafka answers.
- A timestamp: the first record at or after it (in the first batch whose max timestamp
  reaches it, the first record that does, as Kafka scans a batch).
- Any other negative timestamp, or one the request's version does not know yet:
  UNSUPPORTED_VERSION, as Kafka answers.

Kiln's leader epoch is 0 (proxy.handlers.offset_for_leader_epoch): answers that name
an offset carry it, the others -1, and a request's current leader epoch is checked as Kafka
checks it.
"""

from __future__ import annotations

from proxy.context import KilnContext
from proxy.handlers.offset_for_leader_epoch import check_current_leader_epoch
from storage.model import TopicPartition
from storage.tiered_log import KILN_LEADER_EPOCH
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode, KafkaError

_RESP = CLIENT_APIS[ApiKey.LIST_OFFSETS].response
_TOPIC = _RESP.ListOffsetsTopicResponse
_PARTITION = _TOPIC.ListOffsetsPartitionResponse
LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
EARLIEST_PENDING_UPLOAD = -6
# The first version that knows each special timestamp (older ones: UNSUPPORTED_VERSION).
_SINCE_VERSION = {LATEST: 0, EARLIEST: 0, MAX_TIMESTAMP: 7, EARLIEST_LOCAL: 8,
                  LATEST_TIERED: 9, EARLIEST_PENDING_UPLOAD: 11}
_NOT_FOUND = (-1, -1)
_READ_COMMITTED = 1


async def _offset(ctx: KilnContext, tp: TopicPartition, timestamp: int, version: int,
                  current_leader_epoch: int, committed_only: bool) -> tuple[int, int]:
    """(offset, timestamp) for one partition; raises KafkaError."""
    await ctx.check_partition(tp)
    check_current_leader_epoch(current_leader_epoch)
    if timestamp < 0 and version < _SINCE_VERSION.get(timestamp, version + 1):
        raise KafkaError(ErrorCode.UNSUPPORTED_VERSION,
                         f"timestamp {timestamp} in ListOffsets v{version}")
    if timestamp in (LATEST_TIERED, EARLIEST_PENDING_UPLOAD):
        return _NOT_FOUND
    if timestamp == LATEST:
        return await ctx.log.next_offset(tp, committed_only=committed_only), -1
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return await ctx.log.log_start(tp), -1
    if timestamp == MAX_TIMESTAMP:
        found = await ctx.log.max_timestamp(tp)
    else:
        found = await ctx.log.offset_for_timestamp(tp, timestamp)
    return found if found is not None else _NOT_FOUND


async def handle(ctx: KilnContext, request: Request) -> Message:
    version = request.header.request_api_version
    # v2+: read_committed consumers are told the last stable offset as the end.
    committed_only = version >= 2 and request.body.isolation_level == _READ_COMMITTED
    topics = []
    for topic in request.body.topics:
        partitions = []
        for part in topic.partitions:
            tp = TopicPartition(topic.name, part.partition_index)
            current = part.current_leader_epoch if version >= 4 else -1
            try:
                offset, timestamp = await _offset(ctx, tp, part.timestamp, version, current,
                                                  committed_only)
                code = ErrorCode.NONE
            except KafkaError as exc:
                offset, timestamp, code = -1, -1, exc.error_code
            partitions.append(_PARTITION(
                partition_index=part.partition_index, error_code=int(code),
                timestamp=timestamp, offset=offset,
                leader_epoch=KILN_LEADER_EPOCH if offset >= 0 else -1))
        topics.append(_TOPIC(name=topic.name, partitions=partitions))
    return _RESP[version](throttle_time_ms=0, topics=topics)
