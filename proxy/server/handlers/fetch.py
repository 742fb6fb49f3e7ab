"""Fetch from the log queue (the hot tier), with long-polling.

Batches are returned whole, exactly as producers sent them, with only their base offset set
to the Kiln offset. Offsets below what the log queue still holds (hardened and trimmed)
answer OFFSET_OUT_OF_RANGE until read-through from Kafka lands with the delivery issue.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from proxy.protocol.apis import CLIENT_APIS, ApiKey, Message, Request
from proxy.protocol.batch import with_base_offset
from proxy.protocol.errors import ErrorCode
from proxy.server.context import KilnContext
from storage.model import TopicPartition

_RESP = CLIENT_APIS[ApiKey.FETCH].response
_TOPIC = _RESP.FetchableTopicResponse
_PARTITION = _TOPIC.PartitionData
# How often a waiting fetch re-reads Redis, for appends made through other Kiln processes.
_RECHECK_S = 0.1


@dataclass(slots=True)
class _Read:
    error_code: ErrorCode = ErrorCode.NONE
    high_watermark: int = -1
    log_start_offset: int = -1
    records: bytes = b""


async def _read_partition(ctx: KilnContext, tp: TopicPartition, offset: int,
                          limit_bytes: int) -> _Read:
    config = await ctx.catalog.lookup(tp.topic, allow_create=False)
    if config is None or not 0 <= tp.partition < config.partitions:
        return _Read(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    batches, state, start = await ctx.queue.read_from(tp, offset, limit_bytes)
    read = _Read(high_watermark=state.next_offset, log_start_offset=start)
    if offset < start or offset > state.next_offset:
        read.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
        return read
    read.records = b"".join(with_base_offset(b.data, b.base_offset) for b in batches)
    return read


async def _read_all(ctx: KilnContext, wanted: list[tuple[TopicPartition, int, int]],
                    max_bytes: int) -> dict[TopicPartition, _Read]:
    reads: dict[TopicPartition, _Read] = {}
    budget = max_bytes
    for tp, offset, partition_max in wanted:
        # KIP-74: the first partition with data returns at least one batch, whatever limits.
        limit = max(1, min(partition_max, budget))
        read = await _read_partition(ctx, tp, offset, limit)
        if budget <= 0 and read.records:
            read.records = b""
        budget -= len(read.records)
        reads[tp] = read
    return reads


async def handle(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    wanted = [(TopicPartition(t.topic, p.partition), p.fetch_offset, p.partition_max_bytes)
              for t in body.topics for p in t.partitions]
    max_bytes = body.max_bytes if request.header.request_api_version >= 3 else 2**31 - 1
    deadline = time.monotonic() + max(0, body.max_wait_ms) / 1000
    while True:
        reads = await _read_all(ctx, wanted, max_bytes)
        size = sum(len(r.records) for r in reads.values())
        failed = any(r.error_code is not ErrorCode.NONE for r in reads.values())
        remaining = deadline - time.monotonic()
        if size >= max(1, body.min_bytes) or failed or remaining <= 0:
            break
        await ctx.appends.wait(reads, min(remaining, _RECHECK_S))
    return _response(request, reads)


def _response(request: Request, reads: dict[TopicPartition, _Read]) -> Message:
    topics = []
    for topic in request.body.topics:
        partitions = []
        for part in topic.partitions:
            read = reads.get(TopicPartition(topic.topic, part.partition), _Read())
            partitions.append(_PARTITION(
                partition_index=part.partition, error_code=int(read.error_code),
                high_watermark=read.high_watermark, last_stable_offset=read.high_watermark,
                log_start_offset=read.log_start_offset, aborted_transactions=[],
                preferred_read_replica=-1, records=read.records,
            ))
        topics.append(_TOPIC(topic=topic.topic, partitions=partitions))
    return _RESP[request.header.request_api_version](
        throttle_time_ms=0, error_code=0, session_id=0, responses=topics)


def error_response(request: Request, code: ErrorCode) -> Message:
    failed = {TopicPartition(t.topic, p.partition): _Read(code)
              for t in request.body.topics for p in t.partitions}
    return _response(request, failed)
