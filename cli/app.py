"""The composition root: builds Kiln's parts from Settings, starts and stops them in order."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid

from cli.settings import Settings
from proxy.server.context import KilnContext, ServerSettings
from proxy.server.listener import Listener
from storage.acks import SettledWaiters
from storage.appends import AppendSignals
from storage.budget import BufferBudget
from storage.catalog import Catalog, CatalogSettings
from storage.delivery import Delivery
from storage.errors import StorageError
from storage.groups.coordinator import GroupCoordinator
from storage.groups.model import MembershipSettings
from storage.groups.store import GroupStore
from storage.hardener import Hardener, HardenerSettings
from storage.kafka.client import KafkaClient
from storage.log_queue import LogQueue
from storage.policy.delay import FixedDelay
from storage.read_through import ColdReader
from storage.subscriptions import SubscriptionRegistry
from storage.topics import TopicRegistry

log = logging.getLogger(__name__)


class StartupError(Exception):
    """Kiln cannot start; the message is for the operator."""


class KilnApp:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.queue = LogQueue.from_url(settings.redis_url)
        self.kafka = KafkaClient(settings.kafka_bootstrap, client_id=f"kiln-{settings.node_id}")
        self.catalog = Catalog(
            TopicRegistry(self.queue.redis),
            self.queue,
            self.kafka,
            CatalogSettings(auto_create_topics=settings.auto_create_topics,
                            default_partitions=settings.default_partitions),
        )
        self.waiters = SettledWaiters(self.queue)
        self.budget = BufferBudget(self.queue, self.catalog, settings.buffer_budget_bytes)
        self.hardener = Hardener(
            self.queue, self.catalog, self.kafka, FixedDelay(settings.harden_delay_ms),
            self.waiters, HardenerSettings(owner=f"kiln-{settings.node_id}-{uuid.uuid4().hex}"),
        )
        self.delivery = Delivery(self.queue, self.catalog.registry,
                                 SubscriptionRegistry(self.queue.redis), self.waiters)
        # Reads get their own connections: a large fetch must not hold up hardening writes,
        # and an unreachable Kafka should fail a consumer's read quickly.
        self.cold_kafka = KafkaClient(settings.kafka_bootstrap,
                                      client_id=f"kiln-{settings.node_id}-read",
                                      connect_timeout=3.0, request_timeout=15.0)
        self.cold = ColdReader(self.cold_kafka)
        self.groups = GroupCoordinator(GroupStore.from_url(settings.redis_url), MembershipSettings(
            initial_rebalance_delay_ms=settings.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=settings.group_min_session_timeout_ms,
            max_session_timeout_ms=settings.group_max_session_timeout_ms,
        ))
        self.appends = AppendSignals()
        self.appends.add_listener(self.hardener.appended)
        host, port = settings.advertised_address
        self.context = KilnContext(
            settings=ServerSettings(node_id=settings.node_id, advertised_host=host,
                                    advertised_port=port,
                                    max_frame_bytes=settings.max_frame_bytes),
            queue=self.queue, catalog=self.catalog, waiters=self.waiters, budget=self.budget,
            delivery=self.delivery, appends=self.appends, groups=self.groups,
            cold=self.cold,
        )
        listen_host, listen_port = settings.listen_address
        self.listener = Listener(self.context, listen_host, listen_port)

    @property
    def port(self) -> int:
        return self.listener.port

    async def start(self) -> None:
        """Check both stores answer, then start hardening and accepting clients."""
        try:
            await self.queue.ping()
        except StorageError as exc:
            raise StartupError(f"cannot reach Redis at {self.settings.redis_url}: "
                               f"{exc.__cause__ or exc}") from exc
        try:
            await self.kafka.start()
        except StorageError as exc:
            raise StartupError(f"cannot reach Kafka at {self.settings.kafka_bootstrap}: "
                               f"{exc.message}") from exc
        for topic, group in self.settings.subscriptions:
            if await self.delivery.subscribe(topic, group, source="config"):
                log.info("durable subscription %s of topic %s registered from the configuration",
                         group, topic)
        self.budget.start()
        self.hardener.start()
        await self.listener.start()
        if self.settings.advertise == "" and self.settings.listen_address[1] == 0:
            # Listening on port 0 (tests): advertise the port actually bound.
            self.context.settings = dataclasses.replace(self.context.settings,
                                                        advertised_port=self.port)

    async def drain(self, timeout_s: float = 60.0) -> bool:
        """Planned shutdown: stop accepting, harden every buffered persistent record."""
        await self.listener.stop_accepting()
        hardened = await self.hardener.flush(timeout_s=timeout_s)
        if not hardened:
            log.error("drain: not everything could be hardened within %.0fs", timeout_s)
        return hardened

    async def close(self) -> None:
        await self.listener.close()
        await self.groups.stop()
        await self.hardener.stop()
        await self.budget.stop()
        await self.waiters.close()
        await self.kafka.close()
        await self.cold.close()
        await self.cold_kafka.close()
        await self.queue.close()

    async def run_until(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.close()
