"""Kafka error codes, and the one exception type that carries them across layers."""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """The Kafka error codes Kiln answers with (numbers from the Kafka protocol guide)."""

    retriable: bool

    def __new__(cls, value: int, retriable: bool = False) -> ErrorCode:
        member = int.__new__(cls, value)
        member._value_ = value
        member.retriable = retriable
        return member

    UNKNOWN_SERVER_ERROR = (-1, False)
    NONE = (0, False)
    OFFSET_OUT_OF_RANGE = (1, False)
    CORRUPT_MESSAGE = (2, True)
    UNKNOWN_TOPIC_OR_PARTITION = (3, True)
    INVALID_FETCH_SIZE = (4, False)
    LEADER_NOT_AVAILABLE = (5, True)
    NOT_LEADER_OR_FOLLOWER = (6, True)
    REQUEST_TIMED_OUT = (7, True)
    MESSAGE_TOO_LARGE = (10, False)
    OFFSET_METADATA_TOO_LARGE = (12, False)
    COORDINATOR_LOAD_IN_PROGRESS = (14, True)
    COORDINATOR_NOT_AVAILABLE = (15, True)
    NOT_COORDINATOR = (16, True)
    INVALID_TOPIC_EXCEPTION = (17, False)
    RECORD_LIST_TOO_LARGE = (18, False)
    NOT_ENOUGH_REPLICAS = (19, True)
    INVALID_REQUIRED_ACKS = (21, False)
    ILLEGAL_GENERATION = (22, False)
    INCONSISTENT_GROUP_PROTOCOL = (23, False)
    INVALID_GROUP_ID = (24, False)
    UNKNOWN_MEMBER_ID = (25, False)
    INVALID_SESSION_TIMEOUT = (26, False)
    REBALANCE_IN_PROGRESS = (27, False)
    UNSUPPORTED_VERSION = (35, False)
    TOPIC_ALREADY_EXISTS = (36, False)
    INVALID_PARTITIONS = (37, False)
    INVALID_REPLICATION_FACTOR = (38, False)
    INVALID_REPLICA_ASSIGNMENT = (39, False)
    INVALID_CONFIG = (40, False)
    INVALID_REQUEST = (42, False)
    UNSUPPORTED_FOR_MESSAGE_FORMAT = (43, False)
    POLICY_VIOLATION = (44, False)
    OUT_OF_ORDER_SEQUENCE_NUMBER = (45, False)
    DUPLICATE_SEQUENCE_NUMBER = (46, False)
    INVALID_PRODUCER_EPOCH = (47, False)
    INVALID_TXN_STATE = (48, False)
    INVALID_PRODUCER_ID_MAPPING = (49, False)
    INVALID_TRANSACTION_TIMEOUT = (50, False)
    CONCURRENT_TRANSACTIONS = (51, True)
    TRANSACTION_COORDINATOR_FENCED = (52, False)
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = (53, False)
    OPERATION_NOT_ATTEMPTED = (55, False)
    CLUSTER_AUTHORIZATION_FAILED = (31, False)
    UNSUPPORTED_SASL_MECHANISM = (33, False)
    ILLEGAL_SASL_STATE = (34, False)
    SASL_AUTHENTICATION_FAILED = (58, False)
    INVALID_TIMESTAMP = (32, False)
    UNKNOWN_PRODUCER_ID = (59, False)
    KAFKA_STORAGE_ERROR = (56, True)
    NON_EMPTY_GROUP = (68, False)
    GROUP_ID_NOT_FOUND = (69, False)
    TOPIC_DELETION_DISABLED = (73, False)
    FENCED_LEADER_EPOCH = (74, True)
    UNKNOWN_LEADER_EPOCH = (75, True)
    GROUP_SUBSCRIBED_TO_TOPIC = (86, False)
    UNSUPPORTED_COMPRESSION_TYPE = (76, False)
    MEMBER_ID_REQUIRED = (79, False)
    INVALID_RECORD = (87, False)
    UNSTABLE_OFFSET_COMMIT = (88, True)
    GROUP_MAX_SIZE_REACHED = (81, False)
    FENCED_INSTANCE_ID = (82, False)
    THROTTLING_QUOTA_EXCEEDED = (89, True)
    PRODUCER_FENCED = (90, False)
    UNKNOWN_TOPIC_ID = (100, True)
    TRANSACTIONAL_ID_NOT_FOUND = (105, False)
    FENCED_MEMBER_EPOCH = (110, False)
    UNRELEASED_INSTANCE_ID = (111, False)
    UNSUPPORTED_ASSIGNOR = (112, False)
    STALE_MEMBER_EPOCH = (113, False)
    MISMATCHED_ENDPOINT_TYPE = (114, False)
    UNSUPPORTED_ENDPOINT_TYPE = (115, False)
    TRANSACTION_ABORTABLE = (120, False)
    INVALID_REGULAR_EXPRESSION = (128, False)

    @classmethod
    def of(cls, value: int) -> ErrorCode:
        """The member for a code read off the wire; unknown codes become UNKNOWN_SERVER_ERROR."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN_SERVER_ERROR


class KafkaError(Exception):
    """An error that becomes a Kafka error code at the protocol boundary."""

    def __init__(self, error_code: ErrorCode, message: str = "") -> None:
        super().__init__(f"{error_code.name}: {message}" if message else error_code.name)
        self.error_code = error_code
        self.message = message or error_code.name

    @property
    def retriable(self) -> bool:
        return self.error_code.retriable


class MalformedRequest(Exception):
    """A frame that cannot be parsed. Where a correlation id is known it is carried."""

    def __init__(self, message: str, correlation_id: int | None = None) -> None:
        super().__init__(message)
        self.correlation_id = correlation_id
