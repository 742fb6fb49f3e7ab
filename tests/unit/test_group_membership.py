"""The classic group state machine with literal clocks: joins, rebalance completion,
timeouts, leaving, static members, commits and the errors Kafka answers."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from storage.groups.membership import Group, join_precheck
from storage.groups.model import (
    GroupState,
    JoinRequest,
    JoinResult,
    MemberIdentity,
    MembershipSettings,
    Protocol,
    Reply,
    SyncRequest,
    SyncResult,
)
from storage.groups.snapshot import group_from_json, group_to_json
from wire.errors import ErrorCode

SETTINGS = MembershipSettings(initial_rebalance_delay_ms=300, min_session_timeout_ms=6_000,
                              max_session_timeout_ms=1_800_000)
SESSION = 10_000
REBALANCE = 60_000
E = ErrorCode
S = GroupState


def request(member_id: str = "", *, client: str = "c", instance: str | None = None,
            protocols: tuple[tuple[str, bytes], ...] = (("range", b"meta"),),
            protocol_type: str = "consumer", session: int = SESSION,
            rebalance: int = REBALANCE, known_id_required: bool = True) -> JoinRequest:
    return JoinRequest(group_id="g", member_id=member_id, group_instance_id=instance,
                       client_id=client, client_host="/127.0.0.1", session_timeout_ms=session,
                       rebalance_timeout_ms=rebalance, protocol_type=protocol_type,
                       protocols=tuple(Protocol(n, m) for n, m in protocols),
                       require_known_member_id=known_id_required and instance is None)


@dataclass
class Driver:
    """A group plus the replies it has handed out, by ticket."""

    group: Group = field(default_factory=lambda: new_group())
    replies: dict[int, Reply] = field(default_factory=dict)
    tickets: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def _collect(self) -> None:
        for ticket, reply in self.group.take_replies():
            assert ticket not in self.replies, f"ticket {ticket} answered twice"
            self.replies[ticket] = reply

    def join(self, now: int, join: JoinRequest) -> int:
        ticket = next(self.tickets)
        self.group.join(now, join, ticket)
        self._collect()
        return ticket

    def sync(self, now: int, member_id: str, generation: int,
             assignments: dict[str, bytes] | None = None, instance: str | None = None,
             protocol_name: str | None = None) -> int:
        ticket = next(self.tickets)
        self.group.sync(now, SyncRequest("g", member_id, instance, generation, None,
                                         protocol_name, assignments or {}), ticket)
        self._collect()
        return ticket

    def tick(self, now: int) -> None:
        """Run every timer due up to `now`, each at its own deadline (as the coordinator's
        timers do)."""
        while (due := self.group.next_deadline_ms()) is not None and due <= now:
            self.group.tick(due)
            self._collect()
        self.group.tick(now)
        self._collect()

    def leave(self, now: int, *who: MemberIdentity) -> list[ErrorCode]:
        codes = self.group.leave(now, who)
        self._collect()
        return codes

    def joined(self, ticket: int) -> JoinResult:
        reply = self.replies[ticket]
        assert isinstance(reply, JoinResult)
        return reply

    def synced(self, ticket: int) -> SyncResult:
        reply = self.replies[ticket]
        assert isinstance(reply, SyncResult)
        return reply

    def new_member(self, now: int, client: str = "c", **kwargs: object) -> str:
        """A dynamic member through the MEMBER_ID_REQUIRED round trip; returns its id and
        leaves its second join waiting (or answered) under the returned ticket."""
        first = self.joined(self.join(now, request(client=client, **kwargs)))  # type: ignore[arg-type]
        assert first.error_code is E.MEMBER_ID_REQUIRED
        return first.member_id


def new_group() -> Group:
    ids = itertools.count(1)
    return Group("g", SETTINGS, lambda: f"u{next(ids)}")


def stable_group(*clients: str, now: int = 0) -> tuple[Driver, list[str]]:
    """A Stable group whose members joined together; the first is the leader and assigns
    each member its own client name as assignment."""
    d = Driver()
    ids = [d.new_member(now, c) for c in clients]
    tickets = [d.join(now, request(m, client=c)) for m, c in zip(ids, clients, strict=True)]
    d.tick(now + 2 * SETTINGS.initial_rebalance_delay_ms)
    generation = d.joined(tickets[0]).generation_id
    for member_id in ids[1:]:
        d.sync(now + 600, member_id, generation)
    d.sync(now + 600, ids[0], generation,
           {m: c.encode() for m, c in zip(ids, clients, strict=True)})
    assert d.group.state is S.STABLE
    return d, ids


# --- joining ---------------------------------------------------------------------------


def test_a_new_member_without_an_id_is_given_one_and_asked_to_rejoin() -> None:
    d = Driver()

    result = d.joined(d.join(0, request(client="app")))

    assert result.error_code is E.MEMBER_ID_REQUIRED
    assert result.member_id == "app-u1"
    assert result.generation_id == -1
    assert d.group.state is S.EMPTY
    assert d.group.pending_members == {"app-u1": SESSION}


def test_first_join_waits_out_the_initial_delay_then_leads_generation_1() -> None:
    d = Driver()
    member = d.new_member(0)
    ticket = d.join(10, request(member))

    d.tick(309)
    waited = ticket in d.replies
    d.tick(310)

    assert not waited
    result = d.joined(ticket)
    assert (result.error_code, result.generation_id, result.leader) == (E.NONE, 1, member)
    assert result.protocol_type == "consumer"
    assert result.protocol_name == "range"
    assert [(m.member_id, m.metadata) for m in result.members] == [(member, b"meta")]
    assert d.group.state is S.COMPLETING_REBALANCE


def test_initial_delay_is_extended_while_new_members_keep_arriving() -> None:
    d = Driver()
    first, second = d.new_member(0, "a"), d.new_member(0, "b")
    t1 = d.join(0, request(first, client="a"))
    t2 = d.join(200, request(second, client="b"))

    d.tick(300)
    after_first_delay = dict(d.replies)
    d.tick(600)

    assert t1 not in after_first_delay and t2 not in after_first_delay
    leader_view, follower_view = d.joined(t1), d.joined(t2)
    assert leader_view.generation_id == follower_view.generation_id == 1
    assert leader_view.leader == follower_view.leader == first
    assert [m.member_id for m in leader_view.members] == [first, second]
    assert follower_view.members == ()


def test_followers_wait_for_the_leaders_assignment() -> None:
    d = Driver()
    leader, follower, idle = (d.new_member(0, c) for c in "abc")
    for member, client in ((leader, "a"), (follower, "b"), (idle, "c")):
        d.join(0, request(member, client=client))
    d.tick(600)  # the initial delay, extended once: members kept arriving in the first

    follower_ticket = d.sync(700, follower, 1)
    waiting = follower_ticket in d.replies
    leader_ticket = d.sync(800, leader, 1, {leader: b"p0", follower: b"p1", "stranger": b"x"})
    idle_ticket = d.sync(900, idle, 1)

    assert not waiting
    assert d.synced(follower_ticket) == SyncResult(E.NONE, "consumer", "range", b"p1")
    assert d.synced(leader_ticket).assignment == b"p0"
    # A member the leader left out gets an empty assignment.
    assert d.synced(idle_ticket) == SyncResult(E.NONE, "consumer", "range", b"")
    assert d.group.state is S.STABLE


def test_protocol_is_one_every_member_supports_chosen_by_votes() -> None:
    d = Driver()
    prefs = [(("roundrobin", b"1"), ("range", b"2")), (("roundrobin", b"3"), ("range", b"4")),
             (("range", b"5"), ("roundrobin", b"6"), ("sticky", b"7"))]
    ids = [d.new_member(0, c) for c in "abc"]
    tickets = [d.join(0, request(m, client=c, protocols=p))
               for m, c, p in zip(ids, "abc", prefs, strict=True)]

    d.tick(600)

    leader_view = d.joined(tickets[0])
    assert leader_view.protocol_name == "roundrobin"
    assert [m.metadata for m in leader_view.members] == [b"1", b"3", b"6"]


def test_join_with_another_protocol_type_or_no_common_protocol_is_inconsistent() -> None:
    d, _ = stable_group("a")

    other_type = d.joined(d.join(1000, request(protocol_type="connect")))
    no_common = d.joined(d.join(1000, request(protocols=(("sticky", b""),))))
    empty = Driver()
    nothing = empty.joined(empty.join(0, request(protocols=())))

    assert other_type.error_code is E.INCONSISTENT_GROUP_PROTOCOL
    assert no_common.error_code is E.INCONSISTENT_GROUP_PROTOCOL
    assert nothing.error_code is E.INCONSISTENT_GROUP_PROTOCOL
    assert d.group.state is S.STABLE


@pytest.mark.parametrize(("group_id", "session", "expected"), [
    ("g", 5_999, E.INVALID_SESSION_TIMEOUT),
    ("g", 1_800_001, E.INVALID_SESSION_TIMEOUT),
    ("", SESSION, E.INVALID_GROUP_ID),
    ("g", 6_000, None),
])
def test_join_precheck(group_id: str, session: int, expected: ErrorCode | None) -> None:
    joining = request(session=session)
    joining = JoinRequest(group_id, *(getattr(joining, f) for f in (
        "member_id", "group_instance_id", "client_id", "client_host", "session_timeout_ms",
        "rebalance_timeout_ms", "protocol_type", "protocols", "require_known_member_id")))

    assert join_precheck(joining, SETTINGS) is expected


def test_a_follower_rejoining_a_stable_group_unchanged_gets_the_current_generation() -> None:
    d, (leader, follower) = stable_group("a", "b")

    result = d.joined(d.join(1000, request(follower, client="b")))

    assert (result.error_code, result.generation_id, result.leader) == (E.NONE, 1, leader)
    assert result.members == ()
    assert d.group.state is S.STABLE


def test_the_leader_rejoining_a_stable_group_starts_a_rebalance() -> None:
    d, (leader, _) = stable_group("a", "b")

    ticket = d.join(1000, request(leader, client="a"))

    assert ticket not in d.replies
    assert d.group.state is S.PREPARING_REBALANCE


# --- rebalancing -----------------------------------------------------------------------


def test_rebalance_completes_as_soon_as_every_known_member_has_rejoined() -> None:
    d, (a, b) = stable_group("a", "b")
    c = d.new_member(1000, "c")
    tc = d.join(1000, request(c, client="c"))
    heartbeat = d.group.heartbeat(1100, a, None, 1)
    ta = d.join(1200, request(a, client="a"))
    before_last = dict(d.replies)

    tb = d.join(1300, request(b, client="b"))

    assert heartbeat is E.REBALANCE_IN_PROGRESS
    assert tc not in before_last and ta not in before_last
    assert {d.joined(t).generation_id for t in (ta, tb, tc)} == {2}
    assert d.joined(ta).leader == a
    assert [m.member_id for m in d.joined(ta).members] == [a, b, c]


def test_members_that_do_not_rejoin_within_the_rebalance_timeout_are_removed() -> None:
    d, (a, b) = stable_group("a", "b")
    c = d.new_member(1000, "c")
    tc = d.join(1000, request(c, client="c"))
    ta = d.join(1000, request(a, client="a"))
    # b keeps heartbeating (so its session never expires) but never rejoins.
    for now in range(2000, 61_000, 5000):
        assert d.group.heartbeat(now, b, None, 1) is E.REBALANCE_IN_PROGRESS

    d.tick(1000 + REBALANCE - 1)
    early = dict(d.replies)
    d.tick(1000 + REBALANCE)

    assert ta not in early and tc not in early
    assert d.joined(ta).generation_id == 2
    assert [m.member_id for m in d.joined(ta).members] == [a, c]
    assert b not in d.group.members
    assert d.group.heartbeat(61_001, b, None, 2) is E.UNKNOWN_MEMBER_ID


def test_an_expired_session_removes_the_member_and_starts_a_rebalance() -> None:
    d, (a, b) = stable_group("a", "b")  # sessions restarted at the syncs, t=600
    for now in (3000, 6000, 9000):
        assert d.group.heartbeat(now, a, None, 1) is E.NONE

    d.tick(600 + SESSION - 1)
    still_there = b in d.group.members
    d.tick(600 + SESSION)

    assert still_there
    assert b not in d.group.members
    assert d.group.state is S.PREPARING_REBALANCE
    assert d.group.heartbeat(10_400, a, None, 1) is E.REBALANCE_IN_PROGRESS
    rejoined = d.joined(d.join(10_500, request(a, client="a")))
    assert (rejoined.generation_id, rejoined.leader) == (2, a)
    assert [m.member_id for m in rejoined.members] == [a]


def test_a_member_waiting_in_a_rebalance_is_not_expired_by_its_session() -> None:
    d, (a, b) = stable_group("a", "b")
    ta = d.join(1000, request(a, client="a"))  # the leader asks for a rebalance; b is slow
    d.group.heartbeat(1000, b, None, 1)

    d.tick(1000 + SESSION - 1)  # a's session deadline (600 + SESSION) passed while it waited
    both_there = set(d.group.members) == {a, b}
    d.tick(1000 + SESSION)  # b's too: it neither heartbeat again nor rejoined

    assert both_there
    assert list(d.group.members) == [a]
    assert d.joined(ta).generation_id == 2


def test_pending_member_that_never_comes_back_expires() -> None:
    d = Driver()
    member = d.new_member(0)

    d.tick(SESSION)
    late = d.joined(d.join(SESSION + 1, request(member)))

    assert d.group.pending_members == {}
    assert late.error_code is E.UNKNOWN_MEMBER_ID


def test_a_rebalance_answers_members_waiting_for_their_assignment() -> None:
    d = Driver()
    a, b = d.new_member(0, "a"), d.new_member(0, "b")
    d.join(0, request(a, client="a"))
    d.join(0, request(b, client="b"))
    d.tick(600)
    waiting = d.sync(700, b, 1)

    c = d.new_member(800, "c")
    d.join(800, request(c, client="c"))

    assert d.synced(waiting).error_code is E.REBALANCE_IN_PROGRESS
    assert d.group.state is S.PREPARING_REBALANCE


def test_members_that_never_sync_are_removed_after_the_rebalance_timeout() -> None:
    d = Driver()
    a, b = d.new_member(0, "a"), d.new_member(0, "b")
    d.join(0, request(a, client="a"))
    d.join(0, request(b, client="b"))
    d.tick(600)
    d.sync(700, a, 1, {a: b"x", b: b"y"})
    for now in range(1000, 60_600, 3000):  # b heartbeats but never sends SyncGroup
        d.group.heartbeat(now, b, None, 1)
        d.group.heartbeat(now, a, None, 1)

    d.tick(600 + REBALANCE)

    assert list(d.group.members) == [a]
    assert d.group.state is S.PREPARING_REBALANCE


def test_heartbeat_errors() -> None:
    d, (a, _) = stable_group("a", "b")

    assert d.group.heartbeat(1000, a, None, 1) is E.NONE
    assert d.group.heartbeat(1000, a, None, 0) is E.ILLEGAL_GENERATION
    assert d.group.heartbeat(1000, "nobody", None, 1) is E.UNKNOWN_MEMBER_ID
    assert d.group.heartbeat(1000, a, "no-such-instance", 1) is E.UNKNOWN_MEMBER_ID


def test_sync_errors() -> None:
    d, (a, b) = stable_group("a", "b")

    wrong_generation = d.synced(d.sync(1000, a, 7))
    unknown = d.synced(d.sync(1000, "nobody", 1))
    other_protocol = d.synced(d.sync(1000, a, 1, protocol_name="roundrobin"))
    d.join(1000, request(a, client="a"))
    during_rebalance = d.synced(d.sync(1000, b, 1))

    assert wrong_generation.error_code is E.ILLEGAL_GENERATION
    assert unknown.error_code is E.UNKNOWN_MEMBER_ID
    assert other_protocol.error_code is E.INCONSISTENT_GROUP_PROTOCOL
    assert during_rebalance.error_code is E.REBALANCE_IN_PROGRESS


def test_sync_in_a_stable_group_returns_the_members_assignment() -> None:
    d, (_, b) = stable_group("a", "b")

    assert d.synced(d.sync(1000, b, 1)) == SyncResult(E.NONE, "consumer", "range", b"b")


# --- leaving ---------------------------------------------------------------------------


def test_leaving_starts_a_rebalance_and_the_last_leave_empties_the_group() -> None:
    d, (a, b) = stable_group("a", "b")

    left_b = d.leave(1000, MemberIdentity(b))
    state_after_b = d.group.state
    rejoined = d.joined(d.join(1100, request(a, client="a")))
    left_a = d.leave(1200, MemberIdentity(a))

    assert left_b == [E.NONE]
    assert state_after_b is S.PREPARING_REBALANCE
    assert (rejoined.generation_id, [m.member_id for m in rejoined.members]) == (2, [a])
    assert left_a == [E.NONE]
    assert d.group.state is S.EMPTY
    assert d.group.generation_id == 3
    assert d.group.members == {}


def test_leave_of_several_members_answers_each() -> None:
    d = Driver()
    static_ticket = d.join(0, request(client="s", instance="i-1"))  # no id round trip
    static = d.group.static_members["i-1"]
    pending = d.new_member(0, "p")

    codes = d.leave(100, MemberIdentity("", "i-1"), MemberIdentity(pending),
                    MemberIdentity("nobody"), MemberIdentity("", "i-unknown"))

    assert codes == [E.NONE, E.NONE, E.UNKNOWN_MEMBER_ID, E.UNKNOWN_MEMBER_ID]
    assert static not in d.group.members
    assert d.group.pending_members == {}
    # Its join was still waiting: it is told it is no longer a member.
    assert d.joined(static_ticket) == JoinResult(E.UNKNOWN_MEMBER_ID, "")


# --- static members --------------------------------------------------------------------


def static_stable_group(dynamic_protocols: tuple[tuple[str, bytes], ...] = (("range", b"m"),)
                        ) -> tuple[Driver, str, str]:
    """A Stable group of a static leader (instance "i-s") and a dynamic follower."""
    d = Driver()
    ts = d.join(0, request(client="s", instance="i-s"))
    dynamic = d.new_member(0, "d")
    d.join(0, request(dynamic, client="d", protocols=dynamic_protocols))
    d.tick(600)
    static = d.joined(ts).member_id
    d.sync(600, dynamic, 1)
    d.sync(600, static, 1, {static: b"ps", dynamic: b"pd"})
    assert d.group.state is S.STABLE
    return d, static, dynamic


def test_a_restarted_static_member_takes_over_its_old_id_without_a_rebalance() -> None:
    d, old, dynamic = static_stable_group()
    revision = d.group.revision

    result = d.joined(d.join(5000, request(client="s", instance="i-s")))

    new = result.member_id
    assert new != old and new.startswith("i-s-")
    assert result.error_code is E.NONE
    assert result.generation_id == 1
    # The old leader id, so the restarted member does not think it must assign.
    assert result.leader == old
    assert result.members == ()
    assert d.group.state is S.STABLE
    assert d.group.leader_id == new
    assert d.group.revision > revision  # the replacement is persisted
    assert d.synced(d.sync(5100, new, 1, instance="i-s")).assignment == b"ps"
    assert d.group.heartbeat(5200, new, "i-s", 1) is E.NONE
    assert d.group.heartbeat(5200, old, "i-s", 1) is E.FENCED_INSTANCE_ID
    assert d.group.heartbeat(5200, dynamic, None, 1) is E.NONE


def test_a_static_member_joining_with_a_stale_member_id_is_fenced() -> None:
    d, old, _ = static_stable_group()
    d.join(5000, request(client="s", instance="i-s"))

    fenced = d.joined(d.join(5100, request(old, client="s", instance="i-s")))

    assert fenced.error_code is E.FENCED_INSTANCE_ID


def test_a_static_member_rejoining_with_new_protocols_rebalances_only_if_the_choice_changes(
        ) -> None:
    d, _, _ = static_stable_group(dynamic_protocols=(("range", b"m"), ("sticky", b"m")))
    same_choice = d.join(5000, request(client="s", instance="i-s",
                                       protocols=(("range", b"meta"), ("sticky", b""))))
    state_after_same = d.group.state

    # Now the votes tie (sticky by the static member, range by the other) and the
    # static member's vote came first: sticky would be chosen, so the group rebalances.
    changed = d.join(6000, request(client="s", instance="i-s",
                                   protocols=(("sticky", b""), ("range", b"meta"))))

    assert d.joined(same_choice).error_code is E.NONE
    assert state_after_same is S.STABLE
    assert changed not in d.replies
    assert d.group.state is S.PREPARING_REBALANCE


def test_a_static_member_that_does_not_rejoin_stays_in_the_group() -> None:
    d, static, dynamic = static_stable_group()
    newcomer = d.new_member(1000, "n")
    tn = d.join(1000, request(newcomer, client="n"))
    td = d.join(1000, request(dynamic, client="d"))
    for now in range(1000, 1000 + REBALANCE, 5000):  # alive, but it does not rejoin
        assert d.group.heartbeat(now, static, "i-s", 1) is E.REBALANCE_IN_PROGRESS

    d.tick(1000 + REBALANCE)

    assert d.joined(tn).generation_id == d.joined(td).generation_id == 2
    assert static in d.group.members
    leader_view = d.joined(td) if d.joined(td).members else d.joined(tn)
    assert {m.member_id for m in leader_view.members} == {static, dynamic, newcomer}


# --- offset commits --------------------------------------------------------------------


def test_a_commit_without_group_management_is_allowed_only_while_the_group_is_empty() -> None:
    empty = new_group()
    d, (a, _) = stable_group("a", "b")

    assert empty.validate_commit(0, -1, "", None) is E.NONE
    assert d.group.validate_commit(1000, -1, "", None) is E.UNKNOWN_MEMBER_ID
    assert d.group.validate_commit(1000, 1, a, None) is E.NONE
    assert d.group.validate_commit(1000, 0, a, None) is E.ILLEGAL_GENERATION
    assert d.group.validate_commit(1000, 1, "nobody", None) is E.UNKNOWN_MEMBER_ID


def test_a_commit_between_join_and_sync_is_told_to_wait_for_the_rebalance() -> None:
    d = Driver()
    a = d.new_member(0)
    d.join(0, request(a))
    d.tick(300)

    assert d.group.state is S.COMPLETING_REBALANCE
    assert d.group.validate_commit(400, 1, a, None) is E.REBALANCE_IN_PROGRESS


# --- persistence -----------------------------------------------------------------------


def test_a_persisted_stable_group_restores_with_session_timers_from_load_time() -> None:
    d, static, dynamic = static_stable_group()
    saved = group_to_json(d.group)

    restored = group_from_json("g", saved, 1_000_000, SETTINGS, lambda: "x")

    assert restored.state is S.STABLE
    assert (restored.generation_id, restored.leader_id) == (1, static)
    assert list(restored.members) == [static, dynamic]
    assert restored.members[dynamic].assignment == b"pd"
    assert restored.static_members == {"i-s": static}
    assert restored.heartbeat(1_000_000 + SESSION - 1, dynamic, None, 1) is E.NONE
    restored.tick(1_000_000 + SESSION)  # the static member never heartbeat after the load
    assert static not in restored.members
    assert restored.state is S.PREPARING_REBALANCE


def test_a_group_persisted_mid_rebalance_restarts_the_rebalance_when_loaded() -> None:
    d, (a, b) = stable_group("a", "b")
    d.join(1000, request(a, client="a"))
    saved = group_to_json(d.group)

    restored = group_from_json("g", saved, 50_000, SETTINGS, lambda: "x")

    assert restored.state is S.PREPARING_REBALANCE
    assert restored.heartbeat(50_001, b, None, 1) is E.REBALANCE_IN_PROGRESS
    restored.tick(50_000 + REBALANCE)  # nobody rejoined: dynamic members are dropped
    assert restored.state is S.EMPTY
    assert restored.generation_id == 2
