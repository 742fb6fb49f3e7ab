"""Delay control in the Kiln process: keeps the delay observer's Redis-held amounts fresh
and publishes every topic's decision, with its inputs, for `kiln delay explain`.

The observer (storage.policy.observer) hears appends, commits and Kafka writes from the
produce handler, delivery and the hardener as they happen; this task adds, every refresh
period, what lives in Redis: which topics have durable subscriptions (and a `harden` policy
under which delivery spares a write), the buffered bytes and records the buffer budget sums
over all Kiln processes, and the guarantee acks waiting here.

Each node sees the appends to the partitions it leads and the acks waiting on it: a share of
each topic's senders and rates. So every node publishes what it alone sees (`own` in its
report, `kiln:delay:<node>`) and reads its live peers' reports every publish period: their
figures, summed, are added to its own (storage.policy.observer.PeerSignals), and every node
decides a topic's delay from cluster-wide senders, rates and waiting acks. Buffered and
at-risk amounts are read from Redis and so cover every node already. A peer's report older
than `_PEER_REPORT_MAX_AGE_MS` counts for nothing (the node stopped publishing).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import ResponseError
from redis.typing import EncodableT, FieldT

from storage.acks import SettledWaiters
from storage.budget import BufferBudget
from storage.catalog import Catalog
from storage.clock import wall_clock_ms
from storage.errors import BufferUnavailable, StorageError
from storage.policy.observer import DelayObserver, PeerSignals
from storage.redis_pool import REDIS_FAILURES, RedisClient
from storage.subscriptions import SubscriptionRegistry
from storage.tasks import stop_task
from storage.topics import HardenPolicy

log = logging.getLogger(__name__)

REPORT_KEY_PREFIX = "kiln:delay:"
_REPORT_TTL_S = 30
_PEER_REPORT_MAX_AGE_MS = 5_000


class DelayControl:
    def __init__(self, observer: DelayObserver, *, budget: BufferBudget,
                 waiters: SettledWaiters, catalog: Catalog,
                 subscriptions: SubscriptionRegistry, redis: RedisClient, node: str,
                 peers: Callable[[], Sequence[str]] = lambda: (),
                 refresh_s: float = 0.25, publish_s: float = 1.0) -> None:
        self.observer = observer
        self._budget = budget
        self._waiters = waiters
        self._catalog = catalog
        self._subscriptions = subscriptions
        self._redis = redis
        self._node = node
        # The live nodes (their report names, as `node` is this one's).
        self._peers = peers
        self._refresh_s = refresh_s
        self._publish_s = publish_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="kiln-delay-control")

    async def stop(self) -> None:
        """Stop, and withdraw this process's reports: it no longer decides anything."""
        if self._task is not None:
            await stop_task(self._task)
        try:
            await self._redis.delete(REPORT_KEY_PREFIX + self._node)
        except REDIS_FAILURES as exc:
            log.debug("cannot withdraw delay reports: %s", exc)

    async def refresh(self) -> None:
        configs = await self._catalog.registry.all()
        subscribed = await self._subscriptions.all()
        observer = self.observer
        observer.deliverable(frozenset(
            name for name, config in configs.items()
            if config.harden is HardenPolicy.NEVER
            or (config.harden is HardenPolicy.SURVIVORS and subscribed.get(name))
        ), wall_clock_ms())
        observer.buffered(self._budget.buffered_bytes, self._budget.buffered_records)
        observer.pending_acks(self._waiters.pending_by_topic())
        for name in configs:
            observer.decision(name, wall_clock_ms())

    async def publish(self) -> None:
        now = wall_clock_ms()
        reports: dict[FieldT, EncodableT] = {
            name: json.dumps({**self.observer.report(name, now), "node": self._node})
            for name in self.observer.topics}
        if not reports:
            return
        key = REPORT_KEY_PREFIX + self._node
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                pipe.hset(key, mapping=reports)
                pipe.expire(key, _REPORT_TTL_S)
                await pipe.execute()
        except REDIS_FAILURES as exc:
            log.debug("cannot publish delay reports: %s", exc)

    async def _run(self) -> None:
        published_at = 0.0
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self.refresh()
            except StorageError as exc:
                log.debug("delay control refresh failed: %s", exc)
            if loop.time() - published_at >= self._publish_s:
                await self.publish()
                await self.read_peers()
                published_at = loop.time()
            await asyncio.sleep(self._refresh_s)


    async def read_peers(self) -> PeerSignals:
        """Sum what the live peers published of their own observations into the observer;
        what was summed (nothing from a peer whose report is missing or too old)."""
        names = [name for name in self._peers() if name != self._node]
        signals = PeerSignals()
        if names:
            try:
                async with self._redis.pipeline(transaction=False) as pipe:
                    for name in names:
                        pipe.hgetall(REPORT_KEY_PREFIX + name)
                    replies = await pipe.execute(raise_on_error=False)
            except REDIS_FAILURES as exc:
                log.debug("cannot read the peers' delay reports: %s", exc)
                return signals
            signals = _summed(replies, wall_clock_ms() - _PEER_REPORT_MAX_AGE_MS)
        self.observer.peers(signals)
        return signals


def _summed(replies: Sequence[Any], since_ms: int) -> PeerSignals:
    """Each peer's own figures per topic, from its reports written since `since_ms`, summed
    over peers (its ingress rates, Kiln-wide, counted once per peer)."""
    senders: dict[str, int] = {}
    acks: dict[str, int] = {}
    bytes_per_s = records_per_s = 0.0
    for entries in replies:
        if not isinstance(entries, dict):
            continue  # an error, or a key of another type under Kiln's prefix
        peer_bytes = peer_records = 0.0
        for raw in entries.values():
            try:
                report = json.loads(raw)
                own, topic = report["own"], str(report["topic"])
                if int(report["at_ms"]) < since_ms:
                    continue
                senders[topic] = senders.get(topic, 0) + int(own["senders"])
                acks[topic] = acks.get(topic, 0) + int(own["pending_acks"])
                peer_bytes = max(peer_bytes, float(own["bytes_per_s"]))
                peer_records = max(peer_records, float(own["records_per_s"]))
            except (ValueError, TypeError, KeyError):
                continue  # not a report this Kiln wrote
        bytes_per_s += peer_bytes
        records_per_s += peer_records
    return PeerSignals(senders, bytes_per_s, records_per_s, acks)


async def ingress_by_node(redis: RedisClient, names: Sequence[str]
                          ) -> dict[str, tuple[float, float]]:
    """(records/s, bytes/s) producers sent through each named node lately, as its reports
    say; a node without a report of the last `_PEER_REPORT_MAX_AGE_MS` is left out."""
    if not names:
        return {}
    try:
        async with redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hgetall(REPORT_KEY_PREFIX + name)
            replies = await pipe.execute(raise_on_error=False)
    except REDIS_FAILURES as exc:
        raise BufferUnavailable(str(exc)) from exc
    since = wall_clock_ms() - _PEER_REPORT_MAX_AGE_MS
    out = {}
    for name, entries in zip(names, replies, strict=True):
        if isinstance(entries, dict) and any(_written_since(raw, since)
                                             for raw in entries.values()):
            signals = _summed([entries], since)
            out[name] = (signals.records_per_s, signals.bytes_per_s)
    return out


def _written_since(raw: bytes | str, since_ms: int) -> bool:
    try:
        return int(json.loads(raw)["at_ms"]) >= since_ms
    except (ValueError, TypeError, KeyError):
        return False


async def read_reports(redis: RedisClient) -> list[dict[str, Any]]:
    """Every live Kiln process's latest delay report per topic."""
    reports = []
    async for key in redis.scan_iter(match=REPORT_KEY_PREFIX + "*", count=100):
        try:
            entries = await redis.hgetall(key)
        except ResponseError:
            continue  # a key of another type under Kiln's prefix
        for raw in entries.values():
            try:
                report = json.loads(raw)
            except ValueError:
                continue  # not a report Kiln wrote
            if isinstance(report, dict) and {"topic", "node", "at_ms"} <= report.keys():
                reports.append(report)
    return sorted(reports, key=lambda r: (r["topic"], r["node"]))
