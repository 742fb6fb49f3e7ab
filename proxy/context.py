"""Everything a handler needs, built once by the composition root (cli)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.limits import ListenerLimits, ListenerMemory
from storage.acks import SettledWaiters
from storage.appender import Appender
from storage.appends import AppendSignals
from storage.broker_configs import BrokerConfigs
from storage.budget import BufferBudget
from storage.catalog import Catalog
from storage.clock import wall_clock_ms
from storage.delivery import Delivery
from storage.groups.coordinator import GroupCoordinator
from storage.log_queue import LogQueue
from storage.observability.metrics import KilnMetrics
from storage.policy.observer import DelayObserver
from storage.read_through import ColdReader
from storage.topic_configs import TopicConfigs


@dataclass(frozen=True, slots=True)
class ServerSettings:
    node_id: int
    advertised_host: str
    advertised_port: int
    cluster_id: str = "kiln"
    max_frame_bytes: int = 100 * 1024 * 1024
    max_in_flight_per_connection: int = 64


@dataclass
class ServerCounters:
    requests_by_api: Counter[str] = field(default_factory=Counter)
    records_in: int = 0
    bytes_in: int = 0
    connections: int = 0
    malformed_frames: int = 0


@dataclass
class KilnContext:
    settings: ServerSettings
    queue: LogQueue
    appender: Appender  # appends, starting partitions Redis lost from what Kafka holds
    catalog: Catalog
    waiters: SettledWaiters
    budget: BufferBudget
    cold: ColdReader  # reads below the log queue from the hardened Kafka topic
    delivery: Delivery
    groups: GroupCoordinator
    delay: DelayObserver  # told about every append (senders, rates, append times)
    # Configs through Kiln: a topic's (Kafka's and Kiln's `kiln.*`), and those of the Kafka
    # brokers Kiln's node stands for.
    topic_configs: TopicConfigs
    broker_configs: BrokerConfigs
    appends: AppendSignals = field(default_factory=AppendSignals)
    clock_ms: Callable[[], int] = wall_clock_ms
    counters: ServerCounters = field(default_factory=ServerCounters)
    metrics: KilnMetrics = field(default_factory=KilnMetrics)
    # What the listener may hold for its clients (requests, answers not yet taken).
    memory: ListenerMemory = field(default_factory=lambda: ListenerMemory(ListenerLimits()))
