"""Everything a handler needs, built once by the composition root (cli)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from proxy.limits import ListenerLimits, ListenerMemory
from storage.acks import AckOutcome
from storage.broker_configs import BrokerConfigs
from storage.catalog import Catalog
from storage.clock import wall_clock_ms
from storage.groups.coordinator import GroupCoordinator
from storage.log_queue import AppendRequest, AppendResult
from storage.model import TopicPartition
from storage.observability.metrics import KilnMetrics
from storage.producer_ids import ProducerIds
from storage.tiered_log import PartitionRead
from storage.topic_configs import TopicConfigs


@dataclass(frozen=True, slots=True)
class ServerSettings:
    node_id: int
    advertised_host: str
    advertised_port: int
    cluster_id: str = "kiln"
    max_frame_bytes: int = 100 * 1024 * 1024
    max_in_flight_per_connection: int = 64


class PartitionLog(Protocol):
    """A partition's records in Kiln offsets, whichever tier holds them (storage.tiered_log).
    Every method but `read` and the waits raises KafkaError with the code a client sees."""

    async def append(self, requests: Sequence[AppendRequest], sender: Hashable, now_ms: int
                     ) -> tuple[list[AppendResult], int]:
        """Results per request, and the throttle time in ms."""

    async def wait_for_appends(self, tps: Iterable[TopicPartition], timeout_s: float
                               ) -> bool: ...

    async def wait_settled(self, tp: TopicPartition, incarnation: str, last_offset: int,
                           timeout_s: float) -> AckOutcome:
        """Until `last_offset` of the partition's `incarnation` is safe for an assured ack."""

    async def read(self, tp: TopicPartition, offset: int, limit_bytes: int,
                   *, at_least_one: bool) -> PartitionRead: ...

    async def next_offset(self, tp: TopicPartition) -> int: ...

    async def log_start(self, tp: TopicPartition) -> int: ...

    async def delete_records(self, tp: TopicPartition, offset: int) -> int:
        """The log start after deleting below `offset`."""

    async def offset_for_timestamp(self, tp: TopicPartition, timestamp: int
                                   ) -> tuple[int, int] | None: ...

    async def max_timestamp(self, tp: TopicPartition) -> tuple[int, int] | None: ...


@dataclass
class KilnContext:
    settings: ServerSettings
    log: PartitionLog
    catalog: Catalog
    groups: GroupCoordinator
    producer_ids: ProducerIds
    # Configs through Kiln: a topic's (Kafka's and Kiln's `kiln.*`), and those of the Kafka
    # brokers Kiln's node stands for.
    topic_configs: TopicConfigs
    broker_configs: BrokerConfigs
    clock_ms: Callable[[], int] = wall_clock_ms
    metrics: KilnMetrics = field(default_factory=KilnMetrics)
    # What the listener may hold for its clients (requests, answers not yet taken).
    memory: ListenerMemory = field(default_factory=lambda: ListenerMemory(ListenerLimits()))
