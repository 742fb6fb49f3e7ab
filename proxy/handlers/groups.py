"""JoinGroup, SyncGroup, Heartbeat, LeaveGroup, DescribeGroups, ListGroups: the classic
group protocol, coordinated by storage/groups.

A JoinGroup waits until the rebalance completes, and a follower's SyncGroup until the
leader's assignment: both are deferred, so the member's connection goes on with its next
requests (a heartbeat sent meanwhile still counts at once; its answer follows in order).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from proxy.context import KilnContext
from proxy.peer import CLIENT_HOST
from proxy.reply import Deferred
from storage.errors import NotCoordinator, StorageError, coordinator_errors
from storage.groups.model import (
    GroupSummary,
    JoinRequest,
    JoinResult,
    MemberIdentity,
    Protocol,
    SyncRequest,
    SyncResult,
)
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode, KafkaError

_JOIN = CLIENT_APIS[ApiKey.JOIN_GROUP].response
_SYNC = CLIENT_APIS[ApiKey.SYNC_GROUP].response
_HEARTBEAT = CLIENT_APIS[ApiKey.HEARTBEAT].response
_LEAVE = CLIENT_APIS[ApiKey.LEAVE_GROUP].response
_DESCRIBE = CLIENT_APIS[ApiKey.DESCRIBE_GROUPS].response
_DESCRIBED = _DESCRIBE.DescribedGroup
_LIST = CLIENT_APIS[ApiKey.LIST_GROUPS].response


def _answer(future: asyncio.Future[Any], build: Callable[[Any], Message]
            ) -> Message | Deferred:
    if future.done():
        return build(future.result())

    async def later() -> Message:
        return build(await future)

    return Deferred(later())


# --- JoinGroup ---------------------------------------------------------------------------


async def join(ctx: KilnContext, request: Request) -> Message | Deferred:
    body = request.body
    version = request.header.request_api_version
    instance = body.group_instance_id if version >= 5 else None
    joining = JoinRequest(
        group_id=body.group_id, member_id=body.member_id, group_instance_id=instance,
        client_id=request.header.client_id or "", client_host=CLIENT_HOST.get(),
        session_timeout_ms=body.session_timeout_ms,
        # v0 has no rebalance timeout: the session timeout serves for both, as in Kafka.
        rebalance_timeout_ms=body.rebalance_timeout_ms if version >= 1 else
        body.session_timeout_ms,
        protocol_type=body.protocol_type,
        protocols=tuple(Protocol(p.name, bytes(p.metadata)) for p in body.protocols),
        require_known_member_id=version >= 4 and instance is None,
    )
    with coordinator_errors():
        future = await ctx.groups.join(joining)
    return _answer(future, lambda result: join_body(version, result))


def join_body(version: int, result: JoinResult) -> Message:
    member = _JOIN.JoinGroupResponseMember
    return _JOIN[version](
        throttle_time_ms=0, error_code=int(result.error_code),
        generation_id=result.generation_id, protocol_type=result.protocol_type,
        # Nullable from v7; before, an unknown protocol is the empty string.
        protocol_name=result.protocol_name if version >= 7 else result.protocol_name or "",
        leader=result.leader, member_id=result.member_id,
        members=[member(member_id=m.member_id, group_instance_id=m.group_instance_id,
                        metadata=m.metadata) for m in result.members],
    )


def join_error(request: Request, code: ErrorCode) -> Message:
    return join_body(request.header.request_api_version,
                     JoinResult(code, request.body.member_id))


# --- SyncGroup ---------------------------------------------------------------------------


async def sync(ctx: KilnContext, request: Request) -> Message | Deferred:
    body = request.body
    version = request.header.request_api_version
    syncing = SyncRequest(
        group_id=body.group_id, member_id=body.member_id,
        group_instance_id=body.group_instance_id if version >= 3 else None,
        generation_id=body.generation_id,
        protocol_type=body.protocol_type if version >= 5 else None,
        protocol_name=body.protocol_name if version >= 5 else None,
        assignments={a.member_id: bytes(a.assignment) for a in body.assignments},
    )
    with coordinator_errors():
        future = await ctx.groups.sync(syncing)
    return _answer(future, lambda result: sync_body(version, result))


def sync_body(version: int, result: SyncResult) -> Message:
    return _SYNC[version](throttle_time_ms=0, error_code=int(result.error_code),
                          protocol_type=result.protocol_type,
                          protocol_name=result.protocol_name, assignment=result.assignment)


def sync_error(request: Request, code: ErrorCode) -> Message:
    return sync_body(request.header.request_api_version, SyncResult(code))


# --- Heartbeat ---------------------------------------------------------------------------


async def heartbeat(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    version = request.header.request_api_version
    with coordinator_errors():
        code = await ctx.groups.heartbeat(
            body.group_id, body.member_id,
            body.group_instance_id if version >= 3 else None, body.generation_id)
    return heartbeat_body(version, code)


def heartbeat_body(version: int, code: ErrorCode) -> Message:
    return _HEARTBEAT[version](throttle_time_ms=0, error_code=int(code))


def heartbeat_error(request: Request, code: ErrorCode) -> Message:
    return heartbeat_body(request.header.request_api_version, code)


# --- LeaveGroup --------------------------------------------------------------------------


async def leave(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    version = request.header.request_api_version
    if version >= 3:
        leaving = [MemberIdentity(m.member_id, m.group_instance_id) for m in body.members]
    else:
        leaving = [MemberIdentity(body.member_id)]
    if not body.group_id:
        raise KafkaError(ErrorCode.INVALID_GROUP_ID, "empty group id")
    with coordinator_errors():
        codes = await ctx.groups.leave(body.group_id, leaving)
    return leave_body(version, ErrorCode.NONE, list(zip(leaving, codes, strict=True)))


def leave_body(version: int, code: ErrorCode,
               members: list[tuple[MemberIdentity, ErrorCode]]) -> Message:
    if version < 3 and code is ErrorCode.NONE and members:
        # One member per request before v3: its outcome is the response's error.
        code = members[0][1]
    return _LEAVE[version](
        throttle_time_ms=0, error_code=int(code),
        members=[_LEAVE.MemberResponse(member_id=who.member_id,
                                       group_instance_id=who.group_instance_id,
                                       error_code=int(member_code))
                 for who, member_code in members])


def leave_error(request: Request, code: ErrorCode) -> Message:
    return leave_body(request.header.request_api_version, code, [])


# --- DescribeGroups, ListGroups ----------------------------------------------------------


async def describe(ctx: KilnContext, request: Request) -> Message:
    described = []
    for group_id in request.body.groups:
        try:
            described.append(_described(await ctx.groups.describe(group_id)))
        except NotCoordinator as exc:  # each group is answered for by its own coordinator
            described.append(_described_error(group_id, exc.error_code, exc.message))
        except StorageError as exc:
            described.append(_described_error(group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                              exc.message))
    return _DESCRIBE[request.header.request_api_version](throttle_time_ms=0, groups=described)


def _described(summary: GroupSummary) -> Message:
    member = _DESCRIBED.DescribedGroupMember
    # authorized_operations is left at its default (not requested / not computed).
    return _DESCRIBED(
        error_code=0, error_message=None, group_id=summary.group_id,
        group_state=summary.state.value, protocol_type=summary.protocol_type,
        protocol_data=summary.protocol_name,
        members=[member(member_id=m.member_id, group_instance_id=m.group_instance_id,
                        client_id=m.client_id, client_host=m.client_host,
                        member_metadata=m.metadata, member_assignment=m.assignment)
                 for m in summary.members])


def _described_error(group_id: str, code: ErrorCode, message: str | None = None) -> Message:
    return _DESCRIBED(error_code=int(code), error_message=message, group_id=group_id,
                      group_state="", protocol_type="", protocol_data="", members=[])


def describe_error(request: Request, code: ErrorCode) -> Message:
    return _DESCRIBE[request.header.request_api_version](
        throttle_time_ms=0, groups=[_described_error(g, code) for g in request.body.groups])


async def list_groups(ctx: KilnContext, request: Request) -> Message:
    version = request.header.request_api_version
    # Kafka matches both filters without regard to case.
    states = {s.lower() for s in request.body.states_filter or ()} if version >= 4 else set()
    types = {t.lower() for t in request.body.types_filter or ()} if version >= 5 else set()
    with coordinator_errors():
        listed = await ctx.groups.list_groups()
    groups = [_LIST.ListedGroup(group_id=g.group_id, protocol_type=g.protocol_type,
                                group_state=g.state, group_type=g.group_type)
              for g in listed
              if (not states or g.state.lower() in states)
              and (not types or g.group_type in types)]
    return _LIST[version](throttle_time_ms=0, error_code=0, groups=groups)


def list_groups_error(request: Request, code: ErrorCode) -> Message:
    return _LIST[request.header.request_api_version](throttle_time_ms=0,
                                                     error_code=int(code), groups=[])
