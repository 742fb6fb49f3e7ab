"""One log per partition, in Kiln offsets, over both tiers: the log queue (hot tier, Redis)
and, below it, the hardened Kafka topic (cold tier). What the front asks of storage about a
partition's records goes through here: appends (and everything an append sets off), reads,
its ends and timestamps, deletions, waiting for appends and for assured acks.

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
OffsetForLeaderEpoch report, whichever tier they come from. A partition Redis holds no
state for (new to it, or lost) is started from what Kafka holds before its ends are told.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from storage import record_deletion
from storage.acks import AckOutcome, SettledWaiters
from storage.appender import Appender, PartitionLeases, PartitionStarts
from storage.appends import AppendSignals
from storage.budget import BufferBudget
from storage.errors import (
    COLD_TIER_UNAVAILABLE,
    HardenedStoreUnavailable,
    StorageError,
    cold_tier_errors,
)
from storage.log_queue import AbortedTransaction, AppendRequest, AppendResult, HotRead, LogQueue
from storage.model import StoredBatch, TopicPartition
from storage.observability.metrics import KilnMetrics
from storage.policy.observer import DelayObserver
from storage.read_through import ColdReader
from wire.batch import as_served, read_header, with_base_offset, with_leader_epoch
from wire.errors import ErrorCode
from wire.records import DecodedRecord, decode_records

# The one leader epoch of every Kiln partition (proxy.handlers.offset_for_leader_epoch).
KILN_LEADER_EPOCH = 0
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
    # Every transaction below it is decided; a read_committed read stops there.
    last_stable_offset: int = -1
    # For a read_committed read: the aborted transactions among the records served.
    aborted: list[AbortedTransaction] = field(default_factory=list)

    @property
    def retry_later(self) -> bool:
        """A failure worth waiting out within a long poll (the cold tier unreachable)."""
        return self.error_code == COLD_TIER_UNAVAILABLE


class TieredLog:
    def __init__(self, queue: LogQueue, cold: ColdReader, starts: PartitionStarts,
                 waiters: SettledWaiters, budget: BufferBudget, delay: DelayObserver,
                 metrics: KilnMetrics, signals: AppendSignals, leases: PartitionLeases) -> None:
        self._queue = queue
        self._cold = cold
        self._starts = starts
        self._appender = Appender(queue, starts, leases)
        self._waiters = waiters
        self._budget = budget
        self._delay = delay
        self._metrics = metrics
        self._signals = signals

    # -- appends ---------------------------------------------------------------------------

    async def append(self, requests: Sequence[AppendRequest], sender: Hashable, now_ms: int
                     ) -> tuple[list[AppendResult], int]:
        """Append each partition's batches (all of a partition's or none), then tell
        whoever follows appends: waiting fetches and the hardener, metrics, the delay
        observer. Returns the results and the throttle time; raises StorageError when the
        buffer cannot take the request at all."""
        throttle_ms = self._budget.admit(sum(r.size for r in requests)) if requests else 0
        results = await self._appender.append(requests, now_ms)
        for request, result in zip(requests, results, strict=True):
            if result.error_code is not ErrorCode.NONE or result.duplicate:
                continue  # a retry answered with its original offset: nothing new arrived
            count, size = request.record_count, request.size
            self._signals.appended(request.tp)
            self._metrics.appended(request.tp.topic, request.reliability, count, size)
            self._delay.appended(request.tp, sender, count, size, result.base_offset + count,
                                 now_ms)
        return results, throttle_ms

    async def wait_for_appends(self, tps: Iterable[TopicPartition], timeout_s: float) -> bool:
        """True when one of `tps` received records through this process within timeout_s."""
        return await self._signals.wait(tps, timeout_s)

    async def wait_settled(self, tp: TopicPartition, incarnation: str, last_offset: int,
                           timeout_s: float) -> AckOutcome:
        """Wait until `last_offset` of the partition's `incarnation` is hardened or
        delivered, the incarnation is gone, or timeout_s passes."""
        return await self._waiters.wait(tp, incarnation, last_offset, timeout_s)

    # -- reads -----------------------------------------------------------------------------

    async def read(self, tp: TopicPartition, offset: int, limit_bytes: int,
                   *, at_least_one: bool, committed_only: bool = False) -> PartitionRead:
        """Batches from `offset`, up to `limit_bytes` (with `at_least_one`, at least one
        batch whatever the limit), from whichever tier holds them; with `committed_only`
        (read_committed), none at or past the last stable offset, and the aborted
        transactions among them listed. The caller checks the topic."""
        if offset < 0:
            return PartitionRead(ErrorCode.OFFSET_OUT_OF_RANGE)
        for _ in range(_TIER_ATTEMPTS):
            hot = await self._queue.read_from(tp, offset, max(1, limit_bytes))
            state, hot_start = hot.state, hot.start_offset
            batches = _stable(hot) if committed_only else hot.batches
            deleted = state.deleted_offset
            read = PartitionRead(high_watermark=state.next_offset, read_offset=offset,
                                 last_stable_offset=hot.last_stable_offset)
            if offset > state.next_offset or offset < deleted:
                read.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
                return read
            if offset >= hot_start:
                cold_earliest = await self._cold.earliest_after_hardening(
                    tp, state.hardened_records)
                read.log_start_offset = _log_start(deleted, cold_earliest, hot_start)
                read.records = _served(batches)
                if committed_only:
                    read.aborted = _aborted_among(hot, batches)
                return read
            read.log_start_offset = _log_start(
                deleted, self._cold.earliest_if_known(tp, state.hardened_records), hot_start)
            if limit_bytes <= 0 and not at_least_one:
                return read  # nothing would fit: leave Kafka alone
            try:
                cold = await self._cold.read(tp, offset, max(1, limit_bytes),
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
                    served = _fitting(batches, limit_bytes - len(read.records))
                    read.records += _served(served)
                    if committed_only:
                        read.aborted = _aborted_among(hot, served)
                return read
            offset = hot_start  # a gap of dropped records up to the hot start
        return PartitionRead(high_watermark=read.high_watermark,
                             log_start_offset=read.log_start_offset, read_offset=offset,
                             last_stable_offset=read.last_stable_offset)

    async def next_offset(self, tp: TopicPartition, *, committed_only: bool = False) -> int:
        """The partition's end (its high watermark), or with `committed_only` its last
        stable offset; raises KafkaError."""
        with cold_tier_errors():
            await self._start_if_unknown(tp)
            if committed_only:
                return await self._queue.last_stable_offset(tp)
            return (await self._queue.state(tp)).next_offset

    async def log_start(self, tp: TopicPartition) -> int:
        """The partition's log start: the earliest Kiln offset either tier holds, not below
        its deleted mark; raises KafkaError."""
        with cold_tier_errors():
            await self._start_if_unknown(tp)
            return await self._log_start_of_started(tp)

    async def delete_records(self, tp: TopicPartition, offset: int) -> int:
        """Delete the partition's records below `offset` in both tiers
        (storage.record_deletion); returns its log start after; raises KafkaError."""
        with cold_tier_errors():
            await record_deletion.delete_records(self._queue, self._cold, self._waiters,
                                                 self._starts, tp, offset)
            return await self._log_start_of_started(tp)

    async def offset_for_timestamp(self, tp: TopicPartition, timestamp: int
                                   ) -> tuple[int, int] | None:
        """(Kiln offset, timestamp) of the first record at or after `timestamp`, never
        below the deleted mark, as Kafka finds it: in the first batch whose max timestamp
        reaches it, the first record that does. Kafka is asked only when the hot tier's
        first batch already reaches the timestamp (or none does), so that the answer may lie
        below it. Raises KafkaError."""
        with cold_tier_errors():
            await self._start_if_unknown(tp)
            deleted = (await self._queue.state(tp)).deleted_offset
            hot = await self._hot_first_at_or_after(tp, timestamp, deleted)
            if hot is not None and hot[0] > await self._queue.start_offset(tp):
                return hot[1]
            cold = await self._cold.offset_for_timestamp(tp, timestamp)
            if cold is not None and (hot is None or cold.kiln_offset < hot[1][0]):
                # A record Kafka still holds below the deleted mark (its deletion failed).
                return max(cold.kiln_offset, deleted), cold.timestamp
            return None if hot is None else hot[1]

    async def max_timestamp(self, tp: TopicPartition) -> tuple[int, int] | None:
        """(Kiln offset, timestamp) of the record with the largest timestamp in either tier,
        the first of them on a tie, as Kafka answers ListOffsets MAX_TIMESTAMP (None: no
        record). The hot tier is read whole (batch headers, and the records of the batch
        that wins); Kafka is asked for its own (storage.read_through). Raises KafkaError."""
        with cold_tier_errors():
            await self._start_if_unknown(tp)
            state = await self._queue.state(tp)
            deleted = state.deleted_offset
            found: list[tuple[int, int]] = []
            hot = await self._hot_max_timestamp(tp, deleted, state.next_offset)
            if hot is not None:
                found.append(hot)
            cold = await self._cold.max_timestamp_record(tp)
            # A record Kafka still holds below the deleted mark (its deletion failed) is not
            # served.
            if cold is not None and cold.kiln_offset >= deleted:
                found.append((cold.kiln_offset, cold.timestamp))
            return min(found, key=lambda f: (-f[1], f[0]), default=None)

    async def _start_if_unknown(self, tp: TopicPartition) -> None:
        """Start a partition Redis holds no state for (new to it, or lost with its data)
        from what Kafka holds, as an append would: where it begins and ends is then where
        Kafka's Kiln records leave off, not 0."""
        if not await self._queue.started(tp):
            await self._starts.start(tp)

    async def _log_start_of_started(self, tp: TopicPartition) -> int:
        hot_start = await self._queue.start_offset(tp)
        deleted = (await self._queue.state(tp)).deleted_offset
        return _log_start(deleted, await self._cold.earliest(tp), hot_start)

    async def _hot_first_at_or_after(self, tp: TopicPartition, timestamp: int, floor: int
                                     ) -> tuple[int, tuple[int, int]] | None:
        """(base offset of its batch, (offset, timestamp)) of the first record in the log
        queue at or above `floor` whose timestamp reaches `timestamp`."""
        from_offset = 0
        while (batch := await self._queue.first_batch_reaching(tp, timestamp, from_offset)) \
                is not None:
            for record in _records(batch):
                if record.timestamp >= timestamp and record.offset >= floor:
                    return batch.base_offset, (record.offset, record.timestamp)
            from_offset = batch.next_offset
        return None

    async def _hot_max_timestamp(self, tp: TopicPartition, floor: int, end: int
                                 ) -> tuple[int, int] | None:
        """The record with the largest timestamp in the log queue at or above `floor`,
        among the batches below `end` (appends during the scan do not keep it going)."""
        best: StoredBatch | None = None
        best_timestamp = -1
        from_offset: int | None = None
        while True:
            batches = (await self._queue.read(tp, _SCAN_BYTES, _SCAN_BATCHES,
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
        # The batch header's max timestamp names a record; if it names none, the largest.
        top = max(records, key=lambda r: (r.timestamp == best_timestamp, r.timestamp,
                                          -r.offset))
        return top.offset, top.timestamp


def _stable(hot: HotRead) -> list[StoredBatch]:
    """The batches below the last stable offset (it is always a batch's first offset)."""
    return [b for b in hot.batches if b.base_offset < hot.last_stable_offset]


def _aborted_among(hot: HotRead, served: list[StoredBatch]) -> list[AbortedTransaction]:
    """The aborted transactions that began before the end of `served` (those whose
    markers lie before the read's offset are not in `hot.aborted`)."""
    if not served:
        return []
    end = served[-1].next_offset
    return [a for a in hot.aborted if a.first_offset < end]


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


def _records(batch: StoredBatch) -> list[DecodedRecord]:
    """The records of a stored batch, with their Kiln offsets."""
    return decode_records(with_base_offset(batch.data, batch.base_offset))


def _log_start(deleted: int, cold_earliest: int | None, hot_start: int) -> int:
    return max(deleted, _earliest(cold_earliest, hot_start))


def _earliest(cold_earliest: int | None, hot_start: int) -> int:
    return hot_start if cold_earliest is None else min(cold_earliest, hot_start)
