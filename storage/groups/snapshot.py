"""A group's metadata and committed offsets as stored in Redis (JSON), and back.

What is kept is what a Kafka coordinator keeps in its group metadata record: protocol type
and name, generation, leader, and per member its ids, client id and host, timeouts,
protocols with their metadata and its assignment; plus the state, so a group persisted in
the middle of a rebalance restarts that rebalance when loaded. A KIP-848 consumer group's
record (`"type": "consumer"`) keeps its epochs, target assignment and, per member, its
subscription, epoch, reconciliation state and assigned and revoking partitions.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from storage.groups.assignors import Assignment
from storage.groups.consumer_group import ConsumerGroup, ConsumerMember
from storage.groups.consumer_model import ConsumerGroupSettings, MemberState
from storage.groups.members import Member
from storage.groups.membership import Group
from storage.groups.model import CommittedOffset, GroupState, MembershipSettings, Protocol

_FORMAT = 1


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def group_to_json(group: Group) -> str:
    return json.dumps({
        "format": _FORMAT,
        "state": group.state.value,
        "generation_id": group.generation_id,
        "protocol_type": group.protocol_type,
        "protocol_name": group.protocol_name,
        "leader": group.leader_id,
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "session_timeout_ms": m.session_timeout_ms,
                "rebalance_timeout_ms": m.rebalance_timeout_ms,
                "protocol_type": m.protocol_type,
                "protocols": [[p.name, _b64(p.metadata)] for p in m.protocols],
                "assignment": _b64(m.assignment),
            }
            for m in group.members.values()
        ],
    }, separators=(",", ":"))


def group_from_json(group_id: str, raw: str | bytes, now_ms: int,
                    settings: MembershipSettings, unique_suffix: Callable[[], str]) -> Group:
    """The persisted group, its session timers restarting at `now_ms`."""
    record: dict[str, Any] = json.loads(raw)
    if record.get("format") != _FORMAT:
        raise ValueError(f"group {group_id!r}: unknown record format {record.get('format')!r}")
    members = [
        Member(
            member_id=m["member_id"], group_instance_id=m["group_instance_id"],
            client_id=m["client_id"], client_host=m["client_host"],
            session_timeout_ms=int(m["session_timeout_ms"]),
            rebalance_timeout_ms=int(m["rebalance_timeout_ms"]),
            protocol_type=m["protocol_type"],
            protocols=tuple(Protocol(name, _unb64(data)) for name, data in m["protocols"]),
            assignment=_unb64(m["assignment"]),
        )
        for m in record["members"]
    ]
    group = Group(group_id, settings, unique_suffix)
    group.restore(now_ms, GroupState(record["state"]), int(record["generation_id"]),
                  record["protocol_type"], record["protocol_name"], record["leader"], members)
    return group


def offset_to_json(committed: CommittedOffset) -> str:
    return json.dumps({"offset": committed.offset, "metadata": committed.metadata,
                       "leader_epoch": committed.leader_epoch,
                       "commit_timestamp_ms": committed.commit_timestamp_ms},
                      separators=(",", ":"))


def offset_from_json(raw: str | bytes) -> CommittedOffset:
    record: dict[str, Any] = json.loads(raw)
    return CommittedOffset(int(record["offset"]), record["metadata"],
                           int(record["leader_epoch"]), int(record["commit_timestamp_ms"]))


# --- KIP-848 consumer groups ---------------------------------------------------------------

_CONSUMER_TYPE = "consumer"


def is_consumer_group_record(raw: str | bytes) -> bool:
    record: dict[str, Any] = json.loads(raw)
    return record.get("type") == _CONSUMER_TYPE


def _assignment_to_json(assignment: Assignment) -> dict[str, list[int]]:
    return {t: sorted(ps) for t, ps in sorted(assignment.items())}


def _assignment_from_json(raw: dict[str, list[int]]) -> Assignment:
    return {t: frozenset(int(p) for p in ps) for t, ps in raw.items()}


def consumer_group_to_json(group: ConsumerGroup) -> str:
    return json.dumps({
        "format": _FORMAT,
        "type": _CONSUMER_TYPE,
        "group_epoch": group.group_epoch,
        "assignment_epoch": group.assignment_epoch,
        "subscribed_partitions": group.subscribed_partitions,
        "target": {m: _assignment_to_json(a) for m, a in group.target.items()},
        "members": [
            {
                "member_id": m.member_id,
                "instance_id": m.instance_id,
                "rack_id": m.rack_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "rebalance_timeout_ms": m.rebalance_timeout_ms,
                "subscribed_topic_names": list(m.subscribed_topic_names),
                "subscribed_topic_regex": m.subscribed_topic_regex,
                "server_assignor": m.server_assignor,
                "member_epoch": m.member_epoch,
                "previous_member_epoch": m.previous_member_epoch,
                "state": m.state.value,
                "assigned": _assignment_to_json(m.assigned),
                "revoking": _assignment_to_json(m.revoking),
                "assigned_epochs": m.assigned_epochs,
            }
            for m in group.members.values()
        ],
    }, separators=(",", ":"))


def consumer_group_from_json(group_id: str, raw: str | bytes, now_ms: int,
                             settings: ConsumerGroupSettings) -> ConsumerGroup:
    """The persisted consumer group, its members' sessions restarting at `now_ms`."""
    record: dict[str, Any] = json.loads(raw)
    if record.get("format") != _FORMAT or record.get("type") != _CONSUMER_TYPE:
        raise ValueError(f"group {group_id!r}: not a consumer group record")
    group = ConsumerGroup(group_id, settings)
    group.group_epoch = int(record["group_epoch"])
    group.assignment_epoch = int(record["assignment_epoch"])
    group.subscribed_partitions = {t: int(n) for t, n in
                                   record["subscribed_partitions"].items()}
    group.target = {m: _assignment_from_json(a) for m, a in record["target"].items()}
    for m in record["members"]:
        member = ConsumerMember(
            member_id=m["member_id"], instance_id=m["instance_id"], rack_id=m["rack_id"],
            client_id=m["client_id"], client_host=m["client_host"],
            rebalance_timeout_ms=int(m["rebalance_timeout_ms"]),
            subscribed_topic_names=tuple(m["subscribed_topic_names"]),
            subscribed_topic_regex=m["subscribed_topic_regex"],
            server_assignor=m["server_assignor"], member_epoch=int(m["member_epoch"]),
            previous_member_epoch=int(m["previous_member_epoch"]),
            state=MemberState(m["state"]), assigned=_assignment_from_json(m["assigned"]),
            revoking=_assignment_from_json(m["revoking"]),
            assigned_epochs={k: int(v) for k, v in m["assigned_epochs"].items()})
        group.members[member.member_id] = member
    group.restart_timers(now_ms)
    return group
