"""Reads over one continuous log: the log queue (hot tier) and, below it, the hardened Kafka
topic (cold tier), both in Kiln offsets.

Everything below the log queue's start was hardened (or dropped as delivered, or never meant
to be kept) before it was trimmed, so a read below that start is served from Kafka; when
Kafka holds nothing at or above the wanted offset (records dropped just below the hot start)
it is served from the hot start. A read from Kafka that reaches the hot start goes on there.
Hot reads do not wait on Kafka, but once to learn the log start after records moved into a
Kafka last seen holding none (storage.read_through.ColdReader.earliest_after_hardening).

The partition's log start is the earliest offset either tier holds, but never below its
deleted mark (DeleteRecords, storage.record_deletion): nothing below that mark is served,
even while Kafka still holds some of it, and a read below it is OFFSET_OUT_OF_RANGE.

Served batches carry Kiln's leader epoch, the one Metadata, ListOffsets and
OffsetForLeaderEpoch report, whichever tier they come from.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.context import KilnContext
from storage.errors import HardenedStoreUnavailable, StorageError
from storage.model import StoredBatch, TopicPartition
from wire.batch import as_served, read_header, with_base_offset, with_leader_epoch
from wire.errors import ErrorCode
from wire.records import DecodedRecord, decode_records

# The one leader epoch of every Kiln partition (proxy.handlers.offset_for_leader_epoch).
KILN_LEADER_EPOCH = 0
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
        return PartitionRead(ErrorCode.OFFSET_OUT_OF_RANGE)
    for _ in range(_TIER_ATTEMPTS):
        batches, state, hot_start = await ctx.queue.read_from(tp, offset, max(1, limit_bytes))
        deleted = state.deleted_offset
        read = PartitionRead(high_watermark=state.next_offset, read_offset=offset)
        if offset > state.next_offset or offset < deleted:
            read.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
            return read
        if offset >= hot_start:
            cold_earliest = await ctx.cold.earliest_after_hardening(tp, state.hardened_records)
            read.log_start_offset = _log_start(deleted, cold_earliest, hot_start)
            read.records = _served(batches)
            return read
        read.log_start_offset = _log_start(
            deleted, ctx.cold.earliest_if_known(tp, state.hardened_records), hot_start)
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
            read.records = with_leader_epoch(cold.records, KILN_LEADER_EPOCH)
            if cold.records and cold.next_offset == hot_start:
                # Kafka's records reach the hot start: the log goes on in Redis (all of
                # `batches`, read below the hot start), as one Kafka log would answer.
                read.records += _served(_fitting(batches, limit_bytes - len(read.records)))
            return read
        offset = hot_start  # a gap of dropped records up to the hot start
    return PartitionRead(high_watermark=read.high_watermark,
                         log_start_offset=read.log_start_offset, read_offset=offset)


def _served(batches: list[StoredBatch]) -> bytes:
    return b"".join(as_served(b.data, b.base_offset, KILN_LEADER_EPOCH) for b in batches)


def _fitting(batches: list[StoredBatch], limit_bytes: int) -> list[StoredBatch]:
    """The first batches that fit in `limit_bytes` together."""
    taken: list[StoredBatch] = []
    for batch in batches:
        limit_bytes -= len(batch.data)
        if limit_bytes < 0:
            break
        taken.append(batch)
    return taken


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
    """(Kiln offset, timestamp) of the first record at or after `timestamp`, never below the
    deleted mark, as Kafka finds it: in the first batch whose max timestamp reaches it, the
    first record that does. Kafka is asked only when the hot tier's first batch already
    reaches the timestamp (or none does), so that the answer may lie below it."""
    deleted = (await ctx.queue.state(tp)).deleted_offset
    hot = await _hot_first_at_or_after(ctx, tp, timestamp, deleted)
    if hot is not None and hot[0] > await ctx.queue.start_offset(tp):
        return hot[1]
    cold = await ctx.cold.offset_for_timestamp(tp, timestamp)
    if cold is not None and (hot is None or cold.kiln_offset < hot[1][0]):
        # A record Kafka still holds below the deleted mark (its deletion failed).
        return max(cold.kiln_offset, deleted), cold.timestamp
    return None if hot is None else hot[1]


async def _hot_first_at_or_after(ctx: KilnContext, tp: TopicPartition, timestamp: int,
                                 floor: int) -> tuple[int, tuple[int, int]] | None:
    """(base offset of its batch, (offset, timestamp)) of the first record in the log queue
    at or above `floor` whose timestamp reaches `timestamp`."""
    from_offset = 0
    while (batch := await ctx.queue.first_batch_reaching(tp, timestamp, from_offset)) \
            is not None:
        for record in _records(batch):
            if record.timestamp >= timestamp and record.offset >= floor:
                return batch.base_offset, (record.offset, record.timestamp)
        from_offset = batch.next_offset
    return None


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
