"""The Kiln nodes of one deployment (one Redis, one Kafka): every live `kiln serve` process,
registered under a node id of its own and kept alive by a heartbeat.

A node registers when it starts and renews its registration every `heartbeat_ms`; a node not
renewed for `session_timeout_ms` (killed, paused, cut off from Redis) is dead to the others.
No two live nodes share an id:

- an id the operator gives (`node_id`) is refused at start while a live node at another
  address holds it;
- otherwise a node takes the id its advertised address held before (a restarted node keeps
  its id, as clients and dashboards expect), or else the lowest id nobody holds. A dead
  node's id is given to another address only once it has been dead `id_reuse_after_ms`, so
  that a paused node waking within that time finds its id still its own.

A node whose registration is gone (Redis lost it) registers again under the same id; one
whose id another process holds (it was dead to the others past `id_reuse_after_ms`) is not a
member until it can: it says so in its log and in readiness. A planned shutdown removes the
registration at once. The node id never changes while a process runs.

Everything lives in one Redis hash under one hash tag: one slot of a Redis Cluster. A
registration's expiry is written by its node's clock and read by the others': the hosts'
clocks must agree to well within the session timeout (NTP does).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, fields

from storage.clock import wall_clock_ms
from storage.errors import BufferUnavailable, StorageError
from storage.redis_pool import REDIS_FAILURES, RedisClient
from storage.tasks import stop_task
from wire.errors import ErrorCode

log = logging.getLogger(__name__)

NODES_KEY = "{kiln:nodes}"
AUTO_NODE_ID = -1

# A registration as the scripts read it; nil for one that is not Kiln's JSON (it holds no id).
_DECODE = """
local function decoded(text)
  local ok, entry = pcall(cjson.decode, text)
  if ok and type(entry) == 'table' and tonumber(entry.expires_ms) then return entry end
  return nil
end
"""

# KEYS[1] the nodes hash. ARGV: wanted id (-1: any), address ("" when it is not known yet),
# now (ms), how long a dead node's id is kept from other addresses (ms), the entry (JSON).
# Entries that do not decode, and those dead for longer than that (but this address's own),
# are removed: the hash holds the nodes of the last few minutes, not every node ever.
# Returns {id, ""} or, when a live node at another address holds the wanted id, {-1, its
# address}.
_REGISTER = _DECODE + """
local now = tonumber(ARGV[3])
local reuse_after = tonumber(ARGV[4])
local wanted = tonumber(ARGV[1])
local held = {}
local own = nil
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local id = tonumber(fields[i])
  local entry = decoded(fields[i + 1])
  if id == nil or entry == nil then
    redis.call('HDEL', KEYS[1], fields[i])
  else
    held[id] = entry
    if ARGV[2] ~= '' and entry.address == ARGV[2] and (own == nil or id < own) then
      own = id
    end
  end
end
for id, entry in pairs(held) do
  if id ~= own and tonumber(entry.expires_ms) + reuse_after <= now then
    redis.call('HDEL', KEYS[1], id)
    held[id] = nil
  end
end
local id = wanted
if wanted >= 0 then
  local entry = held[wanted]
  if entry ~= nil and tonumber(entry.expires_ms) > now and entry.address ~= ARGV[2] then
    return {-1, entry.address}
  end
elseif own ~= nil then
  id = own
else
  id = 0
  while held[id] ~= nil do
    id = id + 1
  end
end
redis.call('HSET', KEYS[1], id, ARGV[5])
return {id, ''}
"""

# KEYS[1] the nodes hash. ARGV: id, incarnation, the entry (JSON; "" to remove it).
# 1 when the registration was this incarnation's (and is now renewed or removed), else 0.
_RENEW = _DECODE + """
local current = redis.call('HGET', KEYS[1], ARGV[1])
current = current and decoded(current)
if not current or current.incarnation ~= ARGV[2] then
  return 0
end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
return 1
"""


@dataclass(frozen=True, slots=True)
class NodeSettings:
    heartbeat_ms: int = 1_000
    session_timeout_ms: int = 3_000
    id_reuse_after_ms: int = 600_000
    # The live nodes are read this often between heartbeats (one HGETALL), so that a node
    # seen dead moves its partitions at once, not at the next heartbeat.
    view_refresh_ms: int = 200


@dataclass(frozen=True, slots=True)
class KilnNode:
    """A node's registration, as every process reads it."""

    node_id: int
    host: str
    port: int
    http: str  # HOST:PORT of its HTTP endpoints, "" when off
    pid: int
    incarnation: str  # one per process start
    started_ms: int
    renewed_ms: int
    expires_ms: int
    # (listener name, host, port) clients of each Kafka listener are told; () from a node
    # started before listeners had names: `host`:`port` on every listener.
    listeners: tuple[tuple[str, str, int], ...] = ()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}" if self.port else ""

    def live(self, now_ms: int) -> bool:
        return now_ms < self.expires_ms


class NodeIdTaken(StorageError):
    def __init__(self, node_id: int, address: str) -> None:
        super().__init__(ErrorCode.INVALID_REQUEST,
                         f"node id {node_id} is held by the live node at {address}")


async def read_nodes(redis: RedisClient) -> list[KilnNode]:
    """Every registration, live or dead, by node id."""
    try:
        entries = await redis.hgetall(NODES_KEY)
    except REDIS_FAILURES as exc:
        raise BufferUnavailable(str(exc)) from exc
    nodes = [node for node_id, text in entries.items()
             if (node := decode_node(node_id, text)) is not None]
    return sorted(nodes, key=lambda n: n.node_id)


_FIELDS = frozenset(f.name for f in fields(KilnNode)) - {"node_id", "listeners"}


def _identities(nodes: Sequence[KilnNode]) -> set[tuple[int, str, str]]:
    return {(n.node_id, n.incarnation, n.address) for n in nodes}


def decode_node(node_id: bytes | str | int, text: bytes | str) -> KilnNode | None:
    """A registration as read from the nodes hash; None for one that is not a registration
    (the scripts remove those). Fields a newer Kiln adds are left out."""
    try:
        entry = json.loads(text)
        listeners = tuple((str(name), str(host), int(port))
                          for name, host, port in entry.get("listeners", ()))
        return KilnNode(node_id=int(node_id), **{k: entry[k] for k in _FIELDS},
                        listeners=listeners)
    except (ValueError, TypeError, KeyError):
        return None


class Membership:
    """This process's registration as a node, renewed in the background once started."""

    def __init__(self, redis: RedisClient, settings: NodeSettings = NodeSettings(),
                 clock_ms: Callable[[], int] = wall_clock_ms) -> None:
        self._redis = redis
        self._settings = settings
        self._clock_ms = clock_ms
        self._register = redis.register_script(_REGISTER)
        self._renew = redis.register_script(_RENEW)
        self._incarnation = uuid.uuid4().hex
        self._started_ms = clock_ms()
        self._node_id = AUTO_NODE_ID
        self._host, self._port, self._http = "", 0, ""
        self._listeners: tuple[tuple[str, str, int], ...] = ()
        self._member = False
        self._task: asyncio.Task[None] | None = None
        # The live nodes as last read from Redis, when, and who is told of changes.
        self._live: tuple[KilnNode, ...] = ()
        self._live_ids: tuple[int, ...] = ()
        self._read_at = float("-inf")
        self._view_listeners: list[Callable[[], Awaitable[object]]] = []

    @property
    def node_id(self) -> int:
        return self._node_id

    @property
    def incarnation(self) -> str:
        return self._incarnation

    def live_nodes(self) -> tuple[KilnNode, ...]:
        """The live nodes as of the last heartbeat, by id."""
        return self._live

    def live_ids(self) -> tuple[int, ...]:
        """Their ids, in order (asked on every request that names a partition or group)."""
        return self._live_ids

    def view_age_s(self) -> float:
        """How long ago the live nodes were last read from Redis."""
        return time.monotonic() - self._read_at

    def on_view_change(self, listener: Callable[[], Awaitable[object]]) -> None:
        """Call `listener` after a heartbeat that found other live nodes than the last."""
        self._view_listeners.append(listener)

    async def refresh_view(self) -> bool:
        """Read the live nodes; whether they changed. Raises BufferUnavailable."""
        nodes = await read_nodes(self._redis)
        now = self._clock_ms()
        live = tuple(sorted((n for n in nodes if n.live(now)), key=lambda n: n.node_id))
        self._read_at = time.monotonic()
        changed = _identities(live) != _identities(self._live)
        self._live = live
        self._live_ids = tuple(n.node_id for n in live)
        if changed:
            log.info("live nodes: %s", ", ".join(f"{n.node_id} at {n.address}" for n in live)
                     or "none")
            for listener in self._view_listeners:
                await listener()
        return changed

    @property
    def member(self) -> bool:
        """Whether the last heartbeat found this process registered under its id."""
        return self._member

    async def register(self, wanted_id: int, host: str, port: int, http: str = "",
                       listeners: tuple[tuple[str, str, int], ...] = ()) -> int:
        """Register under `wanted_id` (AUTO_NODE_ID: as the module says) and return the id;
        raises NodeIdTaken, or BufferUnavailable when Redis cannot be reached."""
        self._host, self._port, self._http = host, port, http
        self._listeners = listeners
        now = self._clock_ms()
        try:
            node_id, holder = await self._register(
                keys=[NODES_KEY],
                args=[wanted_id, self._address(), now, self._settings.id_reuse_after_ms,
                      self._entry(now)])
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        if int(node_id) < 0:
            raise NodeIdTaken(wanted_id, holder.decode() if isinstance(holder, bytes)
                              else str(holder))
        self._node_id = int(node_id)
        self._member = True
        await self.refresh_view()
        return self._node_id

    def bound(self, host: str, port: int, http: str,
              listeners: tuple[tuple[str, str, int], ...] = ()) -> None:
        """The addresses as bound (a listener on port 0 learns its port only then); the next
        heartbeat tells them."""
        self._host, self._port, self._http = host, port, http
        self._listeners = listeners

    async def heartbeat(self) -> bool:
        """Renew the registration (register again under the same id if Redis lost it) and
        read the live nodes; whether this process is a member now. Raises
        BufferUnavailable."""
        now = self._clock_ms()
        try:
            renewed = await self._renew(keys=[NODES_KEY], args=[
                self._node_id, self._incarnation, self._entry(now)])
            if not renewed:
                node_id, _ = await self._register(keys=[NODES_KEY], args=[
                    self._node_id, self._address(), now, self._settings.id_reuse_after_ms,
                    self._entry(now)])
                renewed = int(node_id) == self._node_id
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        if bool(renewed) != self._member:
            if renewed:
                log.info("registered again as node %d", self._node_id)
            else:
                log.error("node id %d is held by another live process: this process is not "
                          "a member of the cluster until it can register again", self._node_id)
        self._member = bool(renewed)
        await self.refresh_view()
        return self._member

    def start(self) -> None:
        self._task = asyncio.create_task(self._beat(), name="kiln-node-heartbeat")

    async def stop(self) -> None:
        """Stop renewing and remove the registration (others see the node gone at once)."""
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
        if self._node_id == AUTO_NODE_ID:
            return
        try:
            await self._renew(keys=[NODES_KEY], args=[self._node_id, self._incarnation, ""])
        except REDIS_FAILURES as exc:
            log.warning("could not remove node %d's registration: %s", self._node_id, exc)
        self._member = False

    async def check(self) -> None:
        """For readiness: raises unless this process is a registered node."""
        if not self._member:
            raise StorageError(ErrorCode.UNKNOWN_SERVER_ERROR,
                               f"not registered as node {self._node_id}")

    async def _beat(self) -> None:
        heartbeat_s = self._settings.heartbeat_ms / 1000
        refresh_s = min(heartbeat_s, self._settings.view_refresh_ms / 1000)
        beaten_at = time.monotonic()
        while True:
            await asyncio.sleep(min(refresh_s, max(0.0, beaten_at + heartbeat_s
                                                   - time.monotonic())))
            try:
                if time.monotonic() >= beaten_at + heartbeat_s:
                    beaten_at = time.monotonic()
                    await self.heartbeat()
                else:
                    await self.refresh_view()
            except StorageError as exc:
                log.warning("node %d heartbeat failed: %s", self._node_id, exc)

    def _address(self) -> str:
        return f"{self._host}:{self._port}" if self._port else ""

    def _entry(self, now_ms: int) -> str:
        """The registration as stored: a KilnNode without its id (the hash field), with the
        address the register script matches."""
        return json.dumps({
            "host": self._host, "port": self._port, "address": self._address(),
            "http": self._http, "pid": os.getpid(), "incarnation": self._incarnation,
            "listeners": [list(listener) for listener in self._listeners],
            "started_ms": self._started_ms, "renewed_ms": now_ms,
            "expires_ms": now_ms + self._settings.session_timeout_ms}, sort_keys=True)
