"""Which Kiln node leads each partition and coordinates each group, and the partition leases
that fence appends.

**Placement.** A partition's leader and a group's coordinator are chosen among the live nodes
(storage/nodes.py) by rendezvous hashing: every node scores each (key, node id) pair with the
same hash and the highest score wins. Every node computes the same answer from the same view
of the live nodes, with no coordination; when a node comes or goes only the keys it wins or
held move (about 1/N of them), so healthy partitions are not paused by a rebalance. Views
differ only between heartbeats (a second by default), and the leases below make that safe.

**Partition leases.** A node appends to a partition only under the partition's lease,
`kiln:{<topic>/<partition>}:leader` (the partition's hash tag: one slot of a Redis Cluster,
beside its log), whose value `<epoch> <node id> <incarnation>` is the **fencing token**: the
append script stores nothing unless the key still holds the token the node was given
(storage/log_queue.py), and a node refused so drops its token. A node takes the lease

- when nobody holds it, or when it was released (`<epoch> -1 `);
- from a holder whose process is not among the live nodes it sees (killed, paused past its
  session, cut off from Redis), with the epoch raised by one;
- never from a live holder: the holder lets go itself once its view shows another node wins
  the partition (`Leadership.rebalance`), and the winner takes it on its next request.

A node takes leases only while its view of the nodes is fresher than the session timeout: a
process that was paused wakes with an old view, and must not take a lease from a node that
joined while it slept. The lease has no expiry: a dead holder is recognised through the nodes'
registrations, so a node alone never renews anything per partition.

Hardening takes its own lease (storage/hardener.py, fenced in Kafka too); the hardener works
on the partitions this node leads. Group coordination moves with the view as well: a node
answers a group's requests only while the group's placement is its own, and group state is
written only over the revision it was read at (storage/groups/store.py), which fences a
coordinator that lost the group while it was paused.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from storage.clock import wall_clock_ms
from storage.errors import BufferUnavailable
from storage.log_queue import partition_key
from storage.model import TopicPartition
from storage.nodes import KilnNode
from storage.redis_pool import REDIS_FAILURES, RedisClient

log = logging.getLogger(__name__)

# KEYS[1] the lease. ARGV: node id, incarnation, then the incarnations of every live node.
# Returns the token this process holds (taken now or before), or nil when a live node holds it.
_ACQUIRE = """
local current = redis.call('GET', KEYS[1])
local epoch = 0
if current then
  local e, holder = string.match(current, '^(%d+) %-?%d+ (%S*)$')
  if e then
    epoch = tonumber(e)
    if holder == ARGV[2] then return current end
    for i = 3, #ARGV do
      if ARGV[i] == holder then return false end
    end
  end
end
local token = string.format('%d %s %s', epoch + 1, ARGV[1], ARGV[2])
redis.call('SET', KEYS[1], token)
return token
"""

# KEYS[1] the lease. ARGV[1] the token held. Released when still held: 1, else 0.
_RELEASE = """
local current = redis.call('GET', KEYS[1])
if current ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], string.match(current, '^(%d+)') .. ' -1 ')
return 1
"""


def lease_key(tp: TopicPartition) -> str:
    return partition_key(tp, "leader")


def _score(key: str, node_id: int) -> int:
    digest = hashlib.blake2b(f"{key}\0{node_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@functools.lru_cache(maxsize=1 << 16)
def place(key: str, node_ids: tuple[int, ...]) -> int | None:
    """The node among `node_ids` that `key` belongs to (None when there is none). Asked on
    every request for each partition in it, so remembered."""
    return max(node_ids, key=lambda n: (_score(key, n), n), default=None)


def partition_placement_key(tp: TopicPartition) -> str:
    return f"partition {tp.topic}/{tp.partition}"


def group_placement_key(group_id: str) -> str:
    return f"group {group_id}"


def transaction_placement_key(transactional_id: str) -> str:
    return f"transaction {transactional_id}"


def lane_placement_key(lane: str) -> str:
    return f"hardening lane {lane}"


class NodesView(Protocol):
    """What Leadership needs of this process's membership (storage.nodes.Membership)."""

    @property
    def node_id(self) -> int: ...

    @property
    def incarnation(self) -> str: ...

    def live_nodes(self) -> Sequence[KilnNode]:
        """By id."""

    def live_ids(self) -> tuple[int, ...]:
        """Theirs, in order."""

    def view_age_s(self) -> float: ...


class Leadership:
    """This node's answers to "who leads / coordinates what", and the leases it holds."""

    def __init__(self, redis: RedisClient, nodes: NodesView, fresh_within_s: float,
                 silent_after_ms: int = 2_000, clock_ms: Callable[[], int] = wall_clock_ms
                 ) -> None:
        self._nodes = nodes
        self._fresh_within_s = fresh_within_s
        self._silent_after_ms = silent_after_ms
        self._clock_ms = clock_ms
        self._acquire = redis.register_script(_ACQUIRE)
        self._release = redis.register_script(_RELEASE)
        self._held: dict[TopicPartition, str] = {}

    # -- placement --------------------------------------------------------------------------

    def brokers(self) -> list[KilnNode]:
        """The live nodes, by id: what clients are told the brokers are."""
        return list(self._nodes.live_nodes())

    def leader(self, tp: TopicPartition) -> int:
        """The node id that leads `tp` (this node's when no node is known live)."""
        return self._placed(partition_placement_key(tp))

    def leads(self, tp: TopicPartition) -> bool:
        return self.leader(tp) == self._nodes.node_id

    def silent(self, node_id: int) -> bool:
        """Whether another node missed its heartbeats (not renewed for `silent_after_ms`)
        though it is not dead yet: clients are told its partitions have no leader, so that
        they ask again at once, as for an offline partition, instead of retrying it until
        the others take its partitions over."""
        if node_id == self._nodes.node_id:
            return False
        now = self._clock_ms()
        return any(n.node_id == node_id and now - n.renewed_ms > self._silent_after_ms
                   for n in self._nodes.live_nodes())

    def coordinator(self, group_id: str) -> int:
        return self._placed(group_placement_key(group_id))

    def coordinates(self, group_id: str) -> bool:
        return self.coordinator(group_id) == self._nodes.node_id

    def transaction_coordinator(self, transactional_id: str) -> int:
        return self._placed(transaction_placement_key(transactional_id))

    def coordinates_transactions(self, transactional_id: str) -> bool:
        return self.transaction_coordinator(transactional_id) == self._nodes.node_id

    def runs_lane(self, lane: str) -> bool:
        """Whether this node runs the hardening lane `lane` (storage/lane.py)."""
        return self._placed(lane_placement_key(lane)) == self._nodes.node_id

    def _placed(self, key: str) -> int:
        placed = place(key, self._nodes.live_ids())
        return self._nodes.node_id if placed is None else placed

    # -- partition leases ---------------------------------------------------------------------

    async def token(self, tp: TopicPartition) -> str | None:
        """The fencing token for appending to `tp`, taken now if need be; None when this node
        does not lead `tp`, or another live node still holds its lease. Raises
        BufferUnavailable."""
        if not self.leads(tp):
            return None
        held = self._held.get(tp)
        if held is not None:
            return held
        if self._nodes.view_age_s() > self._fresh_within_s:
            log.info("%s/%d: not taking the lease on a view of the nodes %.1fs old",
                     tp.topic, tp.partition, self._nodes.view_age_s())
            return None
        live = [n.incarnation for n in self._nodes.live_nodes()]
        try:
            token = await self._acquire(
                keys=[lease_key(tp)], args=[self._nodes.node_id, self._nodes.incarnation, *live])
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        if token is None:
            log.debug("%s/%d: the lease is still held by a live node", tp.topic, tp.partition)
            return None
        text = token.decode() if isinstance(token, bytes) else str(token)
        log.debug("%s/%d: lease held as %s", tp.topic, tp.partition, text)
        self._held[tp] = text
        return text

    def lost(self, tp: TopicPartition, token: str) -> None:
        """The log refused `token` for `tp`: another node took the lease (or Redis lost it)."""
        if self._held.get(tp) == token:
            del self._held[tp]

    async def rebalance(self) -> int:
        """Let go of the leases of partitions another live node now wins (called when the
        view of the nodes changed); how many were released."""
        moving = [(tp, token) for tp, token in self._held.items() if not self.leads(tp)]
        released = 0
        for tp, token in moving:
            del self._held[tp]
            try:
                released += int(await self._release(keys=[lease_key(tp)], args=[token]))
            except REDIS_FAILURES as exc:
                # Nobody can take it from this live node now: the winner waits until this
                # node is seen dead, or retries the release at the next change.
                log.warning("%s/%d: cannot release the lease: %s", tp.topic, tp.partition,
                            exc)
                self._held[tp] = token
        if moving:
            log.info("released %d partition leases to other nodes", released)
        return released
