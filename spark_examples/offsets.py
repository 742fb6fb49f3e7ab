"""Offset bookkeeping and range planning for the compatible reader, as Spark's Kafka source
does it. No Spark, no I/O.

A stream offset is the JSON Spark's Kafka source writes to its checkpoint,
`{"topic": {"0": 42, "1": 7}}`: per partition the next Kafka offset to read. A micro-batch
reads, per partition, the half-open range [start, end) between two such offsets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from spark_examples.options import TopicPartition

StreamOffset = dict[str, dict[str, int]]


@dataclass(frozen=True, slots=True, order=True)
class OffsetRange:
    """Kafka offsets [from_offset, until_offset) of one partition: one Spark task's work."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    @property
    def size(self) -> int:
        return max(0, self.until_offset - self.from_offset)


def to_stream_offset(offsets: Mapping[TopicPartition, int]) -> StreamOffset:
    """The checkpoint form: topics, then partitions as strings, in a stable order."""
    out: StreamOffset = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = offsets[tp]
    return out


def from_stream_offset(doc: Mapping[str, Mapping[str, int]]) -> dict[TopicPartition, int]:
    return {TopicPartition(topic, int(partition)): int(offset)
            for topic, partitions in doc.items() for partition, offset in partitions.items()}


def rate_limit(start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int],
               max_offsets: int) -> dict[TopicPartition, int]:
    """End offsets for a micro-batch of at most about `max_offsets` records
    (`maxOffsetsPerTrigger`), shared among partitions in proportion to what each has
    waiting. As in Spark, a partition whose share rounds below one still gets one record, so
    the total can exceed the limit by up to one record per partition.

    `start` must hold every partition of `latest`.
    """
    sizes = {tp: end - start[tp] for tp, end in latest.items() if end - start[tp] > 0}
    total = sum(sizes.values())
    if total < 1:
        return dict(latest)
    out: dict[TopicPartition, int] = {}
    for tp, end in latest.items():
        size = sizes.get(tp)
        if size is None:
            out[tp] = end
            continue
        share = max_offsets * (size / total)
        step = math.ceil(share) if share < 1 else math.floor(share)
        out[tp] = min(end, start[tp] + step)
    return out


def plan_ranges(start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int],
                min_partitions: int | None = None) -> list[OffsetRange]:
    """The non-empty ranges between two offsets, by topic and partition. With
    `minPartitions` above the number of ranges, large ranges are split into pieces in
    proportion to their size (Spark's KafkaOffsetRangeCalculator).

    Partitions of `end` missing from `start` are not read: callers add new partitions to
    `start` (at their earliest offset) first.
    """
    ranges = [OffsetRange(tp.topic, tp.partition, start[tp], until)
              for tp, until in sorted(end.items()) if tp in start and until > start[tp]]
    if min_partitions is None or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    out: list[OffsetRange] = []
    for r in ranges:
        # Half up, as Scala's math.round (Python's round() goes to even).
        parts = max(math.floor(r.size / total * min_partitions + 0.5), 1)
        remaining, begin = r.size, r.from_offset
        for part in range(parts):
            piece = remaining // (parts - part)  # the last piece takes the round-off
            remaining -= piece
            until = min(begin + piece, r.until_offset)
            if until > begin:
                out.append(OffsetRange(r.topic, r.partition, begin, until))
            begin = until
    return out


def lost_between(start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]
                 ) -> list[str]:
    """What a micro-batch from `start` to `end` would silently skip, as messages: partitions
    that disappeared, and partitions whose end moved below where reading had got to (a
    topic deleted and created again). Empty when nothing is lost."""
    problems = []
    for tp in sorted(start):
        if tp not in end:
            problems.append(f"partition {tp} disappeared; records after offset {start[tp]} "
                            "may have been lost")
        elif end[tp] < start[tp]:
            problems.append(f"partition {tp}: offset went back from {start[tp]} to {end[tp]}; "
                            "some records may have been missed")
    return problems
