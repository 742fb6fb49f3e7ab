"""Every advertised version of the group APIs: requests as kafka-python's classes send them
decode, and every response Kiln builds (answers and error answers) encodes and reads back
with the fields a client looks at."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from kafka.protocol.admin import DescribeGroupsRequest, ListGroupsRequest
from kafka.protocol.consumer import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import FindCoordinatorRequest

from proxy.dispatch import failure_response
from proxy.handlers import groups, offsets
from storage.groups.model import (
    GroupState,
    GroupSummary,
    JoinMember,
    JoinResult,
    MemberIdentity,
    MemberSummary,
    SyncResult,
)
from wire import apis
from wire.apis import CLIENT_APIS, ApiKey, Request
from wire.errors import ErrorCode

E = ErrorCode


def versions(key: ApiKey) -> list[int]:
    spec = CLIENT_APIS[key]
    return list(range(spec.min_version, spec.max_version + 1))


def decoded_request(message: Any, version: int) -> Request:
    message.with_header(correlation_id=5, client_id="unit")
    return apis.decode_request(bytes(message.encode(version=version, header=True)))


def read_back(request: Request, body: Any) -> Any:
    """Encode `body` as Kiln would send it and decode it as a client would."""
    frame = apis.encode_response(request, body)
    version = request.header.request_api_version
    assert struct.unpack_from(">ii", frame) == (len(frame) - 4, 5)
    header_size = 4 + 4 + (1 if apis.response_header_flexible(request.spec, version) else 0)
    return request.spec.response.decode(frame[header_size:], version=version)


def join_request(version: int) -> Request:
    protocol = JoinGroupRequest.JoinGroupRequestProtocol
    return decoded_request(JoinGroupRequest[version](
        group_id="g", session_timeout_ms=10_000, rebalance_timeout_ms=30_000, member_id="m1",
        group_instance_id="i-1" if version >= 5 else None, protocol_type="consumer",
        protocols=[protocol(name="range", metadata=b"\x00\x01meta")]), version)


@pytest.mark.parametrize("version", versions(ApiKey.JOIN_GROUP))
def test_join_group(version: int) -> None:
    request = join_request(version)
    leader_view = JoinResult(E.NONE, "m1", 4, "consumer", "range", "m1",
                             (JoinMember("m1", "i-1", b"a"), JoinMember("m2", None, b"b")))

    answer = read_back(request, groups.join_body(version, leader_view))
    required = read_back(request, groups.join_body(version, JoinResult(
        E.MEMBER_ID_REQUIRED, "c-1")))
    failed = read_back(request, failure_response(request, E.COORDINATOR_NOT_AVAILABLE))

    assert request.body.protocols[0].name == "range"
    assert bytes(request.body.protocols[0].metadata) == b"\x00\x01meta"
    assert (answer.error_code, answer.generation_id, answer.leader, answer.member_id) == (
        0, 4, "m1", "m1")
    assert answer.protocol_name == "range"
    assert [(m.member_id, bytes(m.metadata)) for m in answer.members] == [("m1", b"a"),
                                                                         ("m2", b"b")]
    if version >= 5:
        assert [m.group_instance_id for m in answer.members] == ["i-1", None]
    assert (required.error_code, required.member_id) == (E.MEMBER_ID_REQUIRED, "c-1")
    assert required.protocol_name == (None if version >= 7 else "")
    assert (failed.error_code, failed.member_id) == (E.COORDINATOR_NOT_AVAILABLE, "m1")


@pytest.mark.parametrize("version", versions(ApiKey.SYNC_GROUP))
def test_sync_group(version: int) -> None:
    assignment = SyncGroupRequest.SyncGroupRequestAssignment
    request = decoded_request(SyncGroupRequest[version](
        group_id="g", generation_id=3, member_id="m1", group_instance_id=None,
        protocol_type="consumer", protocol_name="range",
        assignments=[assignment(member_id="m1", assignment=b"p0")]), version)

    answer = read_back(request, groups.sync_body(version, SyncResult(
        E.NONE, "consumer", "range", b"p0")))
    failed = read_back(request, failure_response(request, E.REBALANCE_IN_PROGRESS))

    assert bytes(request.body.assignments[0].assignment) == b"p0"
    assert (answer.error_code, bytes(answer.assignment)) == (0, b"p0")
    if version >= 5:
        assert (answer.protocol_type, answer.protocol_name) == ("consumer", "range")
    assert failed.error_code == E.REBALANCE_IN_PROGRESS


@pytest.mark.parametrize("version", versions(ApiKey.HEARTBEAT))
def test_heartbeat(version: int) -> None:
    request = decoded_request(HeartbeatRequest[version](
        group_id="g", generation_id=3, member_id="m1", group_instance_id=None), version)

    answer = read_back(request, groups.heartbeat_body(version, E.REBALANCE_IN_PROGRESS))
    failed = read_back(request, failure_response(request, E.COORDINATOR_NOT_AVAILABLE))

    assert answer.error_code == E.REBALANCE_IN_PROGRESS
    assert failed.error_code == E.COORDINATOR_NOT_AVAILABLE


@pytest.mark.parametrize("version", versions(ApiKey.LEAVE_GROUP))
def test_leave_group(version: int) -> None:
    identity = LeaveGroupRequest.MemberIdentity
    request = decoded_request(LeaveGroupRequest[version](
        group_id="g", member_id="m1",
        members=[identity(member_id="m1", group_instance_id=None),
                 identity(member_id="", group_instance_id="i-9")]), version)
    outcomes = [(MemberIdentity("m1"), E.UNKNOWN_MEMBER_ID)]
    if version >= 3:
        outcomes.append((MemberIdentity("", "i-9"), E.NONE))

    answer = read_back(request, groups.leave_body(version, E.NONE, outcomes))
    failed = read_back(request, failure_response(request, E.COORDINATOR_NOT_AVAILABLE))

    if version >= 3:
        assert len(request.body.members) == 2
        assert answer.error_code == 0
        assert [(m.member_id, m.group_instance_id, m.error_code) for m in answer.members] == [
            ("m1", None, E.UNKNOWN_MEMBER_ID), ("", "i-9", 0)]
    else:
        assert request.body.member_id == "m1"
        # One member per request: its outcome is the response's error.
        assert answer.error_code == E.UNKNOWN_MEMBER_ID
    assert failed.error_code == E.COORDINATOR_NOT_AVAILABLE


@pytest.mark.parametrize("version", versions(ApiKey.DESCRIBE_GROUPS))
def test_describe_groups(version: int) -> None:
    request = decoded_request(DescribeGroupsRequest[version](
        groups=["g", "gone"], include_authorized_operations=False), version)
    summary = GroupSummary("g", GroupState.STABLE, "consumer", "range", (
        MemberSummary("m1", "i-1", "client", "/127.0.0.1", b"meta", b"assigned"),))

    body = CLIENT_APIS[ApiKey.DESCRIBE_GROUPS].response[version](
        throttle_time_ms=0, groups=[groups._described(summary),
                                    groups._described_error("gone", E.COORDINATOR_NOT_AVAILABLE)])
    answer = read_back(request, body)
    failed = read_back(request, failure_response(request, E.COORDINATOR_NOT_AVAILABLE))

    described, missing = answer.groups
    assert (described.group_id, described.group_state, described.protocol_type,
            described.protocol_data) == ("g", "Stable", "consumer", "range")
    member = described.members[0]
    assert (member.member_id, member.client_id, member.client_host) == (
        "m1", "client", "/127.0.0.1")
    assert (bytes(member.member_metadata), bytes(member.member_assignment)) == (
        b"meta", b"assigned")
    assert (missing.group_id, missing.error_code) == ("gone", E.COORDINATOR_NOT_AVAILABLE)
    assert [(g.group_id, g.error_code) for g in failed.groups] == [
        ("g", E.COORDINATOR_NOT_AVAILABLE), ("gone", E.COORDINATOR_NOT_AVAILABLE)]


@pytest.mark.parametrize("version", versions(ApiKey.LIST_GROUPS))
def test_list_groups(version: int) -> None:
    request = decoded_request(ListGroupsRequest[version](states_filter=["stable"]), version)
    listed = CLIENT_APIS[ApiKey.LIST_GROUPS].response
    body = listed[version](throttle_time_ms=0, error_code=0, groups=[
        listed.ListedGroup(group_id="g", protocol_type="consumer", group_state="Stable")])

    answer = read_back(request, body)
    failed = read_back(request, failure_response(request, E.COORDINATOR_NOT_AVAILABLE))

    assert [(g.group_id, g.protocol_type) for g in answer.groups] == [("g", "consumer")]
    if version >= 4:
        assert request.body.states_filter == ["stable"]
        assert answer.groups[0].group_state == "Stable"
    assert (failed.error_code, failed.groups) == (E.COORDINATOR_NOT_AVAILABLE, [])


@pytest.mark.parametrize("version", versions(ApiKey.OFFSET_COMMIT))
def test_offset_commit(version: int) -> None:
    topic = OffsetCommitRequest.OffsetCommitRequestTopic
    part = topic.OffsetCommitRequestPartition
    request = decoded_request(OffsetCommitRequest[version](
        group_id="g", generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
        retention_time_ms=-1, topics=[topic(name="t", partitions=[
            part(partition_index=0, committed_offset=42, committed_leader_epoch=-1,
                 committed_metadata="meta"),
            part(partition_index=1, committed_offset=7, committed_leader_epoch=-1,
                 committed_metadata=None)])]), version)

    answer = read_back(request, offsets._commit_body(request, {
        offsets.TopicPartition("t", 0): E.NONE,
        offsets.TopicPartition("t", 1): E.UNKNOWN_TOPIC_OR_PARTITION}))
    failed = read_back(request, failure_response(request, E.COORDINATOR_NOT_AVAILABLE))

    parts = request.body.topics[0].partitions
    assert [(p.committed_offset, p.committed_metadata) for p in parts] == [(42, "meta"), (7, None)]
    assert [(p.partition_index, p.error_code) for p in answer.topics[0].partitions] == [
        (0, 0), (1, E.UNKNOWN_TOPIC_OR_PARTITION)]
    assert {p.error_code for p in failed.topics[0].partitions} == {E.COORDINATOR_NOT_AVAILABLE}


# v8 changed the shape: several groups per request, each with its own error.
SINGLE_GROUP_FETCH = [v for v in versions(ApiKey.OFFSET_FETCH) if v < 8]
BATCHED_FETCH = [v for v in versions(ApiKey.OFFSET_FETCH) if v >= 8]


@pytest.mark.parametrize("version", SINGLE_GROUP_FETCH)
def test_offset_fetch(version: int) -> None:
    topic = OffsetFetchRequest.OffsetFetchRequestTopic
    request = decoded_request(OffsetFetchRequest[version](
        group_id="g", topics=[topic(name="t", partition_indexes=[0, 1])],
        require_stable=False), version)
    found = {offsets.TopicPartition("t", 0): offsets.CommittedOffset(42, "meta", 3)}

    answer = read_back(request, offsets._fetch_body(request, {"t": [0, 1]}, found, E.NONE))
    failed = read_back(request, failure_response(request, E.COORDINATOR_NOT_AVAILABLE))

    partitions = answer.topics[0].partitions
    assert [(p.partition_index, p.committed_offset, p.metadata) for p in partitions] == [
        (0, 42, "meta"), (1, -1, "")]
    if version >= 5:
        assert [p.committed_leader_epoch for p in partitions] == [3, -1]
    if version >= 2:
        assert (answer.error_code, failed.error_code, failed.topics) == (
            0, E.COORDINATOR_NOT_AVAILABLE, [])
    else:
        assert {p.error_code for p in failed.topics[0].partitions} == {
            E.COORDINATOR_NOT_AVAILABLE}


@pytest.mark.parametrize("version", SINGLE_GROUP_FETCH[1:])
def test_offset_fetch_of_every_committed_partition_is_a_null_topic_list(version: int) -> None:
    request = decoded_request(OffsetFetchRequest[version](group_id="g", topics=None,
                                                         require_stable=False), version)

    assert request.body.topics is None


@pytest.mark.parametrize("version", BATCHED_FETCH)
def test_offset_fetch_of_several_groups_answers_each_group(version: int) -> None:
    group = OffsetFetchRequest.OffsetFetchRequestGroup
    topic = group.OffsetFetchRequestTopics
    request = decoded_request(OffsetFetchRequest[version](groups=[
        group(group_id="g", member_id="m", member_epoch=3,
              topics=[topic(name="t", partition_indexes=[0, 1])]),
        group(group_id="h", topics=None)], require_stable=False), version)
    found = {offsets.TopicPartition("t", 0): offsets.CommittedOffset(42, "meta", 3)}

    answer = read_back(request, offsets._fetch_groups_body(version, [
        offsets._GroupOffsets("g", {"t": [0, 1]}, found, E.NONE),
        offsets._GroupOffsets("h", {}, {}, E.STALE_MEMBER_EPOCH)]))
    failed = read_back(request, failure_response(request, E.COORDINATOR_LOAD_IN_PROGRESS))

    assert request.body.groups[1].topics is None
    if version >= 9:
        assert (request.body.groups[0].member_id, request.body.groups[0].member_epoch) == (
            "m", 3)
    g, h = answer.groups
    assert [(p.partition_index, p.committed_offset, p.committed_leader_epoch, p.metadata)
            for p in g.topics[0].partitions] == [(0, 42, 3, "meta"), (1, -1, -1, "")]
    assert (g.error_code, h.error_code, h.topics) == (0, E.STALE_MEMBER_EPOCH, [])
    assert [(f.group_id, f.error_code) for f in failed.groups] == [
        ("g", E.COORDINATOR_LOAD_IN_PROGRESS), ("h", E.COORDINATOR_LOAD_IN_PROGRESS)]


@pytest.mark.parametrize("version", versions(ApiKey.FIND_COORDINATOR))
def test_find_coordinator_error_shape(version: int) -> None:
    request = decoded_request(FindCoordinatorRequest[version](
        key="g", key_type=0, coordinator_keys=["g", "h"]), version)

    failed = read_back(request, failure_response(request, E.COORDINATOR_NOT_AVAILABLE))

    if version >= 4:
        assert [(c.key, c.error_code) for c in failed.coordinators] == [
            ("g", E.COORDINATOR_NOT_AVAILABLE), ("h", E.COORDINATOR_NOT_AVAILABLE)]
    else:
        assert failed.error_code == E.COORDINATOR_NOT_AVAILABLE
