"""What goes in and out of a KIP-848 consumer group: the heartbeat and its answer, settings,
states and topic metadata, and what Kafka refuses before it looks a group up. Plain values,
no I/O; field names follow Kafka's."""

from __future__ import annotations

import enum
import functools
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import re2

from storage.groups.assignors import ASSIGNORS
from wire.errors import ErrorCode

# The member epochs of a leaving member (dynamic, and static that may come back).
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2
JOIN_EPOCH = 0


class ConsumerGroupState(enum.Enum):
    """Kafka's consumer group states; the values are the names ListGroups reports."""

    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


class MemberState(enum.Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


@dataclass(frozen=True, slots=True)
class ConsumerGroupSettings:
    # Kafka's group.consumer.session.timeout.ms and group.consumer.heartbeat.interval.ms.
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    # Kafka's group.consumer.max.size.
    max_size: int = 2**31 - 1


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    topic_id: uuid.UUID
    partitions: int


@dataclass(frozen=True, slots=True)
class ConsumerHeartbeat:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None
    rack_id: str | None
    rebalance_timeout_ms: int  # -1: unchanged
    subscribed_topic_names: tuple[str, ...] | None  # None: unchanged
    subscribed_topic_regex: str | None  # None: unchanged
    server_assignor: str | None
    # The partitions the member owns (topic id -> partitions); None: unchanged since the last.
    owned: Mapping[uuid.UUID, frozenset[int]] | None
    client_id: str
    client_host: str


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    error_code: ErrorCode
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    # topic id -> partitions; None: the member's assignment is not repeated.
    assignment: Mapping[uuid.UUID, frozenset[int]] | None = None


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


@functools.lru_cache(maxsize=1024)
def topic_regex(pattern: str) -> Any:
    """A subscription regex, compiled with RE2 as Kafka's coordinator compiles it (RE2/J):
    matching runs in linear time, where a backtracking engine given `(a+)+b` and a long topic
    name would hold Kiln's event loop for seconds or for good. re2.error when invalid."""
    return re2.compile(pattern, _RE2_OPTIONS)


def heartbeat_precheck(request: ConsumerHeartbeat) -> HeartbeatResult | None:
    """What Kafka refuses before it looks the group up (INVALID_REQUEST, with its words)."""
    def invalid(message: str) -> HeartbeatResult:
        return HeartbeatResult(ErrorCode.INVALID_REQUEST, message)

    if not request.group_id:
        return invalid("GroupId can't be empty.")
    if request.instance_id == "":
        return invalid("InstanceId can't be empty.")
    if request.rack_id == "":
        return invalid("RackId can't be empty.")
    epoch = request.member_epoch
    if epoch == JOIN_EPOCH:
        if request.rebalance_timeout_ms == -1:
            return invalid("RebalanceTimeoutMs must be provided in first request.")
        if request.owned is None or any(request.owned.values()):
            return invalid("TopicPartitions must be empty when (re-)joining.")
        if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
            return invalid("SubscribedTopicNames or SubscribedTopicRegex must be set in "
                           "first request.")
    elif epoch == STATIC_LEAVE_EPOCH and request.instance_id is None:
        return invalid("InstanceId can't be null.")
    elif epoch < STATIC_LEAVE_EPOCH:
        return invalid(f"MemberEpoch is {epoch}, but must be greater than or equal to -2.")
    if epoch != JOIN_EPOCH and not request.member_id:
        return invalid("MemberId can't be empty.")
    if request.subscribed_topic_regex:
        try:
            topic_regex(request.subscribed_topic_regex)
        except re2.error as exc:
            return HeartbeatResult(ErrorCode.INVALID_REGULAR_EXPRESSION,
                                   f"SubscribedTopicRegex is invalid: {exc}")
    if request.server_assignor is not None and request.server_assignor not in ASSIGNORS:
        return HeartbeatResult(ErrorCode.UNSUPPORTED_ASSIGNOR,
                               f"ServerAssignor {request.server_assignor} is not supported. "
                               f"Supported assignors: {', '.join(sorted(ASSIGNORS))}.")
    return None
