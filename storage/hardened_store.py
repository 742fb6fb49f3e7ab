"""Writing surviving batches of one partition into Kafka exactly once, across crashes.

Each partition has one writer, and a fencing id `kiln-harden.<topic>.<partition>`: recovery
calls InitProducerId with it, which bumps the producer epoch. The coordinator knows the new
epoch at once, but a partition leader learns it only from a write or a transaction marker:
a zombie's write (a paused Kiln process that lost the partition, resuming in the middle of
a write) would still land before the successor's first write, after the successor read
the tail, and be written twice. So where an earlier writer may not have let go,
`recover(fence=True)` also runs an empty transaction over the partition and aborts it:
its abort marker (which takes one Kafka offset) carries the new epoch to the leader, which
refuses the zombie from then on; the next InitProducerId waits for that marker. Then the
tail of the partition is read: the Kiln offset of its last record tells where to resume,
and sequence numbers start again at 0 under the newest epoch. No data is ever written in a
transaction here; the tail is still read as read_committed readers see it, because the
hardening lane writes in Kafka transactions and an aborted one leaves its records behind.

A hardened record's Kiln offset is its `kiln.offset` header, or its Kafka offset when it has
none (wire.lineage). The writer tracks the partition's next Kafka offset: while it
equals the next Kiln offset to write, client batches are forwarded whole and need no header;
once records were dropped, they are re-encoded with one (storage.hardened_batches). Either
way, the last record in the partition says where hardening stopped.

A write pipelines the batches to the leader with acks=-1, one batch per Produce request. Any
failure leaves the writer needing recover() again: some of the write may have landed, and
only Kafka knows how much. Kiln must be the only writer of a hardened topic: a record
another producer put there shifts the Kafka offsets that forwarded batches rely on.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from storage.errors import (
    HardenedStoreRejected,
    HardenedStoreUnavailable,
    StorageError,
)
from storage.hardened_batches import (
    SEQUENCE_MODULUS,
    HardenedBatch,
    SourceBatch,
    iter_hardened_batches,
    last_kiln_offset,
)
from storage.kafka.client import EARLIEST, KafkaClient, PartitionSender, ProduceResult
from storage.model import StoredBatch
from wire.apis import Message
from wire.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

FENCING_ID_PREFIX = "kiln-harden"
_TAIL_FETCH_BYTES = 4 * 1024 * 1024
_MAX_TAIL_FETCH_BYTES = 64 * 1024 * 1024
_TAIL_WINDOW_GROWTH = 8
# How far back to look past batches without data records before giving up.
_MAX_LOOK_BACK_RECORDS = 1_000_000


class Fence(enum.Enum):
    """How recovery deals with earlier writers of the partition."""

    NONE = "none"  # none can be in the middle of a write (it let go cleanly)
    AT_LEADER = "at_leader"  # one may be: an abort marker makes the leader refuse it
    # As AT_LEADER, unless no Kiln writer ever had the partition (a topic new to Kiln).
    IF_EVER_WRITTEN = "if_ever_written"


def fencing_id(topic: str, partition: int) -> str:
    return f"{FENCING_ID_PREFIX}.{topic}.{partition}"


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What one write() put into Kafka.

    `last_kiln_offset` is None when every record was below skip_below (nothing was sent).
    Kafka offsets are None where the broker did not say (a DUPLICATE_SEQUENCE_NUMBER answer).
    """

    last_kiln_offset: int | None
    records: int
    bytes: int
    batches: int
    first_base_offset: int | None  # Kafka offset of the first record written
    last_base_offset: int | None  # Kafka base offset of the last batch written
    forwarded_records: int = 0  # records of client batches forwarded whole (not re-encoded)


NOTHING_WRITTEN = WriteResult(None, 0, 0, 0, None, None)


class SendProgress:
    """Tallies of one write, as the broker acknowledges it."""

    def __init__(self, kafka_end: int) -> None:
        self.records = 0
        self.forwarded_records = 0
        self.bytes = 0
        self.batches = 0
        self.last_kiln_offset = -1
        self.first_base_offset: int | None = None
        self.last_base_offset: int | None = None
        self.kafka_end = kafka_end  # the partition's next Kafka offset, as far as known
        self.misplaced = 0  # header-less batches that did not land at their Kiln offset

    def acknowledged(self, result: ProduceResult, batch: HardenedBatch) -> None:
        # A DUPLICATE_SEQUENCE_NUMBER answer carries no offset.
        offset = result.base_offset if result.base_offset >= 0 else None
        if self.batches == 0:
            self.first_base_offset = offset
        self.last_base_offset = offset
        self.records += batch.record_count
        if batch.forwarded:
            self.forwarded_records += batch.record_count
        self.bytes += len(batch.data)
        self.batches += 1
        self.last_kiln_offset = batch.last_kiln_offset
        if offset is None:
            self.kafka_end += batch.record_count
            return
        if not batch.kiln_headers and offset != batch.first_kiln_offset:
            self.misplaced += 1
        self.kafka_end = offset + batch.record_count


class HardenedPartitionWriter:
    """The only writer of one Kafka partition; `recover()` before the first `write()` and
    after any failed one."""

    def __init__(
        self,
        client: KafkaClient,
        topic: str,
        partition: int,
        *,
        max_batch_bytes: int = 1_000_000,
        max_in_flight: int = 4,
        transaction_timeout_ms: int = 60_000,
        produce_timeout_ms: int = 30_000,
    ) -> None:
        if max_in_flight < 1 or max_in_flight > 5:
            # Kafka keeps the last 5 batches per producer for duplicate detection.
            raise ValueError("max_in_flight must be 1..5")
        self._client = client
        self.topic = topic
        self.partition = partition
        self._max_batch_bytes = max_batch_bytes
        self._max_in_flight = max_in_flight
        self._transaction_timeout_ms = transaction_timeout_ms
        self._produce_timeout_ms = produce_timeout_ms
        self._producer_id = -1
        self._producer_epoch = -1
        self._sequence = 0
        self._next_kiln_offset = 0
        self._kafka_end = 0  # the partition's next Kafka offset
        self._ready = False

    @property
    def ready(self) -> bool:
        """Recovered and not failed since: write() may be called."""
        return self._ready

    @property
    def next_kiln_offset(self) -> int:
        """The Kiln offset after the last record known to be in Kafka (valid when ready)."""
        return self._next_kiln_offset

    async def recover(self, fence: Fence = Fence.NONE) -> int | None:
        """Bump the writer's epoch and find where hardening stopped, fencing earlier
        writers at the partition's leader first where `fence` says so.

        Returns the Kiln offset just after the last Kiln record in the partition, or None if
        it holds none.
        """
        self._ready = False
        fencing = fencing_id(self.topic, self.partition)
        pid, epoch = await self._client.init_producer_id(fencing, self._transaction_timeout_ms)
        # A fencing id's first epoch is 0: no Kiln writer ever had the partition before.
        if fence is Fence.AT_LEADER or (fence is Fence.IF_EVER_WRITTEN and epoch > 0):
            await self._client.fence_partition(fencing, pid, epoch, self.topic, self.partition)
            pid, epoch = await self._client.init_producer_id(fencing,
                                                             self._transaction_timeout_ms)
        self._producer_id, self._producer_epoch, self._sequence = pid, epoch, 0
        try:
            resume, self._kafka_end = await tail_position(self._client, self.topic,
                                                          self.partition)
        except StorageError:
            raise
        except KafkaError as exc:
            raise self._undecodable(exc, "tail of the partition") from exc
        self._next_kiln_offset = 0 if resume is None else resume
        self._ready = True
        log.info("hardening %s[%d] resumes at Kiln offset %s, Kafka offset %d "
                 "(producer %d epoch %d)", self.topic, self.partition, resume,
                 self._kafka_end, pid, epoch)
        return resume

    async def write(self, batches: Sequence[StoredBatch], skip_below: int) -> WriteResult:
        """Write the records of `batches` at Kiln offsets >= skip_below, in order.

        Records below what recovery or earlier writes saw in Kafka are skipped too, whatever
        skip_below says. Raises HardenedStoreUnavailable, Fenced or HardenedStoreRejected
        (CORRUPT_MESSAGE for a stored batch that cannot be decoded); the writer then needs
        recover().
        """
        if not self._ready:
            raise RuntimeError(f"{self.topic}[{self.partition}]: recover() before write()")
        skip = max(skip_below, self._next_kiln_offset)
        sources: list[SourceBatch] = [(b.base_offset, b.data, b.carries_kiln_header)
                                      for b in batches if b.next_offset > skip]
        if not sources:
            return NOTHING_WRITTEN
        self._ready = False  # until every batch is acknowledged
        sender = await self._client.partition_sender(self.topic, self.partition)
        built = iter_hardened_batches(
            sources,
            skip,
            producer_id=self._producer_id,
            producer_epoch=self._producer_epoch,
            base_sequence=self._sequence,
            max_batch_bytes=self._max_batch_bytes,
            kafka_end=self._kafka_end,
        )
        try:
            stats = await self._send_all(sender, built)
        except StorageError:
            raise
        except KafkaError as exc:
            raise self._undecodable(exc, "stored batch") from exc
        if stats.records == 0:
            self._ready = True
            return NOTHING_WRITTEN
        self._sequence = (self._sequence + stats.records) % SEQUENCE_MODULUS
        self._next_kiln_offset = stats.last_kiln_offset + 1
        self._kafka_end = stats.kafka_end
        if stats.misplaced:
            # Only another producer writing to the topic does this; those records' Kafka
            # offsets no longer name their Kiln offsets.
            log.error("%s[%d]: %d forwarded batches landed away from their Kiln offsets: "
                      "something besides Kiln writes to this hardened topic", self.topic,
                      self.partition, stats.misplaced)
        self._ready = True
        log.debug("hardened %s[%d] up to Kiln offset %d: %d records in %d batches",
                  self.topic, self.partition, stats.last_kiln_offset, stats.records,
                  stats.batches)
        return WriteResult(
            stats.last_kiln_offset,
            stats.records,
            stats.bytes,
            stats.batches,
            stats.first_base_offset,
            stats.last_base_offset,
            stats.forwarded_records,
        )

    def _undecodable(self, exc: KafkaError, what: str) -> HardenedStoreRejected:
        """A batch that cannot be decoded (bad CRC, unknown codec): retrying cannot help."""
        return HardenedStoreRejected(
            exc.error_code, f"{self.topic}[{self.partition}]: {what}: {exc.message}"
        )

    async def _send_all(self, sender: PartitionSender, built: Iterator[HardenedBatch]
                        ) -> SendProgress:
        return await send_batches(sender, built, SendProgress(self._kafka_end),
                                  max_in_flight=self._max_in_flight,
                                  timeout_ms=self._produce_timeout_ms)


async def send_batches(sender: PartitionSender, built: Iterator[HardenedBatch],
                       progress: SendProgress, *, max_in_flight: int, timeout_ms: int,
                       transactional_id: str | None = None) -> SendProgress:
    """Send batches as they are built, one per request (Apache Kafka refuses Produce v3+
    requests holding more than one batch per partition), up to max_in_flight at once;
    encoding the next batch overlaps with the broker storing the last ones."""
    in_flight: collections.deque[tuple[asyncio.Future[Message], HardenedBatch]] = (
        collections.deque()
    )
    try:
        for batch in built:
            while len(in_flight) >= max_in_flight:
                answer, sent = in_flight.popleft()
                progress.acknowledged(await sender.result(answer), sent)
            in_flight.append((sender.send(batch.data, timeout_ms=timeout_ms,
                                          transactional_id=transactional_id), batch))
            await sender.drain()
            # Building a batch holds the event loop for milliseconds; let others run.
            await asyncio.sleep(0)
        while in_flight:
            answer, sent = in_flight.popleft()
            progress.acknowledged(await sender.result(answer), sent)
    except asyncio.CancelledError:
        for answer, _ in in_flight:
            answer.cancel()
        raise
    finally:
        # After a failure, wait out what is still in flight: once the broker has answered
        # it (or the connection is gone), recovery's fetch, which goes after it on the
        # same connection, sees all of it.
        if in_flight:
            await asyncio.gather(*(answer for answer, _ in in_flight),
                                 return_exceptions=True)
    return progress


async def tail_position(client: KafkaClient, topic: str, partition: int
                        ) -> tuple[int | None, int]:
    """(the Kiln offset after the last committed data record in a Kafka partition, or None
    if it holds none; the partition's high watermark, where the next write lands), looking
    further back (in growing windows) past batches that hold no such record.

    The partition is read as a read_committed consumer reads it. A lane transaction that
    was aborted (its writer crashed) leaves records in the log that were not hardened: they
    are written again later, and their Kiln offsets must not count as written. Records past
    the last stable offset belong to a transaction not yet decided, so not hardened yet
    either. Transaction markers (a fence's abort marker too) hold no data record."""
    ends = await client.partition_ends(topic, partition)
    stable = end = ends.last_stable_offset
    span = 1
    while end > 0:
        start = max(0, end - span)
        found, log_start = await _last_kiln_offset_in(client, topic, partition, start, end)
        if found is not None:
            return found + 1, ends.high_watermark
        if start <= log_start:
            return None, ends.high_watermark
        if stable - start >= _MAX_LOOK_BACK_RECORDS:
            log.warning("%s[%d]: no committed data record in the last %d offsets below the "
                        "last stable offset; treating the partition as holding none", topic,
                        partition, stable - start)
            return None, ends.high_watermark
        end = start
        span *= _TAIL_WINDOW_GROWTH
    return None, ends.high_watermark


async def _last_kiln_offset_in(client: KafkaClient, topic: str, partition: int, start: int,
                               end: int) -> tuple[int | None, int]:
    """(largest Kiln offset in the committed batches covering [start, end), log start
    offset)."""
    best: int | None = None
    log_start = 0
    position = start
    max_bytes = _TAIL_FETCH_BYTES
    while position < end:
        result = await client.fetch_committed(topic, partition, position, max_bytes)
        if result.log_start_offset >= 0:
            log_start = result.log_start_offset
        if result.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
            # Retention removed the start of the window; read on from what is left.
            log_start = await client.list_offset(topic, partition, EARLIEST)
            if position >= log_start:
                raise HardenedStoreUnavailable(
                    f"{topic}[{partition}]: offset {position} out of range"
                )
            position = log_start
            continue
        after = result.next_fetch_offset  # past the batches left out too
        if after is None:
            if result.fetched and max_bytes < _MAX_TAIL_FETCH_BYTES:
                max_bytes *= 4  # one batch larger than the fetch size
                continue
            if position < result.last_stable_offset:
                raise HardenedStoreUnavailable(
                    f"{topic}[{partition}]: no records at {position} below the "
                    f"last stable offset {result.last_stable_offset}"
                )
            break
        if after <= position:
            raise HardenedStoreUnavailable(
                f"{topic}[{partition}]: fetch at {position} went nowhere"
            )
        found = last_kiln_offset(result.records)
        if found is not None and (best is None or found > best):
            best = found
        position = after
    return best, log_start
