"""Read-through: records below the log queue, read back from the hardened Kafka topic.

A hardened record's Kiln offset is its `kiln.offset` header; a record without one (forwarded
while the partition's Kafka offsets equalled its Kiln offsets, or written before Kiln adopted
the topic) has its Kafka offset as Kiln offset (wire.lineage). Kiln offsets
increase along a Kafka partition, with gaps where records were delivered and dropped or never
hardened, so the first record at or above a wanted Kiln offset is found by binary search over
Kafka batches, narrowed (for a consumer reading on, settled) by KilnPositions. Records come
back rebuilt in Kiln offsets, as the hot tier serves them (storage.hardened_batches).

Kafka is read as a read_committed consumer reads it: up to its last stable offset, without
control batches (fence and transaction markers) and without the batches of aborted
transactions. The hardening lane writes in Kafka transactions; one aborted by a crash leaves
its records in the log, and the same records are written again, committed, later. Seen, they
would be served twice, and break the rule that Kiln offsets increase along the partition
that the search below relies on.

Kafka failures surface as the storage layer's errors: HardenedStoreUnavailable (retriable)
when Kafka cannot be reached, HardenedStoreRejected otherwise.

The same mapping serves DeleteRecords through Kiln: records below a Kiln offset are deleted
from Kafka below the Kafka offset of the first record at or above it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from storage.errors import (
    Fenced,
    HardenedStoreRejected,
    HardenedStoreUnavailable,
    HardenedTopicMissing,
    StorageError,
)
from storage.hardened_batches import (
    BatchSpan,
    LocatedRecord,
    batch_spans,
    first_record_at_or_after,
    to_kiln_offsets,
)
from storage.hardened_store import Fence, HardenedPartitionWriter
from storage.kafka.client import (
    EARLIEST,
    READ_COMMITTED,
    CommittedRead,
    KafkaClient,
    committed_read,
)
from storage.kiln_positions import KilnPositions
from storage.model import TopicPartition
from wire.errors import ErrorCode, KafkaError
from wire.lineage import lineage_offset
from wire.records import decode_records

log = logging.getLogger(__name__)

# A broker returns the whole first batch whatever the limit: a probe moves one batch.
_PROBE_BYTES = 1
# tansu caps fetch answers at 5 MiB.
_MAX_FETCH_BYTES = 4 * 1024 * 1024
# Batches read through without finding a record to serve before a read gives up for now.
_MAX_FETCHES_PER_READ = 16
_MAX_PROBES = 128
_FENCE_ATTEMPTS = 3

_P = ParamSpec("_P")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ColdRead:
    """Records at or above a wanted Kiln offset, in Kiln offsets.

    `next_offset` is the Kiln offset after the last record in `records` (the wanted offset
    when none could be served yet), or None when Kafka holds nothing at or above the wanted
    offset. `earliest` is the first Kiln offset Kafka holds (None: it holds no record).
    """

    records: bytes
    next_offset: int | None
    earliest: int | None


@dataclass
class ColdReaderCounters:
    reads: int = 0  # reads that served records
    records: int = 0  # records served
    probes: int = 0  # one-batch fetches made to find where a Kiln offset lies


@dataclass(frozen=True, slots=True)
class _Earliest:
    log_start: int  # Kafka's log start offset when it was learned
    kiln_offset: int | None
    learned_at: float
    # How many records Kiln had hardened into the partition (Redis's count) when the look-up
    # began: an answer that Kafka held none is out of date once more have been.
    hardened_records: int = 0


@dataclass(frozen=True, slots=True)
class _Probe:
    span: BatchSpan | None  # the first data batch ending at or after the probed offset
    end: int  # the last stable offset: no committed record lies at or past it
    log_start: int


class _Side(enum.Enum):
    """Where a searched-for record lies relative to a probed batch."""

    LATER = 1  # after the batch
    WITHIN = 2  # in the batch, and no earlier batch holds it
    EARLIER = 3  # in the batch or an earlier one


class ColdReader:
    def __init__(self, client: KafkaClient, *, positions: KilnPositions | None = None,
                 max_fetch_bytes: int = _MAX_FETCH_BYTES, earliest_ttl_s: float = 30.0,
                 refresh_retry_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._positions = positions or KilnPositions()
        self._max_fetch_bytes = max_fetch_bytes
        self._earliest_ttl_s = earliest_ttl_s
        self._refresh_retry_s = refresh_retry_s
        self._clock = clock
        self._earliest: dict[TopicPartition, _Earliest] = {}
        self._refresh_not_before: dict[TopicPartition, float] = {}
        self._refreshing: dict[TopicPartition, asyncio.Task[None]] = {}
        self.counters = ColdReaderCounters()

    # --- earliest Kiln offset --------------------------------------------------------------

    async def earliest(self, tp: TopicPartition, hardened_records: int = 0) -> int | None:
        """The first Kiln offset Kafka holds for the partition (None: it holds no record),
        asked of Kafka now; the last answer if Kafka cannot be reached and it held records
        then (they only ever go away from the front). `hardened_records`: as
        earliest_after_hardening."""
        try:
            log_start = await self._client.list_offset(tp.topic, tp.partition, EARLIEST)
            known = self._earliest.get(tp)
            if known is not None and known.kiln_offset is not None \
                    and known.log_start == log_start:
                kiln_offset: int | None = known.kiln_offset
            else:
                probe = await self._probe(tp, log_start)
                kiln_offset = None if probe.span is None else probe.span.first.kiln_offset
                if probe.span is not None and probe.span.first.kafka_offset < log_start:
                    # DeleteRecords left the log start inside a batch: its first record
                    # from there on.
                    first = await self._first_record(tp, log_start)
                    kiln_offset = None if first is None else first.kiln_offset
        except HardenedTopicMissing:
            self._positions.forget(tp)
            log_start, kiln_offset = 0, None
        except HardenedStoreUnavailable:
            known = self._earliest.get(tp)
            if known is None or known.kiln_offset is None:
                raise
            log.debug("%s/%d: Kafka unreachable; earliest Kiln offset as last seen, %d",
                      tp.topic, tp.partition, known.kiln_offset)
            return known.kiln_offset
        self._earliest[tp] = _Earliest(log_start, kiln_offset, self._clock(), hardened_records)
        return kiln_offset

    def earliest_if_known(self, tp: TopicPartition, hardened_records: int = 0) -> int | None:
        """The earliest Kiln offset as last seen, without waiting on Kafka (None: unknown, or
        Kafka held no record); a missing or stale answer is asked for in the background.
        For answers that must not wait on Kafka. `hardened_records`: as
        earliest_after_hardening."""
        known = self._earliest.get(tp)
        if known is None or self._clock() - known.learned_at >= self._earliest_ttl_s:
            self._refresh(tp, hardened_records)
        return None if known is None else known.kiln_offset

    async def earliest_after_hardening(self, tp: TopicPartition, hardened_records: int
                                       ) -> int | None:
        """As earliest_if_known, but an answer that Kafka held no record, learned when Kiln
        had hardened fewer records into the partition than `hardened_records` (Redis's count
        now), is asked of Kafka again and waited for: the log start must not move up to the
        hot start because records moved into Kafka. Not while Kafka fails to answer."""
        for _ in range(2):  # the look-up under way may have begun before the last hardening
            known = self._earliest.get(tp)
            if known is None or known.kiln_offset is not None \
                    or hardened_records <= known.hardened_records \
                    or tp in self._refresh_not_before:  # Kafka failed to answer
                break
            task = self._refresh(tp, hardened_records)
            if task is None:
                break
            await asyncio.shield(task)
        return self.earliest_if_known(tp, hardened_records)

    def _refresh(self, tp: TopicPartition, hardened_records: int) -> asyncio.Task[None] | None:
        """The look-up of the partition's earliest Kiln offset under way, started if none is;
        None while a failed one waits out `refresh_retry_s`."""
        task = self._refreshing.get(tp)
        if task is None and self._clock() >= self._refresh_not_before.get(tp, float("-inf")):
            task = asyncio.create_task(self._refresh_earliest(tp, hardened_records),
                                       name=f"kiln-earliest-{tp.topic}-{tp.partition}")
            self._refreshing[tp] = task
            task.add_done_callback(lambda _: self._refreshing.pop(tp, None))
        return task

    async def _refresh_earliest(self, tp: TopicPartition, hardened_records: int) -> None:
        try:
            await self.earliest(tp, hardened_records)
            self._refresh_not_before.pop(tp, None)
        except StorageError as exc:
            self._refresh_not_before[tp] = self._clock() + self._refresh_retry_s
            log.debug("%s/%d: earliest Kiln offset unknown: %s", tp.topic, tp.partition, exc)

    async def close(self) -> None:
        """Stop background look-ups (the Kafka client is closed by its owner)."""
        tasks = list(self._refreshing.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- reading ---------------------------------------------------------------------------

    async def read(self, tp: TopicPartition, kiln_offset: int, max_bytes: int, *,
                   at_least_one: bool = True) -> ColdRead:
        """Records from the first one at or above `kiln_offset`, up to `max_bytes` (with
        `at_least_one`, at least one batch however large)."""
        known = self._earliest.get(tp)
        if known is None or known.kiln_offset is None or kiln_offset < known.kiln_offset \
                or self._clock() - known.learned_at >= self._earliest_ttl_s:
            earliest = await self.earliest(tp)
        else:
            earliest = known.kiln_offset
        if earliest is None or kiln_offset < earliest:
            return ColdRead(b"", None, earliest)
        position = await self._locate_readable(tp, kiln_offset)
        fetch_bytes = max(1, min(max_bytes, self._max_fetch_bytes))
        for _ in range(_MAX_FETCHES_PER_READ):
            if position is None:
                if await self._undecided_after_stable(tp):
                    return ColdRead(b"", kiln_offset, earliest)  # ask again after it ends
                return ColdRead(b"", None, earliest)
            result = await self._fetch(tp, position, fetch_bytes)
            if result.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                position = await self._after_out_of_range(tp, kiln_offset)
                continue
            rebuilt = _decoded(to_kiln_offsets, result.records, kiln_offset, max_bytes,
                               at_least_one=at_least_one)
            if rebuilt.last is not None:
                last = rebuilt.last
                self._positions.learn(tp, last.kafka_offset, last.kiln_offset)
                self.counters.reads += 1
                self.counters.records += rebuilt.record_count
                return ColdRead(rebuilt.data, last.kiln_offset + 1, earliest)
            if rebuilt.full:  # not even one batch fits what is left of the response
                return ColdRead(b"", kiln_offset, earliest)
            if result.next_fetch_offset is not None:
                # Every whole batch was read through, the ones left out included.
                position = result.next_fetch_offset
            elif not result.fetched:
                if position < result.last_stable_offset:
                    raise HardenedStoreUnavailable(
                        f"{tp.topic}[{tp.partition}]: no records at {position} below the "
                        f"last stable offset {result.last_stable_offset}")
                if result.last_stable_offset < result.high_watermark:
                    return ColdRead(b"", kiln_offset, earliest)  # ask again after it ends
                position = None
            elif fetch_bytes < self._max_fetch_bytes:
                fetch_bytes = self._max_fetch_bytes  # one batch larger than the fetch size
            else:
                raise HardenedStoreRejected(
                    ErrorCode.RECORD_LIST_TOO_LARGE,
                    f"{tp.topic}[{tp.partition}]: batch at {position} exceeds "
                    f"{self._max_fetch_bytes} bytes")
        return ColdRead(b"", kiln_offset, earliest)  # no record to serve yet; ask again

    async def offset_for_timestamp(self, tp: TopicPartition, timestamp: int
                                   ) -> LocatedRecord | None:
        """The first record whose timestamp is at or after `timestamp` (None: there is none).

        Kafka's ListOffsets answers it, and the record it names is read for its Kiln offset;
        when that record is earlier than the timestamp (tansu 0.6 answers 0 whatever the
        timestamp), batch max timestamps are searched instead, as the hot tier does.
        """
        try:
            position = await self._client.list_offset(tp.topic, tp.partition, timestamp)
        except HardenedTopicMissing:
            return None
        if position < 0:
            return None
        found = await self._first_record(tp, position)
        if found is not None and found.timestamp >= timestamp:
            return found

        def side(span: BatchSpan) -> _Side:
            return _Side.LATER if span.max_timestamp < timestamp else _Side.EARLIER

        start = await self._search(tp, side, 0, None)
        return None if start is None else await self._first_record(tp, start, timestamp)

    async def max_timestamp_record(self, tp: TopicPartition) -> LocatedRecord | None:
        """The record with the largest timestamp (the first of them on a tie), in Kiln
        offsets (None: Kafka holds no record).

        Kafka's ListOffsets MAX_TIMESTAMP names it, unless the largest timestamp is a control
        batch's (a fence's abort marker carries the time it was written) or the broker does
        not know the query: then every data batch's max timestamp is looked at.
        """
        try:
            position, timestamp = await self._client.max_timestamp(tp.topic, tp.partition)
        except HardenedTopicMissing:
            return None
        except HardenedStoreRejected as exc:
            log.debug("%s/%d: no MAX_TIMESTAMP from Kafka (%s); scanning", tp.topic,
                      tp.partition, exc)
        else:
            if position < 0:
                return None  # no record at all
            found = await self._first_record(tp, position, timestamp)
            if found is not None:
                return found
        return await self._scan_max_timestamp(tp)

    async def _scan_max_timestamp(self, tp: TopicPartition) -> LocatedRecord | None:
        """Every data record from Kafka's log start on (a batch it starts inside of holds
        deleted records before it)."""
        log_start = position = await self._client.list_offset(tp.topic, tp.partition,
                                                              EARLIEST)
        best: LocatedRecord | None = None
        while True:
            result = await self._fetch(tp, position, self._max_fetch_bytes)
            if result.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                start = await self._client.list_offset(tp.topic, tp.partition, EARLIEST)
                if start <= position:
                    break  # past the end
                log_start = position = start
                continue
            for record in _decoded(decode_records, result.records):
                if record.offset < log_start:
                    continue
                if best is None or record.timestamp > best.timestamp:
                    best = LocatedRecord(record.offset,
                                         lineage_offset(record.headers, record.offset),
                                         record.timestamp)
            end = result.next_fetch_offset
            if end is None or end <= position:
                if position < result.last_stable_offset:
                    raise HardenedStoreUnavailable(
                        f"{tp.topic}[{tp.partition}]: no records at {position} below the "
                        f"last stable offset {result.last_stable_offset}")
                break
            position = end
        return best

    # --- deleting (DeleteRecords through Kiln: storage.record_deletion) ----------------------

    async def check_deletable(self, tp: TopicPartition) -> None:
        """Raise what Kafka would answer a DeleteRecords of the partition with (a compacted
        topic: POLICY_VIOLATION; Kafka unreachable), before anything is deleted anywhere. A
        DeleteRecords at offset 0 moves nothing."""
        try:
            await self._client.delete_records(tp.topic, tp.partition, 0)
        except HardenedTopicMissing:
            return

    async def fence_writers(self, tp: TopicPartition) -> None:
        """Make a hardening write of the partition still in flight fail rather than land
        later (storage.hardened_store: an abort marker at the leader, if Kiln ever hardened
        the partition). The writer that was fenced recovers and reads the marks again."""
        for attempt in range(1, _FENCE_ATTEMPTS + 1):
            try:
                await HardenedPartitionWriter(self._client, tp.topic, tp.partition).recover(
                    Fence.IF_EVER_WRITTEN)
                return
            except HardenedTopicMissing:
                return
            except Fenced:
                # A hardener recovering at the same moment bumped the epoch between ours
                # and our marker: fence again, over its epoch.
                if attempt == _FENCE_ATTEMPTS:
                    raise

    async def delete_below(self, tp: TopicPartition, kiln_offset: int) -> None:
        """Delete from Kafka every record whose Kiln offset is below `kiln_offset`: Kafka's
        log start moves to the first record at or above it (into a batch, if one straddles
        it), or to Kafka's last stable offset when it holds none. (Records past that belong
        to a transaction still open: once committed, some may be at or above `kiln_offset`.)
        Safe to ask again."""
        try:
            target = await self._kafka_offset_of(tp, kiln_offset)
            if target is None:
                target = (await self._client.partition_ends(tp.topic, tp.partition)
                          ).last_stable_offset
            low_watermark = await self._client.delete_records(tp.topic, tp.partition, target)
            log.info("%s/%d: records below Kiln offset %d deleted from Kafka (log start %d)",
                     tp.topic, tp.partition, kiln_offset, low_watermark)
        except HardenedTopicMissing:
            return
        finally:
            self._earliest.pop(tp, None)
            self._positions.forget(tp)

    async def _kafka_offset_of(self, tp: TopicPartition, kiln_offset: int) -> int | None:
        """The Kafka offset of the first record whose Kiln offset is `kiln_offset` or more
        (None: Kafka holds none)."""
        position = await self._locate_readable(tp, kiln_offset)
        for _ in range(_MAX_FETCHES_PER_READ):
            if position is None:
                return None
            result = await self._fetch(tp, position, self._max_fetch_bytes)
            if result.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                position = await self._after_out_of_range(tp, kiln_offset)
                continue
            for record in _decoded(decode_records, result.records):
                if record.offset >= position and \
                        lineage_offset(record.headers, record.offset) >= kiln_offset:
                    return record.offset
            end = result.next_fetch_offset
            if end is None or end <= position:
                if position < result.last_stable_offset:
                    raise HardenedStoreUnavailable(
                        f"{tp.topic}[{tp.partition}]: no records at {position} below the "
                        f"last stable offset {result.last_stable_offset}")
                return None
            position = end
        raise HardenedStoreUnavailable(
            f"{tp.topic}[{tp.partition}]: Kiln offset {kiln_offset} not found in Kafka")

    # --- finding records ---------------------------------------------------------------------

    async def _locate_readable(self, tp: TopicPartition, kiln_offset: int) -> int | None:
        """As `_locate`, but never below Kafka's log start as last learned: DeleteRecords
        can leave the log start inside a batch, and a fetch from that batch's start is
        refused (OFFSET_OUT_OF_RANGE), while one from the log start returns the batch."""
        position = await self._locate(tp, kiln_offset)
        known = self._earliest.get(tp)
        if position is not None and known is not None and position < known.log_start:
            return known.log_start
        return position

    async def _after_out_of_range(self, tp: TopicPartition, kiln_offset: int) -> int | None:
        """Where to read next after Kafka refused a fetch: the log start moved (retention,
        DeleteRecords) or the facts outlived the log they describe."""
        log_start = await self._client.list_offset(tp.topic, tp.partition, EARLIEST)
        self._positions.forget(tp)
        position = await self._locate(tp, kiln_offset)
        return None if position is None else max(position, log_start)

    async def _locate(self, tp: TopicPartition, kiln_offset: int) -> int | None:
        """A Kafka offset to read from for the first record at or above `kiln_offset`: that
        record's, or its batch's start (None: Kafka holds no such record)."""
        bounds = self._positions.bounds(tp, kiln_offset)
        if bounds.exact:
            return bounds.after

        def side(span: BatchSpan) -> _Side:
            if span.last.kiln_offset < kiln_offset:
                return _Side.LATER
            if span.first.kiln_offset < kiln_offset:
                return _Side.WITHIN
            return _Side.EARLIER

        return await self._search(tp, side, bounds.after, bounds.at_most)

    async def _search(self, tp: TopicPartition, side: Callable[[BatchSpan], _Side],
                      low: int, found: int | None) -> int | None:
        """Binary search over Kafka batches for the first batch that `side` does not place
        the wanted record after; returns its first Kafka offset (None: no such batch).

        `low`: every data record below it lies before the wanted one; `found`: a Kafka
        offset known to be at or after it. The first probe is at `low`, so a reader just
        behind the wanted record finds it at once. Positions in [bound, found) hold no data
        record, so the search is over when `low` reaches `bound`.
        """
        bound = found
        probe_at = low
        for _ in range(_MAX_PROBES):
            probe = await self._probe(tp, probe_at)
            low = max(low, probe.log_start)
            if bound is None or probe.end < bound:
                bound = probe.end
            span = probe.span
            if span is None:
                bound = min(bound, probe_at)
            else:
                where = side(span)
                if where is _Side.WITHIN:
                    return span.first.kafka_offset
                if where is _Side.LATER:
                    low = max(low, span.last.kafka_offset + 1)
                else:
                    first = span.first.kafka_offset
                    found = first if found is None else min(found, first)
                    bound = min(bound, probe_at, first)
            if low >= bound:
                return found
            probe_at = (low + bound) // 2
        log.warning("%s/%d: search gave up after %d probes", tp.topic, tp.partition,
                    _MAX_PROBES)
        return found

    async def _probe(self, tp: TopicPartition, position: int) -> _Probe:
        """The first committed data batch that ends at or after `position` (one fetch of one
        batch, more only past control batches and aborted transactions' batches); what it
        shows of Kiln offsets is remembered."""
        fetch_bytes = _PROBE_BYTES
        for _ in range(_MAX_FETCHES_PER_READ):
            self.counters.probes += 1
            result = await self._fetch(tp, position, fetch_bytes)
            log_start = max(result.log_start_offset, 0)
            if result.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                # Kafka leaves the offsets out of an error answer: ask which end it was.
                log_start = await self._client.list_offset(tp.topic, tp.partition, EARLIEST)
                if position < log_start:
                    position = log_start
                    continue
                return _Probe(None, position, log_start)  # the partition ends before it
            spans = _decoded(batch_spans, result.records)
            for span in spans:
                self._positions.learn(tp, span.first.kafka_offset, span.first.kiln_offset)
                self._positions.learn(tp, span.last.kafka_offset, span.last.kiln_offset)
            for span in spans:
                if span.last.kafka_offset >= position:
                    return _Probe(span, result.last_stable_offset, log_start)
            after = result.next_fetch_offset
            if after is None or after <= position:
                if position < result.last_stable_offset and not result.fetched:
                    raise HardenedStoreUnavailable(
                        f"{tp.topic}[{tp.partition}]: no records at {position} below the "
                        f"last stable offset {result.last_stable_offset}")
                return _Probe(None, result.last_stable_offset, log_start)
            # Only markers, older formats or an aborted transaction here: look past them, a
            # fetch's worth at a time (an aborted lane pass may span many batches).
            position = after
            fetch_bytes = self._max_fetch_bytes
        raise HardenedStoreRejected(
            ErrorCode.CORRUPT_MESSAGE,
            f"{tp.topic}[{tp.partition}]: no data batch found near {position}")

    async def _first_record(self, tp: TopicPartition, position: int,
                            min_timestamp: int | None = None) -> LocatedRecord | None:
        result = await self._fetch(tp, position, self._max_fetch_bytes)
        return _decoded(first_record_at_or_after, result.records, position, min_timestamp)

    async def _fetch(self, tp: TopicPartition, position: int, max_bytes: int
                     ) -> CommittedRead:
        """Committed data batches from `position` (a marker that cannot be read is Kafka's
        fault, as in _decoded)."""
        return _decoded(committed_read, await self._client.fetch(
            tp.topic, tp.partition, position, max_bytes, isolation_level=READ_COMMITTED))

    async def _undecided_after_stable(self, tp: TopicPartition) -> bool:
        """Kafka holds records past its last stable offset: a transaction not decided yet.
        Once committed, its records may be the ones a read looks for (the lane trims them
        from Redis once Kafka has its commit, maybe before the markers are written): a
        read_committed consumer waits at the last stable offset, it does not skip it."""
        ends = await self._client.partition_ends(tp.topic, tp.partition)
        return ends.last_stable_offset < ends.high_watermark


def _decoded(decode: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """A fetched record set that cannot be decoded is Kafka's fault, not the client's."""
    try:
        return decode(*args, **kwargs)
    except StorageError:
        raise
    except KafkaError as exc:
        raise HardenedStoreRejected(exc.error_code, f"hardened records: {exc.message}") from exc
