"""A small Kafka client for the hardened store: metadata, topics, producer ids, produce, fetch.

Only what hardening needs, built on pipelined BrokerConnections (one per broker). Requests go
to the partition leader (or the transaction coordinator, or the controller); answers that
say the metadata is stale drop the cached leader so the next call looks it up again.

Error codes in answers become the storage layer's errors (storage.errors). Produce is
never retried here: a retry of one request while later ones are in flight would break
sequence order, so the caller recovers and rewrites instead.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from kafka.protocol.admin import (
    AlterConfigsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    IncrementalAlterConfigsRequest,
)
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import (
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    ProduceRequest,
)

from storage.errors import (
    HardenedStoreRejected,
    HardenedStoreUnavailable,
    HardenedTopicMissing,
    error_for,
    stale_metadata,
)
from storage.kafka.connection import BrokerConnection
from wire.apis import ApiKey, Message
from wire.errors import ErrorCode
from wire.records import record_set_end
from wire.txn_markers import committed_batches

log = logging.getLogger(__name__)

EARLIEST = -2
LATEST = -1
READ_UNCOMMITTED = 0  # Fetch isolation levels
READ_COMMITTED = 1
MAX_TIMESTAMP = -3
_MAX_TIMESTAMP_VERSION = 7  # the first ListOffsets version that knows MAX_TIMESTAMP
_TRANSACTION_COORDINATOR = 1
_COORDINATOR_ATTEMPTS = 10
# The Java producer's retry backoff for CONCURRENT_TRANSACTIONS on AddPartitionsToTxn.
_CONCURRENT_BACKOFF_S = 0.02
_COORDINATOR_BACKOFF_S = 0.1
_COORDINATOR_MAX_BACKOFF_S = 0.5  # 10 attempts: about 4 s, a new cluster's transaction log
_LEADER_POLL_S = 0.05
_READ_ATTEMPTS = 2
_ZERO_UUID = uuid.UUID(int=0)
_BROKER_RESOURCE = 4  # DescribeConfigs resource type of a broker


# Waits (ms) of the fetches that ask again after an empty answer below the high watermark.
_EMPTY_FETCH_RETRY_WAITS_MS = (10, 100)


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition_index: int
    leader_id: int
    leader_epoch: int
    error_code: int


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    error_code: int
    topic_id: uuid.UUID | None
    is_internal: bool
    partitions: tuple[PartitionInfo, ...]  # by partition_index

    @property
    def partition_count(self) -> int:
        return len(self.partitions)


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    cluster_id: str | None
    controller_id: int
    brokers: Mapping[int, BrokerInfo]
    topics: Mapping[str, TopicInfo]


@dataclass(frozen=True, slots=True)
class FetchResult:
    """One partition's fetch answer. error_code is NONE or OFFSET_OUT_OF_RANGE (others raise);
    `records` may hold several batches and end in a truncated one."""

    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    records: bytes
    # (producer_id, first_offset) of the aborted transactions overlapping `records`, as a
    # read_committed fetch lists them; empty for read_uncommitted.
    aborted_transactions: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class CommittedRead:
    """A read_committed fetch as a read_committed consumer sees it (committed_read()).

    `records` holds data batches only, so Kiln offsets increase along it even where an
    aborted lane transaction left copies of records that were written again later.
    `next_fetch_offset` still counts the batches left out: a reader that went by the last
    batch it kept would fetch the dropped ones again, for ever.
    """

    error_code: int
    records: bytes
    next_fetch_offset: int | None  # after the last whole batch fetched; None: there was none
    fetched: bool  # the broker answered with some bytes (a batch, or part of a large one)
    # The end of what read_committed readers see: records at or past it belong to open
    # transactions (high_watermark when the broker does not report one).
    last_stable_offset: int
    high_watermark: int
    log_start_offset: int


def committed_read(result: FetchResult) -> CommittedRead:
    """A read_committed FetchResult without control batches and aborted transactions'
    batches (wire.txn_markers.committed_batches, the Java consumer's algorithm); raises
    KafkaError for a control batch that cannot be read."""
    return CommittedRead(
        result.error_code,
        committed_batches(result.records, result.aborted_transactions),
        record_set_end(result.records),
        bool(result.records),
        _last_stable(result),
        result.high_watermark,
        result.log_start_offset,
    )


def _last_stable(result: FetchResult) -> int:
    """The answer's last stable offset; its high watermark where the broker left it out (-1)
    or reported one past it."""
    stable = result.last_stable_offset
    return stable if 0 <= stable <= result.high_watermark else result.high_watermark


@dataclass(frozen=True, slots=True)
class TopicCreation:
    """Kafka's answer to creating (or, validate_only, checking) one topic, refusals
    included: its error code and message are for the client that asked."""

    error_code: int
    error_message: str | None
    num_partitions: int  # -1 where Kafka did not say
    replication_factor: int  # -1 where Kafka did not say
    configs: tuple[DescribedConfig, ...]  # as CreateTopics v5+ describes them


@dataclass(frozen=True, slots=True)
class ConfigSynonym:
    name: str
    value: str | None
    source: int  # a ConfigSource id


@dataclass(frozen=True, slots=True)
class DescribedConfig:
    """One config as DescribeConfigs describes it (the fields of its latest version)."""

    name: str
    value: str | None
    read_only: bool
    config_source: int  # Kafka's ConfigSource id: 1 set on the topic, 5 the default, ...
    is_sensitive: bool
    synonyms: tuple[ConfigSynonym, ...] = ()  # only when asked for
    config_type: int = 0  # Kafka's ConfigType id; 0 unknown
    documentation: str | None = None  # only when asked for


@dataclass(frozen=True, slots=True)
class DescribedResource:
    """DescribeConfigs' answer for one resource: its configs, or the error instead."""

    error_code: int
    error_message: str | None
    configs: tuple[DescribedConfig, ...] = ()


def _described_resource(result: Any) -> DescribedResource:
    return DescribedResource(
        int(result.error_code), result.error_message,
        tuple(DescribedConfig(
            c.name, c.value, bool(c.read_only), int(getattr(c, "config_source", -1)),
            bool(c.is_sensitive),
            tuple(ConfigSynonym(s.name, s.value, int(s.source))
                  for s in getattr(c, "synonyms", None) or ()),
            int(getattr(c, "config_type", 0) or 0), getattr(c, "documentation", None))
            for c in result.configs or ()))


class PartitionEnds(NamedTuple):
    """Where a partition ends for read_uncommitted readers (high_watermark, the next offset
    a write lands at) and for read_committed ones (last_stable_offset: the first offset of
    the oldest open transaction, else the high watermark)."""

    high_watermark: int
    last_stable_offset: int


class ProduceResult(NamedTuple):
    """base_offset is the broker offset of the request's first record; -1 when the broker
    answered DUPLICATE_SEQUENCE_NUMBER (the records are already there)."""

    base_offset: int
    error_code: int


def parse_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    """"host:port[,host:port...]" (IPv6 hosts in brackets) as (host, port) pairs."""
    out: list[tuple[str, int]] = []
    for item in bootstrap.split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"bootstrap server {item!r} is not host:port")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("no bootstrap servers")
    return out


class PartitionSender:
    """Produce requests to one partition leader, written in call order on one connection.

    `send()` writes at once and returns an awaitable for the answer; await every one of
    them (in any order) so no failure goes unseen.
    """

    def __init__(self, client: KafkaClient, connection: BrokerConnection, topic: str,
                 partition: int) -> None:
        self._client = client
        self._connection = connection
        self.topic = topic
        self.partition = partition

    def send(self, records: bytes, *, acks: int = -1, timeout_ms: int = 30_000,
             transactional_id: str | None = None) -> asyncio.Future[Message]:
        body = ProduceRequest(
            transactional_id=transactional_id,
            acks=acks,
            timeout_ms=timeout_ms,
            topic_data=[ProduceRequest.TopicProduceData(
                name=self.topic,
                partition_data=[ProduceRequest.TopicProduceData.PartitionProduceData(
                    index=self.partition, records=records
                )],
            )],
        )
        try:
            return self._connection.send(ApiKey.PRODUCE, body)
        except HardenedStoreUnavailable:
            self._client.forget_leader(self.topic, self.partition)
            raise

    async def drain(self) -> None:
        await self._connection.drain()

    async def result(self, answer: asyncio.Future[Message]) -> ProduceResult:
        """The outcome of one `send()`; raises the storage error for a failed one."""
        try:
            response = await answer
        except HardenedStoreUnavailable:
            self._client.forget_leader(self.topic, self.partition)
            raise
        if response is None:  # acks=0
            return ProduceResult(-1, ErrorCode.NONE)
        part = response.responses[0].partition_responses[0]
        code = int(part.error_code)
        if code not in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
            detail = f" ({part.error_message})" if part.error_message else ""
            self._client._raise_for(code, self.topic, self.partition,
                                    f"produce to {self.topic}[{self.partition}]{detail}")
        return ProduceResult(int(part.base_offset), code)


class KafkaClient:
    def __init__(self, bootstrap: str, client_id: str = "kiln", *,
                 connect_timeout: float = 10.0, request_timeout: float = 45.0) -> None:
        self._bootstrap = parse_bootstrap(bootstrap)
        self._client_id = client_id
        self._connect_timeout = connect_timeout
        self._request_timeout = request_timeout
        self._brokers: dict[int, BrokerInfo] = {}
        self._controller_id = -1
        self._leaders: dict[tuple[str, int], int] = {}
        self._coordinators: dict[str, int] = {}
        self._connections: dict[int, BrokerConnection] = {}
        self._any: BrokerConnection | None = None  # for requests any broker may answer
        self._connect_lock = asyncio.Lock()
        # Not _connect_lock: a connection to a node is opened under it after Metadata,
        # which asks any broker.
        self._any_lock = asyncio.Lock()

    async def start(self) -> None:
        """Connect to a bootstrap server and learn the brokers."""
        meta = await self.metadata([])
        log.info("connected to Kafka cluster %s: %d broker(s)", meta.cluster_id, len(meta.brokers))

    async def close(self) -> None:
        connections = list(self._connections.values())
        if self._any is not None and self._any not in connections:
            connections.append(self._any)
        self._connections.clear()
        self._any = None
        for connection in connections:
            await connection.close()

    # --- metadata and topics -------------------------------------------------------------

    async def metadata(self, topics: list[str] | None) -> ClusterMetadata:
        """Brokers and the named topics (all topics for None; none for [])."""
        request = MetadataRequest(
            topics=None if topics is None else [
                MetadataRequest.MetadataRequestTopic(name=t) for t in topics
            ],
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
        response = await self._request_any(ApiKey.METADATA, request)
        brokers = {
            b.node_id: BrokerInfo(b.node_id, b.host, b.port, b.rack) for b in response.brokers
        }
        self._brokers.update(brokers)
        controller_id = getattr(response, "controller_id", None)  # v1+
        self._controller_id = -1 if controller_id is None else int(controller_id)
        infos: dict[str, TopicInfo] = {}
        for t in response.topics:
            partitions = tuple(sorted(
                (PartitionInfo(p.partition_index, p.leader_id,
                               int(getattr(p, "leader_epoch", -1)), p.error_code)
                 for p in t.partitions),
                key=lambda p: p.partition_index,
            ))
            topic_id = getattr(t, "topic_id", None)
            infos[t.name] = TopicInfo(
                t.name, t.error_code, topic_id if topic_id and topic_id.int else None,
                bool(getattr(t, "is_internal", False)), partitions,
            )
            for p in partitions:
                if p.error_code == ErrorCode.NONE and p.leader_id >= 0:
                    self._leaders[(t.name, p.partition_index)] = p.leader_id
                else:
                    self._leaders.pop((t.name, p.partition_index), None)
        return ClusterMetadata(
            getattr(response, "cluster_id", None), self._controller_id, brokers, infos
        )

    async def list_topics(self) -> dict[str, int]:
        """Topic name → partition count, leaving out internal topics (`__…`)."""
        meta = await self.metadata(None)
        return {
            name: info.partition_count
            for name, info in meta.topics.items()
            if not info.is_internal and not name.startswith("__") and info.error_code == 0
        }

    async def create_topic(self, name: str, partitions: int, replication_factor: int = -1,
                           configs: dict[str, str] | None = None,
                           timeout_ms: int = 30_000) -> bool:
        """Create a topic; False if it already exists (its settings are then not checked).
        Returns once every partition has a leader (Kafka elects them a moment after it
        answers), so a write right after it is not refused as NOT_LEADER_OR_FOLLOWER."""
        answer = await self.create_topic_as_requested(
            name, partitions, replication_factor, configs=configs, timeout_ms=timeout_ms)
        if answer.error_code == ErrorCode.TOPIC_ALREADY_EXISTS:
            return False
        if answer.error_code != ErrorCode.NONE:
            detail = f" ({answer.error_message})" if answer.error_message else ""
            raise error_for(answer.error_code, f"create topic {name}{detail}")
        return True

    async def create_topic_as_requested(
            self, name: str, partitions: int = -1, replication_factor: int = -1, *,
            assignments: Mapping[int, Sequence[int]] | None = None,
            configs: Mapping[str, str] | None = None, validate_only: bool = False,
            timeout_ms: int = 30_000) -> TopicCreation:
        """Create one topic as a client's CreateTopics names it (-1 partitions or
        replication factor: the cluster's defaults; `assignments`: partition -> brokers,
        with both -1) and return Kafka's answer, refusals included, for the caller to pass
        on; raises only when Kafka cannot be reached. A created topic is returned once
        every partition has a leader."""
        creatable = CreateTopicsRequest.CreatableTopic
        request = CreateTopicsRequest(
            topics=[creatable(
                name=name,
                num_partitions=partitions,
                replication_factor=replication_factor,
                assignments=[
                    creatable.CreatableReplicaAssignment(partition_index=index,
                                                         broker_ids=list(brokers))
                    for index, brokers in (assignments or {}).items()
                ],
                configs=[creatable.CreatableTopicConfig(name=k, value=v)
                         for k, v in (configs or {}).items()],
            )],
            timeout_ms=timeout_ms,
            validate_only=validate_only,
        )
        result = (await self._controller_request(ApiKey.CREATE_TOPICS, request)).topics[0]
        answer = TopicCreation(
            int(result.error_code), result.error_message,
            int(getattr(result, "num_partitions", -1)),
            int(getattr(result, "replication_factor", -1)),
            tuple(DescribedConfig(c.name, c.value, bool(c.read_only), int(c.config_source),
                                  bool(c.is_sensitive))
                  for c in getattr(result, "configs", None) or ()))
        if answer.error_code == ErrorCode.NONE and not validate_only:
            log.info("created topic %s with %d partition(s)", name, answer.num_partitions)
            await self._await_leaders(name, timeout_ms / 1000, answer.num_partitions)
        return answer

    async def create_partitions(self, name: str, count: int, *,
                                assignments: Sequence[Sequence[int]] | None = None,
                                validate_only: bool = False,
                                timeout_ms: int = 30_000) -> tuple[int, str | None]:
        """Grow a topic to `count` partitions (`assignments`: the brokers of each new one)
        and return Kafka's (error code, message) for the caller to pass on; raises only
        when Kafka cannot be reached. Returns once every new partition has a leader."""
        grown = CreatePartitionsRequest.CreatePartitionsTopic
        request = CreatePartitionsRequest(
            topics=[grown(name=name, count=count, assignments=None if assignments is None else [
                grown.CreatePartitionsAssignment(broker_ids=list(brokers))
                for brokers in assignments])],
            timeout_ms=timeout_ms,
            validate_only=validate_only,
        )
        result = (await self._controller_request(ApiKey.CREATE_PARTITIONS,
                                                 request)).results[0]
        code = int(result.error_code)
        if code == ErrorCode.NONE and not validate_only:
            log.info("topic %s now has %d partitions", name, count)
            await self._await_leaders(name, timeout_ms / 1000, count)
        return code, result.error_message

    async def delete_topic(self, name: str, timeout_ms: int = 30_000
                           ) -> tuple[int, str | None]:
        """Delete a topic by name and return Kafka's (error code, message); raises only when
        Kafka cannot be reached. Returns once the broker's metadata no longer lists the
        topic, so a listing taken afterwards does not show it."""
        request = DeleteTopicsRequest(
            topics=[DeleteTopicsRequest.DeleteTopicState(name=name, topic_id=_ZERO_UUID)],
            topic_names=[name],  # below v6
            timeout_ms=timeout_ms,
        )
        result = (await self._controller_request(ApiKey.DELETE_TOPICS, request)).responses[0]
        code = int(result.error_code)
        if code == ErrorCode.NONE:
            log.info("deleted topic %s", name)
            await self._await_gone(name, timeout_ms / 1000)
        return code, getattr(result, "error_message", None)

    async def broker_configs(self, names: Sequence[str]) -> dict[str, str | None]:
        """The named configs of the broker with the lowest id, as it describes them (Kafka
        answers DescribeConfigs for a broker resource only on that broker)."""
        meta = await self.metadata([])
        if not meta.brokers:
            raise HardenedStoreUnavailable("the cluster lists no brokers")
        node = min(meta.brokers)
        [result] = await self.describe_configs([(_BROKER_RESOURCE, str(node), names)],
                                               include_synonyms=False,
                                               include_documentation=False, node_id=node)
        if result.error_code != ErrorCode.NONE:
            raise error_for(result.error_code, f"configs of broker {node}")
        return {c.name: c.value for c in result.configs}

    # --- configs, relayed for clients of Kiln ----------------------------------------------

    async def broker_ids(self) -> list[int]:
        """The ids of the cluster's brokers, lowest first."""
        return sorted((await self.metadata([])).brokers)

    async def describe_configs(self, resources: Sequence[tuple[int, str, Sequence[str] | None]],
                               *, include_synonyms: bool, include_documentation: bool,
                               node_id: int | None = None) -> list[DescribedResource]:
        """Kafka's DescribeConfigs answers for (resource type, name, keys or None for all),
        one per resource in their order, as Kafka gives them (refusals included) for the
        caller to relay. Asked of broker `node_id` (a broker describes its own configs
        only), else of any broker; raises only when Kafka cannot be reached."""
        request = DescribeConfigsRequest(
            resources=[DescribeConfigsRequest.DescribeConfigsResource(
                resource_type=kind, resource_name=name,
                configuration_keys=None if keys is None else list(keys))
                for kind, name, keys in resources],
            include_synonyms=include_synonyms,
            include_documentation=include_documentation,
        )
        response = await self._config_request(ApiKey.DESCRIBE_CONFIGS, request, node_id)
        results = [_described_resource(result) for result in response.results]
        if len(results) != len(resources):
            raise HardenedStoreRejected(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"DescribeConfigs: {len(resources)} resources asked, {len(results)} answered")
        return results

    async def alter_configs(self, resource_type: int, resource_name: str,
                            configs: Mapping[str, str | None], *, validate_only: bool,
                            node_id: int | None = None) -> tuple[int, str | None]:
        """AlterConfigs of one resource (its whole set of dynamic configs replaced by
        `configs`); Kafka's (error code, message) for the caller to pass on. Raises only
        when Kafka cannot be reached."""
        entry = AlterConfigsRequest.AlterConfigsResource
        request = AlterConfigsRequest(
            resources=[entry(resource_type=resource_type, resource_name=resource_name,
                             configs=[entry.AlterableConfig(name=k, value=v)
                                      for k, v in configs.items()])],
            validate_only=validate_only,
        )
        response = await self._config_request(ApiKey.ALTER_CONFIGS, request, node_id)
        result = response.responses[0]
        return int(result.error_code), result.error_message

    async def incremental_alter_configs(
            self, resource_type: int, resource_name: str,
            configs: Sequence[tuple[str, int, str | None]], *, validate_only: bool,
            node_id: int | None = None) -> tuple[int, str | None]:
        """IncrementalAlterConfigs of one resource: (name, operation, value) each; Kafka's
        (error code, message) for the caller to pass on. Raises only when Kafka cannot be
        reached."""
        entry = IncrementalAlterConfigsRequest.AlterConfigsResource
        request = IncrementalAlterConfigsRequest(
            resources=[entry(resource_type=resource_type, resource_name=resource_name,
                             configs=[entry.AlterableConfig(name=name, config_operation=op,
                                                            value=value)
                                      for name, op, value in configs])],
            validate_only=validate_only,
        )
        response = await self._config_request(ApiKey.INCREMENTAL_ALTER_CONFIGS, request,
                                               node_id)
        result = response.responses[0]
        return int(result.error_code), result.error_message

    async def _config_request(self, api_key: ApiKey, body: Message, node_id: int | None
                              ) -> Any:
        if node_id is None:
            return await self._request_any(api_key, body)
        connection = await self._connection(node_id)
        return await connection.request(api_key, body)

    async def _controller_request(self, api_key: ApiKey, body: Message) -> Any:
        """An admin request (topics, partitions), to the controller as far as known: a
        KRaft broker forwards it there anyway."""
        await self.metadata([])  # learn the current controller
        connection = await self._controller_connection()
        return await connection.request(api_key, body)

    async def _await_leaders(self, topic: str, timeout_s: float, partitions: int = -1) -> None:
        """Until every partition (at least `partitions` of them) has a leader, and the leader
        knows it: a broker's metadata names a new partition's leader a moment before that
        leader serves the partition, and a write in between is refused with
        NOT_LEADER_OR_FOLLOWER. So each leader is asked for the partition's end until none
        answers that its metadata is stale."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        info = await self._await_topic(
            topic, timeout_s, "a leader for every partition", lambda info: (
                info is not None and info.error_code == ErrorCode.NONE
                and info.partition_count >= max(partitions, 1)
                and all(p.leader_id >= 0 and p.error_code == ErrorCode.NONE
                        for p in info.partitions)))
        waiting = [p.partition_index for p in info.partitions if p.leader_id >= 0] \
            if info is not None else []
        while waiting:
            answers = await asyncio.gather(*(self._list_offsets(topic, p, LATEST)
                                             for p in waiting))
            waiting = [p for p, answer in zip(waiting, answers, strict=True)
                       if stale_metadata(answer.error_code)]
            for p in waiting:
                self.forget_leader(topic, p)
            if waiting and asyncio.get_running_loop().time() >= deadline:
                log.warning("topic %s: partitions %s not served by their leaders after %.0f s",
                            topic, waiting, timeout_s)
                return
            if waiting:
                await asyncio.sleep(_LEADER_POLL_S)

    async def _await_gone(self, topic: str, timeout_s: float) -> None:
        """Until the broker's metadata no longer lists `topic`; its cached leaders are
        forgotten."""
        await self._await_topic(topic, timeout_s, "the deleted topic to go", lambda info: (
            info is None or info.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
        for key in [key for key in self._leaders if key[0] == topic]:
            del self._leaders[key]

    async def _await_topic(self, topic: str, timeout_s: float, what: str,
                           done: Callable[[TopicInfo | None], bool]) -> TopicInfo | None:
        """Until `done` holds for the broker's metadata of `topic` (it follows the controller
        a moment behind), or `timeout_s` has passed; the metadata last seen."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not done(info := (await self.metadata([topic])).topics.get(topic)):
            if asyncio.get_running_loop().time() >= deadline:
                log.warning("topic %s: waited %.0f s in vain for %s", topic, timeout_s, what)
                break
            await asyncio.sleep(_LEADER_POLL_S)
        return info

    # --- producer ids ------------------------------------------------------------------------

    async def init_producer_id(self, transactional_id: str | None,
                               transaction_timeout_ms: int) -> tuple[int, int]:
        """(producer_id, producer_epoch). With a transactional id this bumps its epoch, which
        fences every earlier holder of the id at the coordinator (partition leaders learn
        the new epoch only from a write or a marker: see fence_partition)."""
        request = InitProducerIdRequest(
            transactional_id=transactional_id,
            transaction_timeout_ms=transaction_timeout_ms,
            producer_id=-1,
            producer_epoch=-1,
        )
        response = await self._coordinator_request(
            transactional_id, ApiKey.INIT_PRODUCER_ID, request,
            f"InitProducerId for {transactional_id!r}")
        return int(response.producer_id), int(response.producer_epoch)

    async def fence_partition(self, transactional_id: str, producer_id: int,
                              producer_epoch: int, topic: str, partition: int) -> None:
        """Make the partition's leader refuse every write of an epoch older than
        `producer_epoch`: a transaction over the partition, aborted at once, has the
        coordinator write an abort marker there at that epoch. (It takes one offset.) The
        marker is written after EndTxn answers; the next InitProducerId for the id waits
        for it (CONCURRENT_TRANSACTIONS until then)."""
        await self.add_partitions_to_txn(transactional_id, producer_id, producer_epoch,
                                         [(topic, partition)])
        await self.end_txn(transactional_id, producer_id, producer_epoch, commit=False)

    async def add_partitions_to_txn(self, transactional_id: str, producer_id: int,
                                    producer_epoch: int,
                                    partitions: Sequence[tuple[str, int]]) -> None:
        """Add partitions to the producer's transaction (starting it), as a transactional
        producer does before its first write to each (transactions V1). Asked again, as the
        Java producer does, while the coordinator still writes the markers of the producer's
        previous transaction (CONCURRENT_TRANSACTIONS, per partition)."""
        what = f"adding {len(partitions)} partitions to the transaction of {transactional_id!r}"
        by_topic: dict[str, list[int]] = {}
        for topic, partition in partitions:
            by_topic.setdefault(topic, []).append(partition)
        request = AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=transactional_id,
            v3_and_below_producer_id=producer_id,
            v3_and_below_producer_epoch=producer_epoch,
            v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(
                name=topic, partitions=numbers) for topic, numbers in by_topic.items()])
        for attempt in range(1, _COORDINATOR_ATTEMPTS + 1):
            added = await self._coordinator_request(
                transactional_id, ApiKey.ADD_PARTITIONS_TO_TXN, request, what)
            refused = [(result.name, answer.partition_index, answer.partition_error_code)
                       for result in added.results_by_topic_v3_and_below
                       for answer in result.results_by_partition
                       if answer.partition_error_code != ErrorCode.NONE]
            if not refused:
                return
            topic, partition, code = next(
                (r for r in refused if r[2] != ErrorCode.CONCURRENT_TRANSACTIONS), refused[0])
            if code != ErrorCode.CONCURRENT_TRANSACTIONS or attempt == _COORDINATOR_ATTEMPTS:
                raise error_for(code, f"{what} ({topic}[{partition}])")
            await asyncio.sleep(_CONCURRENT_BACKOFF_S * attempt)

    async def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, *,
                      commit: bool) -> None:
        """Commit or abort the producer's transaction. Answered once the decision is logged;
        Kafka writes the markers after that (the next InitProducerId or AddPartitionsToTxn
        meets CONCURRENT_TRANSACTIONS until they are written, and is asked again)."""
        await self._coordinator_request(
            transactional_id, ApiKey.END_TXN, EndTxnRequest(
                transactional_id=transactional_id, producer_id=producer_id,
                producer_epoch=producer_epoch, committed=commit),
            f"{'committing' if commit else 'aborting'} the transaction of {transactional_id!r}")

    async def _coordinator_request(self, transactional_id: str | None, api_key: ApiKey,
                                   request: Message, what: str) -> Any:
        """A request to the transaction coordinator of `transactional_id` (any broker when
        None), asked again while the coordinator moves, loads or finishes an earlier
        transaction (soon over)."""
        for attempt in range(1, _COORDINATOR_ATTEMPTS + 1):
            try:
                if transactional_id is None:
                    connection = await self._any_connection()
                else:
                    # COORDINATOR_NOT_AVAILABLE while a new cluster creates its
                    # transaction log: retried like the answers below.
                    connection = await self._coordinator_connection(transactional_id)
                response: Any = await connection.request(api_key, request)
                code = int(getattr(response, "error_code", ErrorCode.NONE))
                if code == ErrorCode.NONE:
                    return response
                raise error_for(code, what)
            except HardenedStoreUnavailable as error:
                if transactional_id is not None:
                    self._coordinators.pop(transactional_id, None)
                if attempt == _COORDINATOR_ATTEMPTS:
                    raise
                log.debug("%s: %s; retrying", what, error)
                await asyncio.sleep(min(_COORDINATOR_MAX_BACKOFF_S,
                                        _COORDINATOR_BACKOFF_S * attempt))
        raise AssertionError("unreachable")

    # --- produce and fetch -------------------------------------------------------------------

    async def finalized_features(self) -> dict[str, int]:
        """The cluster-wide finalized features a broker reports (name: max version level);
        an Apache Kafka broker in KRaft mode finalizes at least `metadata.version`."""
        return dict((await self._any_connection()).finalized_features)

    async def partition_sender(self, topic: str, partition: int) -> PartitionSender:
        """A sender bound to the partition's current leader."""
        return PartitionSender(self, await self._leader_connection(topic, partition), topic,
                               partition)

    async def produce_together(self, batches: Sequence[tuple[str, int, bytes]], *,
                               transactional_id: str | None = None,
                               timeout_ms: int = 30_000) -> list[ProduceResult]:
        """One batch for each of several partitions (each named once), acks=all, in one
        Produce request per leader, as a producer sends them: a broker handles one request of
        a connection at a time, and verifies a transactional request's partitions with its
        transaction coordinator together. The results in the order given; once every answer
        is in, raises the storage error of the first partition that failed."""
        groups: dict[int, tuple[BrokerConnection, list[int]]] = {}
        for index, (topic, partition, _) in enumerate(batches):
            connection = await self._leader_connection(topic, partition)
            groups.setdefault(id(connection), (connection, []))[1].append(index)
        answers = []
        for connection, indexes in groups.values():
            by_topic: dict[str, list[ProduceRequest.TopicProduceData.PartitionProduceData]] = {}
            for index in indexes:
                topic, partition, records = batches[index]
                by_topic.setdefault(topic, []).append(
                    ProduceRequest.TopicProduceData.PartitionProduceData(index=partition,
                                                                         records=records))
            body = ProduceRequest(transactional_id=transactional_id, acks=-1,
                                  timeout_ms=timeout_ms,
                                  topic_data=[ProduceRequest.TopicProduceData(name=topic,
                                                                              partition_data=data)
                                              for topic, data in by_topic.items()])
            answers.append(self._produce_answer(connection, body, [batches[i][:2]
                                                                   for i in indexes]))
        found: dict[tuple[str, int], ProduceResult] = {}
        failure: BaseException | None = None
        for outcome in await asyncio.gather(*answers, return_exceptions=True):
            if isinstance(outcome, BaseException):
                failure = failure or outcome
            else:
                found.update(outcome)
        codes = [(topic, partition, found[topic, partition].error_code)
                 for topic, partition, _ in batches if (topic, partition) in found]
        for topic, partition, code in codes:
            if code not in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
                self._raise_for(code, topic, partition, f"produce to {topic}[{partition}]")
        if failure is not None:
            raise failure
        return [found[topic, partition] for topic, partition, _ in batches]

    async def _produce_answer(self, connection: BrokerConnection, body: Message,
                              tps: Sequence[tuple[str, int]]
                              ) -> dict[tuple[str, int], ProduceResult]:
        try:
            response = await connection.request(ApiKey.PRODUCE, body)
        except HardenedStoreUnavailable:
            for topic, partition in tps:
                self.forget_leader(topic, partition)
            raise
        return {(str(topic.name), int(part.index)): ProduceResult(int(part.base_offset),
                                                                  int(part.error_code))
                for topic in response.responses for part in topic.partition_responses}

    async def produce(self, topic: str, partition: int, records: bytes, acks: int = -1,
                      timeout_ms: int = 30_000) -> ProduceResult:
        """Produce one record batch; (base_offset, error_code) with error_code NONE or
        DUPLICATE_SEQUENCE_NUMBER, any other answer raises. Apache Kafka refuses (with
        INVALID_RECORD) a Produce v3+ request holding more than one batch per partition;
        tansu accepts it."""
        sender = await self.partition_sender(topic, partition)
        answer = sender.send(records, acks=acks, timeout_ms=timeout_ms)
        await sender.drain()
        return await sender.result(answer)

    async def fetch(self, topic: str, partition: int, offset: int, max_bytes: int,
                    max_wait_ms: int = 1, *, isolation_level: int = READ_UNCOMMITTED
                    ) -> FetchResult:
        """Records from `offset`. A broker returns at least one whole batch however small
        max_bytes is; max_wait_ms=0 makes tansu answer empty, so keep it ≥ 1. READ_COMMITTED
        stops at the last stable offset and lists the aborted transactions among the records
        (which it does not leave out: see committed_read).

        tansu 0.6 now and then answers empty below its high watermark (about 1 fetch in 400
        at max_wait_ms 1 or 5); such an answer is asked again, waiting longer (a broker
        answers at once when records are there). A read_committed fetch at or past the last
        stable offset is empty by right, and not asked again."""
        for wait_ms in (max_wait_ms, *_EMPTY_FETCH_RETRY_WAITS_MS):
            result = await self._fetch_once(topic, partition, offset, max_bytes, wait_ms,
                                            isolation_level)
            end = (_last_stable(result) if isolation_level == READ_COMMITTED
                   else result.high_watermark)
            if result.records or result.error_code or offset >= end:
                break
        return result

    async def fetch_committed(self, topic: str, partition: int, offset: int, max_bytes: int,
                              max_wait_ms: int = 1) -> CommittedRead:
        """Records from `offset` as a read_committed consumer reads them (committed_read)."""
        return committed_read(await self.fetch(topic, partition, offset, max_bytes, max_wait_ms,
                                               isolation_level=READ_COMMITTED))

    async def _fetch_once(self, topic: str, partition: int, offset: int, max_bytes: int,
                          max_wait_ms: int, isolation_level: int = READ_UNCOMMITTED
                          ) -> FetchResult:
        request = FetchRequest(
            replica_id=-1,
            max_wait_ms=max_wait_ms,
            min_bytes=1,
            max_bytes=max_bytes,
            isolation_level=isolation_level,
            session_id=0,
            session_epoch=-1,
            topics=[FetchRequest.FetchTopic(
                topic=topic,
                partitions=[FetchRequest.FetchTopic.FetchPartition(
                    partition=partition,
                    current_leader_epoch=-1,
                    fetch_offset=offset,
                    last_fetched_epoch=-1,
                    log_start_offset=-1,
                    partition_max_bytes=max_bytes,
                )],
            )],
            forgotten_topics_data=[],
            rack_id="",
        )
        response = await self._leader_request(topic, partition, ApiKey.FETCH, request)
        top_code = int(getattr(response, "error_code", 0) or 0)  # v7+ only
        if top_code:
            raise error_for(top_code, f"fetch {topic}[{partition}]")
        part = response.responses[0].partitions[0]
        code = int(part.error_code)
        if code != ErrorCode.OFFSET_OUT_OF_RANGE:
            self._raise_for(code, topic, partition, f"fetch {topic}[{partition}] at {offset}")
        aborted = tuple((int(txn.producer_id), int(txn.first_offset))
                        for txn in getattr(part, "aborted_transactions", None) or ())
        return FetchResult(code, int(part.high_watermark), int(part.last_stable_offset),
                           int(part.log_start_offset), bytes(part.records or b""), aborted)

    async def list_offset(self, topic: str, partition: int, timestamp: int, *,
                          isolation_level: int = READ_UNCOMMITTED) -> int:
        """ListOffsets for one partition (EARLIEST, LATEST or a timestamp). tansu 0.6 answers
        LATEST wrongly; use high_watermark() for the end of a partition."""
        part = await self._list_offsets(topic, partition, timestamp, isolation_level)
        self._raise_for(part.error_code, topic, partition, f"list offsets of {topic}[{partition}]")
        return int(part.offset)

    async def _list_offsets(self, topic: str, partition: int, timestamp: int,
                            isolation_level: int = READ_UNCOMMITTED) -> Message:
        """One partition's ListOffsets answer, asked of its leader."""
        request = ListOffsetsRequest(
            replica_id=-1,
            isolation_level=isolation_level,
            topics=[ListOffsetsRequest.ListOffsetsTopic(
                name=topic,
                partitions=[ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                    partition_index=partition, current_leader_epoch=-1, timestamp=timestamp
                )],
            )],
        )
        response = await self._leader_request(topic, partition, ApiKey.LIST_OFFSETS, request)
        return response.topics[0].partitions[0]

    def _raise_for(self, code: int, topic: str, partition: int, context: str) -> None:
        """A partition-level error of a leader's answer as a storage error (forgetting the
        leader where the error says it moved)."""
        if code == ErrorCode.NONE:
            return
        if stale_metadata(code):
            self.forget_leader(topic, partition)
        raise error_for(code, context)

    async def high_watermark(self, topic: str, partition: int) -> int:
        """The partition's high watermark, as a Fetch answer reports it."""
        return (await self.partition_ends(topic, partition)).high_watermark

    async def partition_ends(self, topic: str, partition: int) -> PartitionEnds:
        """The partition's high watermark and last stable offset, from one Fetch answer (so
        they agree with each other).

        The fetch starts at ListOffsets' idea of the end, so on Kafka it moves no records
        and on tansu (whose LATEST falls short) only the last batch.
        """
        hint = await self.list_offset(topic, partition, LATEST)
        result = await self.fetch(topic, partition, max(hint, 0), max_bytes=1)
        if result.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
            start = await self.list_offset(topic, partition, EARLIEST)
            result = await self.fetch(topic, partition, start, max_bytes=1)
            if result.error_code != ErrorCode.NONE:
                raise error_for(result.error_code, f"high watermark of {topic}[{partition}]")
        return PartitionEnds(result.high_watermark, _last_stable(result))

    async def max_timestamp(self, topic: str, partition: int) -> tuple[int, int]:
        """(offset, timestamp) of the record with the largest timestamp, as Kafka's
        ListOffsets v7+ answers MAX_TIMESTAMP (-3, KIP-734); (-1, -1) for an empty partition.
        Kafka counts control batches (a fence's abort marker) too."""
        connection = await self._leader_connection(topic, partition)
        if connection.version(ApiKey.LIST_OFFSETS) < _MAX_TIMESTAMP_VERSION:
            raise HardenedStoreRejected(ErrorCode.UNSUPPORTED_VERSION,
                                        f"{topic}[{partition}]: no ListOffsets v7")
        part = await self._list_offsets(topic, partition, MAX_TIMESTAMP)
        self._raise_for(part.error_code, topic, partition, f"max timestamp of {topic}[{partition}]")
        return int(part.offset), int(part.timestamp)

    async def delete_records(self, topic: str, partition: int, offset: int,
                             timeout_ms: int = 30_000) -> int:
        """Move the partition's log start offset up to `offset` (DeleteRecords; a no-op at or
        below it); returns the low watermark. Safe to ask again: it only ever moves up."""
        request = DeleteRecordsRequest(
            topics=[DeleteRecordsRequest.DeleteRecordsTopic(
                name=topic,
                partitions=[DeleteRecordsRequest.DeleteRecordsTopic.DeleteRecordsPartition(
                    partition_index=partition, offset=offset)],
            )],
            timeout_ms=timeout_ms,
        )
        response = await self._leader_request(topic, partition, ApiKey.DELETE_RECORDS, request)
        part = response.topics[0].partitions[0]
        self._raise_for(part.error_code, topic, partition,
                        f"delete records below {offset} of {topic}[{partition}]")
        return int(part.low_watermark)

    # --- routing -----------------------------------------------------------------------------

    def forget_leader(self, topic: str, partition: int) -> None:
        """Look the partition's leader up again before the next request to it."""
        self._leaders.pop((topic, partition), None)

    async def _leader_request(self, topic: str, partition: int, api_key: ApiKey,
                              body: Message) -> Message:
        """A read-only request to the leader, tried again once after a connection failure."""
        for attempt in range(1, _READ_ATTEMPTS + 1):
            connection = await self._leader_connection(topic, partition)
            try:
                return await connection.request(api_key, body)
            except HardenedStoreUnavailable:
                self.forget_leader(topic, partition)
                if attempt == _READ_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    async def _leader_connection(self, topic: str, partition: int) -> BrokerConnection:
        leader = self._leaders.get((topic, partition))
        if leader is None:
            meta = await self.metadata([topic])
            info = meta.topics.get(topic)
            if info is None or info.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                raise HardenedTopicMissing(f"Kafka has no topic {topic}")
            if info.error_code != ErrorCode.NONE:
                raise error_for(info.error_code, f"metadata for {topic}")
            if not 0 <= partition < info.partition_count:
                raise HardenedStoreRejected(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"{topic} has {info.partition_count} partitions, not {partition + 1}",
                )
            part = info.partitions[partition]
            if part.error_code != ErrorCode.NONE:
                raise error_for(part.error_code, f"metadata for {topic}[{partition}]")
            leader = self._leaders.get((topic, partition))
            if leader is None:
                raise error_for(ErrorCode.LEADER_NOT_AVAILABLE, f"{topic}[{partition}]")
        return await self._connection(leader)

    async def _coordinator_connection(self, transactional_id: str) -> BrokerConnection:
        node = self._coordinators.get(transactional_id)
        if node is None:
            node = await self._find_coordinator(transactional_id)
            self._coordinators[transactional_id] = node
        return await self._connection(node)

    async def _find_coordinator(self, transactional_id: str) -> int:
        connection = await self._any_connection()
        if connection.version(ApiKey.FIND_COORDINATOR) >= 4:
            request = FindCoordinatorRequest(key_type=_TRANSACTION_COORDINATOR,
                                             coordinator_keys=[transactional_id])
            response = await connection.request(ApiKey.FIND_COORDINATOR, request)
            answer: Any = response.coordinators[0]
        else:
            request = FindCoordinatorRequest(key_type=_TRANSACTION_COORDINATOR,
                                             key=transactional_id)
            answer = await connection.request(ApiKey.FIND_COORDINATOR, request)
        if answer.error_code != ErrorCode.NONE:
            raise error_for(answer.error_code, f"find coordinator of {transactional_id!r}")
        self._brokers.setdefault(
            answer.node_id, BrokerInfo(answer.node_id, answer.host, answer.port, None)
        )
        return int(answer.node_id)

    async def _controller_connection(self) -> BrokerConnection:
        if self._controller_id in self._brokers:
            return await self._connection(self._controller_id)
        return await self._any_connection()

    async def _connection(self, node_id: int) -> BrokerConnection:
        connection = self._connections.get(node_id)
        if connection is not None and not connection.closed:
            return connection
        async with self._connect_lock:
            connection = self._connections.get(node_id)
            if connection is not None and not connection.closed:
                return connection
            broker = self._brokers.get(node_id)
            if broker is None:
                await self.metadata([])
                broker = self._brokers.get(node_id)
                if broker is None:
                    raise HardenedStoreUnavailable(f"broker {node_id} is not in the metadata")
            try:
                connection = await self._open(broker.host, broker.port)
            except HardenedStoreUnavailable:
                # Its partitions have probably moved; look them up again next time.
                for key, leader in list(self._leaders.items()):
                    if leader == node_id:
                        del self._leaders[key]
                raise
            self._connections[node_id] = connection
            return connection

    async def _any_connection(self) -> BrokerConnection:
        """A connection to some broker: an open one, else the bootstrap servers in turn.
        One caller at a time opens it: callers that each opened one would leave all but the
        last open and unreferenced (its socket never closed, its read task collected while
        pending)."""
        if self._any is not None and not self._any.closed:
            return self._any
        async with self._any_lock:
            if self._any is not None and not self._any.closed:
                return self._any
            return await self._open_any()

    async def _open_any(self) -> BrokerConnection:
        for connection in self._connections.values():
            if not connection.closed:
                self._any = connection
                return connection
        candidates = self._bootstrap + [(b.host, b.port) for b in self._brokers.values()]
        failure: HardenedStoreUnavailable | None = None
        for host, port in candidates:
            try:
                self._any = await self._open(host, port)
                return self._any
            except HardenedStoreUnavailable as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def _request_any(self, api_key: ApiKey, body: Message) -> Message:
        for attempt in range(1, _READ_ATTEMPTS + 1):
            connection = await self._any_connection()
            try:
                return await connection.request(api_key, body)
            except HardenedStoreUnavailable:
                if attempt == _READ_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    async def _open(self, host: str, port: int) -> BrokerConnection:
        return await BrokerConnection.open(
            host, port, client_id=self._client_id, connect_timeout=self._connect_timeout,
            request_timeout=self._request_timeout,
        )
