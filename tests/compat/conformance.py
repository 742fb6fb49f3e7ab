"""Kiln's answers compared with Apache Kafka's, request by request: the connections, the
builders and the normalisation behind tests/compat/test_conformance.py.

A builder (`BUILDERS`, keyed by API key; `EDGE_CASES` for requests to refuse) drives one side
of one case: it makes what the case needs on that side (topics, records, group members,
through `Case` helpers whose answers are not compared) and yields the requests whose answers
are compared, all at the version under test. The same builder runs against Kiln and against
Apache Kafka, so both get the same requests except for the resource names: each side has its
own (`Case.name`), of the same length, because Kiln hardens into that very Kafka and a topic
created through Kiln is one of Kafka's topics too.

Answers are compared after `Normaliser`, whose rules (`FIELD_RULES`, `API_RULES`) are the only
differences allowed, each with its reason. Error codes are never normalised, nor the length
of an array, but for entries a rule names as not the case's own (other cases' groups, Kiln's
`kiln.*` configs, records before the fetch offset): a difference there is a Kiln bug, marked
where it is known (tests/compat/test_conformance.py), never hidden here.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from kafka.protocol.admin import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from kafka.protocol.api_header import RequestHeader
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from kafka.record.memory_records import MemoryRecords

from wire.consumer_groups import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
)

CLIENT_ID = "kiln-conformance"
ZERO_UUID = uuid.UUID(int=0)
API_VERSIONS_KEY = 18
# Long enough for a join that waits for Kiln's 100 ms initial rebalance delay and Kafka's
# group.min.session.timeout.ms (6 s by default), short enough that nothing waits on it.
SESSION_TIMEOUT_MS = 10_000
# The first record's timestamp; each next record's is one millisecond later.
FIRST_TIMESTAMP = 1_700_000_000_000

# Error codes the setup helpers step through (Kafka's numbering).
NONE = 0
MEMBER_ID_REQUIRED = 79

# Config resource types (DescribeConfigs, AlterConfigs, IncrementalAlterConfigs).
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4


# --- the connections ---------------------------------------------------------------------------


class SetupFailed(AssertionError):
    """What a case needs could not be made on one side: not the comparison failing."""


class ServerClosed(Exception):
    """The server closed the connection where an answer was due."""


class Wire:
    """One connection to one server, used for every request of the module; reopened after
    the server closed it, each close recorded with the request it cut off."""

    def __init__(self, name: str, bootstrap: str, timeout_s: float = 30) -> None:
        self.name = name
        self.bootstrap = bootstrap
        self._timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._correlation_id = 0
        self.closed_on: list[str] = []

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def request(self, message: Any, version: int, response: Any) -> Any:
        """`message` sent at `version`; its answer decoded with `response` (None when no
        answer is due: Produce with acks=0)."""
        correlation_id = self._next_correlation_id()
        message.with_header(correlation_id=correlation_id, client_id=CLIENT_ID)
        payload = bytes(message.encode(version=version, header=True))
        what = f"{message.name} v{version}"
        if message.name == "ProduceRequest" and message.acks == 0:
            self._send(payload, what)
            return None
        flexible_header = (response.API_KEY != API_VERSIONS_KEY
                           and bool(response.flexible_version_q(version)))
        body = self.exchange(payload, correlation_id, what, flexible_header)
        return decode_exactly(response, version, body, what)

    def raw_api_versions(self, version: int, body: bytes) -> bytes:
        """ApiVersions at any `version`, even one kafka-python does not know, with `body`;
        the answer's body, read after a v0 response header."""
        correlation_id = self._next_correlation_id()
        header = RequestHeader(request_api_key=API_VERSIONS_KEY, request_api_version=version,
                               correlation_id=correlation_id, client_id=CLIENT_ID)
        payload = bytes(header.encode(flexible=version >= 3)) + body
        what = f"ApiVersionsRequest v{version}"
        return self.exchange(payload, correlation_id, what, False)

    def exchange(self, payload: bytes, correlation_id: int, what: str,
                 flexible_header: bool) -> bytes:
        """Send one request frame; the body of its answer, which must be the next frame and
        carry `correlation_id`."""
        self._send(payload, what)
        frame = self._read_frame(what)
        (answered,) = struct.unpack_from(">i", frame, 0)
        if answered != correlation_id:
            self.close()
            raise AssertionError(f"{self.name} answered {what} (correlation id "
                                 f"{correlation_id}) with correlation id {answered}")
        pos = 4
        if flexible_header:
            pos = _skip_tagged_fields(frame, pos)
        return frame[pos:]

    def _next_correlation_id(self) -> int:
        self._correlation_id += 1
        return self._correlation_id

    def _connection(self) -> socket.socket:
        if self._sock is None:
            host, _, port = self.bootstrap.rpartition(":")
            self._sock = socket.create_connection((host, int(port)), timeout=self._timeout_s)
        return self._sock

    def _send(self, payload: bytes, what: str) -> None:
        try:
            self._connection().sendall(struct.pack(">i", len(payload)) + payload)
        except (BrokenPipeError, ConnectionResetError) as exc:
            self._closed(what, exc)

    def _read_frame(self, what: str) -> bytes:
        (size,) = struct.unpack(">i", self._read_exactly(4, what))
        return self._read_exactly(size, what)

    def _read_exactly(self, n: int, what: str) -> bytes:
        sock = self._connection()
        out = b""
        while len(out) < n:
            try:
                chunk = sock.recv(n - len(out))
            except ConnectionResetError as exc:
                self._closed(what, exc)
            except TimeoutError as exc:
                # A late answer would be read as the next request's: start afresh.
                self.close()
                raise AssertionError(f"{self.name} did not answer {what} within "
                                     f"{self._timeout_s:.0f}s") from exc
            if not chunk:
                self._closed(what, None)
            out += chunk
        return out

    def _closed(self, what: str, cause: Exception | None) -> NoReturn:
        self.close()
        self.closed_on.append(what)
        raise ServerClosed(f"{self.name} closed the connection instead of answering {what}"
                           + (f" ({cause!r})" if cause else ""))


def _skip_tagged_fields(data: bytes, pos: int) -> int:
    count, pos = _uvarint(data, pos)
    for _ in range(count):
        _, pos = _uvarint(data, pos)
        size, pos = _uvarint(data, pos)
        pos += size
    return pos


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def decode_exactly(response: Any, version: int, body: bytes, what: str) -> Any:
    """`body` decoded as `response` at `version`; an answer with bytes left over or missing
    is a framing bug, not a value to compare."""
    flexible = bool(response.flexible_version_q(version))
    decoder = response._struct.compiled_decode_from(version, compact=flexible, tagged=flexible,
                                                    data_class=response[None])
    decoded, end = decoder(memoryview(body), 0)
    if end != len(body):
        raise AssertionError(f"the answer to {what} is {len(body)} bytes, its fields take {end}")
    return decoded


# Kafka's group and transaction coordinators answer these until their internal topic is made
# and loaded.
COORDINATOR_LOADING = {14, 15, 16}


def await_coordinators(wire: Wire, timeout_s: float = 60) -> None:
    """Kafka makes the internal topics of its group and transaction coordinators at the first
    request needing one, and answers COORDINATOR_NOT_AVAILABLE until they are loaded: made
    ready before the cases, so that on a fresh Kafka the first group case does not compare
    Kiln's answer with Kafka still starting its coordinator."""
    deadline = time.monotonic() + timeout_s
    warm_up = "cf-warm-up"
    probes = [
        (FindCoordinatorRequest(key=warm_up, key_type=0), 3, FindCoordinatorResponse),
        (FindCoordinatorRequest(key=warm_up, key_type=1), 3, FindCoordinatorResponse),
        (offset_fetch(warm_up, None), 7, OffsetFetchResponse),
        (InitProducerIdRequest(transactional_id=warm_up, transaction_timeout_ms=60_000,
                               producer_id=-1, producer_epoch=-1), 4, InitProducerIdResponse),
    ]
    for request, version, response in probes:
        while (answer := wire.request(request, version, response)).error_code != NONE:
            if (answer.error_code not in COORDINATOR_LOADING
                    or time.monotonic() > deadline):
                raise SetupFailed(f"{wire.name}'s coordinators are not ready: {answer}")
            time.sleep(0.2)


# --- one side of one case ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Member:
    group: str
    member_id: str
    generation_id: int
    topic: str


class Case:
    """One side (Kiln or Kafka) of one case: the connection, the names the case made on this
    side and the helpers that make what the case needs there."""

    def __init__(self, wire: Wire, side: str, tag: str,
                 harden: Callable[[str], None] | None = None) -> None:
        self.wire = wire
        self.side = side
        self._tag = tag
        # Kiln's: write a topic's buffered records to Kafka now (and drop them from Redis).
        self._harden = harden
        # Each name made here -> the label both sides share, for reading answers back.
        self.labels: dict[str, str] = {}

    def name(self, label: str, tail: str = "") -> str:
        """This side's name for the resource `label` (a topic, a group): the other side's
        has the same length and the same label. `tail` makes an invalid name of it."""
        name = f"cf-{self._tag}-{label}-{self.side[:4]}{tail}"
        self.labels[name] = f"<{label}{tail}>"
        return name

    def call(self, message: Any, version: int, response: Any) -> Any:
        return self.wire.request(message, version, response)

    def expect(self, what: str, code: int, answer: Any) -> None:
        if code != NONE:
            raise SetupFailed(f"{self.side}: {what} failed with error {code}: {answer}")

    # topics and records

    def create_topic(self, label: str, partitions: int = 1,
                     configs: dict[str, str] | None = None) -> str:
        name = self.name(label)
        answer = self.call(create_topics([topic_spec(name, partitions, configs)]), 5,
                           CreateTopicsResponse)
        self.expect(f"creating {name}", answer.topics[0].error_code, answer)
        self.await_leaders(name, partitions)
        return name

    def await_leaders(self, topic: str, partitions: int, timeout_s: float = 20) -> None:
        """Until every partition of `topic` answers ListOffsets: Kafka answers CreateTopics
        once its controller decided, before the partitions have a leader."""
        deadline = time.monotonic() + timeout_s
        while True:
            answer = self.call(list_offsets(topic, range(partitions), -1, 7), 7,
                               ListOffsetsResponse)
            codes = [p.error_code for t in answer.topics for p in t.partitions]
            if all(code == NONE for code in codes):
                return
            if time.monotonic() > deadline:
                raise SetupFailed(f"{self.side}: {topic} has no leaders after {timeout_s}s: "
                                  f"{answer}")
            time.sleep(0.05)

    def produce(self, topic: str, values: list[bytes], first_offset: int = 0) -> None:
        """Appends `values` as one batch (acks=1) at `first_offset`, which also gives their
        timestamps (FIRST_TIMESTAMP + offset)."""
        answer = self.call(produce(topic, 0, values, acks=1, first_offset=first_offset), 9,
                           ProduceResponse)
        result = answer.responses[0].partition_responses[0]
        self.expect(f"producing to {topic}", result.error_code, answer)
        if result.base_offset != first_offset:
            raise SetupFailed(f"{self.side}: {topic} appended at {result.base_offset}, not "
                              f"{first_offset}")

    def harden(self, topic: str) -> None:
        """Kiln writes what it buffers of `topic` to Kafka now, and drops it from Redis: what
        was produced so far is read back from Kafka. Kafka: nothing to do."""
        if self._harden is not None:
            self._harden(topic)

    @contextlib.contextmanager
    def hardening(self, topic: str) -> Iterator[None]:
        """While the block waits on an acks=all answer, which Kiln gives once the records are
        hardened (only on demand, in this module)."""
        if self._harden is None:
            yield
            return
        harden, done = self._harden, threading.Event()

        def keep_hardening() -> None:
            while not done.wait(0.05):
                harden(topic)

        worker = threading.Thread(target=keep_hardening, name=f"harden-{topic}")
        worker.start()
        try:
            yield
        finally:
            done.set()
            worker.join(30)

    def two_tiers(self, topic: str) -> None:
        """Offsets 0-2 hardened (Kiln reads them from Kafka), 3-5 not (from Redis), each
        a batch of its own."""
        self.produce(topic, [b"a", b"b", b"c"], first_offset=0)
        self.harden(topic)
        self.produce(topic, [b"d", b"e", b"f"], first_offset=3)

    def all_hardened(self, label: str) -> str:
        """A topic whose records (offsets 0-2) Kiln holds in Kafka only, none in Redis."""
        topic = self.create_topic(label)
        self.produce(topic, [b"a", b"b", b"c"], first_offset=0)
        self.harden(topic)
        return topic

    def init_transactional(self, transactional_id: str) -> tuple[int, int]:
        """A producer id and epoch for `transactional_id`."""
        answer = self.call(InitProducerIdRequest(
            transactional_id=transactional_id, transaction_timeout_ms=60_000,
            producer_id=-1, producer_epoch=-1), 4, InitProducerIdResponse)
        self.expect(f"InitProducerId for {transactional_id}", answer.error_code, answer)
        return int(answer.producer_id), int(answer.producer_epoch)

    def node_id(self) -> int:
        """The node id this side gives its (only) broker."""
        answer = self.call(MetadataRequest(topics=[], allow_auto_topic_creation=False,
                                           include_topic_authorized_operations=False), 9,
                           MetadataResponse)
        return int(answer.brokers[0].node_id)

    def topic_id(self, topic: str) -> uuid.UUID:
        answer = self.call(metadata([topic]), 10, MetadataResponse)
        self.expect(f"describing {topic}", answer.topics[0].error_code, answer)
        return uuid.UUID(str(answer.topics[0].topic_id))

    # groups

    def join(self, group: str, topic: str) -> Member:
        """A member of `group` subscribed to `topic`, joined (its leader) but not synced."""
        answer = self.call(join_group(group, "", topic), 5, JoinGroupResponse)
        if answer.error_code == MEMBER_ID_REQUIRED:
            answer = self.call(join_group(group, answer.member_id, topic), 5, JoinGroupResponse)
        self.expect(f"joining {group}", answer.error_code, answer)
        return Member(group, answer.member_id, answer.generation_id, topic)

    def join_and_sync(self, group: str, topic: str, partitions: int = 1) -> Member:
        member = self.join(group, topic)
        answer = self.call(sync_group(member, range(partitions), 3), 3, SyncGroupResponse)
        self.expect(f"syncing {group}", answer.error_code, answer)
        return member

    def commit(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """Offsets committed for `group` as a standalone client (no member, generation -1)."""
        answer = self.call(offset_commit(group, topic, offsets), 8, OffsetCommitResponse)
        for t in answer.topics:
            for p in t.partitions:
                self.expect(f"committing for {group}", p.error_code, answer)


# --- request makers (all fields of every version given; each version encodes its own) ---------


def topic_spec(name: str, partitions: int, configs: dict[str, str] | None = None,
               replication_factor: int = -1) -> Any:
    creatable = CreateTopicsRequest.CreatableTopic
    return creatable(name=name, num_partitions=partitions,
                     replication_factor=replication_factor, assignments=[],
                     configs=[creatable.CreatableTopicConfig(name=k, value=v)
                              for k, v in (configs or {}).items()])


def create_topics(topics: list[Any], validate_only: bool = False) -> Any:
    return CreateTopicsRequest(topics=topics, timeout_ms=30_000, validate_only=validate_only)


def metadata(topics: list[str]) -> Any:
    wanted = MetadataRequest.MetadataRequestTopic
    return MetadataRequest(topics=[wanted(name=t, topic_id=ZERO_UUID) for t in topics],
                           allow_auto_topic_creation=False,
                           include_cluster_authorized_operations=False,
                           include_topic_authorized_operations=False)


def record_batch(values: list[bytes], first_offset: int = 0) -> bytes:
    """A magic-2 batch of `values`, stamped FIRST_TIMESTAMP + the offset each is expected
    at: both sides get the very same bytes."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=FIRST_TIMESTAMP + first_offset + i, key=None, value=value,
                       headers=[])
    return bytes(builder.build())


def produce(topic: str, partition: int, values: list[bytes], acks: int,
            topic_id: uuid.UUID = ZERO_UUID, first_offset: int = 0) -> Any:
    """`topic_id` for v13+, which names topics by id."""
    data = ProduceRequest.TopicProduceData
    return ProduceRequest(transactional_id=None, acks=acks, timeout_ms=30_000, topic_data=[
        data(name=topic, topic_id=topic_id, partition_data=[
            data.PartitionProduceData(index=partition,
                                      records=record_batch(values, first_offset))])])


def list_offsets(topic: str, partitions: range | list[int], timestamp: int,
                 version: int) -> Any:
    wanted = ListOffsetsRequest.ListOffsetsTopic
    return ListOffsetsRequest(
        replica_id=-1, isolation_level=0, timeout_ms=30_000,
        topics=[wanted(name=topic, partitions=[
            wanted.ListOffsetsPartition(partition_index=p, current_leader_epoch=-1,
                                        timestamp=timestamp, max_num_offsets=1)
            for p in partitions])])


def fetch(topic: str, offset: int, max_wait_ms: int, topic_id: uuid.UUID = ZERO_UUID) -> Any:
    """A sessionless fetch of partition 0; `topic_id` for v13+, which names topics by id."""
    wanted = FetchRequest.FetchTopic
    return FetchRequest(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
        forgotten_topics_data=[],
        topics=[wanted(topic=topic, topic_id=topic_id, partitions=[
            wanted.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=offset,
                                  last_fetched_epoch=-1, log_start_offset=-1,
                                  partition_max_bytes=1 << 20)])])


def subscription(topic: str) -> bytes:
    """ConsumerProtocolSubscription v0: one topic, no user data."""
    return struct.pack(">hi", 0, 1) + _string(topic) + struct.pack(">i", -1)


def assignment(topic: str, partitions: range | list[int]) -> bytes:
    """ConsumerProtocolAssignment v0: partitions of one topic, no user data."""
    chosen = list(partitions)
    return (struct.pack(">hi", 0, 1) + _string(topic) + struct.pack(">i", len(chosen))
            + b"".join(struct.pack(">i", p) for p in chosen) + struct.pack(">i", -1))


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def join_group(group: str, member_id: str, topic: str, protocol_type: str = "consumer") -> Any:
    protocol = JoinGroupRequest.JoinGroupRequestProtocol
    return JoinGroupRequest(group_id=group, session_timeout_ms=SESSION_TIMEOUT_MS,
                            rebalance_timeout_ms=SESSION_TIMEOUT_MS, member_id=member_id,
                            group_instance_id=None, protocol_type=protocol_type,
                            protocols=[protocol(name="range", metadata=subscription(topic))],
                            reason=None)


def sync_group(member: Member, partitions: range | list[int], version: int,
               generation_id: int | None = None, member_id: str | None = None) -> Any:
    given = SyncGroupRequest.SyncGroupRequestAssignment
    return SyncGroupRequest(
        group_id=member.group,
        generation_id=member.generation_id if generation_id is None else generation_id,
        member_id=member.member_id if member_id is None else member_id,
        group_instance_id=None, protocol_type="consumer", protocol_name="range",
        assignments=[given(member_id=member.member_id,
                           assignment=assignment(member.topic, partitions))])


def heartbeat(member: Member, generation_id: int | None = None,
              member_id: str | None = None) -> Any:
    return HeartbeatRequest(
        group_id=member.group,
        generation_id=member.generation_id if generation_id is None else generation_id,
        member_id=member.member_id if member_id is None else member_id,
        group_instance_id=None)


def leave_group(group: str, member_ids: list[str]) -> Any:
    identity = LeaveGroupRequest.MemberIdentity
    return LeaveGroupRequest(group_id=group, member_id=member_ids[0],
                             members=[identity(member_id=m, group_instance_id=None, reason=None)
                                      for m in member_ids])


def offset_commit(group: str, topic: str, offsets: dict[int, int], generation_id: int = -1,
                  member_id: str = "", topic_id: uuid.UUID = ZERO_UUID) -> Any:
    """`topic_id` for v10+, which names topics by id."""
    wanted = OffsetCommitRequest.OffsetCommitRequestTopic
    return OffsetCommitRequest(
        group_id=group, generation_id_or_member_epoch=generation_id, member_id=member_id,
        group_instance_id=None, retention_time_ms=-1,
        topics=[wanted(name=topic, topic_id=topic_id, partitions=[
            wanted.OffsetCommitRequestPartition(partition_index=p, committed_offset=o,
                                                committed_leader_epoch=-1,
                                                commit_timestamp=-1, committed_metadata="m")
            for p, o in offsets.items()])])


def offset_fetch(group: str, topics: dict[str, list[int]] | None,
                 topic_ids: dict[str, uuid.UUID] | None = None) -> Any:
    """The group both as v0-7 name it (group_id, topics) and as v8+ do (groups); `topic_ids`
    for v10+, which name topics by id."""
    wanted = OffsetFetchRequest.OffsetFetchRequestTopic
    grouped = OffsetFetchRequest.OffsetFetchRequestGroup
    ids = topic_ids or {}
    return OffsetFetchRequest(
        group_id=group, require_stable=False,
        topics=None if topics is None else [wanted(name=t, partition_indexes=p)
                                            for t, p in topics.items()],
        groups=[grouped(group_id=group, member_id=None, member_epoch=-1, topics=None
                        if topics is None else [
                            grouped.OffsetFetchRequestTopics(
                                name=t, topic_id=ids.get(t, ZERO_UUID), partition_indexes=p)
                            for t, p in topics.items()])])


def describe_configs(resources: list[tuple[int, str, list[str] | None]],
                     synonyms: bool = True) -> Any:
    wanted = DescribeConfigsRequest.DescribeConfigsResource
    return DescribeConfigsRequest(
        include_synonyms=synonyms, include_documentation=False,
        resources=[wanted(resource_type=kind, resource_name=name, configuration_keys=keys)
                   for kind, name, keys in resources])


def alter_configs(topic: str, configs: dict[str, str | None], validate_only: bool = False,
                  kind: int = TOPIC_RESOURCE) -> Any:
    resource = AlterConfigsRequest.AlterConfigsResource
    return AlterConfigsRequest(validate_only=validate_only, resources=[
        resource(resource_type=kind, resource_name=topic,
                 configs=[resource.AlterableConfig(name=k, value=v)
                          for k, v in configs.items()])])


# IncrementalAlterConfigs operations.
SET, DELETE, APPEND = 0, 1, 2


def incremental_alter(changes: list[tuple[str, list[tuple[str, int, str | None]]]],
                      validate_only: bool = False) -> Any:
    resource = IncrementalAlterConfigsRequest.AlterConfigsResource
    return IncrementalAlterConfigsRequest(validate_only=validate_only, resources=[
        resource(resource_type=TOPIC_RESOURCE, resource_name=topic,
                 configs=[resource.AlterableConfig(name=name, config_operation=op, value=value)
                          for name, op, value in configs])
        for topic, configs in changes])


def create_partitions(topics: list[tuple[str, int]], validate_only: bool = False) -> Any:
    grown = CreatePartitionsRequest.CreatePartitionsTopic
    return CreatePartitionsRequest(
        topics=[grown(name=name, count=count, assignments=None) for name, count in topics],
        timeout_ms=30_000, validate_only=validate_only)


def delete_topics(names: list[str], ids: list[uuid.UUID] | None = None) -> Any:
    state = DeleteTopicsRequest.DeleteTopicState
    return DeleteTopicsRequest(
        topics=[state(name=n, topic_id=ZERO_UUID) for n in names]
        + [state(name=None, topic_id=i) for i in ids or []],
        topic_names=names, timeout_ms=30_000)


def delete_records(topic: str, offsets: dict[int, int]) -> Any:
    wanted = DeleteRecordsRequest.DeleteRecordsTopic
    return DeleteRecordsRequest(timeout_ms=30_000, topics=[wanted(name=topic, partitions=[
        wanted.DeleteRecordsPartition(partition_index=p, offset=o) for p, o in offsets.items()])])


def offset_delete(group: str, topic: str, partitions: list[int]) -> Any:
    wanted = OffsetDeleteRequest.OffsetDeleteRequestTopic
    return OffsetDeleteRequest(group_id=group, topics=[wanted(name=topic, partitions=[
        wanted.OffsetDeleteRequestPartition(partition_index=p) for p in partitions])])


def offset_for_leader_epoch(topic: str, epoch: int) -> Any:
    wanted = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    return OffsetForLeaderEpochRequest(replica_id=-1, topics=[wanted(topic=topic, partitions=[
        wanted.OffsetForLeaderPartition(partition=0, current_leader_epoch=-1,
                                        leader_epoch=epoch)])])


# --- the builders ------------------------------------------------------------------------------

# A builder's requests, each answered (None for Produce with acks=0) before the next is made.
Steps = Generator[Any, Any, None]
Builder = Callable[[Case, int], Steps]


@dataclass(frozen=True, slots=True)
class Api:
    name: str
    response: Any  # kafka-python's response class
    build: Builder
    # Checks of what the normalisation leaves out (Kiln's answers, Kafka's answers).
    check: Callable[[list[Any], list[Any]], None] | None = None


def build_produce(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    topic_id = c.topic_id(topic) if v >= 13 else ZERO_UUID
    yield produce(topic, 0, [b"a", b"b"], acks=1, topic_id=topic_id)
    # acks=all: Kiln answers once the records are hardened into Kafka.
    with c.hardening(topic):
        yield produce(topic, 0, [b"c"], acks=-1, topic_id=topic_id, first_offset=2)
    # acks=0 gets no answer: the next answer on the connection must be the next request's.
    yield produce(topic, 0, [b"d"], acks=0, topic_id=topic_id, first_offset=3)
    yield produce(topic, 0, [b"e"], acks=1, topic_id=topic_id, first_offset=4)


def build_fetch(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    c.two_tiers(topic)
    hardened = c.all_hardened("h")
    ids = {t: c.topic_id(t) if v >= 13 else ZERO_UUID for t in (topic, hardened)}
    yield fetch(topic, 0, max_wait_ms=500, topic_id=ids[topic])
    yield fetch(topic, 1, max_wait_ms=500, topic_id=ids[topic])  # inside the hardened batch
    yield fetch(topic, 4, max_wait_ms=500, topic_id=ids[topic])  # inside the batch in Redis
    # At the end of the log: an empty answer once max_wait_ms has passed.
    yield fetch(topic, 6, max_wait_ms=100, topic_id=ids[topic])
    yield fetch(hardened, 0, max_wait_ms=500, topic_id=ids[hardened])
    yield fetch(hardened, 3, max_wait_ms=100, topic_id=ids[hardened])
    # Waiting at the end of the log while Kiln hardens every record the topic has.
    parked = c.create_topic("p")
    c.produce(parked, [b"a", b"b", b"c"])
    parked_id = c.topic_id(parked) if v >= 13 else ZERO_UUID
    with c.hardening(parked):
        yield fetch(parked, 3, max_wait_ms=500, topic_id=parked_id)


def build_list_offsets(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    c.two_tiers(topic)
    hardened = c.all_hardened("h")
    # -1 latest, -2 earliest, the timestamp of a record inside the hardened batch and of one
    # inside the buffered batch, one past the last record's; v7+ the record with the largest
    # timestamp (-3), v8+ the local log start (-4), v9+ the latest tiered offset (-5).
    wanted = [-1, -2, FIRST_TIMESTAMP + 1, FIRST_TIMESTAMP + 4, FIRST_TIMESTAMP + 10]
    wanted += [-3] if v >= 7 else []
    wanted += [-4] if v >= 8 else []
    wanted += [-5] if v >= 9 else []
    for timestamp in wanted:
        yield list_offsets(topic, [0], timestamp, v)
    for timestamp in (-1, -2):
        yield list_offsets(hardened, [0], timestamp, v)


def build_metadata(c: Case, v: int) -> Steps:
    topic = c.create_topic("t", partitions=2)
    yield metadata([topic])


def build_offset_commit(c: Case, v: int) -> Steps:
    topic = c.create_topic("t", partitions=2)
    topic_id = c.topic_id(topic) if v >= 10 else ZERO_UUID
    group = c.name("g")
    # As a standalone client (generation -1), then as the member of a group.
    yield offset_commit(group, topic, {0: 5, 1: 7}, topic_id=topic_id)
    member_group = c.name("h")
    member = c.join_and_sync(member_group, topic, partitions=2)
    yield offset_commit(member_group, topic, {0: 1}, member.generation_id, member.member_id,
                        topic_id)


def build_offset_fetch(c: Case, v: int) -> Steps:
    topic = c.create_topic("t", partitions=3)
    ids = {topic: c.topic_id(topic)} if v >= 10 else {}
    group = c.name("g")
    c.commit(group, topic, {0: 5, 1: 7})
    yield offset_fetch(group, {topic: [0, 1, 2]}, ids)
    if v >= 2:
        yield offset_fetch(group, None)  # every committed partition
    yield offset_fetch(c.name("none"), {topic: [0]}, ids)  # a group that never committed


def build_find_coordinator(c: Case, v: int) -> Steps:
    group = c.name("g")
    request = FindCoordinatorRequest(key=group, key_type=0, coordinator_keys=[group])
    yield request


def build_join_group(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    group = c.name("g")
    first = yield join_group(group, "", topic)
    if v >= 4:
        # Kafka asks a new member to join again with the id it was given (KIP-394).
        yield join_group(group, first.member_id, topic)


def build_heartbeat(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    member = c.join_and_sync(c.name("g"), topic)
    yield heartbeat(member)


def build_leave_group(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    member = c.join_and_sync(c.name("g"), topic)
    yield leave_group(member.group, [member.member_id])


def build_sync_group(c: Case, v: int) -> Steps:
    topic = c.create_topic("t", partitions=2)
    member = c.join(c.name("g"), topic)
    yield sync_group(member, [0, 1], v)


def build_describe_groups(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    stable = c.join_and_sync(c.name("g"), topic)
    empty = c.name("e")
    c.commit(empty, topic, {0: 1})
    yield DescribeGroupsRequest(groups=[stable.group, empty],
                                include_authorized_operations=False)


def build_list_groups(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    c.join_and_sync(c.name("g"), topic)
    c.commit(c.name("e"), topic, {0: 1})
    yield ListGroupsRequest(states_filter=[], types_filter=[])
    if v >= 4:
        yield ListGroupsRequest(states_filter=["Stable"], types_filter=[])
    if v >= 5:
        yield ListGroupsRequest(states_filter=[], types_filter=["classic"])


def build_api_versions(c: Case, v: int) -> Steps:
    yield ApiVersionsRequest(client_software_name="kiln-conformance",
                             client_software_version="1.0")


def build_sasl_handshake(c: Case, v: int) -> Steps:
    # On a listener without SASL: ILLEGAL_SASL_STATE (a SASL listener: test_sasl_listener.py)
    yield SaslHandshakeRequest(mechanism="PLAIN")


def build_sasl_authenticate(c: Case, v: int) -> Steps:
    yield SaslAuthenticateRequest(auth_bytes=b"\x00kiln\x00secret")


def build_create_topics(c: Case, v: int) -> Steps:
    topics = [topic_spec(c.name("t"), 2, {"retention.ms": "86400000"})]
    if v >= 4:
        # The broker's num.partitions and default.replication.factor (KIP-464).
        topics.append(topic_spec(c.name("d"), -1))
    yield create_topics(topics)
    yield create_topics([topic_spec(c.name("v"), 3)], validate_only=True)


def build_delete_topics(c: Case, v: int) -> Steps:
    by_name = c.create_topic("t")
    if v >= 6:
        by_id = c.create_topic("i")
        yield delete_topics([by_name], [c.topic_id(by_id)])
    else:
        yield delete_topics([by_name])


def build_delete_records(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    c.two_tiers(topic)
    yield delete_records(topic, {0: 1})  # inside the hardened batch
    yield delete_records(topic, {0: 4})  # inside the buffered batch
    yield delete_records(topic, {0: -1})  # -1: up to the high watermark
    yield delete_records(c.all_hardened("h"), {0: 1})


def build_init_producer_id(c: Case, v: int) -> Steps:
    yield InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60_000,
                                producer_id=-1, producer_epoch=-1)


def build_add_partitions_to_txn(c: Case, v: int) -> Steps:
    topic = c.create_topic("t", partitions=2)
    tid = c.name("x")
    pid, epoch = c.init_transactional(tid)
    yield add_partitions_to_txn(tid, pid, epoch, {topic: [0, 1]})
    yield add_partitions_to_txn(tid, pid, epoch, {topic: [0]})  # already in it
    yield add_partitions_to_txn(tid, pid, epoch, {topic: [1], c.name("u"): [0]})
    yield add_partitions_to_txn(tid, pid, epoch + 1, {topic: [0]})  # not the epoch
    yield add_partitions_to_txn(tid, pid + 1, epoch, {topic: [0]})  # not the producer


def build_add_offsets_to_txn(c: Case, v: int) -> Steps:
    tid = c.name("x")
    pid, epoch = c.init_transactional(tid)
    yield AddOffsetsToTxnRequest(transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                                 group_id=c.name("g"))
    yield AddOffsetsToTxnRequest(transactional_id=tid, producer_id=pid,
                                 producer_epoch=epoch + 1, group_id=c.name("g"))


def build_end_txn(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    tid = c.name("x")
    pid, epoch = c.init_transactional(tid)
    yield EndTxnRequest(transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                        committed=True)  # no transaction open
    answer = c.call(add_partitions_to_txn(tid, pid, epoch, {topic: [0]}), 3,
                    AddPartitionsToTxnResponse)
    c.expect("adding a partition", answer.results_by_topic_v3_and_below[0]
             .results_by_partition[0].partition_error_code, answer)
    yield EndTxnRequest(transactional_id=tid, producer_id=pid, producer_epoch=epoch + 1,
                        committed=True)  # not the epoch
    yield EndTxnRequest(transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                        committed=False)


def build_txn_offset_commit(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    tid, group = c.name("x"), c.name("g")
    pid, epoch = c.init_transactional(tid)
    committed = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
    partition = committed.TxnOffsetCommitRequestPartition
    offsets = [committed(name=topic, partitions=[partition(
        partition_index=0, committed_offset=5, committed_leader_epoch=-1,
        committed_metadata="m")])]
    answer = c.call(AddOffsetsToTxnRequest(transactional_id=tid, producer_id=pid,
                                           producer_epoch=epoch, group_id=group), 3,
                    AddOffsetsToTxnResponse)
    c.expect("adding offsets", answer.error_code, answer)
    yield TxnOffsetCommitRequest(transactional_id=tid, group_id=group, producer_id=pid,
                                 producer_epoch=epoch, generation_id=-1, member_id="",
                                 group_instance_id=None, topics=offsets)


def build_describe_transactions(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    idle, busy = c.name("i"), c.name("b")
    c.init_transactional(idle)
    pid, epoch = c.init_transactional(busy)
    answer = c.call(add_partitions_to_txn(busy, pid, epoch, {topic: [0]}), 3,
                    AddPartitionsToTxnResponse)
    c.expect("adding a partition", answer.results_by_topic_v3_and_below[0]
             .results_by_partition[0].partition_error_code, answer)
    yield DescribeTransactionsRequest(transactional_ids=[idle, busy, c.name("u")])


def build_list_transactions(c: Case, v: int) -> Steps:
    tid = c.name("x")
    pid, _ = c.init_transactional(tid)
    # Filtered to this case's producer: other cases' ids are on both sides too.
    yield ListTransactionsRequest(state_filters=[], producer_id_filters=[pid],
                                  duration_filter=-1)
    yield ListTransactionsRequest(state_filters=["Empty", "Bogus"], producer_id_filters=[pid],
                                  duration_filter=-1)
    yield ListTransactionsRequest(state_filters=["Ongoing"], producer_id_filters=[pid],
                                  duration_filter=-1)


def add_partitions_to_txn(transactional_id: str, producer_id: int, epoch: int,
                          partitions: dict[str, list[int]]) -> Any:
    topic = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
    return AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=transactional_id, v3_and_below_producer_id=producer_id,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[topic(name=name, partitions=parts)
                             for name, parts in partitions.items()])


def build_offset_for_leader_epoch(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    c.two_tiers(topic)
    yield offset_for_leader_epoch(topic, 0)


def build_describe_configs(c: Case, v: int) -> Steps:
    topic = c.create_topic("t", configs={"retention.ms": "86400000"})
    yield describe_configs([(TOPIC_RESOURCE, topic, None)])
    yield describe_configs([(TOPIC_RESOURCE, topic, ["retention.ms", "cleanup.policy"])],
                           synonyms=False)
    yield describe_configs([(BROKER_RESOURCE, str(c.node_id()), ["num.io.threads",
                                                                 "log.retention.hours"])])


def build_alter_configs(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    yield alter_configs(topic, {"retention.ms": "3600000", "cleanup.policy": "compact"},
                        validate_only=True)
    yield alter_configs(topic, {"retention.ms": "3600000", "cleanup.policy": "compact"})


def build_incremental_alter_configs(c: Case, v: int) -> Steps:
    topic = c.create_topic("t", configs={"retention.ms": "86400000"})
    yield incremental_alter([(topic, [("retention.ms", DELETE, None),
                                      ("segment.ms", SET, "3600000"),
                                      ("cleanup.policy", APPEND, "compact")])])


def build_create_partitions(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    yield create_partitions([(topic, 4)], validate_only=True)
    yield create_partitions([(topic, 3)])


def build_delete_groups(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    group = c.name("g")
    c.commit(group, topic, {0: 1})
    yield DeleteGroupsRequest(groups_names=[group])


def build_offset_delete(c: Case, v: int) -> Steps:
    topic = c.create_topic("t", partitions=2)
    group = c.name("g")
    c.commit(group, topic, {0: 1, 1: 2})
    yield offset_delete(group, topic, [0])


def build_describe_cluster(c: Case, v: int) -> Steps:
    yield DescribeClusterRequest(include_cluster_authorized_operations=False, endpoint_type=1,
                                 include_fenced_brokers=False)


def consumer_heartbeat(group: str, member_id: str, epoch: int, topic: str | None = None
                       ) -> Any:
    """A KIP-848 heartbeat: joining (epoch 0, with a subscription to `topic`), staying, or
    leaving (-1)."""
    joining = epoch == 0
    return ConsumerGroupHeartbeatRequest(
        group_id=group, member_id=member_id, member_epoch=epoch,
        rebalance_timeout_ms=30_000 if joining else -1,
        subscribed_topic_names=[topic] if joining else None,
        topic_partitions=[] if joining else None)


def build_consumer_group_heartbeat(c: Case, v: int) -> Steps:
    topic = c.create_topic("t", partitions=2)
    group = c.name("g")
    member = str(uuid.uuid4())
    # Joined alone, the member gets both partitions; it heartbeats, then leaves.
    joined = yield consumer_heartbeat(group, member, 0, topic)
    yield consumer_heartbeat(group, member, joined.member_epoch)
    yield consumer_heartbeat(group, member, joined.member_epoch + 7)  # fenced
    yield consumer_heartbeat(group, member, -1)


def build_consumer_group_describe(c: Case, v: int) -> Steps:
    topic = c.create_topic("t", partitions=2)
    group = c.name("g")
    c.call(consumer_heartbeat(group, str(uuid.uuid4()), 0, topic), 0,
           ConsumerGroupHeartbeatResponse)
    yield ConsumerGroupDescribeRequest(group_ids=[group, c.name("none")],
                                       include_authorized_operations=False)


def check_api_versions(kiln: list[Any], kafka: list[Any]) -> None:
    """Kiln advertises its own APIs (the normalisation leaves the lists out): each range
    must be one Kafka serves too, since Kiln hardens into Kafka and relays admin requests."""
    for kiln_answer, kafka_answer in zip(kiln, kafka, strict=True):
        served = {e.api_key: (e.min_version, e.max_version) for e in kafka_answer.api_keys}
        for entry in kiln_answer.api_keys:
            low, high = served.get(entry.api_key, (None, None))
            assert low is not None and high is not None, (
                f"Kiln advertises api {entry.api_key}, which Kafka does not serve")
            assert low <= entry.min_version <= entry.max_version <= high, (
                f"Kiln advertises api {entry.api_key} v{entry.min_version}-"
                f"{entry.max_version}, Kafka serves v{low}-{high}")


BUILDERS: dict[int, Api] = {
    0: Api("Produce", ProduceResponse, build_produce),
    1: Api("Fetch", FetchResponse, build_fetch),
    2: Api("ListOffsets", ListOffsetsResponse, build_list_offsets),
    3: Api("Metadata", MetadataResponse, build_metadata),
    17: Api("SaslHandshake", SaslHandshakeResponse, build_sasl_handshake),
    36: Api("SaslAuthenticate", SaslAuthenticateResponse, build_sasl_authenticate),
    8: Api("OffsetCommit", OffsetCommitResponse, build_offset_commit),
    9: Api("OffsetFetch", OffsetFetchResponse, build_offset_fetch),
    10: Api("FindCoordinator", FindCoordinatorResponse, build_find_coordinator),
    11: Api("JoinGroup", JoinGroupResponse, build_join_group),
    12: Api("Heartbeat", HeartbeatResponse, build_heartbeat),
    13: Api("LeaveGroup", LeaveGroupResponse, build_leave_group),
    14: Api("SyncGroup", SyncGroupResponse, build_sync_group),
    15: Api("DescribeGroups", DescribeGroupsResponse, build_describe_groups),
    16: Api("ListGroups", ListGroupsResponse, build_list_groups),
    18: Api("ApiVersions", ApiVersionsResponse, build_api_versions, check_api_versions),
    19: Api("CreateTopics", CreateTopicsResponse, build_create_topics),
    20: Api("DeleteTopics", DeleteTopicsResponse, build_delete_topics),
    21: Api("DeleteRecords", DeleteRecordsResponse, build_delete_records),
    22: Api("InitProducerId", InitProducerIdResponse, build_init_producer_id),
    23: Api("OffsetForLeaderEpoch", OffsetForLeaderEpochResponse,
            build_offset_for_leader_epoch),
    24: Api("AddPartitionsToTxn", AddPartitionsToTxnResponse, build_add_partitions_to_txn),
    25: Api("AddOffsetsToTxn", AddOffsetsToTxnResponse, build_add_offsets_to_txn),
    26: Api("EndTxn", EndTxnResponse, build_end_txn),
    28: Api("TxnOffsetCommit", TxnOffsetCommitResponse, build_txn_offset_commit),
    65: Api("DescribeTransactions", DescribeTransactionsResponse, build_describe_transactions),
    66: Api("ListTransactions", ListTransactionsResponse, build_list_transactions),
    32: Api("DescribeConfigs", DescribeConfigsResponse, build_describe_configs),
    33: Api("AlterConfigs", AlterConfigsResponse, build_alter_configs),
    37: Api("CreatePartitions", CreatePartitionsResponse, build_create_partitions),
    42: Api("DeleteGroups", DeleteGroupsResponse, build_delete_groups),
    44: Api("IncrementalAlterConfigs", IncrementalAlterConfigsResponse,
            build_incremental_alter_configs),
    47: Api("OffsetDelete", OffsetDeleteResponse, build_offset_delete),
    60: Api("DescribeCluster", DescribeClusterResponse, build_describe_cluster),
    # KIP-848: kafka-python has no schemas for these; Kiln's own codecs encode them.
    68: Api("ConsumerGroupHeartbeat", ConsumerGroupHeartbeatResponse,
            build_consumer_group_heartbeat),
    69: Api("ConsumerGroupDescribe", ConsumerGroupDescribeResponse,
            build_consumer_group_describe),
}


# --- edge cases: invalid yet decodable requests, and valid ones off the common path -------------


@dataclass(frozen=True, slots=True)
class EdgeCase:
    api_key: int
    build: Builder
    since: int = 0  # the lowest version the request can be made at


def bad_create_existing(c: Case, v: int) -> Steps:
    yield create_topics([topic_spec(c.create_topic("t"), 1)])


def bad_create_duplicate(c: Case, v: int) -> Steps:
    name = c.name("t")
    yield create_topics([topic_spec(name, 1), topic_spec(name, 1)])


def bad_create_partitions(c: Case, v: int) -> Steps:
    yield create_topics([topic_spec(c.name("zero"), 0), topic_spec(c.name("neg"), -5)])


def bad_create_config(c: Case, v: int) -> Steps:
    yield create_topics([topic_spec(c.name("value"), 1, {"retention.ms": "soon"}),
                         topic_spec(c.name("name"), 1, {"no.such.config": "1"})])


def bad_create_name(c: Case, v: int) -> Steps:
    yield create_topics([topic_spec(c.name("bad", tail="!"), 1), topic_spec(".", 1),
                         topic_spec("__consumer_offsets", 1)])


def bad_create_replication(c: Case, v: int) -> Steps:
    yield create_topics([topic_spec(c.name("t"), 1, replication_factor=3)])


def bad_delete_unknown(c: Case, v: int) -> Steps:
    yield delete_topics([c.name("t")])


def bad_delete_unknown_id(c: Case, v: int) -> Steps:
    yield delete_topics([], [uuid.UUID("00000000-0000-0000-0000-00000000c0de")])


def bad_delete_duplicate(c: Case, v: int) -> Steps:
    name = c.create_topic("t")
    yield delete_topics([name, name])


def bad_partitions_unknown(c: Case, v: int) -> Steps:
    yield create_partitions([(c.name("t"), 2)])


def bad_partitions_fewer(c: Case, v: int) -> Steps:
    topic = c.create_topic("t", partitions=2)
    yield create_partitions([(topic, 1)])
    yield create_partitions([(topic, 2)])


def bad_partitions_duplicate(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    yield create_partitions([(topic, 2), (topic, 3)])


def bad_describe_unknown(c: Case, v: int) -> Steps:
    yield describe_configs([(TOPIC_RESOURCE, c.name("t"), None)])


def bad_describe_broker(c: Case, v: int) -> Steps:
    yield describe_configs([(BROKER_RESOURCE, "not-a-node", None)])
    yield describe_configs([(BROKER_RESOURCE, str(c.node_id() + 100), None)])


def bad_alter_unknown(c: Case, v: int) -> Steps:
    yield alter_configs(c.name("t"), {"retention.ms": "1000"})


def bad_alter_value(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    yield alter_configs(topic, {"retention.ms": "soon"})
    yield alter_configs(topic, {"no.such.config": "1"})


def bad_incremental_unknown(c: Case, v: int) -> Steps:
    yield incremental_alter([(c.name("t"), [("retention.ms", SET, "1000")])])


def bad_incremental_ops(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    yield incremental_alter([(topic, [("retention.ms", APPEND, "1000")])])
    yield incremental_alter([(topic, [("retention.ms", SET, "soon")])])
    yield incremental_alter([(topic, [("no.such.config", SET, "1")])])
    yield incremental_alter([(topic, [("retention.ms", SET, "1000"),
                                      ("retention.ms", DELETE, None)])])


def bad_incremental_duplicate(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    yield incremental_alter([(topic, [("retention.ms", SET, "1000")]),
                             (topic, [("segment.ms", SET, "1000")])])


def bad_delete_records(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    c.produce(topic, [b"a", b"b"])
    yield delete_records(topic, {0: 5})  # beyond the high watermark
    yield delete_records(topic, {3: 1})  # no such partition
    yield delete_records(c.name("u"), {0: 1})


def bad_delete_groups(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    member = c.join_and_sync(c.name("g"), topic)
    yield DeleteGroupsRequest(groups_names=[member.group, c.name("u")])


def bad_offset_delete(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    member = c.join_and_sync(c.name("g"), topic)
    c.commit(c.name("e"), topic, {0: 1})
    yield offset_delete(member.group, topic, [0])  # the group reads the topic
    yield offset_delete(c.name("u"), topic, [0])


def bad_describe_cluster(c: Case, v: int) -> Steps:
    yield DescribeClusterRequest(include_cluster_authorized_operations=False, endpoint_type=2,
                                 include_fenced_brokers=False)


def bad_init_producer_id(c: Case, v: int) -> Steps:
    yield InitProducerIdRequest(transactional_id=c.name("x"), transaction_timeout_ms=60_000,
                                producer_id=-1, producer_epoch=-1)


def bad_find_transaction_coordinator(c: Case, v: int) -> Steps:
    yield FindCoordinatorRequest(key=c.name("x"), key_type=1, coordinator_keys=[c.name("x")])


def bad_fetch_offset(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    c.produce(topic, [b"a"])
    yield fetch(topic, 10, max_wait_ms=100)


def bad_fetch_topic(c: Case, v: int) -> Steps:
    yield fetch(c.name("u"), 0, max_wait_ms=100)


def bad_produce_partition(c: Case, v: int) -> Steps:
    yield produce(c.create_topic("t"), 4, [b"a"], acks=1)


def bad_produce_topic(c: Case, v: int) -> Steps:
    yield produce(c.name("u"), 0, [b"a"], acks=1)


def bad_group_member(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    member = c.join_and_sync(c.name("g"), topic)
    yield heartbeat(member, generation_id=member.generation_id + 1)
    yield heartbeat(member, member_id="nobody")


def bad_join_group(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    member = c.join_and_sync(c.name("g"), topic)
    yield join_group(member.group, "", topic, protocol_type="connect")
    yield join_group(c.name("u"), "nobody", topic)


def bad_sync_group(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    member = c.join(c.name("g"), topic)
    yield sync_group(member, [0], v, generation_id=member.generation_id + 1)
    yield sync_group(member, [0], v, member_id="nobody")


def bad_leave_group(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    member = c.join_and_sync(c.name("g"), topic)
    yield leave_group(member.group, ["nobody"])
    yield leave_group(c.name("u"), ["nobody"])


def bad_offset_commit(c: Case, v: int) -> Steps:
    topic = c.create_topic("t")
    member = c.join_and_sync(c.name("g"), topic)
    yield offset_commit(member.group, topic, {0: 1}, member.generation_id + 1, member.member_id)
    yield offset_commit(member.group, topic, {0: 1}, member.generation_id, "nobody")
    yield offset_commit(member.group, topic, {0: 1})  # a standalone commit into a live group
    yield offset_commit(c.name("e"), c.name("u"), {0: 1})  # no such topic


EDGE_CASES: dict[str, EdgeCase] = {
    "CreateTopics-existing": EdgeCase(19, bad_create_existing),
    "CreateTopics-duplicate": EdgeCase(19, bad_create_duplicate),
    "CreateTopics-partitions": EdgeCase(19, bad_create_partitions),
    "CreateTopics-config": EdgeCase(19, bad_create_config),
    "CreateTopics-name": EdgeCase(19, bad_create_name),
    "CreateTopics-replication": EdgeCase(19, bad_create_replication),
    "DeleteTopics-unknown": EdgeCase(20, bad_delete_unknown),
    "DeleteTopics-unknown-id": EdgeCase(20, bad_delete_unknown_id, since=6),
    "DeleteTopics-duplicate": EdgeCase(20, bad_delete_duplicate),
    "CreatePartitions-unknown": EdgeCase(37, bad_partitions_unknown),
    "CreatePartitions-fewer": EdgeCase(37, bad_partitions_fewer),
    "CreatePartitions-duplicate": EdgeCase(37, bad_partitions_duplicate),
    "DescribeConfigs-unknown": EdgeCase(32, bad_describe_unknown),
    "DescribeConfigs-broker": EdgeCase(32, bad_describe_broker),
    "AlterConfigs-unknown": EdgeCase(33, bad_alter_unknown),
    "AlterConfigs-value": EdgeCase(33, bad_alter_value),
    "IncrementalAlterConfigs-unknown": EdgeCase(44, bad_incremental_unknown),
    "IncrementalAlterConfigs-ops": EdgeCase(44, bad_incremental_ops),
    "IncrementalAlterConfigs-duplicate": EdgeCase(44, bad_incremental_duplicate),
    "DeleteRecords-bad": EdgeCase(21, bad_delete_records),
    "DeleteGroups-bad": EdgeCase(42, bad_delete_groups),
    "OffsetDelete-bad": EdgeCase(47, bad_offset_delete),
    "DescribeCluster-controllers": EdgeCase(60, bad_describe_cluster, since=1),
    "InitProducerId-transactional": EdgeCase(22, bad_init_producer_id),
    "FindCoordinator-transaction": EdgeCase(10, bad_find_transaction_coordinator, since=1),
    "Fetch-out-of-range": EdgeCase(1, bad_fetch_offset),
    "Fetch-unknown-topic": EdgeCase(1, bad_fetch_topic),
    "Produce-unknown-partition": EdgeCase(0, bad_produce_partition),
    "Produce-unknown-topic": EdgeCase(0, bad_produce_topic),
    "Heartbeat-bad": EdgeCase(12, bad_group_member),
    "JoinGroup-bad": EdgeCase(11, bad_join_group),
    "SyncGroup-bad": EdgeCase(14, bad_sync_group),
    "LeaveGroup-bad": EdgeCase(13, bad_leave_group),
    "OffsetCommit-bad": EdgeCase(8, bad_offset_commit),
}


# --- running a case ----------------------------------------------------------------------------


def drive(build: Builder, response: Any, case: Case, version: int) -> list[tuple[Any, Any]]:
    """The requests `build` makes on one side, each with its answer there."""
    exchanges: list[tuple[Any, Any]] = []
    steps = build(case, version)
    try:
        request = next(steps)
        while True:
            answer = case.wire.request(request, version, response)
            exchanges.append((request, answer))
            request = steps.send(answer)
    except StopIteration:
        pass
    finally:
        steps.close()
    return exchanges


# --- normalisation -----------------------------------------------------------------------------

NOT_COMPARED = "<not compared>"


@dataclass(frozen=True, slots=True)
class Rule:
    why: str
    fix: Callable[[Any, Normaliser], Any]


def _not_compared(value: Any, norm: Normaliser) -> Any:
    return NOT_COMPARED


def _tokens(kind: str) -> Callable[[Any, Normaliser], Any]:
    def fix(value: Any, norm: Normaliser) -> Any:
        if isinstance(value, list):
            return [norm.token(kind, v) for v in value]
        return norm.token(kind, value)
    return fix


def _this_case_only(value: Any, norm: Normaliser) -> Any:
    return norm.plain([g for g in value if norm.is_label(g["group_id"])])


def _resource_name(value: Any, norm: Normaliser) -> Any:
    if norm.is_label(value) or not str(value).isdigit():
        return norm.plain(value)
    return norm.token("node", value)


def _without_kiln_configs(value: Any, norm: Normaliser) -> Any:
    if value is None:
        return None
    return norm.plain([c for c in value if not str(c["name"]).startswith("kiln.")])


def _delivered_records(value: Any, norm: Normaliser) -> Any:
    """The records a consumer takes from the answer, each with the header of its batch:
    those from the fetch offset on. Where a batch starts is not compared: Kafka answers
    whole batches from the one holding the fetch offset, and consumers drop the records
    before it."""
    if not value:
        return value
    data = value if isinstance(value, bytes | bytearray | memoryview) else value.buffer()
    batches = MemoryRecords(bytes(data))
    delivered = []
    while batches.has_next():
        batch = batches.next_batch()
        header = {"leader_epoch": batch.leader_epoch, "magic": batch.magic,
                  "attributes": batch.attributes,
                  "producer_id": norm.token("producer", batch.producer_id),
                  "producer_epoch": batch.producer_epoch}
        delivered += [{"offset": r.offset, "timestamp": r.timestamp, "key": r.key,
                       "value": r.value, "headers": list(r.headers), **header}
                      for r in batch if r.offset >= norm.fetch_offset]
    return delivered


_NODE = Rule("Kiln is the only broker its clients see, under a node id of its own",
             _tokens("node"))
_TOPIC_ID = Rule("each side's topic has an id of its own (zero and non-zero kept apart)",
                 _tokens("topic id"))
_MEMBER = Rule("member ids are made up by the coordinator (relations between them kept)",
               _tokens("member"))

def _clock_reading(value: Any, norm: Normaliser) -> Any:
    return value if value <= 0 else "<a time>"


# Field name -> what may differ there, in every API.
FIELD_RULES: dict[str, Rule] = {
    "transaction_start_time_ms": Rule("each side's clock, read when the transaction began "
                                      "(0 and -1 kept: no transaction)", _clock_reading),
    "throttle_time_ms": Rule("Kafka's quotas may throttle a client; Kiln has none (0)",
                             _not_compared),
    "error_message": Rule("free text; the error code next to it carries the meaning",
                          _not_compared),
    "node_id": _NODE,
    "leader_id": _NODE,
    "controller_id": _NODE,
    "replica_nodes": _NODE,
    "isr_nodes": _NODE,
    "offline_replicas": _NODE,
    "broker_id": _NODE,
    "resource_name": Rule("a broker's configs are named by its node id", _resource_name),
    "host": Rule("Kiln's listener, not Kafka's", _not_compared),
    "port": Rule("Kiln's listener, not Kafka's", _not_compared),
    "cluster_id": Rule("Kiln presents a cluster of its own", _tokens("cluster")),
    "topic_id": _TOPIC_ID,
    "member_id": _MEMBER,
    "producer_id": Rule("each side allocates producer ids from its own range",
                        _tokens("producer")),
    "records": Rule("compared record by record, as a consumer takes them",
                    _delivered_records),
    "configs": Rule("Kiln's `kiln.*` policies are topic configs of its own",
                    _without_kiln_configs),
}

# (API key, field name) -> what may differ there in that API only.
API_RULES: dict[tuple[int, str], Rule] = {
    (11, "leader"): _MEMBER,
    (16, "groups"): Rule("the groups of other cases, and Kafka's groups of other tests, are "
                         "listed too", _this_case_only),
    (18, "api_keys"): Rule("Kiln advertises what it serves; check_api_versions checks each "
                           "range is one Kafka serves", _not_compared),
    (18, "supported_features"): Rule("features (KIP-584) describe Kafka's cluster, which "
                                     "Kiln does not stand for", _not_compared),
    (18, "finalized_features"): Rule("as supported_features", _not_compared),
    (18, "finalized_features_epoch"): Rule("as supported_features", _not_compared),
}

# Fields that name an entry of an array: arrays are compared sorted by them. Not the ids
# a side makes up (member ids, node ids): those sort differently on each side.
IDENTITY_FIELDS = ("name", "topic", "resource_name", "group_id", "partition_index",
                   "partition", "index", "api_key", "key")


class Normaliser:
    """Turns one side's answer into plain data comparable with the other side's: names
    become the labels both sides share, and the fields of FIELD_RULES and API_RULES become
    what both sides must agree on there."""

    def __init__(self, api_key: int, labels: dict[str, str]) -> None:
        self._api_key = api_key
        self._labels = labels
        self._tokens: dict[str, dict[Any, str]] = {}
        self.fetch_offset = 0

    def answer(self, request: Any, answer: Any) -> Any:
        if answer is None:
            return None
        # The builders fetch one partition a request.
        self.fetch_offset = min((p.fetch_offset for t in getattr(request, "topics", None) or []
                                 for p in getattr(t, "partitions", None) or []
                                 if hasattr(p, "fetch_offset")), default=0)
        return self.plain(answer.to_dict(json=False))

    def is_label(self, name: Any) -> bool:
        return name in self._labels

    def token(self, kind: str, value: Any) -> Any:
        """`value` as the n-th distinct `kind` this side named; "none" values kept as they
        are, since a -1 where the other side has an id is a real difference."""
        if value in (-1, None, "", ZERO_UUID):
            return value
        if isinstance(value, str) and value.lstrip("-").isdigit():
            value = int(value)
        seen = self._tokens.setdefault(kind, {})
        if value not in seen:
            seen[value] = f"<{kind} {len(seen) + 1}>"
        return seen[value]

    def field(self, name: str, value: Any) -> Any:
        rule = API_RULES.get((self._api_key, name)) or FIELD_RULES.get(name)
        return self.plain(value) if rule is None else rule.fix(value, self)

    def plain(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self.field(k, v) for k, v in value.items()}
        if isinstance(value, list):
            # Sorted before tokens are given, so that both sides give them in one order.
            return [self.plain(v) for v in self._sorted(value)]
        if isinstance(value, str):
            return self._labels.get(value, value)
        if isinstance(value, bytes | bytearray | memoryview):
            data = bytes(value)
            for name, label in self._labels.items():
                data = data.replace(name.encode(), label.encode())
            return data
        return value

    def _sorted(self, entries: list[Any]) -> list[Any]:
        if not entries or not all(isinstance(e, dict) for e in entries):
            return entries
        keys = [f for f in IDENTITY_FIELDS if all(f in e for e in entries)]
        return sorted(entries, key=lambda e: tuple(
            repr(self._labels.get(e[k], e[k]) if isinstance(e[k], str) else e[k])
            for k in keys))


# Marks the difference in an array's length, apart from differences in its entries.
LENGTH = "#length"


def differences(kiln: Any, kafka: Any, path: str = "") -> list[str]:
    """Where two normalised answers differ, one line each (Kiln's value, then Kafka's)."""
    if isinstance(kiln, dict) and isinstance(kafka, dict):
        found = []
        for key in sorted(set(kiln) | set(kafka)):
            where = f"{path}.{key}" if path else key
            if key not in kiln or key not in kafka:
                found.append(f"{where}: field only in {'Kiln' if key in kiln else 'Kafka'}")
            else:
                found += differences(kiln[key], kafka[key], where)
        return found
    if isinstance(kiln, list) and isinstance(kafka, list):
        found = []
        if len(kiln) != len(kafka):
            found.append(f"{path}{LENGTH}: {len(kiln)} entries from Kiln, {len(kafka)} from "
                         "Kafka")
        # The entries both have are compared all the same: a short answer may differ in them
        # too.
        for i, (a, b) in enumerate(zip(kiln, kafka, strict=False)):
            found += differences(a, b, f"{path}[{i}]")
        return found
    if kiln != kafka:
        return [f"{path}: {kiln!r} from Kiln, {kafka!r} from Kafka"]
    return []
