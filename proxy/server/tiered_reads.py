"""Reads over one continuous log: the log queue (hot tier) and, below it, the hardened Kafka
topic (cold tier), both in Kiln offsets.

Everything below the log queue's start was hardened (or dropped as delivered, or never meant
to be kept) before it was trimmed, so a read below that start is served from Kafka; when
Kafka holds nothing at or above the wanted offset (records dropped just below the hot start)
it is served from the hot start. Hot reads never wait on Kafka.

The partition's log start is the earliest offset either tier holds, but never below its
deleted mark (DeleteRecords, storage.record_deletion): nothing below that mark is served,
even while Kafka still holds some of it, and a read below it is OFFSET_OUT_OF_RANGE.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from proxy.protocol.batch import read_header, with_base_offset
from proxy.protocol.errors import ErrorCode
from proxy.protocol.records import DecodedRecord, decode_records
from proxy.server.context import KilnContext
from storage.errors import HardenedStoreUnavailable, StorageError
from storage.model import StoredBatch, TopicPartition

# What a consumer gets for a partition whose records are in Kafka while Kafka cannot be
# reached. kafka-python, aiokafka and librdkafka all refresh metadata (Kiln is still the
# leader) and retry it without a word; KAFKA_STORAGE_ERROR, the closer meaning, makes aiokafka
# log a warning on every failed fetch.
COLD_TIER_UNAVAILABLE = ErrorCode.NOT_LEADER_OR_FOLLOWER
# A read that keeps losing the race with hardening (trimmed between the hot and the cold
# look) answers empty after this many tries; the client asks again.
_TIER_ATTEMPTS = 3
# A MAX_TIMESTAMP scan reads the log queue this much at a time.
_SCAN_BYTES = 4 * 1024 * 1024
_SCAN_BATCHES = 1000


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
        deleted = state.deleted_offset
        cold_earliest = ctx.cold.earliest_if_known(tp)
        read = PartitionRead(high_watermark=state.next_offset,
                             log_start_offset=_log_start(deleted, cold_earliest, hot_start),
                             read_offset=offset)
        if offset > state.next_offset or offset < deleted:
            read.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
            if cold_earliest is None:
                # A client resets to this log start: ask Kafka rather than guess.
                with contextlib.suppress(StorageError):
                    read.log_start_offset = await earliest_offset(ctx, tp)
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
        read.log_start_offset = _log_start(deleted, cold.earliest, hot_start)
        if cold.earliest is None or offset < cold.earliest:
            read.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
            return read
        if cold.next_offset is not None:
            read.records = cold.records
            return read
        offset = hot_start  # a gap of dropped records up to the hot start
    return PartitionRead(high_watermark=read.high_watermark,
                         log_start_offset=read.log_start_offset, read_offset=offset)


async def start_if_unknown(ctx: KilnContext, tp: TopicPartition) -> None:
    """Start a partition Redis holds no state for (new to it, or lost with its data) from
    what Kafka holds, as an append would: where it begins and ends is then where Kafka's
    Kiln records leave off, not 0. For answers about the partition's ends."""
    if not await ctx.queue.started(tp):
        await ctx.catalog.starts.start(tp)


async def earliest_offset(ctx: KilnContext, tp: TopicPartition) -> int:
    """The partition's log start: the earliest Kiln offset either tier holds, not below its
    deleted mark; raises StorageError."""
    hot_start = await ctx.queue.start_offset(tp)
    deleted = (await ctx.queue.state(tp)).deleted_offset
    return _log_start(deleted, await ctx.cold.earliest(tp), hot_start)


async def offset_for_timestamp(ctx: KilnContext, tp: TopicPartition, timestamp: int
                               ) -> tuple[int, int] | None:
    """(Kiln offset, timestamp) of the first record at or after `timestamp`, at batch
    granularity in the hot tier; Kafka is asked only when the hot tier's first batch
    already reaches the timestamp (or none does), so that the answer may lie below it.
    Never below the deleted mark."""
    deleted = (await ctx.queue.state(tp)).deleted_offset
    found = await _first_at_or_after(ctx, tp, timestamp)
    if found is not None and found[0] < deleted:
        return deleted, found[1]
    return found


async def _first_at_or_after(ctx: KilnContext, tp: TopicPartition, timestamp: int
                             ) -> tuple[int, int] | None:
    hot = await ctx.queue.first_at_or_after(tp, timestamp)
    if hot is not None and hot[0] > await ctx.queue.start_offset(tp):
        return hot
    cold = await ctx.cold.offset_for_timestamp(tp, timestamp)
    if cold is not None and (hot is None or cold.kiln_offset < hot[0]):
        return cold.kiln_offset, cold.timestamp
    return hot


async def max_timestamp(ctx: KilnContext, tp: TopicPartition) -> tuple[int, int] | None:
    """(Kiln offset, timestamp) of the record with the largest timestamp in either tier, the
    first of them on a tie, as Kafka answers ListOffsets MAX_TIMESTAMP (None: no record).
    The hot tier is read whole (batch headers, and the records of the batch that wins);
    Kafka is asked for its own (storage.read_through)."""
    state = await ctx.queue.state(tp)
    deleted = state.deleted_offset
    found: list[tuple[int, int]] = []
    hot = await _hot_max_timestamp(ctx, tp, deleted, state.next_offset)
    if hot is not None:
        found.append(hot)
    cold = await ctx.cold.max_timestamp_record(tp)
    # A record Kafka still holds below the deleted mark (its deletion failed) is not served.
    if cold is not None and cold.kiln_offset >= deleted:
        found.append((cold.kiln_offset, cold.timestamp))
    return min(found, key=lambda f: (-f[1], f[0]), default=None)


async def _hot_max_timestamp(ctx: KilnContext, tp: TopicPartition, floor: int, end: int
                             ) -> tuple[int, int] | None:
    """The record with the largest timestamp in the log queue at or above `floor`, among
    the batches below `end` (appends during the scan do not keep it going)."""
    best: StoredBatch | None = None
    best_timestamp = -1
    from_offset: int | None = None
    while True:
        batches = (await ctx.queue.read(tp, _SCAN_BYTES, _SCAN_BATCHES,
                                        from_offset=from_offset)).batches
        batches = [b for b in batches if b.base_offset < end
                   and (from_offset is None or b.base_offset >= from_offset)]
        for batch in batches:
            if batch.next_offset <= floor:
                continue
            if batch.base_offset < floor:  # straddles the deleted mark: its later records
                later = [r.timestamp for r in _records(batch) if r.offset >= floor]
                timestamp = max(later, default=-1)
            else:
                timestamp = read_header(batch.data).max_timestamp
            if best is None or timestamp > best_timestamp:
                best, best_timestamp = batch, timestamp
        if not batches:
            break
        from_offset = batches[-1].next_offset
    if best is None:
        return None
    records = [r for r in _records(best) if r.offset >= floor]
    # The batch header's max timestamp names a record; if it names none, the largest one.
    top = max(records, key=lambda r: (r.timestamp == best_timestamp, r.timestamp, -r.offset))
    return top.offset, top.timestamp


def _records(batch: StoredBatch) -> list[DecodedRecord]:
    """The records of a stored batch, with their Kiln offsets."""
    return decode_records(with_base_offset(batch.data, batch.base_offset))


def _log_start(deleted: int, cold_earliest: int | None, hot_start: int) -> int:
    return max(deleted, _earliest(cold_earliest, hot_start))


def _earliest(cold_earliest: int | None, hot_start: int) -> int:
    return hot_start if cold_earliest is None else min(cold_earliest, hot_start)
