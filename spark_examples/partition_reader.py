"""One Spark task of the compatible reader: the records of one offset range of one partition,
fetch after fetch, decoded into columns.

What the real Kafka source does about records that are no longer there is done here too:
with `failOnDataLoss` (the default) the task fails, otherwise it logs a warning and reads on
from what is left.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from spark_examples.kafka_wire import OFFSET_OUT_OF_RANGE, KafkaWire, PartitionFetch, with_retries
from spark_examples.offsets import OffsetRange
from spark_examples.options import SourceOptions, TopicPartition
from spark_examples.record_sets import RecordColumns, decode_into, record_set_end

log = logging.getLogger(__name__)

# tansu 0.6 now and then answers a fetch empty below its high watermark (about 1 in 400);
# the same fetch is asked again after these pauses, then after the last one until the
# poll timeout runs out.
_EMPTY_ANSWER_PAUSES_S = (0.0, 0.01, 0.1, 0.5)
_MAX_FETCH_BYTES = 64 * 1024 * 1024  # how far a fetch grows for a batch larger than asked
_FETCH_WAIT_MS = 100


class DataLoss(Exception):
    """Records the query was going to read are gone (and failOnDataLoss is true)."""


class _Fetcher:
    """Fetches of one partition on a thread of their own, one at a time, so that the next
    record set is on its way while the last one is decoded and handed to Spark (waiting on
    the socket releases the GIL; decoding holds it). Only this thread uses the connection
    while a fetch is in flight."""

    def __init__(self, wire: KafkaWire, tp: TopicPartition, options: SourceOptions) -> None:
        self._wire = wire
        self._tp = tp
        self._options = options
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"kiln-fetch-{tp}")
        self._pending: Future[PartitionFetch] | None = None
        self.asked_at: int | None = None

    def ask(self, position: int, max_bytes: int) -> None:
        assert self._pending is None, "one fetch at a time"
        self.asked_at = position
        self._pending = self._pool.submit(with_retries, functools.partial(
            _fetch, self._wire, self._tp, position, max_bytes, self._options),
            attempts=self._options.offset_fetch_attempts,
            interval_s=self._options.offset_retry_interval_ms / 1000, what=f"fetch {self._tp}")

    def answer(self) -> PartitionFetch:
        assert self._pending is not None, "nothing asked"
        pending, self._pending = self._pending, None
        self.asked_at = None
        return pending.result()

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        self._pool.shutdown(wait=True)


def read_range(wire: KafkaWire, offsets: OffsetRange, options: SourceOptions, *,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> Iterator[RecordColumns]:
    """The data records at offsets [from_offset, until_offset) of one partition, one
    `RecordColumns` per fetch that returned any (transaction markers, aborted records and
    gaps left by compaction take up offsets but yield nothing)."""
    tp = TopicPartition(offsets.topic, offsets.partition)
    until = offsets.until_offset
    position = offsets.from_offset
    max_bytes = options.max_partition_fetch_bytes
    empty_answers = 0
    deadline = clock() + options.poll_timeout_ms / 1000
    fetcher = _Fetcher(wire, tp, options)
    try:
        while position < until:
            if fetcher.asked_at is None:
                fetcher.ask(position, max_bytes)
            elif fetcher.asked_at != position:  # cannot happen; never read a wrong range
                fetcher.answer()
                continue
            answer = fetcher.answer()
            if answer.error_code == OFFSET_OUT_OF_RANGE:
                earliest = wire.earliest_offsets([tp])[tp]
                if position < earliest:
                    _lost(options, f"{tp}: offsets {position}..{min(earliest, until) - 1} "
                          "were deleted before they were read (retention or compaction)")
                    position = earliest
                    continue
                _lost(options, f"{tp}: offsets {position}..{until - 1} are no longer in the "
                      f"partition (it ends at {answer.high_watermark})")
                return
            ahead = record_set_end(answer.records)
            if ahead is not None and ahead < until:
                fetcher.ask(ahead, max_bytes)
            columns = RecordColumns()
            after = decode_into(columns, answer.records, from_offset=position,
                                until_offset=until,
                                aborted=answer.aborted if options.read_committed else None,
                                include_headers=options.include_headers)
            if after is not None:
                if columns:
                    yield columns
                position = after
                empty_answers = 0
                deadline = clock() + options.poll_timeout_ms / 1000
                continue
            if answer.records and max_bytes < _MAX_FETCH_BYTES:
                max_bytes = min(max_bytes * 2, _MAX_FETCH_BYTES)  # a batch larger than asked
                continue
            end = answer.end(options.read_committed)
            if end <= position and answer.high_watermark < until:
                _lost(options, f"{tp}: offsets {position}..{until - 1} are no longer in the "
                      f"partition (it ends at {answer.high_watermark})")
                return
            if clock() > deadline:
                raise TimeoutError(f"{tp}: no records at offset {position} for "
                                   f"{options.poll_timeout_ms} ms (kafkaConsumer.pollTimeoutMs),"
                                   f" though the partition ends at {end}")
            sleep(_EMPTY_ANSWER_PAUSES_S[min(empty_answers, len(_EMPTY_ANSWER_PAUSES_S) - 1)])
            empty_answers += 1
    finally:
        fetcher.close()


def _fetch(wire: KafkaWire, tp: TopicPartition, position: int, max_bytes: int,
           options: SourceOptions) -> PartitionFetch:
    return wire.fetch({tp: position}, max_bytes=max_bytes, read_committed=options.read_committed,
                      max_wait_ms=_FETCH_WAIT_MS)[tp]


def _lost(options: SourceOptions, message: str) -> None:
    if options.fail_on_data_loss:
        raise DataLoss(message + ". Set failOnDataLoss=false to read on from what is left.")
    log.warning("%s; reading on (failOnDataLoss=false)", message)
