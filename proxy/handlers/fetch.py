"""Fetch, with long-polling, over both tiers (storage.tiered_log).

From the log queue, batches are returned whole, exactly as producers sent them, with only
their base offset set to the Kiln offset and their leader epoch to Kiln's; below it, records
are read back from the hardened Kafka topic and rebuilt in Kiln offsets. A partition whose
records are in an unreachable Kafka answers a retriable error when the wait is over; the
others answer as usual. A fetch reaching the end of Kafka's records goes on in the log
queue.
"""

from __future__ import annotations

import time

from proxy.context import KilnContext
from storage.model import TopicPartition
from storage.tiered_log import PartitionRead
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode, KafkaError

_RESP = CLIENT_APIS[ApiKey.FETCH].response
_TOPIC = _RESP.FetchableTopicResponse
_PARTITION = _TOPIC.PartitionData
_ABORTED = _PARTITION.AbortedTransaction
_READ_COMMITTED = 1
_REFUSED_BEFORE_READING = frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})
# How often a waiting fetch re-reads Redis, for appends made through other Kiln processes.
_RECHECK_S = 0.1


async def _read_partition(ctx: KilnContext, tp: TopicPartition, offset: int,
                          limit_bytes: int, at_least_one: bool, committed_only: bool
                          ) -> PartitionRead:
    try:
        await ctx.check_partition(tp)
    except KafkaError as exc:
        return PartitionRead(exc.error_code)
    return await ctx.log.read(tp, offset, limit_bytes, at_least_one=at_least_one,
                              committed_only=committed_only)


async def _read_all(ctx: KilnContext, wanted: list[tuple[TopicPartition, int, int]],
                    max_bytes: int, committed_only: bool) -> dict[TopicPartition, PartitionRead]:
    reads: dict[TopicPartition, PartitionRead] = {}
    budget = max_bytes
    served = False
    for tp, offset, partition_max in wanted:
        limit = min(partition_max, budget)
        # KIP-74: the first partition with data returns at least one batch, whatever the
        # limits; the others only what fits.
        read = await _read_partition(ctx, tp, offset, limit, not served, committed_only)
        if served and len(read.records) > max(0, limit):
            read.records = b""
        served = served or bool(read.records)
        budget -= len(read.records)
        reads[tp] = read
    return reads


async def handle(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    wanted = [(TopicPartition(t.topic, p.partition), p.fetch_offset, p.partition_max_bytes)
              for t in body.topics for p in t.partitions]
    asked = body.max_bytes if request.header.request_api_version >= 3 else 2**31 - 1
    # At most max_fetch_bytes, less while answers not yet taken fill the listener's budget
    # (KIP-74 still answers with the first batch).
    max_bytes = ctx.memory.fetch_bytes(asked)
    deadline = time.monotonic() + max(0, body.max_wait_ms) / 1000
    committed_only = body.isolation_level == _READ_COMMITTED
    while True:
        reads = await _read_all(ctx, wanted, max_bytes, committed_only)
        size = sum(len(r.records) for r in reads.values())
        # An unreachable Kafka is waited out like an empty partition: answering at once
        # would have clients retry in a tight loop.
        failed = any(r.error_code is not ErrorCode.NONE and not r.retry_later
                     for r in reads.values())
        remaining = deadline - time.monotonic()
        if size >= max(1, body.min_bytes) or failed or remaining <= 0:
            break
        # Read on where the data is (past a gap below the hot tier, found once).
        wanted = [(tp, reads[tp].read_offset if reads[tp].read_offset >= 0 else offset, pm)
                  for tp, offset, pm in wanted]
        await ctx.log.wait_for_appends(reads, min(remaining, _RECHECK_S))
    return _response(request, reads)


def _response(request: Request, reads: dict[TopicPartition, PartitionRead],
              refused_whole: bool = False) -> Message:
    read_committed = request.body.isolation_level == _READ_COMMITTED
    topics = []
    for topic in request.body.topics:
        partitions = []
        for part in topic.partitions:
            read = reads.get(TopicPartition(topic.topic, part.partition), PartitionRead())
            failed = read.error_code is not ErrorCode.NONE
            # An erroring partition's answer carries no offsets, as Kafka's does.
            high_watermark = -1 if failed else read.high_watermark
            stable = -1 if failed else read.last_stable_offset
            partitions.append(_PARTITION(
                partition_index=part.partition, error_code=int(read.error_code),
                high_watermark=high_watermark, last_stable_offset=stable,
                log_start_offset=-1 if failed else read.log_start_offset,
                aborted_transactions=_aborted_transactions(read, read_committed, refused_whole),
                preferred_read_replica=-1, records=read.records,
            ))
        topics.append(_TOPIC(topic=topic.topic, partitions=partitions))
    return _RESP[request.header.request_api_version](
        throttle_time_ms=0, error_code=0, session_id=0, responses=topics)


def _aborted_transactions(read: PartitionRead, read_committed: bool, refused_whole: bool
                          ) -> list[object] | None:
    """The aborted transactions among a read_committed read's records. Whether the list is
    empty or null is Kafka's: empty for a partition refused before its log is read, null for
    a read_uncommitted read or a failed one."""
    if refused_whole or read.error_code in _REFUSED_BEFORE_READING:
        return []
    if not read_committed or read.error_code is not ErrorCode.NONE:
        return None
    return [_ABORTED(producer_id=a.producer_id, first_offset=a.first_offset)
            for a in read.aborted]


def error_response(request: Request, code: ErrorCode) -> Message:
    failed = {TopicPartition(t.topic, p.partition): PartitionRead(code)
              for t in request.body.topics for p in t.partitions}
    return _response(request, failed, refused_whole=True)
