"""What goes in and out of group coordination: requests, results, summaries, settings.

Plain values, no I/O; field names follow Kafka's.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from wire.errors import ErrorCode

# The member id of a member that has none yet (Kafka's JoinGroupRequest.UNKNOWN_MEMBER_ID).
UNKNOWN_MEMBER_ID = ""
NO_GENERATION = -1


class GroupState(enum.Enum):
    """Kafka's classic group states; the values are the names DescribeGroups reports."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class MembershipSettings:
    # Kafka's group.initial.rebalance.delay.ms (Kafka defaults to 3 s; Kiln to 300 ms).
    initial_rebalance_delay_ms: int = 300
    # Kafka's group.min.session.timeout.ms and group.max.session.timeout.ms.
    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    # A new member waiting in a rebalance is dropped after this long (Kafka's
    # GroupCoordinator.NewMemberJoinTimeoutMs), whatever its session timeout.
    new_member_join_timeout_ms: int = 300_000
    # Kafka's offset.metadata.max.bytes.
    max_offset_metadata_bytes: int = 4096


@dataclass(frozen=True, slots=True)
class Protocol:
    name: str
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[Protocol, ...]
    # JoinGroup v4+ from a dynamic member: an empty member id gets MEMBER_ID_REQUIRED first.
    require_known_member_id: bool


@dataclass(frozen=True, slots=True)
class JoinMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    error_code: ErrorCode
    member_id: str
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: tuple[JoinMember, ...] = ()


@dataclass(frozen=True, slots=True)
class SyncRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    generation_id: int
    protocol_type: str | None
    protocol_name: str | None
    assignments: Mapping[str, bytes]


@dataclass(frozen=True, slots=True)
class SyncResult:
    error_code: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


# What a member waiting for a JoinGroup or SyncGroup answer is eventually told.
Reply = JoinResult | SyncResult


@dataclass(frozen=True, slots=True)
class MemberIdentity:
    member_id: str
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class MemberSummary:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupSummary:
    group_id: str
    state: GroupState
    protocol_type: str
    protocol_name: str
    members: tuple[MemberSummary, ...]


def dead_summary(group_id: str) -> GroupSummary:
    """How Kafka describes a group it does not know."""
    return GroupSummary(group_id, GroupState.DEAD, "", "", ())


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    metadata: str | None = ""
    leader_epoch: int = -1
    commit_timestamp_ms: int = -1
