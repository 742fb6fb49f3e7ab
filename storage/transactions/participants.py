"""A transaction's participants in the log queue: its registration at each partition and the
marker that ends it there.

Registration (AddPartitionsToTxn) is what lets a producer's transactional batches into a
partition (the append script checks it, as Kafka's broker verifies a transactional batch with
its coordinator); the marker is a Kafka control batch appended to the partition's log with an
offset of its own, as Kafka writes one, so clients skip it and offsets match Kafka's. Both
scripts are idempotent per (producer id, transaction number) and never lower a producer's
epoch: a replayed or late registration of a transaction that already ended here is refused,
and a marker written twice is written once. Each touches one partition's keys (one Redis
Cluster slot); the coordinator writes them directly, without the partition's leader lease.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.typing import EncodableT

from storage.errors import BufferUnavailable
from storage.groups.model import CommittedOffset
from storage.groups.snapshot import offset_from_json, offset_to_json
from storage.groups.store import GROUPS_KEY, group_key, offset_field, offset_partition
from storage.log_queue import RUN_ID_LUA, partition_keys
from storage.model import Reliability, TopicPartition
from storage.redis_pool import REDIS_FAILURES, RedisClient, ScriptCall, run_scripts
from wire.errors import ErrorCode

# KEYS: meta, txns. ARGV: producer id, epoch, transaction number, transactional id.
# Returns -1 when the partition is not started in this Redis process (start it, then ask
# again), else an error code: 0, 48 INVALID_TXN_STATE (that transaction already ended here),
# 47 INVALID_PRODUCER_EPOCH (an older epoch than one seen here), 51 CONCURRENT_TRANSACTIONS
# (an earlier transaction of the producer is still open here: its marker is being written).
_REGISTER = RUN_ID_LUA + """
local meta, txns = KEYS[1], KEYS[2]
local pid, epoch, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if not redis.call('HGET', meta, 'inc') or redis.call('HGET', meta, 'rid') ~= redis_run_id() then
  return -1
end
local raw = redis.call('HGET', txns, pid)
local reg = {e = -1, n = 0, m = 0, f = -1, t = ARGV[4]}
if raw then reg = cjson.decode(raw) end
if reg.m >= n then return 48 end
if epoch < reg.e then return 47 end
redis.call('HSET', meta, 'lane', 1)
if reg.n == n then
  if epoch > reg.e then
    reg.e = epoch
    redis.call('HSET', txns, pid, cjson.encode(reg))
  end
  return 0
end
if reg.n > reg.m then return 51 end
reg.n, reg.e, reg.f, reg.a, reg.t = n, epoch, -1, 0, ARGV[4]
redis.call('HSET', txns, pid, cjson.encode(reg))
return 0
"""

# KEYS: log, meta, txns, open, aborted, pids, committed. ARGV: producer id, epoch,
# transaction number, commit (1/0), the control batch, now (ms), level. Ends transaction
# ARGV[3] here: when it is registered, the marker is appended at the next offset, the
# transaction leaves the open set (the last stable offset moves on) and, with records, joins
# the aborted list or the committed one (member "pid:number:first:marker:assured", score
# first, until the hardening lane decides it). An
# earlier transaction of the producer still open here (possible only when the coordinator's
# state was lost) is aborted instead. The marker's epoch is the producer's from now on: a
# fencing marker carries a bumped one, and batches of the fenced epoch are refused. Returns
# {-1} when the partition is not started in this Redis process (a partition Redis lost: start
# it and write again; its transaction's records went with it), {0} when there was nothing to
# write (never registered, or already written: then {0, first offset, assured} when it is
# still in the committed list), else {1, marker offset, first offset of the transaction's
# records or -1, assured (0/1)}.
_WRITE_MARKER = RUN_ID_LUA + """
local log, meta, txns, open, aborted, pids = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local committed = KEYS[7]
local pid, epoch, n, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[6]
if not redis.call('HGET', meta, 'inc') or redis.call('HGET', meta, 'rid') ~= redis_run_id() then
  return {-1}
end
local raw = redis.call('HGET', txns, pid)
local reg = {e = epoch, n = n, m = n, f = -1, t = ''}
if raw then reg = cjson.decode(raw) end
if raw and reg.m >= n then
  local prefix = pid .. ':' .. n .. ':'
  for _, member in ipairs(redis.call('ZRANGE', committed, 0, -1)) do
    if string.sub(member, 1, #prefix) == prefix then
      local first, assured = string.match(member, '^%d+:%d+:(%d+):%d+:(%d)$')
      return {0, tonumber(first), tonumber(assured)}
    end
  end
  return {0}
end
local reply = {0}
if raw and reg.n > reg.m then
  local commit = ARGV[4] == '1' and reg.n == n
  local base = tonumber(redis.call('HGET', meta, 'next'))
  local size = string.len(ARGV[5])
  local before = redis.call('HINCRBY', meta, 'appended', size) - size
  redis.call('XADD', log, string.format('%d-1', base), 'd', ARGV[5], 'n', 1, 't', now,
             'l', ARGV[7], 'c', before)
  redis.call('HSET', meta, 'next', base + 1)
  redis.call('HINCRBY', meta, 'bytes', size)
  redis.call('HINCRBY', meta, 'records', 1)
  redis.call('HINCRBY', meta, 'control_records', 1)
  redis.call('ZREM', open, pid)
  if not commit and reg.f >= 0 then
    redis.call('ZADD', aborted, base, pid .. ':' .. reg.f)
  elseif reg.f >= 0 then
    redis.call('ZADD', committed, reg.f,
               pid .. ':' .. n .. ':' .. reg.f .. ':' .. base .. ':' .. (reg.a or 0))
  end
  reply = {1, base, reg.f, reg.a or 0}
end
reg.m = n
reg.n = math.max(reg.n, n)
reg.f = -1
reg.a = 0
if epoch > reg.e then reg.e = epoch end
redis.call('HSET', txns, pid, cjson.encode(reg))
local state = redis.call('HGET', pids, pid)
if state then
  state = cjson.decode(state)
  if epoch > state.e then
    redis.call('HSET', pids, pid, cjson.encode({e = epoch, b = {}, t = state.t}))
  end
end
local head = redis.call('XRANGE', log, '-', '+', 'COUNT', 1)
if #head > 0 then
  local start = tonumber(string.match(head[1][1], '^(%d+)'))
  redis.call('ZREMRANGEBYSCORE', aborted, '-inf', '(' .. start)
end
return reply
"""


# A consumer group as a participant (AddOffsetsToTxn, TxnOffsetCommit), in the group's keys:
#   kiln:group:{<group>}:txnreg      hash; producer id -> JSON {e, n, m, t} as `txns` above
#   kiln:group:{<group>}:txnoffsets  hash; producer id -> JSON {n, o = {"topic:partition":
#                                    committed offset JSON}}: offsets committed in its open
#                                    transaction, made the group's own by the commit marker

# KEYS: txnreg. ARGV: producer id, epoch, transaction number, transactional id. Returns an
# error code as _REGISTER (never -1: a group needs no start).
_REGISTER_GROUP = """
local pid, epoch, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local raw = redis.call('HGET', KEYS[1], pid)
local reg = {e = -1, n = 0, m = 0, t = ARGV[4]}
if raw then reg = cjson.decode(raw) end
if reg.m >= n then return 48 end
if epoch < reg.e then return 47 end
if reg.n == n then return 0 end
if reg.n > reg.m then return 51 end
reg.n, reg.e, reg.t = n, epoch, ARGV[4]
redis.call('HSET', KEYS[1], pid, cjson.encode(reg))
return 0
"""

# KEYS: txnreg, txnoffsets. ARGV: producer id, epoch, then field, offset JSON pairs. Stages
# the offsets in the producer's open transaction with the group. Returns 0, 48
# INVALID_TXN_STATE (no open transaction with the group: AddOffsetsToTxn first) or 47
# INVALID_PRODUCER_EPOCH (a fenced epoch), as Kafka's group coordinator answers.
_STAGE_OFFSETS = """
local pid, epoch = ARGV[1], tonumber(ARGV[2])
local raw = redis.call('HGET', KEYS[1], pid)
if not raw then return 48 end
local reg = cjson.decode(raw)
if reg.n <= reg.m then return 48 end
if epoch < reg.e then return 47 end
if epoch > reg.e then return 48 end
local staged = {n = reg.n, o = {}}
local held = redis.call('HGET', KEYS[2], pid)
if held then
  held = cjson.decode(held)
  if held.n == reg.n then staged = held end
end
for i = 3, #ARGV, 2 do staged.o[ARGV[i]] = ARGV[i + 1] end
redis.call('HSET', KEYS[2], pid, cjson.encode(staged))
return 0
"""

# KEYS: txnreg, txnoffsets, offsets. ARGV: producer id, epoch, transaction number, commit
# (1/0). Ends the transaction at the group: on commit its staged offsets become the group's
# committed offsets (the decision is final; the members were checked when they were staged),
# on abort they are dropped. Returns {0} when already ended here, else {1, field, offset
# JSON, ...} with the offsets committed now.
_GROUP_MARKER = """
local pid, epoch, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local raw = redis.call('HGET', KEYS[1], pid)
local reg = {e = epoch, n = n, m = 0, t = ''}
if raw then reg = cjson.decode(raw) end
if reg.m >= n then return {0} end
local out = {1}
local held = redis.call('HGET', KEYS[2], pid)
if held and ARGV[4] == '1' and reg.n == n then
  held = cjson.decode(held)
  if held.n == n then
    for field, value in pairs(held.o) do
      redis.call('HSET', KEYS[3], field, value)
      out[#out + 1] = field
      out[#out + 1] = value
    end
  end
end
redis.call('HDEL', KEYS[2], pid)
reg.m = n
reg.n = math.max(reg.n, n)
if epoch > reg.e then reg.e = epoch end
redis.call('HSET', KEYS[1], pid, cjson.encode(reg))
return out
"""


@dataclass(frozen=True, slots=True)
class MarkerWritten:
    """What ending a transaction did at one partition."""

    needs_start: bool = False  # Redis does not know the partition: start it, write again
    marker_offset: int = -1  # -1: nothing appended (written before, or never registered)
    first_offset: int = -1  # the transaction's first record here, -1 if it had none
    assured: bool = False  # an assured batch among its records here


class TransactionParticipants:
    """Registrations and markers in the partitions' keys; Redis errors become
    BufferUnavailable."""

    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._register = redis.register_script(_REGISTER)
        self._write_marker = redis.register_script(_WRITE_MARKER)
        self._register_group = redis.register_script(_REGISTER_GROUP)
        self._stage_offsets = redis.register_script(_STAGE_OFFSETS)
        self._group_marker = redis.register_script(_GROUP_MARKER)

    async def register(self, tps: Sequence[TopicPartition], producer_id: int, epoch: int,
                       number: int, transactional_id: str) -> list[ErrorCode | None]:
        """Let the producer's transaction `number` append to each of `tps` (one round trip
        for them all); per partition its code, None when it must be started first."""
        calls: list[ScriptCall] = [
            (partition_keys(tp, "meta", "txns"), [producer_id, epoch, number, transactional_id])
            for tp in tps]
        try:
            codes = await run_scripts(self._redis, self._register, calls)
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return [None if int(code) < 0 else ErrorCode(int(code)) for code in codes]

    async def write_markers(self, tps: Sequence[TopicPartition], producer_id: int, epoch: int,
                            number: int, *, commit: bool, marker: bytes, now_ms: int
                            ) -> list[MarkerWritten]:
        """End transaction `number` at each of `tps`, in one round trip."""
        calls: list[ScriptCall] = [
            (partition_keys(tp, "log", "meta", "txns", "open", "aborted", "pids", "committed"),
             [producer_id, epoch, number, int(commit), marker, now_ms,
              int(Reliability.RELIABLE_PERSISTENT)])
            for tp in tps]
        try:
            replies = await run_scripts(self._redis, self._write_marker, calls)
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return [_marker_written(reply) for reply in replies]

    # -- consumer groups -------------------------------------------------------------------

    async def register_group(self, group_id: str, producer_id: int, epoch: int, number: int,
                             transactional_id: str) -> ErrorCode:
        try:
            code = await self._register_group(keys=[group_key(group_id, "txnreg")],
                                              args=[producer_id, epoch, number,
                                                    transactional_id])
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return ErrorCode(int(code))

    async def stage_offsets(self, group_id: str, producer_id: int, epoch: int,
                            offsets: Mapping[TopicPartition, CommittedOffset]) -> ErrorCode:
        """TxnOffsetCommit: keep `offsets` until the producer's transaction ends."""
        args: list[EncodableT] = [producer_id, epoch]
        for tp, committed in offsets.items():
            args += [offset_field(tp), offset_to_json(committed)]
        try:
            code = await self._stage_offsets(
                keys=[group_key(group_id, "txnreg"), group_key(group_id, "txnoffsets")],
                args=args)
            if int(code) == 0:
                await self._redis.sadd(GROUPS_KEY, group_id)
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return ErrorCode(int(code))

    async def end_at_group(self, group_id: str, producer_id: int, epoch: int, number: int,
                           *, commit: bool) -> dict[TopicPartition, CommittedOffset]:
        """The group's marker: the offsets this ending committed (none for an abort, or
        when it was ended here before)."""
        try:
            reply = await self._group_marker(
                keys=[group_key(group_id, "txnreg"), group_key(group_id, "txnoffsets"),
                      group_key(group_id, "offsets")],
                args=[producer_id, epoch, number, int(commit)])
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        pairs = reply[1:]
        return {offset_partition(field): offset_from_json(value)
                for field, value in zip(pairs[::2], pairs[1::2], strict=True)}

    async def staged_partitions(self, group_id: str) -> set[TopicPartition]:
        """The partitions with offsets staged in an open transaction (OffsetFetch with
        require_stable answers UNSTABLE_OFFSET_COMMIT for them)."""
        try:
            held = await self._redis.hvals(group_key(group_id, "txnoffsets"))
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return {offset_partition(field) for raw in held for field in json.loads(raw)["o"]}


def _marker_written(reply: Sequence[Any]) -> MarkerWritten:
    if int(reply[0]) < 0:
        return MarkerWritten(needs_start=True)
    if int(reply[0]) == 0:
        if len(reply) == 1:
            return MarkerWritten()
        return MarkerWritten(first_offset=int(reply[1]), assured=bool(int(reply[2])))
    return MarkerWritten(marker_offset=int(reply[1]), first_offset=int(reply[2]),
                         assured=bool(int(reply[3])))
