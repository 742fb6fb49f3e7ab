"""Which APIs and versions Kiln speaks, and the codecs for their bodies.

Bodies are encoded and decoded with kafka-python's classes, generated from Kafka's own JSON
schemas. This module is the only place that touches them, so the rest of Kiln sees plain
attribute objects and never Kafka bytes.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Any

from kafka.protocol import admin, consumer, metadata, producer, sasl

from wire import consumer_groups
from wire.errors import MalformedRequest
from wire.header import (
    RequestHeader,
    parse_request_header,
    peek_api,
    request_frame,
    response_frame,
    skip_tagged_fields,
)
from wire.required_fields import refuse_nulls

# kafka-python ships no type information; a message is an attribute bag.
Message = Any


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    INCREMENTAL_ALTER_CONFIGS = 44
    OFFSET_DELETE = 47
    DESCRIBE_CLUSTER = 60
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69


@dataclass(frozen=True, slots=True)
class ApiSpec:
    api_key: ApiKey
    min_version: int
    max_version: int
    request: Any
    response: Any
    # Lowest version actually handled; below it (but >= min_version) the connection closes.
    # Produce advertises 0 because librdkafka 2.0 sends compressed batches uncompressed to a
    # broker whose Produce minimum is above 0, yet Kiln only handles magic-2 batches (v3+).
    handled_from: int | None = None

    @property
    def lowest_handled(self) -> int:
        return self.min_version if self.handled_from is None else self.handled_from


def _spec(key: ApiKey, lo: int, hi: int, req: Any, resp: Any,
          handled: int | None = None) -> ApiSpec:
    return ApiSpec(key, lo, hi, req, resp, handled)


# The ranges every client in the notes accepted; Kiln's own ceiling where lower.
CLIENT_APIS: dict[int, ApiSpec] = {
    s.api_key: s
    for s in (
        _spec(ApiKey.PRODUCE, 0, 11, producer.ProduceRequest, producer.ProduceResponse, 3),
        _spec(ApiKey.METADATA, 0, 12, metadata.MetadataRequest, metadata.MetadataResponse),
        # SASL (proxy/authentication.py): SaslHandshake v1 only, as every current client
        # asks (v0's bare tokens without a request header are not served).
        _spec(ApiKey.SASL_HANDSHAKE, 1, 1, sasl.SaslHandshakeRequest,
              sasl.SaslHandshakeResponse),
        _spec(ApiKey.SASL_AUTHENTICATE, 0, 2, sasl.SaslAuthenticateRequest,
              sasl.SaslAuthenticateResponse),
        _spec(
            ApiKey.API_VERSIONS, 0, 4, metadata.ApiVersionsRequest, metadata.ApiVersionsResponse
        ),
        _spec(
            ApiKey.INIT_PRODUCER_ID,
            0,
            5,
            producer.InitProducerIdRequest,
            producer.InitProducerIdResponse,
        ),
        # Topic administration: from the lowest version Apache Kafka 4 still serves (KIP-896).
        _spec(ApiKey.CREATE_TOPICS, 2, 7, admin.CreateTopicsRequest, admin.CreateTopicsResponse),
        _spec(ApiKey.DELETE_TOPICS, 1, 6, admin.DeleteTopicsRequest, admin.DeleteTopicsResponse),
        _spec(ApiKey.CREATE_PARTITIONS, 0, 3, admin.CreatePartitionsRequest,
              admin.CreatePartitionsResponse),
        # Configs (Kafka's for the hardened topic, Kiln's `kiln.*` policies) and the cluster:
        # the versions kafka-python encodes that Apache Kafka 4 still serves (KIP-896).
        _spec(ApiKey.DESCRIBE_CONFIGS, 1, 4, admin.DescribeConfigsRequest,
              admin.DescribeConfigsResponse),
        _spec(ApiKey.ALTER_CONFIGS, 0, 2, admin.AlterConfigsRequest, admin.AlterConfigsResponse),
        _spec(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, 1, admin.IncrementalAlterConfigsRequest,
              admin.IncrementalAlterConfigsResponse),
        _spec(ApiKey.DESCRIBE_CLUSTER, 0, 2, admin.DescribeClusterRequest,
              admin.DescribeClusterResponse),
        # Advertised for librdkafka too: it only uses record batches v2 (and zstd) when the
        # broker offers Fetch v4 (v10).
        _spec(ApiKey.FETCH, 4, 12, consumer.FetchRequest, consumer.FetchResponse),
        # v7+ asks for the record with the largest timestamp (-3), v8+ for the local log start
        # (-4), v9+ and v11+ for tiered-storage positions (-5, -6), answered as a Kafka
        # without tiered storage answers them.
        _spec(
            ApiKey.LIST_OFFSETS, 1, 11, consumer.ListOffsetsRequest, consumer.ListOffsetsResponse
        ),
        # Consumers that detect truncation ask it after a leader change (Kafka 4 serves 2+).
        _spec(ApiKey.OFFSET_FOR_LEADER_EPOCH, 2, 4, consumer.OffsetForLeaderEpochRequest,
              consumer.OffsetForLeaderEpochResponse),
        _spec(ApiKey.DELETE_RECORDS, 0, 2, admin.DeleteRecordsRequest,
              admin.DeleteRecordsResponse),
        # librdkafka compresses with lz4 only for brokers that offer FindCoordinator.
        _spec(
            ApiKey.FIND_COORDINATOR,
            0,
            4,
            metadata.FindCoordinatorRequest,
            metadata.FindCoordinatorResponse,
        ),
        # Consumer groups, the classic protocol (storage/groups).
        _spec(
            ApiKey.OFFSET_COMMIT, 2, 9, consumer.OffsetCommitRequest, consumer.OffsetCommitResponse
        ),
        _spec(
            ApiKey.OFFSET_FETCH, 1, 9, consumer.OffsetFetchRequest, consumer.OffsetFetchResponse
        ),
        _spec(ApiKey.JOIN_GROUP, 0, 7, consumer.JoinGroupRequest, consumer.JoinGroupResponse),
        _spec(ApiKey.HEARTBEAT, 0, 4, consumer.HeartbeatRequest, consumer.HeartbeatResponse),
        _spec(ApiKey.LEAVE_GROUP, 0, 4, consumer.LeaveGroupRequest, consumer.LeaveGroupResponse),
        _spec(ApiKey.SYNC_GROUP, 0, 5, consumer.SyncGroupRequest, consumer.SyncGroupResponse),
        _spec(
            ApiKey.DESCRIBE_GROUPS, 0, 5, admin.DescribeGroupsRequest, admin.DescribeGroupsResponse
        ),
        _spec(ApiKey.LIST_GROUPS, 0, 5, admin.ListGroupsRequest, admin.ListGroupsResponse),
        _spec(ApiKey.DELETE_GROUPS, 0, 2, admin.DeleteGroupsRequest, admin.DeleteGroupsResponse),
        _spec(ApiKey.OFFSET_DELETE, 0, 0, consumer.OffsetDeleteRequest,
              consumer.OffsetDeleteResponse),
        # Transactions V1 (docs/transactions-design.md): the versions clients send their
        # coordinator; AddPartitionsToTxn v4+ is broker-to-coordinator only, EndTxn v5+ and
        # the epoch bump per transaction belong to transactions V2, not offered.
        _spec(ApiKey.ADD_PARTITIONS_TO_TXN, 0, 3, producer.AddPartitionsToTxnRequest,
              producer.AddPartitionsToTxnResponse),
        _spec(ApiKey.ADD_OFFSETS_TO_TXN, 0, 4, producer.AddOffsetsToTxnRequest,
              producer.AddOffsetsToTxnResponse),
        _spec(ApiKey.END_TXN, 0, 4, producer.EndTxnRequest, producer.EndTxnResponse),
        # v5 belongs to transactions V2.
        _spec(ApiKey.TXN_OFFSET_COMMIT, 0, 4, producer.TxnOffsetCommitRequest,
              producer.TxnOffsetCommitResponse),
        # KIP-664; ListTransactions v2 (KIP-1152) filters by a Java regular expression.
        _spec(ApiKey.DESCRIBE_TRANSACTIONS, 0, 0, admin.DescribeTransactionsRequest,
              admin.DescribeTransactionsResponse),
        _spec(ApiKey.LIST_TRANSACTIONS, 0, 1, admin.ListTransactionsRequest,
              admin.ListTransactionsResponse),
        # KIP-848; kafka-python has no schemas for these (wire/consumer_groups).
        _spec(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, 1,
              consumer_groups.ConsumerGroupHeartbeatRequest,
              consumer_groups.ConsumerGroupHeartbeatResponse),
        _spec(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, 1,
              consumer_groups.ConsumerGroupDescribeRequest,
              consumer_groups.ConsumerGroupDescribeResponse),
    )
}

# Every API Kiln may send to the hardened store: the same set it serves (Kiln fences a
# zombie writer of a hardened partition with an aborted empty transaction,
# storage.kafka.client).
UPSTREAM_APIS: dict[int, ApiSpec] = dict(CLIENT_APIS)


def is_flexible(spec: ApiSpec, version: int) -> bool:
    return bool(spec.request.flexible_version_q(version))


def response_header_flexible(spec: ApiSpec, version: int) -> bool:
    # ApiVersions answers with header v0 at every version, so a client that sent a version the
    # broker does not know can still read the reply.
    return spec.api_key != ApiKey.API_VERSIONS and is_flexible(spec, version)


@dataclass(frozen=True, slots=True)
class Request:
    header: RequestHeader
    spec: ApiSpec
    body: Message


class UnsupportedRequest(Exception):
    """An API key or version Kiln does not serve; carries the parsed header."""

    def __init__(self, header: RequestHeader, known: bool) -> None:
        super().__init__(f"api {header.request_api_key} v{header.request_api_version}")
        self.header = header
        self.known = known


def decode_request(frame: memoryview | bytes) -> Request:
    """Parse one request frame (without its size prefix)."""
    api_key, version = peek_api(frame)
    spec = CLIENT_APIS.get(api_key)
    if spec is None or not spec.lowest_handled <= version <= spec.max_version:
        # Header v1 has everything needed for an error reply; flexible extras are not read.
        header, _ = parse_request_header(frame, flexible=False)
        raise UnsupportedRequest(header, known=spec is not None)
    header, body_at = parse_request_header(frame, is_flexible(spec, version))
    # Bytes after the fields are ignored, as Apache Kafka's broker ignores them: librdkafka
    # sends its all-topics Metadata v12 with a 4-byte placeholder left after the fields.
    what = f"{spec.api_key.name} v{version}"
    body = _decode(spec.request, version, memoryview(frame), body_at, what,
                   header.correlation_id, exact=False)
    refuse_nulls(spec.request, version, body, what, header.correlation_id)
    return Request(header, spec, body)


def _decode(cls: Any, version: int, data: memoryview, pos: int, what: str,
            correlation_id: int | None, *, exact: bool = True) -> Message:
    """Decode a body, refusing one that runs past the end of the frame (and, when `exact`,
    one that ends before it).

    kafka-python's decoder slices strings and byte fields without bounds checks, so a
    truncated frame would otherwise decode into silently shortened values."""
    flexible = bool(cls.flexible_version_q(version))
    decoder = cls._struct.compiled_decode_from(version, compact=flexible, tagged=flexible,
                                               data_class=cls[None])
    try:
        body, end = decoder(data, pos)
    except (ValueError, IndexError, struct.error, UnicodeDecodeError, KeyError, TypeError,
            OverflowError, MemoryError) as exc:
        raise MalformedRequest(f"cannot decode {what}: {exc}", correlation_id) from exc
    if end > len(data) or (exact and end != len(data)):
        raise MalformedRequest(f"{what}: body is {len(data) - pos} bytes, the fields take "
                               f"{end - pos}", correlation_id)
    return body


def encode_response(request: Request, body: Message) -> bytes:
    version = request.header.request_api_version
    payload = body.encode(version=version)
    return response_frame(
        request.header.correlation_id, response_header_flexible(request.spec, version), payload
    )


def encode_client_request(spec: ApiSpec, version: int, correlation_id: int, client_id: str,
                          body: Message) -> bytes:
    """A framed request from Kiln to the hardened store."""
    header = RequestHeader(spec.api_key, version, correlation_id, client_id)
    return request_frame(header, is_flexible(spec, version), body.encode(version=version))


def decode_client_response(spec: ApiSpec, version: int, frame: memoryview | bytes
                           ) -> tuple[int, Message]:
    """(correlation_id, body) of a response frame (without its size prefix)."""
    correlation_id = int(struct.unpack_from(">i", frame, 0)[0])
    pos = 4
    if response_header_flexible(spec, version):
        pos = skip_tagged_fields(frame, pos)
    body = _decode(spec.response, version, memoryview(frame), pos,
                   f"{spec.api_key.name} v{version} response", correlation_id)
    return correlation_id, body


def error_response(spec: ApiSpec, version: int, error_code: int) -> Message:
    """A response of the right shape that carries `error_code` where the API has a top-level
    error field, and no per-topic entries; for requests whose body could not be read."""
    body = spec.response[version]()
    if "error_code" in spec.response.fields:
        body.error_code = error_code
    return body
