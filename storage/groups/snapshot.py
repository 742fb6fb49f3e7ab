"""A group's metadata and committed offsets as stored in Redis (JSON), and back.

What is kept is what a Kafka coordinator keeps in its group metadata record: protocol type
and name, generation, leader, and per member its ids, client id and host, timeouts,
protocols with their metadata and its assignment; plus the state, so a group persisted in
the middle of a rebalance restarts that rebalance when loaded.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

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
