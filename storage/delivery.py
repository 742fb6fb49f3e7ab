"""Delivery: a group's commits through Kiln, and the records they make delivered.

A record at offset `o` is delivered when every durable subscription of its topic has
committed an offset `> o` through Kiln (DESIGN §1). Group coordination lives elsewhere; it
reports each stored OffsetCommit here, saying whether a member of the group's current
generation made it. Only such a member commit moves the delivered mark of a subscription
the group registered itself, and only a member commit by a group that is not yet a durable
subscription registers it (when the topic allows, `auto_subscribe`). A standalone commit
(generation -1, no member id: anyone may send one while the group is Empty) counts only for
a subscription an operator registered explicitly (CLI or configuration). Other commits count
for nothing here; they are still stored, and OffsetFetch returns them.

Under `harden = survivors` the batches below the delivered mark are dropped from the log
queue at once, never written to Kafka (the hardener skips the delivered records of a batch
that straddles the mark); under `all` and `never` the mark only answers assured acks.

A deleted group (DeleteGroups) stops counting where it had registered itself; one an
operator registered keeps its subscription but loses its commits, as does a group whose
offsets of some partitions were deleted (OffsetDelete): nothing there is delivered until it
commits again. A delivered mark never moves back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from storage.acks import SettledWaiters
from storage.clock import wall_clock_ms
from storage.log_queue import LogQueue
from storage.model import TopicPartition
from storage.subscriptions import AUTO, Subscription, SubscriptionRegistry
from storage.topics import HardenPolicy, TopicRegistry

log = logging.getLogger(__name__)


class Delivery:
    def __init__(self, queue: LogQueue, topics: TopicRegistry, registry: SubscriptionRegistry,
                 waiters: SettledWaiters, clock_ms: Callable[[], int] = wall_clock_ms,
                 on_delivered: Callable[[TopicPartition, int, int], None] | None = None
                 ) -> None:
        self._queue = queue
        self._topics = topics
        self._registry = registry
        self._waiters = waiters
        self._clock_ms = clock_ms
        # Told (partition, delivered mark, now) after every commit: the delay control.
        self._on_delivered = on_delivered

    async def committed(self, group: str, offsets: Mapping[TopicPartition, int], *,
                        by_member: bool) -> None:
        """`group` committed `offsets` (the next offset it will read, per partition); by a
        member of its current generation, or else a standalone commit (`by_member=False`).
        The empty group id, which Kafka allows for simple commits, is never a durable
        subscription."""
        if not group:
            return
        durable: dict[str, Sequence[str]] = {}
        drop: dict[str, bool] = {}
        for topic in {tp.topic for tp in offsets}:
            config = await self._topics.get(topic)
            if config is None:
                continue
            subscriptions = (await self._registry.all()).get(topic, {})
            groups = frozenset(subscriptions)
            mine = subscriptions.get(group)
            if not by_member and (mine is None or not mine.explicit):
                # Anyone can send a standalone commit: it must not drop records that a
                # subscription the operator did not vouch for has not read.
                log.debug("standalone commit of group %s on %s does not count for delivery",
                          group, topic)
                continue
            if mine is None:
                if not config.auto_subscribe:
                    continue
                if await self._registry.add(topic, group, source=AUTO,
                                            now_ms=self._clock_ms()):
                    log.info("group %s is now a durable subscription of %s (first commit)",
                             group, topic)
                groups = groups | {group}
            durable[topic] = sorted(groups)
            drop[topic] = config.harden is HardenPolicy.SURVIVORS
        counted = {tp: offset for tp, offset in offsets.items() if tp.topic in durable}
        if counted:
            await self._apply(group, counted, durable, drop)

    async def subscribe(self, topic: str, group: str, source: str = "operator") -> bool:
        """Register `group` as a durable subscription of `topic`; False if it already was.
        Until the group commits on a partition, nothing there counts as delivered."""
        return await self._registry.add(topic, group, source=source, now_ms=self._clock_ms())

    async def unsubscribe(self, topic: str, group: str) -> bool:
        """Stop counting `group`; the remaining subscriptions alone decide delivery now."""
        removed = await self._registry.remove(topic, group)
        config = await self._topics.get(topic)
        if config is None:
            return removed
        tps = [TopicPartition(topic, p) for p in range(config.partitions)]
        await self._queue.forget_commits(tps, group)
        remaining = sorted(await self._registry.groups(topic))
        if remaining:
            # Recount each partition's delivered mark from the remaining commits.
            await self._apply("", {tp: 0 for tp in tps}, {topic: remaining},
                              {topic: config.harden is HardenPolicy.SURVIVORS})
        return removed

    async def group_deleted(self, group: str) -> list[str]:
        """`group` was deleted (DeleteGroups). Where it registered itself (`auto`) it stops
        counting: its subscription is removed and the remaining ones decide delivery at
        once. A subscription an operator registered (configuration, CLI) stays, but its
        commits went with the group's offsets: until the group commits again, nothing on
        those partitions counts as delivered (records are hardened after the delay).
        Returns the topics whose subscription was removed."""
        removed = []
        for topic, groups in (await self._registry.all(fresh=True)).items():
            mine = groups.get(group)
            if mine is None:
                continue
            if mine.explicit:
                await self._forget(topic, group, None)
            elif await self.unsubscribe(topic, group):
                removed.append(topic)
                log.info("group %s deleted: no longer a durable subscription of %s", group,
                         topic)
        return removed

    async def offsets_deleted(self, group: str, tps: Sequence[TopicPartition]) -> None:
        """`group`'s committed offsets of `tps` were deleted (OffsetDelete): where it is a
        durable subscription, its commits there no longer count, until it commits again."""
        by_topic: dict[str, list[TopicPartition]] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append(tp)
        subscriptions = await self._registry.all(fresh=True)
        for topic, partitions in by_topic.items():
            if group in subscriptions.get(topic, {}):
                await self._forget(topic, group, partitions)

    async def _forget(self, topic: str, group: str,
                      tps: Sequence[TopicPartition] | None) -> None:
        """Drop `group`'s commits on `tps` (every partition of the topic when None); the
        delivered marks stay where they are, never moving back."""
        if tps is None:
            config = await self._topics.get(topic)
            if config is None:
                return
            tps = [TopicPartition(topic, p) for p in range(config.partitions)]
        await self._queue.forget_commits(tps, group)

    async def subscriptions(self) -> dict[str, dict[str, Subscription]]:
        return await self._registry.all(fresh=True)

    async def _apply(self, group: str, offsets: Mapping[TopicPartition, int],
                     durable: Mapping[str, Sequence[str]], drop: Mapping[str, bool]) -> None:
        # What was dropped is counted in Redis, per partition (LogQueue.deliver).
        results = await self._queue.deliver(group, offsets, durable, drop)
        now = self._clock_ms()
        for tp, result in results.items():
            self._waiters.settled(tp, result.incarnation, result.delivered_offset)
            if self._on_delivered is not None:
                self._on_delivered(tp, result.delivered_offset, now)
