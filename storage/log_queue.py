"""The log queue (hot tier): one Redis stream per topic-partition, batches stored whole.

Every mutation is one Lua script, so offsets are assigned atomically in Redis and several
Kiln processes can append to, harden and trim one partition without colliding. Keys carry
one hash tag per partition, so the layout is Redis Cluster-ready.

Layout per partition (`{topic/partition}` is the hash tag):
  kiln:{t/p}:log     stream; entry id `<base_offset>-1`; fields d=batch bytes, n=records,
                     t=append time (ms), l=reliability level, c=bytes appended before it,
                     k=1 when a record carries a client's own `kiln.offset` header
  kiln:{t/p}:meta    hash; inc (incarnation: a token made when Kiln starts the partition in
                     Redis, so a partition Redis lost and Kiln started again is told apart),
                     next (high watermark), hardened (every offset below it is in
                     Kafka or needs no hardening; batches below it still buffered are
                     held until delivered, with those behind them), delivered (every
                     offset below it is delivered), appended (bytes ever appended), bytes
                     and records buffered, and what left the queue how:
                     hardened_records/_bytes (written to Kafka), delivered_records/_bytes
                     (dropped as delivered), expired_records (never to be hardened:
                     non-persistent levels, harden=never); deleted (DeleteRecords: no
                     offset below it is served or hardened) and deleted_records (removed
                     by it)
  kiln:{t/p}:commits hash; durable subscription (group) -> committed offset
  kiln:{t/p}:pids    hash; producer id -> JSON idempotence state (epoch, last 5 batches,
                     t=time of its last append); pruned after a producer's long silence
  kiln:{t/p}:lease   string; the Kiln process that hardens this partition (fencing token)
  kiln:{t/p}:writer  string; the last process that took the lease and has not let go of it
  kiln:{t/p}:leader  string; the partition's leader lease, `<epoch> <node id> <incarnation>`:
                     appends are stored only under it (storage/leadership.py)
  kiln:{t/p}:txns    hash; producer id -> JSON of its transactions here (storage/transactions):
                     e epoch, n the transaction registered (AddPartitionsToTxn), m the last
                     one ended here (its marker written), f the first offset of its
                     records (-1 before any), a 1 once an assured batch is among them, t its
                     transactional id; open while n > m
  kiln:{t/p}:open    sorted set; producer id -> first offset of its open transaction's
                     records: the last stable offset is the lowest, or the high watermark
  kiln:{t/p}:aborted sorted set; "<producer id>:<first offset>" -> offset of the abort
                     marker: the aborted transactions a read_committed fetch lists
  kiln:{t/p}:committed sorted set; "<producer id>:<number>:<first offset>:<marker offset>:
                     <assured 0/1>" -> first offset: committed transactions the hardening
                     lane has not decided yet (storage/lane.py); nothing from the lowest
                     on is dropped as delivered but by the lane, which writes a
                     transaction whole or not at all
  meta also holds lane=1 once a transaction registered in the partition: the hardening
  lane hardens it from then on, not the partition's own hardener

The log queue only ever loses a prefix (hardened or delivered batches), so buffered bytes
are `appended` minus the first entry's `c`: every removal recounts them exactly, however
hardening and delivered-record removal interleave.
"""

from __future__ import annotations

import enum
import json
import logging
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError

from storage import redis_pool
from storage.errors import BufferUnavailable, Fenced, PartitionLost
from storage.model import Reliability, StoredBatch, TopicPartition
from storage.redis_pool import REDIS_FAILURES, RedisClient, pipe_script, run_scripts
from wire.batch import read_header
from wire.errors import ErrorCode

log = logging.getLogger(__name__)

# The Redis server process the scripts run in: a partition's incarnation is only good in
# the process that started it. A Redis restarted from its AOF or RDB file, or a replica
# promoted by failover, may have lost the last writes before it took over, so the offsets
# they took would be issued again; its partitions are started again like lost ones.
RUN_ID_LUA = """
local function redis_run_id()
  return string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
end
"""

# Sequences wrap at 2^31 as in Kafka. The last five batches of each producer are remembered
# so a retried batch is answered with its original offset and never stored twice. Every batch
# is checked before any is stored, so a request is appended whole or not at all. A partition
# without an incarnation of this Redis process is new, or was lost or partly lost by Redis:
# nothing is appended until Kiln has started it again from what Kafka holds (returns code -1).
# Nothing is appended unless the partition's leader lease (KEYS[4]) still holds the fencing
# token ARGV[4] (returns NOT_LEADER_OR_FOLLOWER). A transactional batch is stored only while
# its producer's transaction is registered here at its epoch (INVALID_TXN_STATE, or
# INVALID_PRODUCER_EPOCH for an older epoch), and a producer's non-transactional batch not
# while its transaction here holds records (INVALID_TXN_STATE), as Kafka's broker checks; the
# first records of a transaction open it in KEYS[6], holding the last stable offset back, and
# an assured batch marks it assured (its commit is answered once it is hardened or delivered).
# Returns {error code, first offset, duplicate (0/1), incarnation}.
_APPEND = RUN_ID_LUA + f"local ASSURED = '{int(Reliability.ASSURED_PERSISTENT)}'\n" + """
local log, meta, pids, txns, open = KEYS[1], KEYS[2], KEYS[3], KEYS[5], KEYS[6]
if redis.call('GET', KEYS[4]) ~= ARGV[4] then return {6, -1, 0, ''} end
local now, level, count = ARGV[1], ARGV[2], tonumber(ARGV[3])
local incarnation = redis.call('HGET', meta, 'inc')
if not incarnation or redis.call('HGET', meta, 'rid') ~= redis_run_id() then
  return {-1, -1, 0, ''}
end
local M = 2147483648
local plans, states, regs = {}, {}, {}
for i = 0, count - 1 do
  local a = 5 + i * 7
  local n, pid = tonumber(ARGV[a + 1]), ARGV[a + 2]
  local epoch, seq = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local plan = {data = ARGV[a], n = n, pid = pid, seq = seq, last = (seq + n - 1) % M,
                headed = ARGV[a + 5], txn = ARGV[a + 6] == '1'}
  if tonumber(pid) >= 0 then
    local state = states[pid]
    if state == nil then
      local raw = redis.call('HGET', pids, pid)
      if raw then state = cjson.decode(raw) else state = {e = epoch, b = {}} end
    end
    if epoch < state.e then return {47, -1, 0, incarnation} end
    local reg = regs[pid]
    if reg == nil then
      local raw = redis.call('HGET', txns, pid)
      if raw then reg = cjson.decode(raw) else reg = false end
      regs[pid] = reg
    end
    if plan.txn then
      if not reg or reg.n <= reg.m then return {48, -1, 0, incarnation} end
      if epoch < reg.e then return {47, -1, 0, incarnation} end
      if epoch > reg.e then return {48, -1, 0, incarnation} end
    elseif reg and reg.n > reg.m and reg.f >= 0 then
      return {48, -1, 0, incarnation}
    end
    if epoch > state.e then
      -- A new epoch starts its sequences again at 0, as Kafka checks.
      if seq ~= 0 then return {45, -1, 0, incarnation} end
      state = {e = epoch, b = {}}
    end
    for _, b in ipairs(state.b) do
      if b[1] == seq and b[2] == plan.last and b[3] >= 0 then plan.dup = b[3] end
    end
    if not plan.dup and #state.b > 0 then
      if seq ~= (state.b[#state.b][2] + 1) % M then return {45, -1, 0, incarnation} end
    end
    -- An unknown producer (new, or pruned after a long silence) may start at any sequence.
    if not plan.dup then table.insert(state.b, {seq, plan.last, -1}) end
    state.t = now
    states[pid] = state
  end
  plans[#plans + 1] = plan
end
local first_offset, duplicate = -1, 0
for _, plan in ipairs(plans) do
  if plan.dup then
    if first_offset < 0 then first_offset = plan.dup end
    duplicate = 1
  else
    local base = tonumber(redis.call('HGET', meta, 'next'))
    local size = string.len(plan.data)
    local before = redis.call('HINCRBY', meta, 'appended', size) - size
    if plan.headed == '1' then
      redis.call('XADD', log, string.format('%d-1', base), 'd', plan.data, 'n', plan.n,
                 't', now, 'l', level, 'c', before, 'k', 1)
    else
      redis.call('XADD', log, string.format('%d-1', base), 'd', plan.data, 'n', plan.n,
                 't', now, 'l', level, 'c', before)
    end
    redis.call('HSET', meta, 'next', base + plan.n)
    redis.call('HINCRBY', meta, 'bytes', size)
    redis.call('HINCRBY', meta, 'records', plan.n)
    if first_offset < 0 then first_offset = base end
    if tonumber(plan.pid) >= 0 then
      for _, b in ipairs(states[plan.pid].b) do
        if b[1] == plan.seq and b[2] == plan.last and b[3] == -1 then b[3] = base end
      end
    end
    local reg = regs[plan.pid]
    if plan.txn and (reg.f < 0 or (level == ASSURED and reg.a ~= 1)) then
      if reg.f < 0 then
        reg.f = base
        redis.call('ZADD', open, base, plan.pid)
      end
      if level == ASSURED then reg.a = 1 end
      redis.call('HSET', txns, plan.pid, cjson.encode(reg))
    end
  end
end
for pid, state in pairs(states) do
  while #state.b > 5 do table.remove(state.b, 1) end
  redis.call('HSET', pids, pid, cjson.encode(state))
end
return {0, first_offset, duplicate, incarnation}
"""

# Shared by every script that removes entries. trim_prefix removes the entries whose records
# all lie below `upto` (a batch that straddles it stays whole: readers skip its earlier
# records) and recounts what is buffered; returns the first offset still buffered before and
# after, and the bytes removed.
_TRIM_PREFIX = """
local function field(f, name)
  for j = 1, #f, 2 do if f[j] == name then return f[j + 1] end end
  return nil
end
local function first_entry(log)
  local e = redis.call('XRANGE', log, '-', '+', 'COUNT', 1)
  if #e == 0 then return nil, nil end
  return tonumber(string.match(e[1][1], '^(%d+)')), tonumber(field(e[1][2], 'c') or '0')
end
local function trim_prefix(log, meta, upto)
  local next_offset = tonumber(redis.call('HGET', meta, 'next') or '0')
  local appended = tonumber(redis.call('HGET', meta, 'appended') or '0')
  local b0, c0 = first_entry(log)
  if b0 == nil then return next_offset, next_offset, 0 end
  if b0 >= upto then return b0, b0, 0 end
  local cut = upto
  local last = redis.call('XREVRANGE', log, '(' .. string.format('%d-1', upto), '-', 'COUNT', 1)
  if #last > 0 then
    local base = tonumber(string.match(last[1][1], '^(%d+)'))
    if base + tonumber(field(last[1][2], 'n')) > upto then cut = base end
  end
  if cut > b0 then redis.call('XTRIM', log, 'MINID', string.format('%d-1', cut)) end
  local b1, c1 = first_entry(log)
  if b1 == nil then b1, c1 = next_offset, appended end
  redis.call('HSET', meta, 'bytes', appended - c1, 'records', next_offset - b1)
  return b0, b1, c1 - c0
end
local function advance(meta, name, to)
  if to > tonumber(redis.call('HGET', meta, name) or '0') then
    redis.call('HSET', meta, name, to)
  end
end
"""

# A hardening pass (or the release of held batches) finished: drop the whole batches below
# ARGV[1] (0: none), advance the hardened mark to ARGV[2], and count what the pass decided:
# ARGV[3] records written to Kafka (ARGV[4] bytes), ARGV[5] delivered and ARGV[6] expired
# (never to be hardened). The pass read incarnation ARGV[7]; if Redis lost the partition
# since, nothing is touched (returns -1), nor if ARGV[8] is no longer the partition's writer
# (KEYS[3]: its lease was taken over while it was paused; returns -2). Returns the records
# removed.
_FINISH_PASS = _TRIM_PREFIX + """
local log, meta = KEYS[1], KEYS[2]
if redis.call('HGET', meta, 'inc') ~= ARGV[7] then return -1 end
if redis.call('GET', KEYS[3]) ~= ARGV[8] then return -2 end
local b0, b1 = trim_prefix(log, meta, tonumber(ARGV[1]))
local counters = {'hardened_records', 'hardened_bytes', 'delivered_records', 'expired_records'}
for i, name in ipairs(counters) do
  local n = tonumber(ARGV[i + 2])
  if n > 0 then redis.call('HINCRBY', meta, name, n) end
end
advance(meta, 'hardened', tonumber(ARGV[2]))
return b1 - b0
"""

# A durable subscription (ARGV[1]; '' to only recount) committed ARGV[2]; ARGV[4..] are
# every durable subscription of the topic. The delivered mark becomes the lowest of their
# commits (capped at the high watermark: committing past it delivers nothing not yet
# appended) and, when ARGV[3] is 1, the batches wholly below it are dropped, unless the log
# queue starts below the hardened mark: that region is held by the hardener (batches kept
# until delivered, and those behind them), which releases it and counts what leaves.
# Nothing at or past the first record of an open transaction (KEYS[4]) is dropped: whether
# it is ever hardened is not decided yet; nor of a committed one the hardening lane has not
# decided (KEYS[5]): it is hardened whole unless every record of it, in every partition, is
# delivered. Returns {delivered mark, records dropped, incarnation}.
_DELIVER = _TRIM_PREFIX + """
local log, meta, commits = KEYS[1], KEYS[2], KEYS[3]
local next_offset = tonumber(redis.call('HGET', meta, 'next') or '0')
if ARGV[1] ~= '' then
  redis.call('HSET', commits, ARGV[1], math.min(tonumber(ARGV[2]), next_offset))
end
local lowest = nil
for i = 4, #ARGV do
  local committed = redis.call('HGET', commits, ARGV[i])
  if not committed then
    return {tonumber(redis.call('HGET', meta, 'delivered') or '0'), 0,
            redis.call('HGET', meta, 'inc') or ''}
  end
  committed = tonumber(committed)
  if lowest == nil or committed < lowest then lowest = committed end
end
advance(meta, 'delivered', lowest or 0)
local delivered = tonumber(redis.call('HGET', meta, 'delivered') or '0')
local dropped = 0
local head = first_entry(log)
if ARGV[3] == '1' and head ~= nil
    and head >= tonumber(redis.call('HGET', meta, 'hardened') or '0') then
  local upto = delivered
  for k = 4, 5 do
    local unstable = redis.call('ZRANGE', KEYS[k], 0, 0, 'WITHSCORES')
    if #unstable > 0 then upto = math.min(upto, tonumber(unstable[2])) end
  end
  local b0, b1, removed_bytes = trim_prefix(log, meta, upto)
  dropped = b1 - b0
  if dropped > 0 then
    redis.call('HINCRBY', meta, 'delivered_records', dropped)
    redis.call('HINCRBY', meta, 'delivered_bytes', removed_bytes)
  end
end
return {delivered, dropped, redis.call('HGET', meta, 'inc') or ''}
"""

# DeleteRecords: every offset below ARGV[1] goes, hardened or not, because an operator asked.
# The deleted mark (the partition's first offset through Kiln) and the hardened mark (nothing
# below it needs hardening) advance to it, and the whole batches below it leave the log
# queue, counted as deleted (a batch that straddles it stays whole: readers skip its earlier
# records). Returns {code, deleted mark, hardened mark before, records removed, incarnation}:
# code -1 when the partition has no incarnation (not started in Redis), 1 when ARGV[1] is
# past the high watermark (nothing changed).
_DELETE_BELOW = _TRIM_PREFIX + """
local log, meta = KEYS[1], KEYS[2]
local upto = tonumber(ARGV[1])
local incarnation = redis.call('HGET', meta, 'inc')
if not incarnation then return {-1, 0, 0, 0, ''} end
if upto > tonumber(redis.call('HGET', meta, 'next') or '0') then
  return {1, 0, 0, 0, incarnation}
end
local hardened = tonumber(redis.call('HGET', meta, 'hardened') or '0')
advance(meta, 'deleted', upto)
advance(meta, 'hardened', upto)
local b0, b1 = trim_prefix(log, meta, upto)
if b1 > b0 then redis.call('HINCRBY', meta, 'deleted_records', b1 - b0) end
-- A nil would end the reply there: 'deleted' is unset until a deletion passes offset 0.
return {0, tonumber(redis.call('HGET', meta, 'deleted') or '0'), hardened, b1 - b0,
        incarnation}
"""

# Take or renew the hardening lease of a partition (KEYS[1]); KEYS[2] names the last owner
# that took it and has not let go. ARGV: owner, time to live (ms), then, when known, every
# live owner: a holder not among them is taken over at once instead of when its lease runs
# out. Returns 0 when another owner holds it, 1 when this owner does, 2 when this owner just
# took it over from one that did not let go (crashed, or paused and maybe still in the
# middle of a write).
LEASE_LUA = """
local holder = redis.call('GET', KEYS[1])
if holder ~= false and holder ~= ARGV[1] then
  local alive = #ARGV < 3
  for i = 3, #ARGV do
    if ARGV[i] == holder then alive = true end
  end
  if alive then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local writer = redis.call('GET', KEYS[2])
if writer == ARGV[1] then return 1 end
redis.call('SET', KEYS[2], ARGV[1])
if writer then return 2 end
return 1
"""

# A partition whose state is new to Redis (or lost by it) starts its offsets where Kafka's
# Kiln records end, so Kiln offsets never repeat after Redis lost its data, under a new
# incarnation (ARGV[2]): what waits on the old one learns its records are gone. One that
# Redis kept across a restart or failover (the incarnation of another Redis process) goes
# on from the larger of its own next offset and Kafka's, in a new incarnation too: the
# restored state may lack the last appends. Returns 1 when started here, 0 when already
# started in this Redis process.
_INITIALIZE = RUN_ID_LUA + """
local meta, resume, rid = KEYS[1], ARGV[1], redis_run_id()
if redis.call('HGET', meta, 'inc') and redis.call('HGET', meta, 'rid') == rid then
  return 0
end
-- Offsets stay decimal strings: Lua's numbers are exact only below 2^53.
local kept = redis.call('HGET', meta, 'next')
if kept and (#kept > #resume or (#kept == #resume and kept > resume)) then resume = kept end
local hardened = redis.call('HGET', meta, 'hardened') or resume
redis.call('HSET', meta, 'next', resume, 'hardened', hardened, 'inc', ARGV[2], 'rid', rid)
return 1
"""

# 1 when the partition was started in this Redis process (see _INITIALIZE).
_STARTED = RUN_ID_LUA + """
if redis.call('HGET', KEYS[1], 'inc') and redis.call('HGET', KEYS[1], 'rid') == redis_run_id()
then return 1 end
return 0
"""

# Entries from ARGV[1] on (or, when ARGV[4] is given, from the entry holding that offset),
# stopping before ARGV[2] bytes of batch data are exceeded (at least one entry) or at ARGV[3]
# entries: reads never move more than a reader can use. Returns {incarnation of the
# partition (KEYS[2], its meta, when given), entries}.
_READ_RANGE = """
local key, start = KEYS[1], ARGV[1]
local limit, most = tonumber(ARGV[2]), tonumber(ARGV[3])
local out, size = {}, 0
local incarnation = ''
if KEYS[2] then incarnation = redis.call('HGET', KEYS[2], 'inc') or '' end
if ARGV[4] then
  local holding = redis.call('XREVRANGE', key, ARGV[4] .. '-1', '-', 'COUNT', 1)
  start = ARGV[4] .. '-1'
  if #holding > 0 then
    local f, n = holding[1][2], 0
    for j = 1, #f, 2 do if f[j] == 'n' then n = tonumber(f[j + 1]) end end
    if tonumber(string.match(holding[1][1], '^(%d+)')) + n > tonumber(ARGV[4]) then
      start = holding[1][1]
    end
  end
end
while #out < most do
  local entries = redis.call('XRANGE', key, start, '+', 'COUNT', 16)
  if #entries == 0 then break end
  for _, e in ipairs(entries) do
    local f, len = e[2], 0
    for j = 1, #f, 2 do
      if f[j] == 'd' then len = string.len(f[j + 1]) end
    end
    if #out > 0 and size + len > limit then return {incarnation, out} end
    out[#out + 1] = e
    size = size + len
    if #out >= most then return {incarnation, out} end
  end
  start = '(' .. entries[#entries][1]
end
return {incarnation, out}
"""

# Forget the producers ARGV[2..] unless one appended since ARGV[1] (ms), or has a
# transaction open here (KEYS[2]); their ended transactions here are forgotten with them.
_FORGET_PRODUCERS = """
local removed = 0
for i = 2, #ARGV do
  local raw = redis.call('HGET', KEYS[1], ARGV[i])
  local reg = redis.call('HGET', KEYS[2], ARGV[i])
  local open = reg and cjson.decode(reg).n > cjson.decode(reg).m
  if raw and not open and tonumber(cjson.decode(raw).t or 0) < tonumber(ARGV[1]) then
    redis.call('HDEL', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
    removed = removed + 1
  end
end
return removed
"""

# Let go of the lease (KEYS[1]) after the last write was answered.
RELEASE_LUA = """
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


_READ_BATCHES = 200


class Lease(enum.IntEnum):
    REFUSED = 0     # another owner holds it
    HELD = 1        # this owner holds it
    TAKEN_OVER = 2  # this owner took it from one that did not let go: fence before writing


@dataclass(frozen=True, slots=True)
class AppendBatch:
    """One validated client record batch, as it is stored."""

    data: bytes
    record_count: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    carries_kiln_header: bool = False
    # Part of a transaction: stored only while it is registered here (storage/transactions).
    transactional: bool = False


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """One partition's share of a produce request, already validated."""

    tp: TopicPartition
    reliability: Reliability
    batches: Sequence[AppendBatch]

    @property
    def record_count(self) -> int:
        return sum(b.record_count for b in self.batches)

    @property
    def size(self) -> int:
        return sum(len(b.data) for b in self.batches)


@dataclass(frozen=True, slots=True)
class AppendResult:
    error_code: ErrorCode
    base_offset: int
    duplicate: bool  # a retry of a batch already stored: answered with its first offset
    # The partition's incarnation the records went into; an answer waiting on them is tied
    # to it, never to the offset alone (after a Redis loss offsets are issued again).
    incarnation: str = ""
    # Redis holds no state for the partition (new to it, or lost): nothing was appended;
    # start the partition from what Kafka holds, then append again.
    needs_start: bool = False


@dataclass(frozen=True, slots=True)
class PartitionState:
    next_offset: int
    hardened_offset: int
    buffered_bytes: int
    buffered_records: int
    delivered_offset: int = 0
    incarnation: str = ""  # "" when Redis holds no state for the partition
    hardened_records: int = 0
    hardened_bytes: int = 0
    delivered_records: int = 0
    delivered_bytes: int = 0
    expired_records: int = 0
    # DeleteRecords: nothing below it is served or hardened (0: never asked).
    deleted_offset: int = 0
    deleted_records: int = 0  # removed from the log queue by DeleteRecords
    # A transaction registered here: the hardening lane hardens the partition (storage/lane.py).
    in_lane: bool = False

    @property
    def start_offset(self) -> int:
        """The first offset the log queue still holds (next_offset when it is empty)."""
        return self.next_offset - self.buffered_records

    @property
    def flushed_offset(self) -> int:
        """Every offset below it has left the log queue or needs nothing more from the
        hardener (in Kafka, or a non-persistent record it holds until delivered)."""
        return max(self.start_offset, self.hardened_offset)

    @property
    def settled_offset(self) -> int:
        """Every offset below it is hardened or delivered: assured acks are due."""
        return max(self.hardened_offset, self.delivered_offset)


@dataclass(frozen=True, slots=True)
class Peek:
    """What a hardener looks at before each pass."""

    oldest: StoredBatch | None  # the partition's oldest batch
    undecided: StoredBatch | None  # the first batch at or after the offset asked about
    in_lane: bool  # the hardening lane has the partition (a transaction registered there)


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    """A transaction aborted in a partition, as a read_committed fetch lists it."""

    producer_id: int
    first_offset: int
    marker_offset: int = -1  # its abort marker


@dataclass(frozen=True, slots=True)
class CommittedTransaction:
    """A committed transaction with records in a partition that the hardening lane has not
    decided yet."""

    producer_id: int
    number: int  # the transactional id's transaction number
    first_offset: int
    marker_offset: int
    member: str  # as listed in Redis
    assured: bool = False  # assured records among them: their commit waits for the lane

    @property
    def key(self) -> str:
        """The same in every partition the transaction has records in."""
        return transaction_key(self.producer_id, self.number)


def transaction_key(producer_id: int, number: int) -> str:
    return f"{producer_id}.{number}"


@dataclass(frozen=True, slots=True)
class HotRead:
    """What the log queue holds of a partition from an offset on."""

    batches: list[StoredBatch]
    state: PartitionState
    start_offset: int  # the lowest offset the log queue still holds
    # Below it, every transaction is decided (Kafka's last stable offset): a read_committed
    # reader stops there.
    last_stable_offset: int
    # Aborted transactions whose abort markers lie at or after the offset read from.
    aborted: list[AbortedTransaction]


@dataclass(frozen=True, slots=True)
class DeliverResult:
    delivered_offset: int
    records_dropped: int
    incarnation: str = ""


@dataclass(frozen=True, slots=True)
class DeleteResult:
    """What DeleteRecords did to the log queue. `error_code` is OFFSET_OUT_OF_RANGE past
    the high watermark, NONE otherwise (then `needs_start` says Redis holds no state for
    the partition: nothing was changed)."""

    error_code: ErrorCode
    deleted_offset: int = 0  # the deleted mark now
    hardened_before: int = 0  # the hardened mark before: below it, nothing left to write
    records_removed: int = 0
    incarnation: str = ""
    needs_start: bool = False


@dataclass(frozen=True, slots=True)
class QueueRead:
    """The oldest batches of a partition, read in one incarnation of it."""

    incarnation: str
    batches: list[StoredBatch]


# Every key a partition has (the layout in the module's docstring).
PARTITION_KEY_KINDS = ("log", "meta", "commits", "pids", "lease", "writer", "leader", "txns",
                       "open", "aborted", "committed")


def partition_key(tp: TopicPartition, kind: str) -> str:
    return f"kiln:{{{tp.topic}/{tp.partition}}}:{kind}"


def partition_keys(tp: TopicPartition, *kinds: str) -> list[str]:
    return [partition_key(tp, kind) for kind in kinds]


class LogQueue:
    """Adapter over Redis: appends, reads, trims; Redis errors become BufferUnavailable."""

    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._append = redis.register_script(_APPEND)
        self._lease = redis.register_script(LEASE_LUA)
        self._release = redis.register_script(RELEASE_LUA)
        self._initialize = redis.register_script(_INITIALIZE)
        self._started = redis.register_script(_STARTED)
        self._read_range = redis.register_script(_READ_RANGE)
        self._finish_pass = redis.register_script(_FINISH_PASS)
        self._deliver = redis.register_script(_DELIVER)
        self._forget_producers = redis.register_script(_FORGET_PRODUCERS)
        self._delete_below = redis.register_script(_DELETE_BELOW)

    @classmethod
    def from_url(cls, url: str, max_connections: int = 64) -> LogQueue:
        """Every partition's hardening task, fetch and produce share these connections."""
        return cls(redis_pool.connect(url, max_connections=max_connections))

    @property
    def redis(self) -> RedisClient:
        return self._redis

    async def close(self) -> None:
        await redis_pool.close(self._redis)

    async def ping(self) -> None:
        try:
            await self._redis.ping()
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def append(self, requests: Sequence[AppendRequest], now_ms: int,
                     tokens: Sequence[str]) -> list[AppendResult]:
        """Append every partition's batches in one round trip (one script per partition),
        each under the fencing token given for it (storage/leadership.py)."""
        calls: list[tuple[list[str], list[bytes | int | str]]] = []
        for req, token in zip(requests, tokens, strict=True):
            args: list[bytes | int | str] = [now_ms, int(req.reliability), len(req.batches),
                                             token]
            for b in req.batches:
                args += [b.data, b.record_count, b.producer_id, b.producer_epoch,
                         b.base_sequence, int(b.carries_kiln_header), int(b.transactional)]
            calls.append((partition_keys(req.tp, "log", "meta", "pids", "leader", "txns",
                                         "open"), args))
        try:
            replies = await run_scripts(self._redis, self._append, calls)
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return [_append_result(reply) for reply in replies]

    async def read(self, tp: TopicPartition, limit_bytes: int, max_batches: int = 1000,
                   from_offset: int | None = None) -> QueueRead:
        """Batches from the start of the partition's log (or from the batch holding
        `from_offset`), oldest first, up to limit_bytes (at least one batch when any
        exists), with the incarnation they belong to."""
        args: list[int | str] = ["-", limit_bytes, max_batches]
        if from_offset is not None:
            args.append(from_offset)
        try:
            incarnation, entries = await self._read_range(
                keys=partition_keys(tp, "log", "meta"), args=args)
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return QueueRead(_text(incarnation),
                         [_stored_batch(entry_id, _field_map(fields))
                          for entry_id, fields in entries])

    async def peek(self, tp: TopicPartition, from_offset: int) -> Peek:
        """The oldest batch of the partition, the first batch holding `from_offset` or after
        it, and whether the hardening lane has the partition. One round trip."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                stream = partition_key(tp, "log")
                pipe.xrange(stream, "-", "+", count=1)
                pipe_script(pipe, self._read_range.sha, [stream], "-", 1, 1, from_offset)
                pipe.hget(partition_key(tp, "meta"), "lane")
                oldest, (_, after), lane = await pipe.execute()
        except NoScriptError:
            return Peek(await self.peek_oldest(tp), next(iter(
                (await self.read(tp, 1, 1, from_offset=from_offset)).batches), None),
                (await self.in_lane([tp]))[0])
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return Peek(_stored_batch(*oldest[0]) if oldest else None,
                    _stored_batch(after[0][0], _field_map(after[0][1])) if after else None,
                    bool(lane))

    async def peek_oldest(self, tp: TopicPartition) -> StoredBatch | None:
        try:
            entries = await self._redis.xrange(partition_key(tp, "log"), "-", "+", count=1)
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return _stored_batch(*entries[0]) if entries else None

    async def read_from(self, tp: TopicPartition, offset: int, limit_bytes: int
                        ) -> HotRead:
        """Batches holding `offset` and after, up to limit_bytes (at least one batch), with the
        partition's state, the lowest offset the log queue still holds, its last stable
        offset and the aborted transactions whose markers are at or after `offset`.

        One round trip: the batch that contains `offset` may start before it."""
        key = partition_key(tp, "log")
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xrevrange(key, f"{offset}-1", "-", count=1)
                pipe_script(pipe, self._read_range.sha, [key], f"{offset}-1", limit_bytes,
                             _READ_BATCHES)
                pipe.xrange(key, "-", "+", count=1)
                pipe.hgetall(partition_key(tp, "meta"))
                pipe.zrange(partition_key(tp, "open"), 0, 0, withscores=True)
                pipe.zrangebyscore(partition_key(tp, "aborted"), offset, "+inf",
                                   withscores=True)
                before, after, first, meta, unstable, aborted = await pipe.execute(
                    raise_on_error=False)
            if isinstance(after, NoScriptError):
                after = await self._read_range(keys=[key],
                                               args=[f"{offset}-1", limit_bytes, _READ_BATCHES])
            for reply in (before, after, first, meta, unstable, aborted):
                if isinstance(reply, Exception):
                    raise reply
            after = after[1]
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        state = _partition_state(meta)
        start = _stored_batch(*first[0]).base_offset if first else state.next_offset
        batches: list[StoredBatch] = []
        if before:
            holding = _stored_batch(*before[0])
            if holding.base_offset < offset < holding.next_offset:
                batches.append(holding)
        size = sum(len(b.data) for b in batches)
        for entry_id, fields in after:
            batch = _stored_batch(entry_id, _field_map(fields))
            if batches and size + len(batch.data) > limit_bytes:
                break
            batches.append(batch)
            size += len(batch.data)
        stable = state.next_offset
        if unstable:
            stable = min(stable, max(state.deleted_offset, int(unstable[0][1])))
        return HotRead(batches, state, start, stable,
                       [_aborted_transaction(member, marker) for member, marker in aborted])

    async def start_offset(self, tp: TopicPartition) -> int:
        """The lowest offset the log queue still holds (the next offset when it is empty)."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xrange(partition_key(tp, "log"), "-", "+", count=1)
                pipe.hget(partition_key(tp, "meta"), "next")
                first, next_offset = await pipe.execute()
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return _stored_batch(*first[0]).base_offset if first else int(next_offset or 0)

    async def first_batch_reaching(self, tp: TopicPartition, timestamp_ms: int,
                                   from_offset: int = 0) -> StoredBatch | None:
        """The first batch starting at or after `from_offset` whose max timestamp reaches
        `timestamp_ms`: the first record at or after that time is in it, or after it."""
        key = partition_key(tp, "log")
        start = f"{from_offset}-0"
        try:
            while True:
                entries = await self._redis.xrange(key, start, "+", count=_READ_BATCHES)
                for entry_id, fields in entries or []:
                    batch = _stored_batch(entry_id, fields)
                    if read_header(batch.data).max_timestamp >= timestamp_ms:
                        return batch
                if not entries or len(entries) < _READ_BATCHES:
                    return None
                last_id = entries[-1][0]
                start = "(" + (last_id.decode() if isinstance(last_id, bytes) else str(last_id))
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def last_stable_offset(self, tp: TopicPartition) -> int:
        """Below it every transaction is decided: the first offset of the oldest open
        transaction, or the high watermark when none is open."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hmget(partition_key(tp, "meta"), "next", "deleted")
                pipe.zrange(partition_key(tp, "open"), 0, 0, withscores=True)
                (next_offset, deleted), unstable = await pipe.execute()
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        if not unstable:
            return int(next_offset or 0)
        return min(int(next_offset or 0), max(int(deleted or 0), int(unstable[0][1])))

    async def state(self, tp: TopicPartition) -> PartitionState:
        try:
            raw = await self._redis.hgetall(partition_key(tp, "meta"))
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return _partition_state(raw)

    async def states(self, tps: Sequence[TopicPartition]) -> list[PartitionState]:
        return [_partition_state(raw) for raw in await self._hashes(tps, "meta")]

    async def _hashes(self, tps: Sequence[TopicPartition], kind: str) -> list[dict[Any, Any]]:
        """One hash per partition, in one round trip."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for tp in tps:
                    pipe.hgetall(partition_key(tp, kind))
                return list(await pipe.execute())
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def finish_pass(self, tp: TopicPartition, incarnation: str, *, owner: str,
                          trim_below: int, hardened_below: int, written_records: int = 0,
                          written_bytes: int = 0, delivered_records: int = 0,
                          expired_records: int = 0) -> int:
        """A hardening pass by `owner`, the partition's writer (acquire_lease), is done: drop
        the whole batches below `trim_below` (0: none), advance the hardened mark to
        `hardened_below` and count what the pass decided. Returns the records removed (fewer
        when delivered-record removal took some first). Raises PartitionLost when Redis lost
        the partition since `incarnation` was read (the marks of its new incarnation are
        not the caller's), Fenced when another owner took the lease over (a paused owner
        that wakes changes nothing its successor decides)."""
        try:
            removed = int(await self._finish_pass(
                keys=partition_keys(tp, "log", "meta", "writer"),
                args=[trim_below, hardened_below, written_records, written_bytes,
                      delivered_records, expired_records, incarnation, owner]))
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        if removed == -1:
            raise PartitionLost(f"{tp.topic}/{tp.partition}: Redis lost the partition's state "
                                f"(incarnation {incarnation!r}) while it was hardened")
        if removed < 0:
            raise Fenced(f"{tp.topic}/{tp.partition}: another Kiln process took over its "
                         f"hardening from {owner}")
        return removed

    async def deliver(self, group: str, offsets: Mapping[TopicPartition, int],
                      durable_groups: Mapping[str, Sequence[str]], drop: Mapping[str, bool]
                      ) -> dict[TopicPartition, DeliverResult]:
        """Record durable subscription `group`'s commits and advance each partition's
        delivered mark to the lowest commit of the topic's durable subscriptions
        (`durable_groups[topic]`); where `drop[topic]`, drop the batches now delivered.
        One round trip for all partitions."""
        tps = list(offsets)
        calls: list[tuple[list[str], Sequence[bytes | int | str]]] = [
            (partition_keys(tp, "log", "meta", "commits", "open", "committed"),
             [group, offsets[tp], int(drop[tp.topic]), *durable_groups[tp.topic]])
            for tp in tps
        ]
        try:
            replies = await run_scripts(self._redis, self._deliver, calls)
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return {tp: DeliverResult(int(mark), int(dropped), _text(incarnation))
                for tp, (mark, dropped, incarnation) in zip(tps, replies, strict=True)}

    async def commits(self, tps: Sequence[TopicPartition]) -> list[dict[str, int]]:
        """Per partition: durable subscription -> the offset it committed."""
        return [{k.decode(): int(v) for k, v in raw.items()}
                for raw in await self._hashes(tps, "commits")]

    async def forget_commits(self, tps: Sequence[TopicPartition], group: str) -> None:
        """`group` is no longer a durable subscription of these partitions' topic."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for tp in tps:
                    pipe.hdel(partition_key(tp, "commits"), group)
                await pipe.execute()
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def remove_partitions(self, tps: Sequence[TopicPartition]) -> int:
        """Drop every key of these partitions (their records, marks, durable subscriptions'
        commits, producers' idempotence state, hardening lease): the topic is deleted. A
        producer waiting for records dropped here finds the partition's incarnation gone.
        Returns how many keys there were."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for tp in tps:  # one command per partition: its keys share a hash tag
                    pipe.delete(*(partition_key(tp, kind) for kind in PARTITION_KEY_KINDS))
                return sum(int(n) for n in await pipe.execute())
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def delete_below(self, tp: TopicPartition, offset: int) -> DeleteResult:
        """DeleteRecords: nothing below `offset` is served or hardened any more; its whole
        batches leave the log queue now (see _DELETE_BELOW)."""
        try:
            code, deleted, hardened, removed, incarnation = await self._delete_below(
                keys=partition_keys(tp, "log", "meta"), args=[offset])
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        if int(code) < 0:
            return DeleteResult(ErrorCode.NONE, needs_start=True)
        if int(code) > 0:
            return DeleteResult(ErrorCode.OFFSET_OUT_OF_RANGE, incarnation=_text(incarnation))
        return DeleteResult(ErrorCode.NONE, int(deleted), int(hardened), int(removed),
                            _text(incarnation))

    async def started(self, tp: TopicPartition) -> bool:
        """Whether the partition has an incarnation of the Redis process serving now."""
        try:
            return bool(await self._started(keys=[partition_key(tp, "meta")]))
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def initialize(self, tp: TopicPartition, next_offset: int) -> bool:
        """Start a partition's offsets at `next_offset` (or on from its own, if Redis kept
        one that is larger), in a new incarnation, unless it was started in the Redis
        process serving now. True when it was started here."""
        try:
            return bool(await self._initialize(keys=[partition_key(tp, "meta")],
                                               args=[next_offset, uuid.uuid4().hex]))
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def prune_producers(self, tp: TopicPartition, silent_since_ms: int) -> int:
        """Forget the idempotence state of producers that have not appended to `tp` since
        `silent_since_ms` (Kafka's producer.id.expiration.ms): the hash would otherwise grow
        with every producer id ever seen. A forgotten producer that comes back is taken as
        new, as Kafka takes one whose state expired; one with a transaction open here is
        kept. Returns how many were forgotten."""
        key = partition_key(tp, "pids")
        removed = 0
        try:
            async for chunk in _stale_producer_chunks(self._redis, key, silent_since_ms):
                removed += int(await self._forget_producers(
                    keys=[key, partition_key(tp, "txns")], args=[silent_since_ms, *chunk]))
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return removed

    async def in_lane(self, tps: Sequence[TopicPartition]) -> list[bool]:
        """Which of `tps` the hardening lane hardens (a transaction registered there), in
        one round trip."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for tp in tps:
                    pipe.hget(partition_key(tp, "meta"), "lane")
                return [bool(flag) for flag in await pipe.execute()]
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def committed_transactions(self, tps: Sequence[TopicPartition]
                                     ) -> list[list[CommittedTransaction]]:
        """Per partition, its committed transactions the hardening lane has not decided, in
        one round trip."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for tp in tps:
                    pipe.zrange(partition_key(tp, "committed"), 0, -1)
                replies = await pipe.execute()
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return [[_committed_transaction(member) for member in members] for members in replies]

    async def forget_committed(self, decided: Mapping[TopicPartition, Sequence[str]]) -> None:
        """The hardening lane decided these transactions (members as listed)."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for tp, members in decided.items():
                    if members:
                        pipe.zrem(partition_key(tp, "committed"), *members)
                await pipe.execute()
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def acquire_lease(self, tp: TopicPartition, owner: str, ttl_ms: int,
                            live_owners: Sequence[str] = ()) -> Lease:
        """Take or renew the partition's hardening lease; with `live_owners`, take it at once
        from a holder that is not among them (its process is gone)."""
        try:
            return Lease(int(await self._lease(keys=partition_keys(tp, "lease", "writer"),
                                               args=[owner, ttl_ms, *live_owners])))
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def release_lease(self, tp: TopicPartition, owner: str) -> None:
        """Let go of the lease: every write of this owner was answered, so the next one
        needs no fence."""
        try:
            await self._release(keys=partition_keys(tp, "lease", "writer"), args=[owner])
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc


async def _stale_producer_chunks(redis: RedisClient, key: str, silent_since_ms: int,
                                 size: int = 500) -> AsyncIterator[list[bytes]]:
    """Producer ids of `key` whose last append is older than `silent_since_ms`, in chunks
    (read with HSCAN, so a large hash never blocks Redis in one call)."""
    chunk: list[bytes] = []
    async for pid, raw in redis.hscan_iter(key, count=size):
        if int(json.loads(raw).get("t", 0)) < silent_since_ms:
            chunk.append(pid)
            if len(chunk) >= size:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _append_result(reply: Sequence[Any]) -> AppendResult:
    code, base, duplicate, incarnation = reply
    if int(code) < 0:
        return AppendResult(ErrorCode.NONE, -1, False, needs_start=True)
    return AppendResult(ErrorCode.of(int(code)), int(base), bool(duplicate), _text(incarnation))


def _aborted_transaction(member: bytes | str, marker: float) -> AbortedTransaction:
    producer_id, first_offset = _text(member).split(":")
    return AbortedTransaction(int(producer_id), int(first_offset), int(marker))


def _committed_transaction(member: bytes | str) -> CommittedTransaction:
    text = _text(member)
    producer_id, number, first, marker, assured = text.split(":")
    return CommittedTransaction(int(producer_id), int(number), int(first), int(marker), text,
                                assured == "1")


def _stored_batch(entry_id: Any, fields: Any) -> StoredBatch:
    return StoredBatch(
        base_offset=int(entry_id.split(b"-", 1)[0]),
        record_count=int(fields[b"n"]),
        append_time_ms=int(fields[b"t"]),
        reliability=Reliability(int(fields[b"l"])),
        data=fields[b"d"],
        carries_kiln_header=b"k" in fields,
    )


def _field_map(fields: Any) -> Any:
    """A script returns stream fields as a flat [name, value, ...] list; XRANGE as a dict."""
    if isinstance(fields, dict):
        return fields
    return dict(zip(fields[::2], fields[1::2], strict=True))


def _partition_state(raw: Mapping[Any, Any]) -> PartitionState:
    def number(name: bytes) -> int:
        return int(raw.get(name, 0))

    return PartitionState(
        next_offset=number(b"next"),
        hardened_offset=number(b"hardened"),
        buffered_bytes=number(b"bytes"),
        buffered_records=number(b"records"),
        delivered_offset=number(b"delivered"),
        hardened_records=number(b"hardened_records"),
        hardened_bytes=number(b"hardened_bytes"),
        delivered_records=number(b"delivered_records"),
        delivered_bytes=number(b"delivered_bytes"),
        expired_records=number(b"expired_records"),
        incarnation=_text(raw.get(b"inc", b"")),
        deleted_offset=number(b"deleted"),
        deleted_records=number(b"deleted_records"),
        in_lane=bool(number(b"lane")),
    )
