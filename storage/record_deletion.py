"""DeleteRecords through Kiln: a partition's records below an offset are gone, from both
tiers, for good.

An operator asked, so nothing below the offset is hardened first. In order:

  1. the request is checked: the offset (-1: the high watermark) must not pass the high
     watermark, and Kafka must accept a deletion at all (a compacted topic answers
     POLICY_VIOLATION), before anything changes;
  2. Redis (one script, storage.log_queue): the partition's deleted mark moves to the
     offset, and so does its hardened mark (nothing below needs hardening now); the whole
     batches below leave the log queue. From here no reader through Kiln sees a record
     below it (the deleted mark is the log start offset), and no hardening pass that
     starts now writes one (it reads the hardened mark);
  3. if records below the offset were not all hardened yet, a hardening write may be in
     flight with some of them: the partition's Kafka writers are fenced (an abort marker
     at the leader), so that such a write lands before the next step or never;
  4. Kafka: its log start moves to the first record whose Kiln offset is at or above the
     offset (storage.read_through: `kiln.offset` headers map the two), or to its end.

The marks persist in Redis, Kafka keeps its own log start: a restarted Kiln neither serves
nor hardens what was deleted. Producers waiting for an assured answer on deleted records
are answered with success: the records were accepted, and the operator decided their fate,
as a Kafka broker has already acknowledged every record DeleteRecords can reach (the
retry an error would cause would put back what was deleted). Steps 2-4 are each safe to
repeat, so a request that failed half way (Kafka unreachable) is completed by asking again.
"""

from __future__ import annotations

import logging

from storage.acks import SettledWaiters
from storage.appender import PartitionStarts
from storage.errors import PartitionLost
from storage.log_queue import LogQueue
from storage.model import TopicPartition
from storage.read_through import ColdReader
from wire.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

HIGH_WATERMARK = -1  # DeleteRecords' "up to the high watermark"


async def delete_records(queue: LogQueue, cold: ColdReader, waiters: SettledWaiters,
                         starts: PartitionStarts, tp: TopicPartition, offset: int) -> int:
    """Delete the partition's records below `offset` in both tiers; returns the offset
    they were deleted below. Raises KafkaError: OFFSET_OUT_OF_RANGE for an offset below 0
    (other than -1) or past the high watermark; storage errors as they come."""
    if not await queue.started(tp):
        await starts.start(tp)
    state = await queue.state(tp)
    upto = state.next_offset if offset == HIGH_WATERMARK else offset
    if not 0 <= upto <= state.next_offset:
        raise KafkaError(ErrorCode.OFFSET_OUT_OF_RANGE,
                         f"{tp.topic}/{tp.partition}: offset {offset} is outside 0.."
                         f"{state.next_offset}")
    await cold.check_deletable(tp)
    deleted = await queue.delete_below(tp, upto)
    if deleted.needs_start:
        raise PartitionLost(f"{tp.topic}/{tp.partition}: Redis lost the partition's state")
    if deleted.error_code is not ErrorCode.NONE:
        raise KafkaError(deleted.error_code,
                         f"{tp.topic}/{tp.partition}: offset {upto} is past the high "
                         "watermark")
    waiters.settled(tp, deleted.incarnation, upto)
    if deleted.records_removed:
        log.info("%s/%d: %d records below offset %d deleted from the log queue", tp.topic,
                 tp.partition, deleted.records_removed, upto)
    if deleted.hardened_before < upto:
        await cold.fence_writers(tp)
    await cold.delete_below(tp, upto)
    return upto
