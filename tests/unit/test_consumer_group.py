"""The KIP-848 consumer group state machine with literal clocks: joining, server-side
assignment, revocation before reassignment, epochs and fencing, leaving, static members,
session and rebalance timeouts, commit validation (KIP-1251), the assignors, and the
record kept in Redis."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Mapping

import pytest

from storage.groups.assignors import range_, uniform
from storage.groups.consumer_group import ConsumerGroup
from storage.groups.consumer_model import (
    ConsumerGroupSettings,
    ConsumerGroupState,
    ConsumerHeartbeat,
    HeartbeatResult,
    MemberState,
    TopicMetadata,
    heartbeat_precheck,
)
from storage.groups.snapshot import consumer_group_from_json, consumer_group_to_json
from storage.model import TopicPartition
from wire.errors import ErrorCode

E = ErrorCode
SETTINGS = ConsumerGroupSettings(session_timeout_ms=45_000, heartbeat_interval_ms=5_000)
T_ID = uuid.UUID(int=1)
U_ID = uuid.UUID(int=2)
TOPICS = {"t": TopicMetadata(T_ID, 4), "u": TopicMetadata(U_ID, 2)}
_ids = itertools.count(1)


def beat(member_id: str, epoch: int, *, topics: tuple[str, ...] | None = None,
         owned: Mapping[uuid.UUID, frozenset[int]] | None = None, regex: str | None = None,
         instance: str | None = None, assignor: str | None = None,
         rebalance: int = 30_000) -> ConsumerHeartbeat:
    joining = epoch == 0
    return ConsumerHeartbeat(
        group_id="g", member_id=member_id, member_epoch=epoch, instance_id=instance,
        rack_id=None, rebalance_timeout_ms=rebalance if joining else -1,
        subscribed_topic_names=topics if topics is not None or not joining or regex
        else ("t",),
        subscribed_topic_regex=regex, server_assignor=assignor,
        owned={} if joining and owned is None else owned, client_id="c",
        client_host="/127.0.0.1")


def send(group: ConsumerGroup, now: int, request: ConsumerHeartbeat,
         topics: Mapping[str, TopicMetadata] = TOPICS) -> HeartbeatResult:
    assert heartbeat_precheck(request) is None
    return group.heartbeat(now, request, topics, lambda: f"gen-{next(_ids)}")


def t(*partitions: int) -> dict[uuid.UUID, frozenset[int]]:
    return {T_ID: frozenset(partitions)}


def test_a_first_member_gets_every_partition_and_the_group_epoch() -> None:
    group = ConsumerGroup("g", SETTINGS)
    result = send(group, 0, beat("a", 0))
    assert result.error_code is E.NONE
    assert result.member_id == "a" and result.member_epoch == group.group_epoch >= 1
    assert result.assignment == t(0, 1, 2, 3)
    assert result.heartbeat_interval_ms == 5_000
    assert group.state is ConsumerGroupState.STABLE


def test_a_partition_moves_only_after_its_owner_revoked_it() -> None:
    group = ConsumerGroup("g", SETTINGS)
    first = send(group, 0, beat("a", 0))
    # B joins: its share is still A's, so B gets nothing yet, at the new epoch
    joined = send(group, 10, beat("b", 0))
    assert joined.assignment == {} and joined.member_epoch == group.assignment_epoch
    assert group.members["b"].state is MemberState.UNRELEASED_PARTITIONS
    # A is told to keep only its share, at its old epoch, until it revokes the rest
    told = send(group, 20, beat("a", first.member_epoch))
    kept = told.assignment
    assert kept is not None and told.member_epoch == first.member_epoch
    a_share = kept[T_ID]
    assert len(a_share) == 2 and group.members["a"].state is MemberState.UNREVOKED_PARTITIONS
    # B still waits while A has not said it let go
    assert send(group, 30, beat("b", joined.member_epoch)).assignment is None
    # A reports owning only its share: it takes the new epoch, and B then gets the rest
    acked = send(group, 40, beat("a", first.member_epoch, owned=kept))
    assert acked.member_epoch == group.assignment_epoch
    got = send(group, 50, beat("b", joined.member_epoch))
    assert got.assignment == {T_ID: frozenset(range(4)) - a_share}
    assert group.state is ConsumerGroupState.STABLE


def test_a_wrong_epoch_is_fenced_and_an_unknown_member_refused() -> None:
    group = ConsumerGroup("g", SETTINGS)
    epoch = send(group, 0, beat("a", 0)).member_epoch
    assert send(group, 1, beat("a", epoch + 1)).error_code is E.FENCED_MEMBER_EPOCH
    assert send(group, 1, beat("x", epoch)).error_code is E.UNKNOWN_MEMBER_ID


def test_the_previous_epoch_is_accepted_when_the_answer_was_lost() -> None:
    group = ConsumerGroup("g", SETTINGS)
    first = send(group, 0, beat("a", 0))
    send(group, 10, beat("b", 0))
    kept = send(group, 20, beat("a", first.member_epoch)).assignment
    new_epoch = send(group, 30, beat("a", first.member_epoch, owned=kept)).member_epoch
    assert new_epoch > first.member_epoch
    # the answer with the new epoch was lost: A sends its previous epoch again
    again = send(group, 40, beat("a", first.member_epoch, owned=kept))
    assert again.error_code is E.NONE and again.member_epoch == new_epoch


def test_a_repeated_join_is_accepted_but_a_member_at_a_later_epoch_cannot_rejoin() -> None:
    group = ConsumerGroup("g", SETTINGS)
    first = send(group, 0, beat("a", 0))
    # the answer to its join was lost: the same join again gets the same answer
    again = send(group, 10, beat("a", 0))
    assert (again.error_code, again.member_epoch, again.assignment) == (
        E.NONE, first.member_epoch, first.assignment)
    # once it moved on, an epoch-0 heartbeat from the same member id is fenced (Kafka's rule)
    send(group, 20, beat("b", 0))
    kept = send(group, 30, beat("a", first.member_epoch)).assignment
    send(group, 40, beat("a", first.member_epoch, owned=kept))
    assert send(group, 50, beat("a", 0)).error_code is E.FENCED_MEMBER_EPOCH


def test_leaving_frees_the_partitions_for_the_others() -> None:
    group = ConsumerGroup("g", SETTINGS)
    a = send(group, 0, beat("a", 0))
    b = send(group, 10, beat("b", 0))
    kept = send(group, 20, beat("a", a.member_epoch)).assignment
    send(group, 30, beat("a", a.member_epoch, owned=kept))
    b = send(group, 40, beat("b", b.member_epoch))
    left = send(group, 50, beat("a", -1))
    assert (left.error_code, left.member_epoch, left.heartbeat_interval_ms) == (E.NONE, -1, 0)
    after = send(group, 60, beat("b", b.member_epoch))
    assert after.assignment == t(0, 1, 2, 3)
    assert list(group.members) == ["b"]


def test_an_expired_session_fences_the_member() -> None:
    group = ConsumerGroup("g", SETTINGS)
    a = send(group, 0, beat("a", 0))
    b = send(group, 1_000, beat("b", 0))
    kept = send(group, 2_000, beat("a", a.member_epoch)).assignment
    send(group, 2_000, beat("a", a.member_epoch, owned=kept))
    send(group, 30_000, beat("b", b.member_epoch))
    assert group.next_deadline_ms() == 47_000  # A's session: its last heartbeat + 45 s
    group.tick(47_000)
    assert list(group.members) == ["b"]
    assert send(group, 47_001, beat("b", b.member_epoch)).assignment == t(0, 1, 2, 3)


def test_a_member_that_does_not_revoke_in_time_is_fenced() -> None:
    group = ConsumerGroup("g", SETTINGS)
    a = send(group, 0, beat("a", 0, rebalance=10_000))
    send(group, 100, beat("b", 0))
    send(group, 200, beat("a", a.member_epoch))  # told to revoke, never acknowledges
    group.tick(10_199)
    assert "a" in group.members
    group.tick(10_200)
    assert list(group.members) == ["b"]


def test_a_static_member_comes_back_under_a_new_id_with_its_partitions() -> None:
    group = ConsumerGroup("g", SETTINGS)
    a = send(group, 0, beat("a", 0, instance="i-1"))
    epoch = group.group_epoch
    left = send(group, 10, beat("a", -2, instance="i-1"))
    assert (left.error_code, left.member_epoch) == (E.NONE, -2)
    # its partitions are kept for it, no rebalance: it restarts under a new member id
    back = send(group, 20, beat("a2", 0, instance="i-1"))
    assert back.error_code is E.NONE and back.member_id == "a2"
    assert back.assignment == a.assignment == t(0, 1, 2, 3)
    assert group.group_epoch == epoch and list(group.members) == ["a2"]


def test_an_instance_id_held_by_a_live_member_is_refused() -> None:
    group = ConsumerGroup("g", SETTINGS)
    send(group, 0, beat("a", 0, instance="i-1"))
    refused = send(group, 10, beat("b", 0, instance="i-1"))
    assert refused.error_code is E.UNRELEASED_INSTANCE_ID


def test_a_new_topic_matching_a_regex_is_assigned_on_the_next_heartbeat() -> None:
    group = ConsumerGroup("g", SETTINGS)
    a = send(group, 0, beat("a", 0, topics=None, regex="t|v.*"))
    assert a.assignment == t(0, 1, 2, 3)
    v_id = uuid.UUID(int=3)
    more = {**TOPICS, "v1": TopicMetadata(v_id, 1)}
    after = send(group, 10, beat("a", a.member_epoch), topics=more)
    assert after.assignment == {**t(0, 1, 2, 3), v_id: frozenset({0})}
    assert after.member_epoch > a.member_epoch


def test_added_partitions_bump_the_epoch_and_are_assigned() -> None:
    group = ConsumerGroup("g", SETTINGS)
    a = send(group, 0, beat("a", 0))
    grown = {**TOPICS, "t": TopicMetadata(T_ID, 6)}
    after = send(group, 10, beat("a", a.member_epoch), topics=grown)
    assert after.assignment == t(0, 1, 2, 3, 4, 5)


@pytest.mark.parametrize(("request_", "message"), [
    (beat("a", 0, rebalance=-1), "RebalanceTimeoutMs must be provided"),
    (beat("a", 0, owned=t(1)), "TopicPartitions must be empty"),
    (ConsumerHeartbeat("", "a", 0, None, None, 1, ("t",), None, None, {}, "c", "h"),
     "GroupId can't be empty"),
    (ConsumerHeartbeat("g", "a", 0, None, None, 1, None, None, None, {}, "c", "h"),
     "SubscribedTopicNames or SubscribedTopicRegex"),
    (ConsumerHeartbeat("g", "", 3, None, None, -1, None, None, None, None, "c", "h"),
     "MemberId can't be empty"),
    (ConsumerHeartbeat("g", "a", -3, None, None, -1, None, None, None, None, "c", "h"),
     "MemberEpoch is -3"),
    (ConsumerHeartbeat("g", "a", 0, "", None, 1, ("t",), None, None, {}, "c", "h"),
     "InstanceId can't be empty"),
])
def test_invalid_heartbeats_are_refused_as_kafka_refuses_them(
        request_: ConsumerHeartbeat, message: str) -> None:
    refused = heartbeat_precheck(request_)
    assert refused is not None and refused.error_code is E.INVALID_REQUEST
    assert message in (refused.error_message or "")


def test_an_unknown_assignor_and_a_bad_regex_get_their_own_codes() -> None:
    unknown = heartbeat_precheck(beat("a", 0, assignor="sticky"))
    assert unknown is not None and unknown.error_code is E.UNSUPPORTED_ASSIGNOR
    bad = heartbeat_precheck(beat("a", 0, topics=None, regex="t("))
    assert bad is not None and bad.error_code is E.INVALID_REGULAR_EXPRESSION


def test_commits_are_checked_against_the_member_epoch_per_partition() -> None:
    group = ConsumerGroup("g", SETTINGS)
    tps = [TopicPartition("t", p) for p in range(4)]
    # empty group: a commit from outside the group is accepted
    assert group.validate_commit("", -1, 9, tps) == {}
    a = send(group, 0, beat("a", 0))
    assert group.validate_commit("", -1, 9, tps) == dict.fromkeys(tps, E.UNKNOWN_MEMBER_ID)
    assert group.validate_commit("a", a.member_epoch, 8, tps) == dict.fromkeys(
        tps, E.UNSUPPORTED_VERSION)
    assert group.validate_commit("a", a.member_epoch, 9, tps) == {}
    assert group.validate_commit("a", a.member_epoch + 1, 9, tps) == dict.fromkeys(
        tps, E.STALE_MEMBER_EPOCH)
    # A moves to a newer epoch keeping two partitions: a commit still in flight at the old
    # epoch is accepted for those, refused for the ones it gave up (KIP-1251)
    send(group, 10, beat("b", 0))
    kept = send(group, 20, beat("a", a.member_epoch)).assignment
    assert kept is not None
    send(group, 30, beat("a", a.member_epoch, owned=kept))
    late = group.validate_commit("a", a.member_epoch, 9, tps)
    assert set(late) == {TopicPartition("t", p) for p in range(4) if p not in kept[T_ID]}
    assert set(late.values()) == {E.STALE_MEMBER_EPOCH}
    assert group.validate_fetch("a", a.member_epoch) is E.STALE_MEMBER_EPOCH
    assert group.validate_fetch(None, -1) is E.NONE


def test_the_record_in_redis_restores_the_group_with_fresh_sessions() -> None:
    group = ConsumerGroup("g", SETTINGS)
    a = send(group, 0, beat("a", 0, regex="u", topics=("t",)))
    send(group, 10, beat("b", 0, instance="i-9"))
    send(group, 20, beat("a", a.member_epoch))
    restored = consumer_group_from_json("g", consumer_group_to_json(group), 100_000, SETTINGS)
    assert consumer_group_to_json(restored) == consumer_group_to_json(group)
    assert restored.next_deadline_ms() == min(100_000 + 45_000, 100_000 + 30_000)
    assert restored.state is group.state


def test_uniform_is_balanced_and_keeps_partitions_where_they_were() -> None:
    members = {m: frozenset({"t"}) for m in "abc"}
    first = uniform(members, {"t": 7}, {})
    sizes = sorted(len(a.get("t", ())) for a in first.values())
    assert sizes == [2, 2, 3]
    more = uniform({**members, "d": frozenset({"t"})}, {"t": 7}, first)
    assert sorted(len(a.get("t", ())) for a in more.values()) == [1, 2, 2, 2]
    moved = sum(len(first[m]["t"] - more[m].get("t", frozenset())) for m in "abc")
    assert moved == 1  # only what the newcomer needs
    assert set().union(*(a.get("t", frozenset()) for a in more.values())) == set(range(7))


def test_uniform_gives_a_topic_only_to_its_subscribers() -> None:
    result = uniform({"a": frozenset({"t", "u"}), "b": frozenset({"u"})}, {"t": 4, "u": 2}, {})
    assert result == {"a": {"t": frozenset(range(4))}, "b": {"u": frozenset({0, 1})}}


def test_range_gives_each_member_a_contiguous_range_per_topic() -> None:
    result = range_({m: frozenset({"t"}) for m in "abc"}, {"t": 7}, {})
    assert result == {"a": {"t": frozenset({0, 1, 2})}, "b": {"t": frozenset({3, 4})},
                      "c": {"t": frozenset({5, 6})}}


def test_a_regex_that_backtracks_exponentially_is_matched_in_linear_time() -> None:
    # `(a+)+b` against forty a's: a backtracking engine would take hours here, holding the
    # event loop; RE2 (Kafka's RE2/J semantics) answers at once that it does not match.
    group = ConsumerGroup("g", SETTINGS)
    topics = {**TOPICS, "a" * 40: TopicMetadata(uuid.UUID(int=9), 1)}
    joined = send(group, 0, beat("a", 0, topics=None, regex="(a+)+b"), topics)
    assert (joined.error_code, joined.assignment) == (E.NONE, {})
    found = send(group, 10, beat("b", 0, topics=None, regex="a+"), topics)
    assert found.assignment == {uuid.UUID(int=9): frozenset({0})}


def test_a_heartbeat_needs_the_named_topics_or_every_one_while_a_regex_is_in_use() -> None:
    group = ConsumerGroup("g", SETTINGS)
    send(group, 0, beat("a", 0, topics=("t",)))
    assert group.topics_needed(beat("b", 0, topics=("u",))) == {"t", "u"}
    send(group, 10, beat("c", 0, topics=None, regex="v.*"))
    assert group.topics_needed(beat("a", 1)) is None
