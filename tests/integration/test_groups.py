"""Consumer groups over the wire with exact requests: coordinator lookup, join/sync/heartbeat,
answers that wait without holding up a connection, offsets in Redis, a Kiln restart, and a
Redis outage."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kafka.protocol.admin import (
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from cli.local_services import LocalRedis
from tests.kiln_harness import RunningKiln, fresh_kiln, start_kiln
from tests.raw_client import RawClient, record_batch
from wire.errors import ErrorCode

E = ErrorCode
GROUP_SETTINGS: dict[str, Any] = {
    # Nothing is hardened (and so trimmed) during a test; short group timings.
    "harden_delay_ms": 600_000, "group_initial_rebalance_delay_ms": 50,
    "group_min_session_timeout_ms": 500,
}


@pytest.fixture
def kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    with fresh_kiln(redis_url, kafka_bootstrap, **GROUP_SETTINGS) as running:
        yield running


def join_request(group: str, member_id: str = "", *, session_ms: int = 10_000,
                 rebalance_ms: int = 10_000, metadata: bytes = b"meta",
                 version: int = 7) -> Any:
    protocol = JoinGroupRequest.JoinGroupRequestProtocol
    return JoinGroupRequest[version](
        group_id=group, session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
        member_id=member_id, group_instance_id=None, protocol_type="consumer",
        protocols=[protocol(name="range", metadata=metadata)])


def join(client: RawClient, group: str, member_id: str = "", **kwargs: Any) -> Any:
    return client.request(join_request(group, member_id, **kwargs), 7, JoinGroupResponse)


def join_new_member(client: RawClient, group: str, **kwargs: Any) -> str:
    """The MEMBER_ID_REQUIRED round trip: the member id to join with."""
    answer = join(client, group, **kwargs)
    assert answer.error_code == E.MEMBER_ID_REQUIRED
    return str(answer.member_id)


def sync_request(group: str, generation: int, member_id: str,
                 assignments: dict[str, bytes] | None = None) -> Any:
    assignment = SyncGroupRequest.SyncGroupRequestAssignment
    return SyncGroupRequest[5](
        group_id=group, generation_id=generation, member_id=member_id,
        group_instance_id=None, protocol_type="consumer", protocol_name="range",
        assignments=[assignment(member_id=m, assignment=a)
                     for m, a in (assignments or {}).items()])


def sync(client: RawClient, group: str, generation: int, member_id: str,
         assignments: dict[str, bytes] | None = None) -> Any:
    return client.request(sync_request(group, generation, member_id, assignments), 5,
                          SyncGroupResponse)


def heartbeat_request(group: str, generation: int, member_id: str) -> Any:
    return HeartbeatRequest[4](group_id=group, generation_id=generation, member_id=member_id,
                               group_instance_id=None)


def heartbeat(client: RawClient, group: str, generation: int, member_id: str) -> int:
    answer = client.request(heartbeat_request(group, generation, member_id), 4,
                            HeartbeatResponse)
    return int(answer.error_code)


def commit(client: RawClient, group: str, offsets: dict[tuple[str, int], int],
           generation: int = -1, member_id: str = "") -> dict[tuple[str, int], int]:
    topic = OffsetCommitRequest.OffsetCommitRequestTopic
    by_topic: dict[str, list[Any]] = {}
    for (name, partition), offset in offsets.items():
        by_topic.setdefault(name, []).append(topic.OffsetCommitRequestPartition(
            partition_index=partition, committed_offset=offset, committed_leader_epoch=-1,
            committed_metadata=f"at {offset}"))
    answer = client.request(OffsetCommitRequest[8](
        group_id=group, generation_id_or_member_epoch=generation, member_id=member_id,
        group_instance_id=None, topics=[topic(name=n, partitions=p)
                                        for n, p in by_topic.items()]), 8, OffsetCommitResponse)
    return {(t.name, p.partition_index): p.error_code for t in answer.topics
            for p in t.partitions}


def fetch_offsets(client: RawClient, group: str, partitions: list[tuple[str, int]] | None
                  ) -> dict[tuple[str, int], tuple[int, str | None]]:
    topic = OffsetFetchRequest.OffsetFetchRequestTopic
    topics = None
    if partitions is not None:
        names = sorted({n for n, _ in partitions})
        topics = [topic(name=n, partition_indexes=[p for m, p in partitions if m == n])
                  for n in names]
    answer = client.request(OffsetFetchRequest[7](group_id=group, topics=topics,
                                                  require_stable=False), 7, OffsetFetchResponse)
    assert answer.error_code == 0
    return {(t.name, p.partition_index): (p.committed_offset, p.metadata)
            for t in answer.topics for p in t.partitions}


def describe(client: RawClient, group: str) -> Any:
    answer = client.request(DescribeGroupsRequest[5](groups=[group],
                                                     include_authorized_operations=False),
                            5, DescribeGroupsResponse)
    return answer.groups[0]


def stable_single_member_group(client: RawClient, group: str) -> tuple[str, int]:
    member = join_new_member(client, group)
    joined = join(client, group, member)
    assert (joined.error_code, joined.leader) == (0, member)
    synced = sync(client, group, joined.generation_id, member, {member: b"all of it"})
    assert (synced.error_code, bytes(synced.assignment)) == (0, b"all of it")
    return member, int(joined.generation_id)


# ---------------------------------------------------------------------------------------


@pytest.fixture
def kiln_without_transactions(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    with fresh_kiln(redis_url, kafka_bootstrap, transactions_enabled=False,
                    **GROUP_SETTINGS) as running:
        yield running


@pytest.mark.parametrize("version", range(5))
def test_find_coordinator_names_kiln_for_groups_and_transactions(
        kiln: RunningKiln, version: int) -> None:
    with RawClient(kiln.bootstrap) as client:
        group = client.request(FindCoordinatorRequest[version](
            key="g", key_type=0, coordinator_keys=["g", "h"]), version, FindCoordinatorResponse)
        txn = client.request(FindCoordinatorRequest[version](
            key="tx", key_type=1, coordinator_keys=["tx"]), version, FindCoordinatorResponse)

    kiln_address = ("127.0.0.1", kiln.app.port)
    if version >= 4:
        assert [(c.key, c.error_code, c.node_id, (c.host, c.port))
                for c in group.coordinators + txn.coordinators] == [
            ("g", 0, 0, kiln_address), ("h", 0, 0, kiln_address), ("tx", 0, 0, kiln_address)]
    else:
        for answer in (group, txn):
            assert (answer.error_code, answer.node_id, (answer.host, answer.port)) == (
                0, 0, kiln_address)


@pytest.mark.parametrize("version", range(5))
def test_find_coordinator_names_nobody_for_transactions_when_they_are_off(
        kiln_without_transactions: RunningKiln, version: int) -> None:
    kiln = kiln_without_transactions
    with RawClient(kiln.bootstrap) as client:
        group = client.request(FindCoordinatorRequest[version](
            key="g", key_type=0, coordinator_keys=["g", "h"]), version, FindCoordinatorResponse)
        txn = client.request(FindCoordinatorRequest[version](
            key="tx", key_type=1, coordinator_keys=["tx"]), version, FindCoordinatorResponse)

    kiln_address = ("127.0.0.1", kiln.app.port)
    if version >= 4:
        assert [(c.key, c.error_code, c.node_id, (c.host, c.port)) for c in group.coordinators] \
            == [("g", 0, 0, kiln_address), ("h", 0, 0, kiln_address)]
        assert [c.error_code for c in txn.coordinators] == [E.COORDINATOR_NOT_AVAILABLE]
    else:
        assert (group.error_code, group.node_id, (group.host, group.port)) == (
            0, 0, kiln_address)
        if version >= 1:
            assert txn.error_code == E.COORDINATOR_NOT_AVAILABLE
        else:  # v0 has no key type: every key is a group
            assert txn.error_code == 0


def test_a_member_joins_syncs_heartbeats_and_is_described(kiln: RunningKiln) -> None:
    with RawClient(kiln.bootstrap) as client:
        asked = join(client, "g1")
        joined = join(client, "g1", asked.member_id)
        synced = sync(client, "g1", joined.generation_id, joined.member_id,
                      {joined.member_id: b"p0"})
        beat = heartbeat(client, "g1", joined.generation_id, joined.member_id)
        stale = heartbeat(client, "g1", joined.generation_id - 1, joined.member_id)
        described = describe(client, "g1")
        listed = client.request(ListGroupsRequest[4](states_filter=[]), 4, ListGroupsResponse)

    assert (asked.error_code, asked.member_id.startswith("raw-test-")) == (
        E.MEMBER_ID_REQUIRED, True)
    assert (joined.error_code, joined.generation_id, joined.leader, joined.member_id) == (
        0, 1, asked.member_id, asked.member_id)
    assert [(m.member_id, bytes(m.metadata)) for m in joined.members] == [
        (asked.member_id, b"meta")]
    assert (synced.error_code, bytes(synced.assignment)) == (0, b"p0")
    assert (beat, stale) == (0, E.ILLEGAL_GENERATION)
    assert (described.error_code, described.group_state, described.protocol_data) == (
        0, "Stable", "range")
    member = described.members[0]
    assert (member.member_id, member.client_id, member.client_host) == (
        asked.member_id, "raw-test", "/127.0.0.1")
    assert bytes(member.member_assignment) == b"p0"
    assert [(g.group_id, g.protocol_type, g.group_state) for g in listed.groups] == [
        ("g1", "consumer", "Stable")]


def test_a_waiting_join_does_not_hold_up_heartbeats_on_the_same_connection(
        kiln: RunningKiln) -> None:
    # Given a Stable group of a and b, both speaking through one connection, with a short
    # session timeout and a long rebalance timeout
    shared, other = RawClient(kiln.bootstrap), RawClient(kiln.bootstrap)
    try:
        a = join_new_member(shared, "g2", session_ms=1500, rebalance_ms=30_000)
        b = join_new_member(shared, "g2", session_ms=1500, rebalance_ms=30_000)
        first = shared.send(join_request("g2", a, session_ms=1500, rebalance_ms=30_000), 7)
        second = shared.send(join_request("g2", b, session_ms=1500, rebalance_ms=30_000), 7)
        generation = shared.receive(first, 7, JoinGroupResponse).generation_id
        shared.receive(second, 7, JoinGroupResponse)
        syncs = [shared.send(sync_request("g2", generation, m, assigned), 5)
                 for m, assigned in ((b, {}), (a, {a: b"x", b: b"y"}))]
        assert [shared.receive(cid, 5, SyncGroupResponse).error_code for cid in syncs] == [0, 0]
        # and a newcomer starting a rebalance
        c = join_new_member(other, "g2", session_ms=1500, rebalance_ms=30_000)
        c_join = other.send(join_request("g2", c, session_ms=1500, rebalance_ms=30_000), 7)

        # When a rejoins (its answer must wait for b) and b's heartbeats follow on the same
        # connection for twice b's session timeout, before b rejoins
        a_join = shared.send(join_request("g2", a, session_ms=1500, rebalance_ms=30_000), 7)
        beats = []
        for _ in range(15):
            beats.append(shared.send(heartbeat_request("g2", generation, b), 4))
            time.sleep(0.2)
        b_client = RawClient(kiln.bootstrap)
        b_answer = b_client.request(join_request("g2", b, session_ms=1500,
                                                 rebalance_ms=30_000), 7, JoinGroupResponse)
        b_client.close()
        a_answer = shared.receive(a_join, 7, JoinGroupResponse)
        beat_codes = [shared.receive(cid, 4, HeartbeatResponse).error_code for cid in beats]
        c_answer = other.receive(c_join, 7, JoinGroupResponse)
    finally:
        shared.close()
        other.close()

    # Then the heartbeats kept b in the group, and every answer came back in request order
    assert beat_codes == [E.REBALANCE_IN_PROGRESS] * 15
    assert {a_answer.error_code, b_answer.error_code, c_answer.error_code} == {0}
    assert a_answer.generation_id == b_answer.generation_id == c_answer.generation_id \
        == generation + 1
    assert sorted(m.member_id for m in a_answer.members) == sorted([a, b, c])


def test_offsets_are_committed_to_redis_and_fetched_back(
        kiln: RunningKiln, unique_topic: str, redis_client: redis.Redis) -> None:
    with RawClient(kiln.bootstrap) as client:
        assert client.produce(unique_topic, 0, record_batch([b"x"] * 5)).error_code == 0

        codes = commit(client, "g3", {(unique_topic, 0): 3, (unique_topic, 1): 1,
                                      ("no-such-topic", 0): 1})
        some = fetch_offsets(client, "g3", [(unique_topic, 0), ("never-committed", 2)])
        every = fetch_offsets(client, "g3", None)
        again = commit(client, "g3", {(unique_topic, 0): 5})
        latest = fetch_offsets(client, "g3", [(unique_topic, 0)])
        described = describe(client, "g3")

    assert codes == {(unique_topic, 0): 0, (unique_topic, 1): E.UNKNOWN_TOPIC_OR_PARTITION,
                     ("no-such-topic", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
    assert some == {(unique_topic, 0): (3, "at 3"), ("never-committed", 2): (-1, "")}
    assert every == {(unique_topic, 0): (3, "at 3")}
    assert (again, latest) == ({(unique_topic, 0): 0}, {(unique_topic, 0): (5, "at 5")})
    # A group that only commits exists, empty, without a protocol.
    assert (described.group_state, described.protocol_type, described.members) == (
        "Empty", "", [])
    keys = sorted(k.decode() for k in redis_client.scan_iter("kiln:group*"))
    assert keys == ["kiln:group:{g3}:meta", "kiln:group:{g3}:offsets", "kiln:group:{g3}:rev",
                    "kiln:groups"]
    assert redis_client.hkeys("kiln:group:{g3}:offsets") == [f"{unique_topic}:0".encode()]


def test_a_member_commit_is_checked_against_the_group(kiln: RunningKiln,
                                                      unique_topic: str) -> None:
    with RawClient(kiln.bootstrap) as client:
        client.produce(unique_topic, 0, record_batch([b"x"]))
        member, generation = stable_single_member_group(client, "g4")

        as_member = commit(client, "g4", {(unique_topic, 0): 1}, generation, member)
        stale = commit(client, "g4", {(unique_topic, 0): 9}, generation - 1, member)
        stranger = commit(client, "g4", {(unique_topic, 0): 9})
        committed = fetch_offsets(client, "g4", [(unique_topic, 0)])

    assert as_member == {(unique_topic, 0): 0}
    assert stale == {(unique_topic, 0): E.ILLEGAL_GENERATION}
    assert stranger == {(unique_topic, 0): E.UNKNOWN_MEMBER_ID}
    assert committed == {(unique_topic, 0): (1, "at 1")}


def test_a_restarted_kiln_loads_the_group_and_its_members_carry_on(
        redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a Stable group with a committed offset, and Kiln stopped
    with fresh_kiln(redis_url, kafka_bootstrap, **GROUP_SETTINGS) as before:
        client = RawClient(before.bootstrap)
        client.produce(unique_topic, 0, record_batch([b"x"] * 4))
        member, generation = stable_single_member_group(client, "g5")
        assert commit(client, "g5", {(unique_topic, 0): 2}, generation, member) == {
            (unique_topic, 0): 0}
        client.close()

    # When a new Kiln on the same Redis hears from the member again
    with start_kiln(redis_url, kafka_bootstrap, **GROUP_SETTINGS) as after:
        client = RawClient(after.bootstrap)
        beat = heartbeat(client, "g5", generation, member)
        committed = fetch_offsets(client, "g5", [(unique_topic, 0)])
        recommit = commit(client, "g5", {(unique_topic, 0): 4}, generation, member)
        described = describe(client, "g5")
        rejoined = join(client, "g5", member)
        client.close()

    # Then it is still a member of the same generation, with its offsets
    assert beat == 0
    assert committed == {(unique_topic, 0): (2, "at 2")}
    assert recommit == {(unique_topic, 0): 0}
    assert (described.group_state, [m.member_id for m in described.members]) == (
        "Stable", [member])
    assert bytes(described.members[0].member_assignment) == b"all of it"
    # The leader rejoining asks for a rebalance: a new generation with the same member.
    assert (rejoined.error_code, rejoined.generation_id, rejoined.leader) == (
        0, generation + 1, member)


def test_group_requests_get_retriable_errors_while_redis_is_down(
        kafka_bootstrap: str, unique_topic: str) -> None:
    store = LocalRedis().start()
    running = start_kiln(store.url, kafka_bootstrap, **GROUP_SETTINGS)
    try:
        client = RawClient(running.bootstrap)
        client.produce(unique_topic, 0, record_batch([b"x"]))
        assert commit(client, "g6", {(unique_topic, 0): 1}) == {(unique_topic, 0): 0}
        store.kill()

        during_commit = commit(client, "g6", {(unique_topic, 0): 1})
        during_join = join(client, "g7")
        located = client.request(FindCoordinatorRequest[3](key="g6", key_type=0), 3,
                                 FindCoordinatorResponse)
        store.start()  # same port, empty
        deadline = time.monotonic() + 20
        after = during_commit
        while after != {(unique_topic, 0): 0} and time.monotonic() < deadline:
            time.sleep(0.2)
            after = commit(client, "g6", {(unique_topic, 0): 1})
        client.close()
    finally:
        running.stop()
        store.stop()

    assert during_commit == {(unique_topic, 0): E.COORDINATOR_NOT_AVAILABLE}
    assert during_join.error_code == E.COORDINATOR_NOT_AVAILABLE
    assert located.error_code == 0
    assert after == {(unique_topic, 0): 0}
