"""Writing the hardening lane's passes into Kafka, each pass as one Kafka transaction.

The lane (storage/lane.py) hardens every partition that carries Kiln transactions; a pass
writes a consistent cut over all of them (storage/policy/lane_pass.py), so each committed
Kiln transaction lands whole in one Kafka transaction and a `read_committed` reader of the
hardened topics (Spark's Kafka source, a Kafka consumer) sees it all or nothing.

The writer holds the transactional id `kiln-harden-lane.<lane>`. `start()` bumps its epoch:
Kafka aborts the transaction an earlier holder left open (a crash or pause mid-pass) and
refuses that holder's later writes and EndTxn, so nothing of a pass lands unless its EndTxn
commits it. Taking a partition over from its own writer (storage/hardened_store.py) fences
that writer's id at the partition's leader first, as a successor of it would, then reads
where the partition's committed Kiln records end: hardening resumes after them. Records in
Kafka from a pass that was never committed are invisible there (read committed) and written
again.

Every record carries its `kiln.offset` header: Kafka's commit markers take offsets of their
own between passes, so Kafka offsets never name Kiln offsets in a lane partition.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from storage.errors import HardenedStoreRejected, HardenedStoreUnavailable
from storage.faults import crash_point
from storage.hardened_batches import SEQUENCE_MODULUS, HardenedBatch, iter_hardened_batches
from storage.hardened_store import (
    Fence,
    SendProgress,
    WriteResult,
    fencing_id,
    send_batches,
    tail_position,
)
from storage.kafka.client import LATEST, READ_COMMITTED, KafkaClient
from storage.model import TopicPartition
from storage.policy.lane_pass import LaneWrite
from wire.errors import KafkaError

log = logging.getLogger(__name__)

LANE_ID_PREFIX = "kiln-harden-lane"
# How long a committed pass may take to become visible to read_committed readers, and how
# often that is looked at (Kafka writes its markers within milliseconds).
_COMMITTED_WAIT_S = 10.0
_COMMITTED_POLL_S = 0.005


def lane_transactional_id(lane: str) -> str:
    return f"{LANE_ID_PREFIX}.{lane}"


async def _nothing() -> None:
    pass


@dataclass(slots=True)
class _Partition:
    next_kiln_offset: int  # after the last Kiln record committed in Kafka
    sequence: int = 0  # the next batch's, under the writer's current epoch


class LaneWriter:
    """The lane's Kafka writer; `start()` before anything else and after any failure."""

    def __init__(self, client: KafkaClient, lane: str, *, max_batch_bytes: int = 1_000_000,
                 max_in_flight: int = 4, transaction_timeout_ms: int = 60_000,
                 produce_timeout_ms: int = 30_000) -> None:
        self._client = client
        self.transactional_id = lane_transactional_id(lane)
        self._max_batch_bytes = max_batch_bytes
        self._max_in_flight = max_in_flight
        self._transaction_timeout_ms = transaction_timeout_ms
        self._produce_timeout_ms = produce_timeout_ms
        self._producer_id = -1
        self._epoch = -1
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._ready = False

    @property
    def ready(self) -> bool:
        return self._ready

    async def start(self) -> None:
        """Fence every earlier holder of the lane's id (aborting its open transaction) and
        forget what was known of the partitions: they are taken again."""
        self._ready = False
        self._partitions.clear()
        self._producer_id, self._epoch = await self._client.init_producer_id(
            self.transactional_id, self._transaction_timeout_ms)
        self._ready = True
        log.info("hardening lane %s: producer %d epoch %d", self.transactional_id,
                 self._producer_id, self._epoch)

    def discard(self) -> None:
        """Forget the epoch and the partitions: `start()` again before writing."""
        self._ready = False
        self._partitions.clear()

    def let_go(self, tp: TopicPartition) -> None:
        self._partitions.pop(tp, None)

    async def take(self, tp: TopicPartition, fence: Fence) -> int | None:
        """Take `tp` over: fence its own writer where `fence` says so, then find where its
        committed Kiln records end. Returns the Kiln offset after them (None: it holds
        none)."""
        fencing = fencing_id(tp.topic, tp.partition)
        pid, epoch = await self._client.init_producer_id(fencing, self._transaction_timeout_ms)
        if fence is Fence.AT_LEADER or (fence is Fence.IF_EVER_WRITTEN and epoch > 0):
            await self._client.fence_partition(fencing, pid, epoch, tp.topic, tp.partition)
        try:
            resume, _ = await tail_position(self._client, tp.topic, tp.partition)
        except KafkaError as exc:
            raise HardenedStoreRejected(exc.error_code, f"{tp.topic}[{tp.partition}]: tail "
                                        f"of the partition: {exc.message}") from exc
        self._partitions[tp] = _Partition(0 if resume is None else resume)
        return resume

    async def write(self, writes: Mapping[TopicPartition, Sequence[LaneWrite]],
                    committed: Callable[[], Awaitable[None]] = _nothing
                    ) -> dict[TopicPartition, WriteResult]:
        """Write one pass in one Kafka transaction, committed before this returns (and
        `committed` called as soon as Kafka has the commit, before its readers see it).
        Records already committed in Kafka are skipped. Raises StorageError (or
        HardenedStoreRejected for a stored batch that cannot be decoded); nothing of the
        pass is visible then, and the writer needs start()."""
        if not self._ready:
            raise RuntimeError("start() the lane writer first")
        work = {tp: runs for tp, runs in ((tp, self._runs(tp, ws)) for tp, ws in writes.items())
                if runs}
        if not work:
            return {}
        self._ready = False  # until the transaction is committed
        await self._client.add_partitions_to_txn(
            self.transactional_id, self._producer_id, self._epoch,
            [(tp.topic, tp.partition) for tp in work])
        try:
            sent = await self._send_all(work)
        except KafkaError as exc:
            raise HardenedStoreRejected(exc.error_code,
                                        f"hardening lane: stored batch: {exc.message}") from exc
        crash_point("lane.before_end_txn")
        await self._client.end_txn(self.transactional_id, self._producer_id, self._epoch,
                                   commit=True)
        crash_point("lane.committed")
        await committed()
        crash_point("lane.settled")
        await asyncio.gather(*(self._committed_at(tp, progress.kafka_end)
                               for tp, progress in zip(work, sent, strict=True)
                               if progress.records))
        results: dict[TopicPartition, WriteResult] = {}
        for tp, progress in zip(work, sent, strict=True):
            state = self._partitions[tp]
            state.sequence = (state.sequence + progress.records) % SEQUENCE_MODULUS
            if progress.records:
                state.next_kiln_offset = progress.last_kiln_offset + 1
            results[tp] = WriteResult(
                progress.last_kiln_offset if progress.records else None, progress.records,
                progress.bytes, progress.batches, progress.first_base_offset,
                progress.last_base_offset)
        self._ready = True
        return results

    async def _committed_at(self, tp: TopicPartition, kafka_end: int) -> None:
        """Wait until read_committed readers of `tp` see everything below `kafka_end`: Kafka
        answers EndTxn once its decision is logged and writes the commit markers after, and
        the pass must not drop its records from the log queue before Kiln's read-through
        (a read_committed reader) finds them in Kafka."""
        deadline = time.monotonic() + _COMMITTED_WAIT_S
        while await self._client.list_offset(tp.topic, tp.partition, LATEST,
                                             isolation_level=READ_COMMITTED) < kafka_end:
            if time.monotonic() > deadline:
                raise HardenedStoreUnavailable(
                    f"{tp.topic}[{tp.partition}]: the hardening lane's commit is not visible "
                    f"after {_COMMITTED_WAIT_S:.0f}s")
            await asyncio.sleep(_COMMITTED_POLL_S)

    def _runs(self, tp: TopicPartition, writes: Sequence[LaneWrite]
              ) -> list[tuple[int, list[tuple[int, bytes, bool]]]]:
        """The writes as runs of batches written from one offset on (skip, sources),
        leaving out what Kafka holds already."""
        done = self._partitions[tp].next_kiln_offset
        runs: list[tuple[int, list[tuple[int, bytes, bool]]]] = []
        for w in writes:
            if w.batch.next_offset <= max(done, w.write_from):
                continue
            source = (w.batch.base_offset, w.batch.data, w.batch.carries_kiln_header)
            if runs and w.write_from <= w.batch.base_offset:
                runs[-1][1].append(source)
            else:
                runs.append((max(done, w.write_from), [source]))
        return runs

    async def _send_all(self, work: Mapping[TopicPartition,
                                            Sequence[tuple[int, list[tuple[int, bytes, bool]]]]]
                        ) -> list[SendProgress]:
        """Every partition's batches, in `work`'s order. The first batch of each goes in one
        request per leader, as a producer sends them (a pass of small transactions is
        mostly that); the rest follow per partition, several in flight."""
        built = [self._built(tp, runs) for tp, runs in work.items()]
        firsts = [(tp, batch) for tp, batch in zip(work, (next(b, None) for b in built),
                                                   strict=True) if batch is not None]
        progress = {tp: SendProgress(0) for tp in work}
        answers = await self._client.produce_together(
            [(tp.topic, tp.partition, batch.data) for tp, batch in firsts],
            transactional_id=self.transactional_id, timeout_ms=self._produce_timeout_ms)
        for (tp, batch), answer in zip(firsts, answers, strict=True):
            progress[tp].acknowledged(answer, batch)
        return list(await asyncio.gather(*(self._send_rest(tp, batches, progress[tp])
                                           for tp, batches in zip(work, built, strict=True))))

    async def _send_rest(self, tp: TopicPartition, batches: Iterator[HardenedBatch],
                         progress: SendProgress) -> SendProgress:
        rest = next(batches, None)
        if rest is None:
            return progress
        sender = await self._client.partition_sender(tp.topic, tp.partition)
        return await send_batches(sender, itertools.chain([rest], batches), progress,
                                  max_in_flight=self._max_in_flight,
                                  timeout_ms=self._produce_timeout_ms,
                                  transactional_id=self.transactional_id)

    def _built(self, tp: TopicPartition,
               runs: Sequence[tuple[int, list[tuple[int, bytes, bool]]]]
               ) -> Iterator[HardenedBatch]:
        sequence = self._partitions[tp].sequence
        for skip_below, sources in runs:
            for batch in iter_hardened_batches(
                    sources, skip_below, producer_id=self._producer_id,
                    producer_epoch=self._epoch, base_sequence=sequence,
                    max_batch_bytes=self._max_batch_bytes, transactional=True):
                sequence = (sequence + batch.record_count) % SEQUENCE_MODULUS
                yield batch

