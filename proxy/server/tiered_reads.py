"""Reads over one continuous log: the log queue (hot tier) and, below it, the hardened Kafka
topic (cold tier), both in Kiln offsets.

Everything below the log queue's start was hardened (or dropped as delivered, or never meant
to be kept) before it was trimmed, so a read below that start is served from Kafka; when
Kafka holds nothing at or above the wanted offset (records dropped just below the hot start)
it is served from the hot start. Hot reads never wait on Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.protocol.batch import with_base_offset
from proxy.protocol.errors import ErrorCode
from proxy.server.context import KilnContext
from storage.errors import HardenedStoreUnavailable, StorageError
from storage.model import TopicPartition

# What a consumer gets for a partition whose records are in Kafka while Kafka cannot be
# reached. kafka-python, aiokafka and librdkafka all refresh metadata (Kiln is still the
# leader) and retry it without a word; KAFKA_STORAGE_ERROR, the closer meaning, makes aiokafka
# log a warning on every failed fetch.
COLD_TIER_UNAVAILABLE = ErrorCode.NOT_LEADER_OR_FOLLOWER
# A read that keeps losing the race with hardening (trimmed between the hot and the cold
# look) answers empty after this many tries; the client asks again.
_TIER_ATTEMPTS = 3


@dataclass(slots=True)
class PartitionRead:
    error_code: ErrorCode = ErrorCode.NONE
    high_watermark: int = -1
    log_start_offset: int = -1
    records: bytes = b""
    # Where the records came from: the hot start when the wanted offset fell in a gap below
    # it (a waiting fetch reads on from there).
    read_offset: int = -1

    @property
    def retry_later(self) -> bool:
        """A failure worth waiting out within a long poll (the cold tier unreachable)."""
        return self.error_code == COLD_TIER_UNAVAILABLE


async def read_partition(ctx: KilnContext, tp: TopicPartition, offset: int, limit_bytes: int,
                         *, at_least_one: bool) -> PartitionRead:
    """Batches from `offset`, up to `limit_bytes` (with `at_least_one`, at least one batch
    whatever the limit), from whichever tier holds them. The caller checks the topic."""
    if offset < 0:
        return PartitionRead(ErrorCode.OFFSET_OUT_OF_RANGE,
                             high_watermark=(await ctx.queue.state(tp)).next_offset,
                             log_start_offset=await earliest_offset(ctx, tp))
    for _ in range(_TIER_ATTEMPTS):
        batches, state, hot_start = await ctx.queue.read_from(tp, offset, max(1, limit_bytes))
        cold_earliest = ctx.cold.earliest_if_known(tp)
        read = PartitionRead(high_watermark=state.next_offset,
                             log_start_offset=_earliest(cold_earliest, hot_start),
                             read_offset=offset)
        if offset > state.next_offset:
            read.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
            return read
        if offset >= hot_start:
            read.records = b"".join(with_base_offset(b.data, b.base_offset) for b in batches)
            return read
        if limit_bytes <= 0 and not at_least_one:
            return read  # nothing would fit: leave Kafka alone
        try:
            cold = await ctx.cold.read(tp, offset, max(1, limit_bytes),
                                       at_least_one=at_least_one)
        except StorageError as exc:
            unavailable = isinstance(exc, HardenedStoreUnavailable)
            read.error_code = COLD_TIER_UNAVAILABLE if unavailable else exc.error_code
            return read
        read.log_start_offset = _earliest(cold.earliest, hot_start)
        if cold.earliest is None or offset < cold.earliest:
            read.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
            return read
        if cold.next_offset is not None:
            read.records = cold.records
            return read
        offset = hot_start  # a gap of dropped records up to the hot start
    return PartitionRead(high_watermark=read.high_watermark,
                         log_start_offset=read.log_start_offset, read_offset=offset)


async def earliest_offset(ctx: KilnContext, tp: TopicPartition) -> int:
    """The earliest Kiln offset either tier holds; raises StorageError."""
    hot_start = await ctx.queue.start_offset(tp)
    return _earliest(await ctx.cold.earliest(tp), hot_start)


async def offset_for_timestamp(ctx: KilnContext, tp: TopicPartition, timestamp: int
                               ) -> tuple[int, int] | None:
    """(Kiln offset, timestamp) of the first record at or after `timestamp`, at batch
    granularity in the hot tier; Kafka is asked only when the hot tier's first batch
    already reaches the timestamp (or none does), so that the answer may lie below it."""
    hot = await ctx.queue.first_at_or_after(tp, timestamp)
    if hot is not None and hot[0] > await ctx.queue.start_offset(tp):
        return hot
    cold = await ctx.cold.offset_for_timestamp(tp, timestamp)
    if cold is not None and (hot is None or cold.kiln_offset < hot[0]):
        return cold.kiln_offset, cold.timestamp
    return hot


def _earliest(cold_earliest: int | None, hot_start: int) -> int:
    return hot_start if cold_earliest is None else min(cold_earliest, hot_start)
