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

from spark_examples.kafka_wire import OFFSET_OUT_OF_RANGE, KafkaWire, PartitionFetch, with_retries
from spark_examples.offsets import OffsetRange
from spark_examples.options import SourceOptions, TopicPartition
from spark_examples.record_sets import RecordColumns, decode_into

log = logging.getLogger(__name__)

# tansu 0.6 now and then answers a fetch empty below its high watermark (about 1 in 400);
# the same fetch is asked again after these pauses, then after the last one until the
# poll timeout runs out.
_EMPTY_ANSWER_PAUSES_S = (0.0, 0.01, 0.1, 0.5)
_MAX_FETCH_BYTES = 64 * 1024 * 1024  # how far a fetch grows for a batch larger than asked
_FETCH_WAIT_MS = 100


class DataLoss(Exception):
    """Records the query was going to read are gone (and failOnDataLoss is true)."""


def read_range(wire: KafkaWire, offsets: OffsetRange, options: SourceOptions, *,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> Iterator[RecordColumns]:
    """The data records at offsets [from_offset, until_offset) of one partition, one
    `RecordColumns` per fetch that returned any (transaction markers, aborted records and
    gaps left by compaction take up offsets but yield nothing)."""
    tp = TopicPartition(offsets.topic, offsets.partition)
    position = offsets.from_offset
    max_bytes = options.max_partition_fetch_bytes
    empty_answers = 0
    deadline = clock() + options.poll_timeout_ms / 1000
    while position < offsets.until_offset:
        answer = with_retries(functools.partial(_fetch, wire, tp, position, max_bytes, options),
                              attempts=options.offset_fetch_attempts,
                              interval_s=options.offset_retry_interval_ms / 1000,
                              what=f"fetch {tp}")
        if answer.error_code == OFFSET_OUT_OF_RANGE:
            earliest = wire.earliest_offsets([tp])[tp]
            if position < earliest:
                last_lost = min(earliest, offsets.until_offset) - 1
                _lost(options, f"{tp}: offsets {position}..{last_lost} were deleted before "
                      "they were read (retention or compaction)")
                position = earliest
                continue
            _lost(options, f"{tp}: offsets {position}..{offsets.until_offset - 1} are no longer "
                  f"in the partition (it ends at {answer.high_watermark})")
            return
        columns = RecordColumns()
        after = decode_into(columns, answer.records, from_offset=position,
                            until_offset=offsets.until_offset,
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
        if end <= position and answer.high_watermark < offsets.until_offset:
            _lost(options, f"{tp}: offsets {position}..{offsets.until_offset - 1} are no longer "
                  f"in the partition (it ends at {answer.high_watermark})")
            return
        if clock() > deadline:
            raise TimeoutError(f"{tp}: no records at offset {position} for "
                               f"{options.poll_timeout_ms} ms (kafkaConsumer.pollTimeoutMs), "
                               f"though the partition ends at {end}")
        sleep(_EMPTY_ANSWER_PAUSES_S[min(empty_answers, len(_EMPTY_ANSWER_PAUSES_S) - 1)])
        empty_answers += 1


def _fetch(wire: KafkaWire, tp: TopicPartition, position: int, max_bytes: int,
           options: SourceOptions) -> PartitionFetch:
    return wire.fetch({tp: position}, max_bytes=max_bytes, read_committed=options.read_committed,
                      max_wait_ms=_FETCH_WAIT_MS)[tp]


def _lost(options: SourceOptions, message: str) -> None:
    if options.fail_on_data_loss:
        raise DataLoss(message + ". Set failOnDataLoss=false to read on from what is left.")
    log.warning("%s; reading on (failOnDataLoss=false)", message)
