"""The composition root: builds Kiln's parts from Settings, starts and stops them in order."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
from pathlib import Path

from cli.settings import SASL_PLAINTEXT, SASL_PROTOCOLS, TLS_PROTOCOLS, Settings
from proxy.authentication import SaslSettings
from proxy.context import KilnContext, ServerSettings
from proxy.http_endpoints import HttpEndpoints
from proxy.limits import ConnectionSlots, ListenerLimits, ListenerMemory
from proxy.listener import Listener
from proxy.tls import TlsConfigError, TlsFiles, server_context
from storage import faults
from storage.acks import SettledWaiters
from storage.appends import AppendSignals
from storage.broker_configs import BrokerConfigs, kiln_broker_configs
from storage.budget import BufferBudget
from storage.catalog import Catalog, CatalogSettings, forget_topic_state
from storage.clock import wall_clock_ms
from storage.delay_control import DelayControl
from storage.delivery import Delivery
from storage.errors import StorageError
from storage.groups.consumer_model import ConsumerGroupSettings
from storage.groups.coordinator import GroupCoordinator
from storage.groups.model import MembershipSettings
from storage.groups.store import GroupStore
from storage.hardener import Hardener, HardenerSettings
from storage.kafka.client import KafkaClient
from storage.lane import HardeningLane, LaneSettings
from storage.lane_store import LANE, LaneStore
from storage.leadership import Leadership
from storage.log_queue import LogQueue
from storage.nodes import AUTO_NODE_ID, Membership, NodeIdTaken, NodeSettings
from storage.observability.buffer import BufferSnapshot
from storage.observability.metrics import KilnMetrics
from storage.observability.readiness import Readiness
from storage.operator_requests import drain_requested
from storage.policy.adaptive import DelayLimits
from storage.policy.observer import DelayObserver
from storage.producer_ids import ProducerIds
from storage.read_through import ColdReader
from storage.redis_eviction import eviction_risk
from storage.security.credentials import CredentialStore
from storage.subscriptions import SubscriptionRegistry
from storage.tiered_log import TieredLog
from storage.topic_configs import TopicConfigs
from storage.topics import TopicRegistry
from storage.transactions.coordinator import TransactionCoordinator
from storage.transactions.participants import TransactionParticipants
from storage.transactions.store import TxnStore

log = logging.getLogger(__name__)

# Planned shutdown: how long requests being handled (a fetch's long poll) may take to finish,
# and how long clients get to take the answers owed to them after the final flush.
_REQUESTS_FINISH_S = 10.0
_ANSWERS_SENT_S = 10.0


class StartupError(Exception):
    """Kiln cannot start; the message is for the operator."""


class KilnApp:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        faults.arm(settings.crash_at)
        self.queue = LogQueue.from_url(settings.redis_url)
        self.membership = Membership(self.queue.redis, NodeSettings(
            heartbeat_ms=settings.node_heartbeat_ms,
            session_timeout_ms=settings.node_session_timeout_ms))
        self.leadership = Leadership(self.queue.redis, self.membership,
                                     fresh_within_s=settings.node_session_timeout_ms / 1000,
                                     silent_after_ms=silent_after_ms(settings))
        self.membership.on_view_change(self._nodes_changed)
        # Kafka sees Kiln's connections under these names (the node id once it is given).
        name = f"kiln-{settings.node_id}" if settings.node_id != AUTO_NODE_ID else "kiln"
        self.kafka = KafkaClient(settings.kafka_bootstrap, client_id=name)
        self.catalog = Catalog(
            TopicRegistry(self.queue.redis),
            self.queue,
            self.kafka,
            CatalogSettings(auto_create_topics=settings.auto_create_topics,
                            default_partitions=settings.default_partitions),
        )
        self.waiters = SettledWaiters(self.queue)
        self.budget = BufferBudget(self.queue, self.catalog, settings.buffer_budget_bytes)
        # This process's hardening leases are held under its node incarnation, so that one a
        # dead node held is taken over as soon as the node is seen dead.
        owner = self.membership.incarnation
        subscriptions = SubscriptionRegistry(self.queue.redis)
        fixed = settings.harden_delay_ms if settings.delay_policy == "fixed" else None
        self.delay = DelayObserver(delay_limits(settings), fixed_delay_ms=fixed)
        self.delay_control = DelayControl(
            self.delay, budget=self.budget, waiters=self.waiters, catalog=self.catalog,
            subscriptions=subscriptions, redis=self.queue.redis, node=owner,
            peers=lambda: [n.incarnation for n in self.membership.live_nodes()],
        )
        self.hardener = Hardener(self.queue, self.catalog, self.kafka, self.delay, self.waiters,
                                 HardenerSettings(owner=owner), subscriptions,
                                 buffer_fill=lambda: self.budget.fill,
                                 leads=self.leadership.leads,
                                 live_owners=lambda: [
                                     n.incarnation for n in self.membership.live_nodes()])
        self.delivery = Delivery(self.queue, self.catalog.registry, subscriptions, self.waiters,
                                 on_delivered=self.delay.delivered)
        # Reads get their own connections: a large fetch must not hold up hardening writes,
        # and an unreachable Kafka should fail a consumer's read quickly.
        self.cold_kafka = KafkaClient(settings.kafka_bootstrap,
                                      client_id=f"{name}-read",
                                      connect_timeout=3.0, request_timeout=15.0)
        self.cold = ColdReader(self.cold_kafka)
        group_store = GroupStore.from_url(settings.redis_url)
        self.groups = GroupCoordinator(group_store, MembershipSettings(
            initial_rebalance_delay_ms=settings.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=settings.group_min_session_timeout_ms,
            max_session_timeout_ms=settings.group_max_session_timeout_ms,
        ), consumer_settings=ConsumerGroupSettings(
            session_timeout_ms=settings.group_consumer_session_timeout_ms,
            heartbeat_interval_ms=settings.group_consumer_heartbeat_interval_ms,
        ), offsets_listener=self.delivery, coordinates=self.leadership.coordinates)
        forget_topic_state(self.catalog, subscriptions, group_store)
        self.metrics = KilnMetrics()
        # Partitions that carry transactions are hardened together, by one node. One store
        # for the lane and the coordinator: an assured commit waits for the lane's settle,
        # told at once when the lane runs in this process.
        lane_store = LaneStore(self.queue.redis, on_committed=self._lane_woken)
        self.lane = (HardeningLane(
            self.queue, lane_store, self.catalog, self.kafka, self.delay,
            self.waiters, LaneSettings(owner=owner), subscriptions, self.hardener.counters,
            runs_here=lambda: self.leadership.runs_lane(LANE),
            buffer_fill=lambda: self.budget.fill,
            live_owners=lambda: [n.incarnation for n in self.membership.live_nodes()])
            if settings.transactions_enabled else None)
        self.transactions = (TransactionCoordinator(
            TxnStore(self.queue.redis), TransactionParticipants(self.queue.redis),
            self.catalog.starts, self.catalog, ProducerIds(self.queue.redis),
            coordinates=self.leadership.coordinates_transactions,
            lane=lane_store,
            offsets_listener=self.delivery, ended=self.metrics)
            if settings.transactions_enabled else None)
        appends = AppendSignals()
        appends.add_listener(self.hardener.appended)
        host, port = settings.advertised_address
        self.context = KilnContext(
            settings=ServerSettings(node_id=settings.node_id, advertised_host=host,
                                    advertised_port=port,
                                    max_frame_bytes=settings.max_frame_bytes,
                                    advertised_listeners=_advertised(settings)),
            log=TieredLog(self.queue, self.cold, self.catalog.starts, self.waiters,
                          self.budget, self.delay, self.metrics, appends, self.leadership),
            topics=self.catalog, groups=self.groups, cluster=self.leadership,
            producer_ids=ProducerIds(self.queue.redis), metrics=self.metrics,
            transactions=self.transactions,
            memory=ListenerMemory(listener_limits(settings)),
            topic_configs=TopicConfigs(self.catalog, self.kafka),
            broker_configs=self._broker_configs(settings.node_id),
        )
        tls = _tls_context(settings)
        sasl = SaslSettings(
            settings.sasl_mechanisms, CredentialStore(self.queue.redis),
            authentication_timeout_s=settings.authentication_timeout_ms / 1000,
            max_preauth_frame_bytes=settings.max_preauth_frame_bytes,
            failed_delay_s=settings.failed_authentication_delay_ms / 1000)
        slots = ConnectionSlots(self.context.memory.limits)
        self.listeners = [
            Listener(self.context, listener.host, listener.port, name=listener.name,
                     tls=tls if listener.protocol in TLS_PROTOCOLS else None,
                     tls_handshake_timeout_s=settings.tls_handshake_timeout_ms / 1000,
                     slots=slots, sasl=sasl if listener.protocol in SASL_PROTOCOLS else None)
            for listener in settings.kafka_listeners]
        for listener in settings.kafka_listeners:
            if listener.protocol == SASL_PLAINTEXT and "PLAIN" in settings.sasl_mechanisms:
                log.warning("listener %s takes PLAIN passwords without TLS: anyone on the "
                            "path reads them", listener)
        # Metrics: collectors read, when scraped, what the parts count anyway.
        self.metrics.watch_hardener(self.hardener.counters)
        self.metrics.watch_buffer(BufferSnapshot(self.queue, self.catalog.registry))
        self.metrics.set_delay_source(lambda: {
            topic: (d.delay_ms, str(d.binding)) for topic, d in self.delay.current().items()})
        # Readiness probes Kafka on a connection of its own, with short timeouts, so that a
        # probe never waits behind hardening writes.
        self.probe_kafka = KafkaClient(settings.kafka_bootstrap,
                                       client_id=f"{name}-probe",
                                       connect_timeout=2.0, request_timeout=2.0)
        self.readiness = Readiness({"redis": self.queue.ping, "node": self.membership.check,
                                    "kafka": lambda: self.probe_kafka.metadata([])})
        self.http = (HttpEndpoints(self.metrics, self.readiness, *settings.http_address)
                     if settings.http_address is not None else None)

    def _lane_woken(self) -> None:
        """A transaction was committed through this node: the lane, if it runs here, looks
        at once (an assured commit waits for it)."""
        if self.lane is not None:
            self.lane.wake()

    def _broker_configs(self, node_id: int) -> BrokerConfigs:
        return BrokerConfigs(self.kafka, node_id,
                             kiln_broker_configs(node_id, self.catalog.settings))

    @property
    def node_id(self) -> int:
        return self.settings.node_id

    @property
    def port(self) -> int:
        """The first listener's bound port."""
        return self.listeners[0].port

    def listener_port(self, name: str) -> int:
        """The bound port of the listener named `name` (as in `listeners`)."""
        return next(listener.port for listener in self.listeners if listener.name == name)

    @property
    def http_port(self) -> int:
        """The bound port of the HTTP endpoints (http_listen must not be off)."""
        assert self.http is not None, "http_listen is off"
        return self.http.port

    async def start(self) -> None:
        """Check both stores answer, then start hardening and accepting clients."""
        try:
            await self.queue.ping()
        except StorageError as exc:
            raise StartupError(f"cannot reach Redis at {self.settings.shown_redis_url}: "
                               f"{exc.__cause__ or exc}") from exc
        risk = await eviction_risk(self.queue.redis)
        if risk is not None:
            raise StartupError(f"{risk} (Redis at {self.settings.shown_redis_url})")
        await self._register_node()
        try:
            await self.kafka.start()
        except StorageError as exc:
            raise StartupError(f"cannot reach Kafka at {self.settings.kafka_bootstrap}: "
                               f"{exc.message}") from exc
        if self.transactions is not None and not await self._kafka_hardens_transactions():
            self._transactions_off()
        for topic, group in self.settings.subscriptions:
            if await self.delivery.subscribe(topic, group, source="config"):
                log.info("durable subscription %s of topic %s registered from the configuration",
                         group, topic)
        self.budget.start()
        self.delay_control.start()
        self.hardener.start()
        if self.lane is not None:
            self.lane.start()
        if self.transactions is not None:
            self.transactions.start()
        if self.http is not None:
            try:
                await self.http.start()
            except OSError as exc:
                raise StartupError(f"cannot listen on {self.settings.http_listen} "
                                   f"(http_listen): {exc}") from exc
        for listener in self.listeners:
            await listener.start()
        self._advertise_bound_ports()
        served = self.context.settings
        self.membership.bound(served.advertised_host, served.advertised_port, self._http_text(),
                              served.advertised_listeners)
        await self.membership.heartbeat()
        self.membership.start()

    def _advertise_bound_ports(self) -> None:
        """Listeners on port 0 (tests) advertised as such are advertised at the port they
        bound."""
        bound = {listener.name: listener.port for listener in self.listeners}
        advertised = tuple((name, host, bound[name] if port == 0 else port)
                           for name, host, port in self.context.settings.advertised_listeners)
        first = advertised[0]
        self.context.settings = dataclasses.replace(
            self.context.settings, advertised_listeners=advertised, advertised_host=first[1],
            advertised_port=first[2])

    async def _kafka_hardens_transactions(self) -> bool:
        """Whether the hardened store is an Apache Kafka broker (KRaft: it finalizes
        `metadata.version`), whose transactions the hardening lane writes into. tansu runs
        transactions but, after a crash, shows aborted records to read_committed readers
        (docs/services.md, "Transactions"), so Kiln transactions hardened there would not
        stay whole."""
        try:
            features = await self.kafka.finalized_features()
        except StorageError as exc:
            raise StartupError(f"cannot reach Kafka at {self.settings.kafka_bootstrap}: "
                               f"{exc.message}") from exc
        return "metadata.version" in features

    def _transactions_off(self) -> None:
        log.warning("transactions are off: Kafka at %s finalizes no metadata.version, so it "
                    "is not an Apache Kafka broker whose transactions Kiln can harden into "
                    "(transactional producers get COORDINATOR_NOT_AVAILABLE; set "
                    "transactions_enabled = false to say so)", self.settings.kafka_bootstrap)
        self.lane = None
        self.transactions = None
        self.context.transactions = None

    async def _register_node(self) -> None:
        """Take this node's id (storage/nodes.py) before anything is told to clients."""
        host, port = self.settings.advertised_address
        try:
            node_id = await self.membership.register(self.settings.node_id, host, port,
                                                     listeners=_advertised(self.settings))
        except NodeIdTaken as exc:
            raise StartupError(f"node_id: {exc.message}") from exc
        except StorageError as exc:
            raise StartupError(f"cannot register the node in Redis: {exc.message}") from exc
        log.info("registered as node %d", node_id)
        if node_id != self.settings.node_id:
            self.settings = dataclasses.replace(self.settings, node_id=node_id)
            self.context.settings = dataclasses.replace(self.context.settings, node_id=node_id)
            self.context.broker_configs = self._broker_configs(node_id)

    async def _nodes_changed(self) -> None:
        """Another node came or went: let go of the partitions and groups placed elsewhere
        now (their new owners take them on their clients' next requests), and start
        hardening the partitions placed here."""
        await self.leadership.rebalance()
        self.groups.forget_uncoordinated()
        self.hardener.leadership_changed()

    def _http_text(self) -> str:
        """HOST:PORT of the HTTP endpoints as bound, "" when off."""
        address = self.settings.http_address
        return "" if address is None or self.http is None else f"{address[0]}:{self.http.port}"

    async def watch_drain_requests(self, stop: asyncio.Event, poll_s: float = 1.0) -> None:
        """Set `stop` when an operator asks this process to drain (`kiln drain`)."""
        started_ms = wall_clock_ms()
        while not stop.is_set():
            try:
                if await drain_requested(self.queue.redis, started_ms):
                    log.info("drain requested through Redis: planned shutdown")
                    stop.set()
                    return
            except StorageError as exc:
                log.debug("cannot check for drain requests: %s", exc)
            await asyncio.sleep(poll_s)

    async def drain(self, timeout_s: float = 60.0) -> bool:
        """Planned shutdown: stop accepting connections and reading requests (those being
        handled finish), harden every buffered persistent record, then let the connections
        write the answers they owe (assured produces settle with the flush)."""
        for listener in self.listeners:
            await listener.stop_accepting()
        connections = sum(await asyncio.gather(*(
            listener.stop_reading(timeout_s=_REQUESTS_FINISH_S) for listener in self.listeners)))
        log.info("drain: %d connections read no more requests; hardening", connections)
        hardened = await self.hardener.flush(timeout_s=timeout_s)
        if not hardened:
            log.error("drain: not everything could be hardened within %.0fs", timeout_s)
        sent = await asyncio.gather(*(listener.answers_sent(timeout_s=_ANSWERS_SENT_S)
                                      for listener in self.listeners))
        if not all(sent):
            log.warning("drain: some clients did not take their answers within %.0fs",
                        _ANSWERS_SENT_S)
        return hardened

    async def close(self) -> None:
        await self.membership.stop()
        if self.http is not None:
            await self.http.close()
        await self.readiness.close()
        await self.probe_kafka.close()
        for listener in self.listeners:
            await listener.close()
        await self.groups.stop()
        if self.transactions is not None:
            await self.transactions.stop()
        if self.lane is not None:
            await self.lane.stop()
        await self.hardener.stop()
        await self.delay_control.stop()
        await self.budget.stop()
        await self.waiters.close()
        await self.kafka.close()
        await self.cold.close()
        await self.cold_kafka.close()
        await self.queue.close()


def listener_limits(settings: Settings) -> ListenerLimits:
    return ListenerLimits(
        max_request_bytes=settings.max_request_bytes,
        max_answer_bytes_per_connection=settings.max_answer_bytes_per_connection,
        max_answer_bytes=settings.max_answer_bytes,
        max_fetch_bytes=settings.max_fetch_bytes,
        frame_read_timeout_s=settings.frame_read_timeout_ms / 1000,
        idle_timeout_s=settings.connections_max_idle_ms / 1000,
        max_connections=settings.max_connections,
        max_connections_per_host=settings.max_connections_per_host,
    )


def delay_limits(settings: Settings) -> DelayLimits:
    return DelayLimits(
        min_delay_ms=settings.min_delay_ms, max_delay_ms=settings.max_delay_ms,
        initial_delay_ms=settings.harden_delay_ms,
        risk_budget_bytes=settings.risk_budget_bytes,
        risk_budget_records=settings.risk_budget_records,
        sender_budget_s=settings.sender_budget_s,
        memory_budget_bytes=settings.buffer_budget_bytes or 2**62,
        max_ack_delay_ms=settings.max_ack_delay_ms,
    )


def silent_after_ms(settings: Settings) -> int:
    """How long a live node may go without renewing its registration before its partitions
    and groups are reported unavailable: two heartbeats, and never less than one heartbeat
    and a second (a busy event loop renews late). At or past the session timeout it never
    applies: the node is dead first."""
    heartbeat = settings.node_heartbeat_ms
    return max(2 * heartbeat, heartbeat + 1_000)


def _advertised(settings: Settings) -> tuple[tuple[str, str, int], ...]:
    """(listener name, host, port) clients of each listener are given, in `listeners`'
    order (port 0: the one the listener binds, filled in once bound)."""
    return tuple((name, host, port)
                 for name, (host, port) in settings.advertised_listener_addresses.items())


def _tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The SSL listeners' server context (proxy/tls.py); None without any."""
    if all(listener.protocol not in TLS_PROTOCOLS for listener in settings.kafka_listeners):
        return None
    password = None
    if settings.ssl_key_password_file:
        try:
            password = Path(settings.ssl_key_password_file).read_text().rstrip("\r\n")
        except OSError as exc:
            raise StartupError(f"ssl_key_password_file: {exc}") from exc
    try:
        return server_context(TlsFiles(settings.ssl_certificate_file, settings.ssl_key_file,
                                       password, settings.ssl_ca_file,
                                       settings.ssl_client_auth))
    except TlsConfigError as exc:
        raise StartupError(f"SSL listener: {exc}") from exc
