"""A classic consumer group's membership, as Apache Kafka's GroupCoordinator runs it.

States Empty -> PreparingRebalance -> CompletingRebalance -> Stable (and Dead once the group
is abandoned). JoinGroup answers wait until every known member has rejoined or the
rebalance timeout passed (members that did not rejoin are removed); a new group first waits
`initial_rebalance_delay_ms`, extended while new members keep arriving. The leader's
SyncGroup sets every member's assignment and answers the followers that wait for it.

I/O-free: every call takes `now_ms` and nothing here sleeps. An answer that must wait is
identified by a ticket the caller chooses; answers come out of `take_replies()`, and
`next_deadline_ms()` says when `tick()` is due. `revision` changes whenever something
worth persisting changed (state, generation, members, leader, assignments).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from storage.groups.members import Member, select_protocol, supported_by_all
from storage.groups.model import (
    UNKNOWN_MEMBER_ID,
    GroupState,
    GroupSummary,
    JoinMember,
    JoinRequest,
    JoinResult,
    MemberIdentity,
    MembershipSettings,
    MemberSummary,
    Protocol,
    Reply,
    SyncRequest,
    SyncResult,
)
from wire.errors import ErrorCode

S = GroupState
_MEMBER_ID_PREFIX_CHARS = 1000


def join_precheck(request: JoinRequest, settings: MembershipSettings) -> ErrorCode | None:
    """What Kafka refuses before it looks the group up."""
    if not request.group_id:
        return ErrorCode.INVALID_GROUP_ID
    if not (settings.min_session_timeout_ms <= request.session_timeout_ms
            <= settings.max_session_timeout_ms):
        return ErrorCode.INVALID_SESSION_TIMEOUT
    return None


def is_standalone_commit(generation_id: int, member_id: str,
                         group_instance_id: str | None) -> bool:
    """An OffsetCommit by a client that does not use group management (assign mode, tools
    resetting offsets): Kafka accepts it only while the group has no members, and it says
    nothing about who committed."""
    return (generation_id < 0 and member_id == UNKNOWN_MEMBER_ID
            and group_instance_id is None)


class Group:
    def __init__(self, group_id: str, settings: MembershipSettings,
                 unique_suffix: Callable[[], str]) -> None:
        self.group_id = group_id
        self.settings = settings
        self._unique_suffix = unique_suffix
        self.state = S.EMPTY
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}  # group instance id -> member id
        self.pending_members: dict[str, int] = {}  # member id -> expiry (MEMBER_ID_REQUIRED)
        self.pending_sync: set[str] = set()  # joined this generation, no SyncGroup yet
        self.revision = 0
        self._replies: list[tuple[int, Reply]] = []
        self._join_deadline_ms: int | None = None
        # While the initial delayed join runs: the current delay and what may still follow.
        self._initial_delay: tuple[int, int] | None = None
        self._new_member_added = False
        self._sync_deadline_ms: int | None = None

    # --- restoring ---------------------------------------------------------------------

    def restore(self, now_ms: int, state: GroupState, generation_id: int,
                protocol_type: str | None, protocol_name: str | None, leader_id: str | None,
                members: Sequence[Member]) -> None:
        """Put back a group persisted by an earlier Kiln process. Session timers restart now,
        so members that keep heartbeating carry on; a group persisted mid-rebalance starts
        the rebalance again (the waiting answers were lost with that process)."""
        self.generation_id = generation_id
        self.protocol_type = protocol_type
        self.protocol_name = protocol_name
        self.members = {m.member_id: m for m in members}
        self.static_members = {m.group_instance_id: m.member_id for m in members
                               if m.group_instance_id is not None}
        self.leader_id = leader_id if leader_id in self.members else next(iter(self.members),
                                                                           None)
        for member in members:
            member.expires_at_ms = now_ms + member.session_timeout_ms
        if not members:
            self.state = S.EMPTY
        elif state is S.STABLE:
            self.state = S.STABLE
        else:
            self.state = S.PREPARING_REBALANCE
            self._join_deadline_ms = now_ms + self.rebalance_timeout_ms()

    # --- JoinGroup -----------------------------------------------------------------------

    def join(self, now_ms: int, request: JoinRequest, ticket: int) -> None:
        member_id = request.member_id
        if self.state is S.DEAD:
            self._reply(ticket, JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id))
        elif not self._supports(request.protocol_type, request.protocols):
            self._reply(ticket, JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id))
        elif member_id == UNKNOWN_MEMBER_ID:
            self._join_new(now_ms, request, ticket)
        else:
            self._join_known(now_ms, request, ticket)
        self._try_complete_join(now_ms)

    def _supports(self, protocol_type: str, protocols: Sequence[Protocol]) -> bool:
        names = [p.name for p in protocols]
        if self.state is S.EMPTY:
            return bool(protocol_type) and bool(names)
        return protocol_type == self.protocol_type and supported_by_all(
            self.members.values(), names)

    def _join_new(self, now_ms: int, request: JoinRequest, ticket: int) -> None:
        # Kafka's member id is the client id (or instance id) and a UUID; cut, so a client id
        # at the string limit still leaves a member id that can be sent back.
        prefix = (request.group_instance_id or request.client_id)[:_MEMBER_ID_PREFIX_CHARS]
        member_id = f"{prefix}-{self._unique_suffix()}"
        instance = request.group_instance_id
        if instance is not None:
            old_member_id = self.static_members.get(instance)
            if old_member_id is None:
                self._add_member_and_rebalance(now_ms, request, member_id, ticket)
            else:
                self._replace_static_member(now_ms, request, old_member_id, member_id, ticket)
        elif request.require_known_member_id:
            self.pending_members[member_id] = now_ms + request.session_timeout_ms
            self._reply(ticket, JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id))
        else:
            self._add_member_and_rebalance(now_ms, request, member_id, ticket)

    def _join_known(self, now_ms: int, request: JoinRequest, ticket: int) -> None:
        member_id = request.member_id
        instance = request.group_instance_id
        if member_id in self.pending_members:
            self._add_member_and_rebalance(now_ms, request, member_id, ticket)
            return
        if instance is not None and self.static_members.get(instance, member_id) != member_id:
            self._reply(ticket, JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id))
            return
        member = self.members.get(member_id)
        if member is None or (instance is not None and instance not in self.static_members):
            self._reply(ticket, JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id))
            return
        unchanged = member.protocols == request.protocols
        if self.state is S.PREPARING_REBALANCE:
            self._update_member(member, request, ticket)
        elif self.state is S.COMPLETING_REBALANCE and unchanged:
            # The member missed the answer to its join: give it the same one again.
            self._reply(ticket, self._joined(member))
        elif self.state is S.STABLE and unchanged and member_id != self.leader_id:
            self._reply(ticket, self._joined(member, with_members=False))
        elif self.state in (S.COMPLETING_REBALANCE, S.STABLE):
            # Changed metadata, or the leader asking for a rebalance (e.g. new topics).
            self._update_member(member, request, ticket)
            self._prepare_rebalance(now_ms)
        else:
            self._reply(ticket, JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id))

    def _add_member_and_rebalance(self, now_ms: int, request: JoinRequest, member_id: str,
                                  ticket: int) -> None:
        member = Member(member_id, request.group_instance_id, request.client_id,
                        request.client_host, request.session_timeout_ms,
                        request.rebalance_timeout_ms, request.protocol_type, request.protocols,
                        join_ticket=ticket, is_new=True,
                        expires_at_ms=now_ms + self.settings.new_member_join_timeout_ms)
        if self.state is S.PREPARING_REBALANCE and self.generation_id == 0:
            self._new_member_added = True
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member_id
        self.members[member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member_id
        self.pending_members.pop(member_id, None)
        self._touch()
        self._maybe_prepare_rebalance(now_ms)

    def _replace_static_member(self, now_ms: int, request: JoinRequest, old_member_id: str,
                               new_member_id: str, ticket: int) -> None:
        """A known group instance id joined without its member id (a restarted static
        member): it takes over the old member, which is fenced. In a Stable group whose
        protocol this does not change there is no rebalance."""
        previous_leader = self.leader_id
        member = self.members[old_member_id]
        if member.join_ticket is not None:
            self._reply(member.join_ticket,
                        JoinResult(ErrorCode.FENCED_INSTANCE_ID, old_member_id))
            member.join_ticket = None
        if member.sync_ticket is not None:
            self._reply(member.sync_ticket, SyncResult(ErrorCode.FENCED_INSTANCE_ID))
            member.sync_ticket = None
        member.member_id = new_member_id
        self.members = {(new_member_id if k == old_member_id else k): v
                        for k, v in self.members.items()}
        if self.leader_id == old_member_id:
            self.leader_id = new_member_id
        if old_member_id in self.pending_sync:
            self.pending_sync.discard(old_member_id)
            self.pending_sync.add(new_member_id)
        assert member.group_instance_id is not None
        self.static_members[member.group_instance_id] = new_member_id
        member.expires_at_ms = now_ms + member.session_timeout_ms
        self._update_member(member, request, ticket)
        if self.state is S.STABLE:
            if self.protocol_name == select_protocol(self.members.values()):
                # Kafka answers with the leader as it was, so that a replaced leader does not
                # take itself for the leader and compute an assignment nobody would receive.
                member.join_ticket = None
                self._reply(ticket, JoinResult(
                    ErrorCode.NONE, new_member_id, self.generation_id, self.protocol_type,
                    self.protocol_name, previous_leader or ""))
            else:
                self._prepare_rebalance(now_ms)
        elif self.state is S.COMPLETING_REBALANCE:
            # The leader may already be assigning to the old member id.
            self._prepare_rebalance(now_ms)

    def _update_member(self, member: Member, request: JoinRequest, ticket: int) -> None:
        if member.join_ticket is not None and member.join_ticket != ticket:
            # Kafka drops the older callback; a connection that still waited for it would
            # stall, so it is answered: the member retries its join.
            self._reply(member.join_ticket,
                        JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id))
        member.protocols = request.protocols
        member.session_timeout_ms = request.session_timeout_ms
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        member.join_ticket = ticket
        self._touch()

    def _joined(self, member: Member, with_members: bool = True) -> JoinResult:
        members: tuple[JoinMember, ...] = ()
        if with_members and member.member_id == self.leader_id:
            members = tuple(JoinMember(m.member_id, m.group_instance_id,
                                       m.metadata(self.protocol_name))
                            for m in self.members.values())
        return JoinResult(ErrorCode.NONE, member.member_id, self.generation_id,
                          self.protocol_type, self.protocol_name, self.leader_id or "", members)

    # --- rebalancing ---------------------------------------------------------------------

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def _maybe_prepare_rebalance(self, now_ms: int) -> None:
        if self.state in (S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY):
            self._prepare_rebalance(now_ms)

    def _prepare_rebalance(self, now_ms: int) -> None:
        if self.state is S.COMPLETING_REBALANCE:
            for member in self.members.values():
                member.assignment = b""
            self._propagate_assignment(now_ms, ErrorCode.REBALANCE_IN_PROGRESS)
        self._sync_deadline_ms = None
        timeout = self.rebalance_timeout_ms()
        if self.state is S.EMPTY:
            delay = self.settings.initial_rebalance_delay_ms
            self._initial_delay = (delay, max(timeout - delay, 0))
            self._new_member_added = False
            self._join_deadline_ms = now_ms + delay
        else:
            self._initial_delay = None
            self._join_deadline_ms = now_ms + timeout
        self._transition(S.PREPARING_REBALANCE)
        # As Kafka's DelayedJoin, which is tried at once: nobody left to wait for.
        self._try_complete_join(now_ms)

    def _try_complete_join(self, now_ms: int) -> None:
        """Complete the join phase early once everyone is in (not during the initial delay,
        which is there to let more new members arrive)."""
        if (self.state is S.PREPARING_REBALANCE and self._initial_delay is None
                and not self.pending_members
                and all(m.awaiting_join for m in self.members.values())):
            self._complete_join(now_ms)

    def _join_deadline_passed(self, now_ms: int) -> None:
        if self._initial_delay is not None:
            delay, remaining = self._initial_delay
            if self._new_member_added and remaining > 0:
                self._new_member_added = False
                next_delay = min(self.settings.initial_rebalance_delay_ms, remaining)
                self._initial_delay = (next_delay, max(remaining - delay, 0))
                self._join_deadline_ms = now_ms + next_delay
                return
        self._complete_join(now_ms)

    def _complete_join(self, now_ms: int) -> None:
        self._initial_delay = None
        for member in list(self.members.values()):
            if not member.awaiting_join and member.group_instance_id is None:
                self._remove(member.member_id)
        if self.members and not self._elect_joined_leader():
            # Only static members, none of them back yet: wait another rebalance timeout
            # (their session timeouts remove them meanwhile if they are gone).
            self._join_deadline_ms = now_ms + self.rebalance_timeout_ms()
            return
        self._join_deadline_ms = None
        self.generation_id += 1
        self.pending_sync.clear()
        if not self.members:
            self.protocol_name = None
            self._transition(S.EMPTY)
            return
        self.protocol_name = select_protocol(self.members.values())
        self._transition(S.COMPLETING_REBALANCE)
        for member in self.members.values():
            if member.join_ticket is not None:
                self._reply(member.join_ticket, self._joined(member))
                member.join_ticket = None
            member.expires_at_ms = now_ms + member.session_timeout_ms
            member.is_new = False
            self.pending_sync.add(member.member_id)
        self._sync_deadline_ms = now_ms + self.rebalance_timeout_ms()

    def _elect_joined_leader(self) -> bool:
        leader = self.members.get(self.leader_id or "")
        if leader is not None and leader.awaiting_join:
            return True
        for member in self.members.values():
            if member.awaiting_join:
                self.leader_id = member.member_id
                self._touch()
                return True
        return False

    # --- SyncGroup -----------------------------------------------------------------------

    def sync(self, now_ms: int, request: SyncRequest, ticket: int) -> None:
        error = self._validate_sync(request)
        if error is not None:
            self._reply(ticket, SyncResult(error))
        elif self.state is S.EMPTY:
            self._reply(ticket, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
        elif self.state is S.PREPARING_REBALANCE:
            self._reply(ticket, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        elif self.state is S.COMPLETING_REBALANCE:
            member = self.members[request.member_id]
            if member.sync_ticket is not None:
                self._reply(member.sync_ticket, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
            member.sync_ticket = ticket
            self._synced(member.member_id)
            if member.member_id == self.leader_id:
                for m in self.members.values():
                    m.assignment = bytes(request.assignments.get(m.member_id, b""))
                self._propagate_assignment(now_ms, ErrorCode.NONE)
                self._transition(S.STABLE)
        else:
            member = self.members[request.member_id]
            self._synced(member.member_id)
            self._reply(ticket, SyncResult(ErrorCode.NONE, self.protocol_type,
                                           self.protocol_name, member.assignment))
            member.expires_at_ms = now_ms + member.session_timeout_ms

    def _validate_sync(self, request: SyncRequest) -> ErrorCode | None:
        if self.state is S.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = self._validate_member(request.member_id, request.group_instance_id)
        if error is not None:
            return error
        if request.generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        if request.protocol_type is not None and request.protocol_type != self.protocol_type:
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if request.protocol_name is not None and request.protocol_name != self.protocol_name:
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        return None

    def _synced(self, member_id: str) -> None:
        self.pending_sync.discard(member_id)
        if not self.pending_sync:
            self._sync_deadline_ms = None

    def _propagate_assignment(self, now_ms: int, error: ErrorCode) -> None:
        for member in self.members.values():
            if member.sync_ticket is None:
                continue
            if error is ErrorCode.NONE:
                result = SyncResult(error, self.protocol_type, self.protocol_name,
                                    member.assignment)
            else:
                result = SyncResult(error)
            self._reply(member.sync_ticket, result)
            member.sync_ticket = None
            member.expires_at_ms = now_ms + member.session_timeout_ms

    # --- Heartbeat, LeaveGroup, OffsetCommit ---------------------------------------------

    def heartbeat(self, now_ms: int, member_id: str, group_instance_id: str | None,
                  generation_id: int) -> ErrorCode:
        if self.state is S.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = self._validate_member(member_id, group_instance_id)
        if error is not None:
            return error
        if generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        if self.state is S.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID
        member = self.members[member_id]
        member.expires_at_ms = now_ms + member.session_timeout_ms
        if self.state is S.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, now_ms: int, leaving: Iterable[MemberIdentity]) -> list[ErrorCode]:
        return [self._leave_one(now_ms, who) for who in leaving]

    def _leave_one(self, now_ms: int, who: MemberIdentity) -> ErrorCode:
        if self.state is S.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if who.member_id == UNKNOWN_MEMBER_ID:
            # Administrative removal of a static member by its instance id alone.
            current = (self.static_members.get(who.group_instance_id)
                       if who.group_instance_id is not None else None)
            if current is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            self._remove_member_and_update(now_ms, current)
            return ErrorCode.NONE
        if who.member_id in self.pending_members:
            self._remove_pending_member(now_ms, who.member_id)
            return ErrorCode.NONE
        error = self._validate_member(who.member_id, who.group_instance_id)
        if error is not None:
            return error
        self._remove_member_and_update(now_ms, who.member_id)
        return ErrorCode.NONE

    def validate_commit(self, now_ms: int, generation_id: int, member_id: str,
                        group_instance_id: str | None) -> ErrorCode:
        """Whether an OffsetCommit may be stored. Generation -1 with no member id is a commit
        by a client that does not use group management (assign mode): allowed while the
        group has no members."""
        if self.state is S.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not is_standalone_commit(generation_id, member_id, group_instance_id):
            error = self._validate_member(member_id, group_instance_id)
            if error is not None:
                return error
            if generation_id != self.generation_id:
                return ErrorCode.ILLEGAL_GENERATION
        elif self.state is not S.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if self.state is S.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        member = self.members.get(member_id)
        if member is not None:
            member.expires_at_ms = now_ms + member.session_timeout_ms
        return ErrorCode.NONE

    def _validate_member(self, member_id: str, group_instance_id: str | None
                         ) -> ErrorCode | None:
        if group_instance_id is not None:
            current = self.static_members.get(group_instance_id)
            if current is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if current != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
            return None
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return None

    # --- removal and time ----------------------------------------------------------------

    def _remove_member_and_update(self, now_ms: int, member_id: str) -> None:
        self._remove(member_id)
        if self.state in (S.STABLE, S.COMPLETING_REBALANCE):
            self._prepare_rebalance(now_ms)
        else:
            self._try_complete_join(now_ms)

    def _remove(self, member_id: str) -> None:
        member = self.members.pop(member_id)
        if member.join_ticket is not None:
            self._reply(member.join_ticket,
                        JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, UNKNOWN_MEMBER_ID))
        if member.sync_ticket is not None:
            # Kafka leaves this request unanswered; Kiln answers so the connection goes on.
            self._reply(member.sync_ticket, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
        instance = member.group_instance_id
        if instance is not None and self.static_members.get(instance) == member_id:
            del self.static_members[instance]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_sync.discard(member_id)
        self._touch()

    def _remove_pending_member(self, now_ms: int, member_id: str) -> None:
        del self.pending_members[member_id]
        self._try_complete_join(now_ms)

    def next_deadline_ms(self) -> int | None:
        deadlines = [m.expires_at_ms for m in self.members.values()
                     if m.expires_at_ms is not None]
        deadlines.extend(self.pending_members.values())
        if self.state is S.PREPARING_REBALANCE and self._join_deadline_ms is not None:
            deadlines.append(self._join_deadline_ms)
        if self._sync_deadline_ms is not None:
            deadlines.append(self._sync_deadline_ms)
        return min(deadlines, default=None)

    def tick(self, now_ms: int) -> None:
        """Act on every deadline that has passed: expired sessions, pending members that
        never came back, the end of the join phase, members that never synced."""
        if self.state is S.DEAD:
            return
        for member in list(self.members.values()):
            due = member.expires_at_ms
            if due is None or due > now_ms or self.members.get(member.member_id) is not member:
                continue
            member.expires_at_ms = None
            if member.expires_now():
                self._remove_member_and_update(now_ms, member.member_id)
        for member_id, due in list(self.pending_members.items()):
            if due <= now_ms:
                self._remove_pending_member(now_ms, member_id)
        if (self.state is S.PREPARING_REBALANCE and self._join_deadline_ms is not None
                and self._join_deadline_ms <= now_ms):
            self._join_deadline_passed(now_ms)
        if self._sync_deadline_ms is not None and self._sync_deadline_ms <= now_ms:
            self._sync_deadline_passed(now_ms)

    def _sync_deadline_passed(self, now_ms: int) -> None:
        self._sync_deadline_ms = None
        if self.state in (S.COMPLETING_REBALANCE, S.STABLE) and self.pending_sync:
            for member_id in list(self.pending_sync):
                self._remove(member_id)
            self._prepare_rebalance(now_ms)

    # --- outputs -------------------------------------------------------------------------

    def take_replies(self) -> list[tuple[int, Reply]]:
        replies, self._replies = self._replies, []
        return replies

    def abandon(self) -> list[int]:
        """The group is dropped from memory (its persisted state is the truth again):
        returns the tickets of every answer still owed, replies not yet taken included."""
        tickets = [ticket for ticket, _ in self._replies]
        self._replies = []
        for member in self.members.values():
            tickets.extend(t for t in (member.join_ticket, member.sync_ticket) if t is not None)
            member.join_ticket = member.sync_ticket = None
        self.state = S.DEAD
        return tickets

    def summary(self) -> GroupSummary:
        stable = self.state is S.STABLE
        members = tuple(
            MemberSummary(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                          m.metadata(self.protocol_name) if stable else b"",
                          m.assignment if stable else b"")
            for m in self.members.values())
        return GroupSummary(self.group_id, self.state, self.protocol_type or "",
                            (self.protocol_name or "") if stable else "", members)

    def _reply(self, ticket: int, reply: Reply) -> None:
        self._replies.append((ticket, reply))

    def _transition(self, state: GroupState) -> None:
        self.state = state
        self._touch()

    def _touch(self) -> None:
        self.revision += 1
