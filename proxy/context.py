"""Everything a handler needs, built once by the composition root (cli)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from proxy.limits import ListenerLimits, ListenerMemory
from proxy.peer import LISTENER_NAME
from storage.acks import AckOutcome
from storage.broker_configs import BrokerConfigs
from storage.catalog import CreatedTopic, DeletedTopic
from storage.clock import wall_clock_ms
from storage.groups.consumer_group import ConsumerGroup
from storage.groups.consumer_model import ConsumerHeartbeat, HeartbeatResult
from storage.groups.coordinator import GroupListing, OffsetDeletion, TopicDirectory
from storage.groups.model import (
    CommittedOffset,
    GroupSummary,
    JoinRequest,
    JoinResult,
    MemberIdentity,
    SyncRequest,
    SyncResult,
)
from storage.log_queue import AppendRequest, AppendResult
from storage.model import TopicPartition
from storage.nodes import KilnNode
from storage.observability.metrics import KilnMetrics
from storage.producer_ids import ProducerIds
from storage.tiered_log import PartitionRead
from storage.topic_configs import TopicConfigs
from storage.topics import TopicConfig
from storage.transactions.coordinator import ProducerIdAnswer
from storage.transactions.state import TxnState
from wire.errors import ErrorCode, KafkaError


@dataclass(frozen=True, slots=True)
class ServerSettings:
    node_id: int
    advertised_host: str
    advertised_port: int
    cluster_id: str = "kiln"
    max_frame_bytes: int = 100 * 1024 * 1024
    max_in_flight_per_connection: int = 64
    # (listener name, host, port) this node gives clients of each listener; (): the
    # advertised address on every listener.
    advertised_listeners: tuple[tuple[str, str, int], ...] = ()


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
                   *, at_least_one: bool, committed_only: bool = False) -> PartitionRead:
        """With `committed_only` (read_committed), nothing from the last stable offset on,
        and the aborted transactions among the records listed."""

    async def next_offset(self, tp: TopicPartition, *, committed_only: bool = False) -> int:
        """The high watermark, or with `committed_only` the last stable offset."""

    async def log_start(self, tp: TopicPartition) -> int: ...

    async def delete_records(self, tp: TopicPartition, offset: int) -> int:
        """The log start after deleting below `offset`."""

    async def offset_for_timestamp(self, tp: TopicPartition, timestamp: int
                                   ) -> tuple[int, int] | None: ...

    async def max_timestamp(self, tp: TopicPartition) -> tuple[int, int] | None: ...


class Topics(Protocol):
    """Topics as clients see them through Kiln, kept in step with Kafka (storage.catalog).
    Administration raises KafkaError with the code a client sees."""

    async def lookup(self, name: str, *, allow_create: bool) -> TopicConfig | None:
        """The topic, adopted from Kafka or auto-created where allowed; None if unknown."""

    async def has_partition(self, tp: TopicPartition) -> bool: ...

    async def all(self) -> dict[str, TopicConfig]: ...

    async def was_deleted(self, name: str) -> bool:
        """Whether a deletion of the topic is remembered (False when Redis cannot say)."""

    async def create_and_describe(
            self, name: str, partitions: int | None, *, require_kafka: bool,
            validate_only: bool = False, configs: Mapping[str, str | None] | None = None,
            replication_factor: int = -1,
            assignments: Mapping[int, Sequence[int]] | None = None) -> CreatedTopic: ...

    async def add_partitions(self, name: str, count: int, *,
                             assignments: Sequence[Sequence[int]] | None = None,
                             validate_only: bool = False, timeout_ms: int = 30_000) -> None: ...

    async def delete(self, name: str, *, timeout_ms: int = 30_000) -> DeletedTopic: ...


class Groups(Protocol):
    """Consumer groups and their committed offsets (storage.groups.coordinator). Raises
    StorageError when the group store cannot be reached (storage.errors maps it)."""

    async def join(self, request: JoinRequest) -> asyncio.Future[JoinResult]: ...

    async def sync(self, request: SyncRequest) -> asyncio.Future[SyncResult]: ...

    async def heartbeat(self, group_id: str, member_id: str, group_instance_id: str | None,
                        generation_id: int) -> ErrorCode: ...

    async def leave(self, group_id: str, leaving: Sequence[MemberIdentity]
                    ) -> list[ErrorCode]: ...

    async def describe(self, group_id: str) -> GroupSummary: ...

    async def list_groups(self) -> list[GroupListing]: ...

    async def delete_group(self, group_id: str) -> ErrorCode: ...

    async def consumer_heartbeat(self, request: ConsumerHeartbeat,
                                 topics: TopicDirectory) -> HeartbeatResult: ...

    async def describe_consumer_group(self, group_id: str) -> ConsumerGroup | None: ...

    async def commit_offsets(self, group_id: str, generation_id: int, member_id: str,
                             group_instance_id: str | None,
                             offsets: Mapping[TopicPartition, CommittedOffset],
                             version: int = 8) -> dict[TopicPartition, ErrorCode]: ...

    async def validate_fetch(self, group_id: str, member_id: str | None,
                             member_epoch: int) -> ErrorCode: ...

    async def validate_transactional_commit(
            self, group_id: str, generation_id: int, member_id: str,
            group_instance_id: str | None, tps: Sequence[TopicPartition], version: int
            ) -> dict[TopicPartition, ErrorCode]:
        """The partitions a TxnOffsetCommit may not commit, with why."""

    async def fetch_offsets(self, group_id: str, tps: Sequence[TopicPartition] | None
                            ) -> dict[TopicPartition, CommittedOffset]: ...

    async def delete_offsets(self, group_id: str, tps: Sequence[TopicPartition]
                             ) -> OffsetDeletion: ...


class Cluster(Protocol):
    """The Kiln nodes clients are told of as brokers, which of them leads each partition and
    which coordinates each group (storage.leadership)."""

    def brokers(self) -> Sequence[KilnNode]:
        """The live nodes."""

    def leader(self, tp: TopicPartition) -> int: ...

    def leads(self, tp: TopicPartition) -> bool:
        """Whether this node leads `tp`."""

    def silent(self, node_id: int) -> bool:
        """Whether that live node stopped renewing its registration (not dead yet)."""

    def coordinator(self, group_id: str) -> int: ...

    def transaction_coordinator(self, transactional_id: str) -> int: ...


class Transactions(Protocol):
    """Kafka transactions (storage.transactions.coordinator). Each method answers with the
    code Kafka's transaction coordinator would (NOT_COORDINATOR on a node that does not
    coordinate the id)."""

    async def init_producer_id(self, transactional_id: str, timeout_ms: int,
                               producer_id: int, producer_epoch: int) -> ProducerIdAnswer: ...

    async def add_partitions(self, transactional_id: str, producer_id: int,
                             producer_epoch: int, tps: Sequence[TopicPartition]
                             ) -> ErrorCode: ...

    async def end_transaction(self, transactional_id: str, producer_id: int,
                              producer_epoch: int, commit: bool) -> ErrorCode: ...

    async def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          group_id: str) -> ErrorCode: ...

    async def stage_offsets(self, group_id: str, producer_id: int, producer_epoch: int,
                            offsets: Mapping[TopicPartition, CommittedOffset]) -> ErrorCode:
        """TxnOffsetCommit's offsets, kept until the producer's transaction ends."""

    async def unstable_partitions(self, group_id: str) -> set[TopicPartition]:
        """The group's partitions with offsets waiting for a transaction to end."""

    async def describe(self, transactional_id: str) -> tuple[ErrorCode, TxnState | None]: ...

    async def coordinated(self) -> list[TxnState]:
        """The ids this node coordinates, with their states."""


@dataclass
class KilnContext:
    settings: ServerSettings
    log: PartitionLog
    topics: Topics
    groups: Groups
    cluster: Cluster
    producer_ids: ProducerIds
    # Configs through Kiln: a topic's (Kafka's and Kiln's `kiln.*`), and those of the Kafka
    # brokers Kiln's node stands for.
    topic_configs: TopicConfigs
    broker_configs: BrokerConfigs
    # None: transactions are off (settings.transactions_enabled).
    transactions: Transactions | None = None
    clock_ms: Callable[[], int] = wall_clock_ms
    metrics: KilnMetrics = field(default_factory=KilnMetrics)
    # What the listener may hold for its clients (requests, answers not yet taken).
    memory: ListenerMemory = field(default_factory=lambda: ListenerMemory(ListenerLimits()))

    def brokers(self) -> dict[int, tuple[str, int]]:
        """The address of every live node by id on the listener the request came in on, this
        one's always among them; a node without that listener is left out, as Kafka leaves
        out brokers without the client's listener."""
        name = LISTENER_NAME.get()
        known = {n.node_id: address for n in self.cluster.brokers()
                 if (address := _address_on(n.listeners, name, (n.host, n.port))) is not None}
        own = self.settings
        primary = (own.advertised_host, own.advertised_port)
        known.setdefault(own.node_id,
                         _address_on(own.advertised_listeners, name, primary) or primary)
        return dict(sorted(known.items()))

    async def check_partition(self, tp: TopicPartition) -> None:
        """Raises KafkaError unless `tp` exists and this node leads it, with the code a Kafka
        broker answers: UNKNOWN_TOPIC_OR_PARTITION, then NOT_LEADER_OR_FOLLOWER."""
        if not await self.topics.has_partition(tp):
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, tp.topic)
        if not self.cluster.leads(tp):
            raise self.not_leader(tp)

    def not_leader(self, tp: TopicPartition) -> KafkaError:
        return KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER,
                          f"node {self.cluster.leader(tp)} leads {tp.topic}/{tp.partition}")


def _address_on(listeners: Sequence[tuple[str, str, int]], name: str,
                primary: tuple[str, int]) -> tuple[str, int] | None:
    """A node's address on listener `name` ("" or a node that names none: its primary one);
    None when it has listeners but not that one."""
    if not listeners or not name:
        return primary
    return next(((host, port) for listener, host, port in listeners if listener == name), None)
