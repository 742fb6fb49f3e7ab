"""Writing surviving batches of one partition into Kafka exactly once, across crashes.

Each partition has one writer, and a fencing id `kiln-harden.<topic>.<partition>`: recovery
calls InitProducerId with it, which bumps the producer epoch so any earlier writer of the
partition (a zombie Kiln process) is refused from then on. The id is used only for fencing;
no transaction is ever started. Then the tail of the partition is read: every record Kiln
writes carries its Kiln offset in a `kiln.offset` header, so the last one tells where to
resume, and sequence numbers start again at 0 under the new epoch.

A write re-encodes the batches (iter_hardened_batches, which merges small client batches)
and pipelines them to the leader with acks=-1, one batch per Produce request. Any failure
leaves the writer needing recover() again: some of the write may have landed, and only
Kafka knows how much.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from proxy.protocol.apis import Message
from proxy.protocol.errors import ErrorCode, KafkaError
from proxy.protocol.records import (
    HardenedBatch,
    iter_hardened_batches,
    last_kiln_offset,
    record_set_end,
)
from storage.errors import (
    HardenedStoreRejected,
    HardenedStoreUnavailable,
    StorageError,
)
from storage.kafka.client import EARLIEST, KafkaClient, PartitionSender, ProduceResult
from storage.model import StoredBatch

log = logging.getLogger(__name__)

FENCING_ID_PREFIX = "kiln-harden"
_SEQUENCE_MODULUS = 1 << 31
_TAIL_FETCH_BYTES = 4 * 1024 * 1024
_MAX_TAIL_FETCH_BYTES = 64 * 1024 * 1024
_TAIL_WINDOW_GROWTH = 8
# Only the hardener should write to a hardened topic; how far back to look past others' writes.
_MAX_LOOK_BACK_RECORDS = 1_000_000


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


NOTHING_WRITTEN = WriteResult(None, 0, 0, 0, None, None)


class _Progress:
    """Tallies of one write, as the broker acknowledges it."""

    def __init__(self) -> None:
        self.records = 0
        self.bytes = 0
        self.batches = 0
        self.last_kiln_offset = -1
        self.first_base_offset: int | None = None
        self.last_base_offset: int | None = None

    def acknowledged(self, result: ProduceResult, batch: HardenedBatch) -> None:
        # A DUPLICATE_SEQUENCE_NUMBER answer carries no offset.
        offset = result.base_offset if result.base_offset >= 0 else None
        if self.batches == 0:
            self.first_base_offset = offset
        self.last_base_offset = offset
        self.records += batch.record_count
        self.bytes += len(batch.data)
        self.batches += 1
        self.last_kiln_offset = batch.last_kiln_offset


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
        self._ready = False

    @property
    def ready(self) -> bool:
        """Recovered and not failed since: write() may be called."""
        return self._ready

    @property
    def next_kiln_offset(self) -> int:
        """The Kiln offset after the last record known to be in Kafka (valid when ready)."""
        return self._next_kiln_offset

    async def recover(self) -> int | None:
        """Fence earlier writers and find where hardening stopped.

        Returns the Kiln offset just after the last Kiln record in the partition, or None if
        it holds none.
        """
        self._ready = False
        pid, epoch = await self._client.init_producer_id(
            fencing_id(self.topic, self.partition), self._transaction_timeout_ms
        )
        self._producer_id, self._producer_epoch, self._sequence = pid, epoch, 0
        try:
            resume = await resume_offset(self._client, self.topic, self.partition)
        except StorageError:
            raise
        except KafkaError as exc:
            raise self._undecodable(exc, "tail of the partition") from exc
        self._next_kiln_offset = 0 if resume is None else resume
        self._ready = True
        log.info("hardening %s[%d] resumes at Kiln offset %s (producer %d epoch %d)",
                 self.topic, self.partition, resume, pid, epoch)
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
        sources = [(b.base_offset, b.data) for b in batches if b.next_offset > skip]
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
        self._sequence = (self._sequence + stats.records) % _SEQUENCE_MODULUS
        self._next_kiln_offset = stats.last_kiln_offset + 1
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
        )

    def _undecodable(self, exc: KafkaError, what: str) -> HardenedStoreRejected:
        """A batch that cannot be decoded (bad CRC, unknown codec): retrying cannot help."""
        return HardenedStoreRejected(
            exc.error_code, f"{self.topic}[{self.partition}]: {what}: {exc.message}"
        )

    async def _send_all(self, sender: PartitionSender, built: Iterator[HardenedBatch]
                        ) -> _Progress:
        """Send batches as they are built, one per request (Apache Kafka refuses Produce v3+
        requests holding more than one batch per partition), up to max_in_flight at once;
        encoding the next batch overlaps with the broker storing the last ones."""
        progress = _Progress()
        in_flight: collections.deque[tuple[asyncio.Future[Message], HardenedBatch]] = (
            collections.deque()
        )
        try:
            for batch in built:
                while len(in_flight) >= self._max_in_flight:
                    answer, sent = in_flight.popleft()
                    progress.acknowledged(await sender.result(answer), sent)
                in_flight.append((sender.send(batch.data, timeout_ms=self._produce_timeout_ms),
                                  batch))
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


async def resume_offset(client: KafkaClient, topic: str, partition: int) -> int | None:
    """The Kiln offset after the last Kiln record in a Kafka partition (None if it holds
    none), looking further back (in growing windows) past any records that carry none.
    Read-only: it fences nobody."""
    high_watermark = end = await client.high_watermark(topic, partition)
    span = 1
    while end > 0:
        start = max(0, end - span)
        found, log_start = await _last_kiln_offset_in(client, topic, partition, start, end)
        if found is not None:
            return found + 1
        if start <= log_start:
            return None
        if high_watermark - start >= _MAX_LOOK_BACK_RECORDS:
            # A topic Kiln never wrote to (or that others wrote to since): do not read it all.
            log.warning("%s[%d]: no Kiln record in the last %d records; treating the "
                        "partition as holding none", topic, partition, high_watermark - start)
            return None
        end = start
        span *= _TAIL_WINDOW_GROWTH
    return None


async def _last_kiln_offset_in(client: KafkaClient, topic: str, partition: int, start: int,
                               end: int) -> tuple[int | None, int]:
    """(largest Kiln offset in the batches covering [start, end), log start offset)."""
    best: int | None = None
    log_start = 0
    position = start
    max_bytes = _TAIL_FETCH_BYTES
    while position < end:
        result = await client.fetch(topic, partition, position, max_bytes)
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
        after = record_set_end(result.records)
        if after is None:
            if result.records and max_bytes < _MAX_TAIL_FETCH_BYTES:
                max_bytes *= 4  # one batch larger than the fetch size
                continue
            if position < result.high_watermark:
                raise HardenedStoreUnavailable(
                    f"{topic}[{partition}]: no records at {position} below the "
                    f"high watermark {result.high_watermark}"
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
