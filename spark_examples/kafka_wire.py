"""A small blocking Kafka client for the compatible reader: metadata, offsets and fetches.

Requests and answers are encoded and decoded with kafka-python's protocol classes (generated
from Kafka's own schemas); this module adds one socket per broker, version negotiation
(ApiVersions) and routing to partition leaders. Fetch answers come back with their record
sets undecoded, for `record_sets.py`. kafka-python's own consumer was not used because it
decodes records in pure Python (about 60 k records/s here).

Only PLAINTEXT connections. Every failure raises `KafkaWireError`; a retriable one (a lost
connection, a leader that moved) also forgets the routing, so that asking again looks it up.

The end of a partition is taken from a Fetch answer (the high watermark, or the last stable
offset when reading committed data), not from ListOffsets alone: tansu 0.6 answers
ListOffsets LATEST with a wrong offset, while its Fetch answers carry the right watermark.
"""

from __future__ import annotations

import logging
import socket
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar

import kafka.errors
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)

from spark_examples.options import EARLIEST, LATEST, Subscription, TopicPartition
from spark_examples.record_sets import AbortedTransaction

log = logging.getLogger(__name__)

T = TypeVar("T")

NONE = 0
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3

_SIZE = struct.Struct(">i")
_READ_UNCOMMITTED = 0
_READ_COMMITTED = 1
# Versions used: the highest both sides know, up to these (Fetch v13 names topics by id,
# which this client does not track); at least these (isolation levels, null topic lists).
_HIGHEST = {FetchRequest.API_KEY: 12, ListOffsetsRequest.API_KEY: 7,
            MetadataRequest.API_KEY: 12}
_LOWEST = {FetchRequest.API_KEY: 4, ListOffsetsRequest.API_KEY: 2,
           MetadataRequest.API_KEY: 1}
_RESPONSES: dict[int, Any] = {FetchRequest.API_KEY: FetchResponse,
                              ListOffsetsRequest.API_KEY: ListOffsetsResponse,
                              MetadataRequest.API_KEY: MetadataResponse}


class KafkaWireError(Exception):
    """A request failed; `retriable` says whether asking again may succeed."""

    def __init__(self, message: str, *, retriable: bool, error_code: int | None = None) -> None:
        super().__init__(message)
        self.retriable = retriable
        self.error_code = error_code


def error_for(code: int, context: str) -> KafkaWireError:
    known: Any = kafka.errors.for_code(code)
    return KafkaWireError(f"{context}: {known.__name__} ({code})", retriable=bool(known.retriable),
                          error_code=code)


@dataclass(frozen=True, slots=True)
class PartitionFetch:
    """One partition of a Fetch answer; `aborted` is None unless committed data was asked
    for. `records` may end in a truncated batch."""

    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted: tuple[AbortedTransaction, ...] | None
    records: bytes

    def end(self, read_committed: bool) -> int:
        """Where a reader of this isolation level must stop."""
        if read_committed and self.last_stable_offset >= 0:
            return self.last_stable_offset
        return self.high_watermark


def parse_bootstrap(servers: str) -> list[tuple[str, int]]:
    """`host:port,host:port` as (host, port) pairs."""
    out = []
    for item in servers.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not port.isdigit():
            raise KafkaWireError(f"bad bootstrap server {item.strip()!r}: want host:port",
                                 retriable=False)
        out.append((host.strip("[]") or "127.0.0.1", int(port)))
    return out


class _BrokerSocket:
    """One connection to one broker, one request at a time."""

    def __init__(self, host: str, port: int, client_id: str, timeout_s: float) -> None:
        self.address = f"{host}:{port}"
        self._client_id = client_id
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            raise KafkaWireError(f"cannot connect to {self.address}: {exc}",
                                 retriable=True) from exc
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._correlation_id = 0
        self._versions: dict[int, int] = {}
        try:
            self._negotiate()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._sock.close()

    def request(self, message: Any, timeout_s: float | None = None) -> Any:
        api_key = int(message.API_KEY)
        version = self._versions.get(api_key)
        if version is None:
            raise KafkaWireError(f"{self.address} shares no usable version of API {api_key}",
                                 retriable=False)
        return self._exchange(message, version, _RESPONSES[api_key], timeout_s)

    def _negotiate(self) -> None:
        answer = self._exchange(ApiVersionsRequest(), 0, ApiVersionsResponse, None)
        if answer.error_code != NONE:
            raise error_for(answer.error_code, f"ApiVersions to {self.address}")
        for api in answer.api_keys:
            highest = _HIGHEST.get(api.api_key)
            if highest is None:
                continue
            version = min(highest, api.max_version)
            if version >= max(_LOWEST[api.api_key], api.min_version):
                self._versions[api.api_key] = version

    def _exchange(self, message: Any, version: int, response_class: Any,
                  timeout_s: float | None) -> Any:
        self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        message.with_header(correlation_id=self._correlation_id, client_id=self._client_id)
        frame = bytes(message.encode(version=version, header=True, framed=True))
        previous = self._sock.gettimeout()
        try:
            if timeout_s is not None:
                self._sock.settimeout(timeout_s)
            self._sock.sendall(frame)
            size = _SIZE.unpack(self._read(4))[0]
            answer = self._read(size)
        except OSError as exc:  # socket.timeout included
            raise KafkaWireError(f"{self.address}: {exc!r}", retriable=True) from exc
        finally:
            if timeout_s is not None:
                self._sock.settimeout(previous)
        try:
            response = response_class.decode(answer, version=version, header=True)
        except (ValueError, IndexError, struct.error, UnicodeDecodeError, KeyError) as exc:
            raise KafkaWireError(f"{self.address}: undecodable answer: {exc!r}",
                                 retriable=False) from exc
        if response.header.correlation_id != self._correlation_id:
            raise KafkaWireError(f"{self.address}: answer to another request", retriable=True)
        return response

    def _read(self, size: int) -> memoryview:
        buffer = bytearray(size)
        view = memoryview(buffer)
        got = 0
        while got < size:
            n = self._sock.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("the broker closed the connection")
            got += n
        return view


class KafkaWire:
    """Blocking requests to a Kafka cluster; close() (or `with`) releases the sockets."""

    def __init__(self, bootstrap_servers: str, *, client_id: str = "kiln-spark-reader",
                 timeout_s: float = 30.0) -> None:
        self._bootstrap = parse_bootstrap(bootstrap_servers)
        self._client_id = client_id
        self._timeout_s = timeout_s
        self._sockets: dict[int | str, _BrokerSocket] = {}
        self._brokers: dict[int, tuple[str, int]] = {}
        self._leaders: dict[TopicPartition, int] = {}
        self._known_ends: dict[TopicPartition, int] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        for sock in self._sockets.values():
            sock.close()
        self._sockets.clear()

    # --- metadata ----------------------------------------------------------------------

    def partitions(self, subscription: Subscription) -> list[TopicPartition]:
        """The partitions a subscription names that exist now, learning their leaders."""
        if subscription.kind == "assign":
            topics: list[str] | None = sorted({tp.topic for tp in subscription.partitions})
        elif subscription.kind == "subscribe":
            topics = list(subscription.topics)
        else:
            topics = None  # every topic, matched against the pattern below
        found = self._metadata(topics)
        if subscription.kind == "assign":
            return [tp for tp in subscription.partitions if tp in found]
        return [tp for tp in found if subscription.wants(tp.topic)]

    def _metadata(self, topics: list[str] | None) -> list[TopicPartition]:
        request = MetadataRequest(
            topics=None if topics is None else [
                MetadataRequest.MetadataRequestTopic(name=t) for t in topics],
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
        key, sock = self._any_broker()
        try:
            response = sock.request(request, self._timeout_s)
        except KafkaWireError as exc:
            if exc.retriable:
                self._drop(key)
            raise
        self._brokers = {b.node_id: (b.host, b.port) for b in response.brokers}
        found = []
        for topic in response.topics:
            if topic.error_code == UNKNOWN_TOPIC_OR_PARTITION:
                continue  # not created yet: a subscription waits for it
            if topic.error_code != NONE:
                raise error_for(topic.error_code, f"metadata of {topic.name}")
            if getattr(topic, "is_internal", False) and topics is None:
                continue
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition_index)
                found.append(tp)
                if p.leader_id >= 0:
                    self._leaders[tp] = p.leader_id
                else:
                    self._leaders.pop(tp, None)
        return sorted(found)

    # --- offsets -----------------------------------------------------------------------

    def list_offsets(self, tps: Iterable[TopicPartition], timestamp: int,
                     read_committed: bool = False) -> dict[TopicPartition, int]:
        """ListOffsets for EARLIEST (-2) or LATEST (-1), per partition."""
        out: dict[TopicPartition, int] = {}
        for leader, group in self._by_leader(tps).items():
            by_topic: dict[str, list[int]] = {}
            for tp in group:
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            request = ListOffsetsRequest(
                replica_id=-1,
                isolation_level=_READ_COMMITTED if read_committed else _READ_UNCOMMITTED,
                topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
                    ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                        partition_index=p, current_leader_epoch=-1, timestamp=timestamp)
                    for p in partitions]) for topic, partitions in by_topic.items()],
            )
            response = self._leader_request(leader, request, group)
            for topic in response.topics:
                for p in topic.partitions:
                    tp = TopicPartition(topic.name, p.partition_index)
                    if p.error_code != NONE:
                        self._forget(tp)
                        raise error_for(p.error_code, f"list offsets of {tp}")
                    out[tp] = int(p.offset)
        return out

    def earliest_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self.list_offsets(tps, EARLIEST)

    def end_offsets(self, tps: Iterable[TopicPartition], read_committed: bool
                    ) -> dict[TopicPartition, int]:
        """Per partition, the offset after the last record a reader of this isolation level
        may read now, from Fetch answers (see the module docstring).

        Each fetch starts at ListOffsets' idea of the end, or at the end seen last time when
        that is further, so it moves at most one batch.
        """
        wanted = list(tps)
        if not wanted:
            return {}
        hints = self.list_offsets(wanted, LATEST, read_committed)
        starts = {tp: max(hints[tp], self._known_ends.get(tp, 0), 0) for tp in wanted}
        answers = self.fetch(starts, max_bytes=1, read_committed=read_committed, max_wait_ms=1)
        lost = [tp for tp, a in answers.items() if a.error_code == OFFSET_OUT_OF_RANGE]
        if lost:  # the partition shrank below what was seen: ask from its start
            for tp in lost:
                self._known_ends.pop(tp, None)
            earliest = self.earliest_offsets(lost)
            answers.update(self.fetch(earliest, max_bytes=1, read_committed=read_committed,
                                      max_wait_ms=1))
        ends = {}
        for tp, answer in answers.items():
            if answer.error_code != NONE:
                raise error_for(answer.error_code, f"end offset of {tp}")
            ends[tp] = answer.end(read_committed)
        self._known_ends.update(ends)
        return ends

    # --- fetch -------------------------------------------------------------------------

    def fetch(self, positions: Mapping[TopicPartition, int], *, max_bytes: int,
              read_committed: bool, max_wait_ms: int) -> dict[TopicPartition, PartitionFetch]:
        """One Fetch per leader. Error codes other than NONE and OFFSET_OUT_OF_RANGE raise.
        max_wait_ms is kept at 1 or more: tansu answers a 0 ms fetch empty."""
        out: dict[TopicPartition, PartitionFetch] = {}
        for leader, group in self._by_leader(positions).items():
            by_topic: dict[str, list[Any]] = {}
            for tp in group:
                by_topic.setdefault(tp.topic, []).append(FetchRequest.FetchTopic.FetchPartition(
                    partition=tp.partition, current_leader_epoch=-1,
                    fetch_offset=positions[tp], last_fetched_epoch=-1, log_start_offset=-1,
                    partition_max_bytes=max_bytes))
            request = FetchRequest(
                replica_id=-1, max_wait_ms=max(1, max_wait_ms), min_bytes=1,
                max_bytes=max(max_bytes, max_bytes * len(group)),
                isolation_level=_READ_COMMITTED if read_committed else _READ_UNCOMMITTED,
                session_id=0, session_epoch=-1,
                topics=[FetchRequest.FetchTopic(topic=topic, partitions=partitions)
                        for topic, partitions in by_topic.items()],
                forgotten_topics_data=[], rack_id="",
            )
            timeout_s = self._timeout_s + max_wait_ms / 1000
            response = self._leader_request(leader, request, group, timeout_s)
            top_code = int(getattr(response, "error_code", 0) or 0)
            if top_code:
                raise error_for(top_code, "fetch")
            for topic in response.responses:
                for p in topic.partitions:
                    tp = TopicPartition(topic.topic, p.partition_index)
                    if p.error_code not in (NONE, OFFSET_OUT_OF_RANGE):
                        self._forget(tp)
                        raise error_for(p.error_code, f"fetch {tp} at {positions.get(tp)}")
                    aborted = None
                    if read_committed:
                        aborted = tuple(AbortedTransaction(int(a.producer_id),
                                                           int(a.first_offset))
                                        for a in p.aborted_transactions or ())
                    out[tp] = PartitionFetch(int(p.error_code), int(p.high_watermark),
                                             int(p.last_stable_offset),
                                             int(p.log_start_offset), aborted,
                                             bytes(p.records or b""))
        return out

    # --- routing -----------------------------------------------------------------------

    def _by_leader(self, tps: Iterable[TopicPartition]) -> dict[int, list[TopicPartition]]:
        wanted = list(tps)
        unknown = sorted({tp.topic for tp in wanted if tp not in self._leaders})
        if unknown:
            self._metadata(unknown)
        groups: dict[int, list[TopicPartition]] = {}
        for tp in wanted:
            leader = self._leaders.get(tp)
            if leader is None:
                raise KafkaWireError(f"{tp} has no leader (or does not exist)", retriable=True,
                                     error_code=UNKNOWN_TOPIC_OR_PARTITION)
            groups.setdefault(leader, []).append(tp)
        return groups

    def _leader_request(self, leader: int, request: Any, group: list[TopicPartition],
                        timeout_s: float | None = None) -> Any:
        try:
            return self._broker(leader).request(request, timeout_s or self._timeout_s)
        except KafkaWireError as exc:
            if exc.retriable:
                self._drop(leader)
                for tp in group:
                    self._forget(tp)
            raise

    def _forget(self, tp: TopicPartition) -> None:
        self._leaders.pop(tp, None)

    def _drop(self, key: int | str) -> None:
        sock = self._sockets.pop(key, None)
        if sock is not None:
            sock.close()

    def _broker(self, node_id: int) -> _BrokerSocket:
        sock = self._sockets.get(node_id)
        if sock is None:
            address = self._brokers.get(node_id)
            if address is None:
                raise KafkaWireError(f"broker {node_id} is unknown", retriable=True)
            sock = _BrokerSocket(*address, self._client_id, self._timeout_s)
            self._sockets[node_id] = sock
        return sock

    def _any_broker(self) -> tuple[int | str, _BrokerSocket]:
        """A connection for requests any broker can answer: an open one, else a new one to
        a bootstrap server."""
        for key, sock in self._sockets.items():
            return key, sock
        failures = []
        for host, port in self._bootstrap:
            try:
                sock = _BrokerSocket(host, port, self._client_id, self._timeout_s)
            except KafkaWireError as exc:
                failures.append(str(exc))
                continue
            key = f"bootstrap:{host}:{port}"
            self._sockets[key] = sock
            return key, sock
        raise KafkaWireError("no bootstrap server answers: " + "; ".join(failures),
                             retriable=True)


def with_retries(action: Callable[[], T], *, attempts: int, interval_s: float, what: str) -> T:
    """Run `action()`; after a retriable KafkaWireError wait and run it again, up to
    `attempts` times in all."""
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except KafkaWireError as exc:
            if not exc.retriable or attempt == attempts:
                raise
            log.info("%s failed (%s), attempt %d of %d; retrying", what, exc, attempt, attempts)
            time.sleep(interval_s)
    raise AssertionError("unreachable")
