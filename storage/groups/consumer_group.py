"""A KIP-848 consumer group, as Apache Kafka's group coordinator runs it for
`group.protocol=consumer` clients: the server assigns, members reconcile by heartbeat.

The group has an epoch, bumped by every change of its members, their subscriptions or the
partition counts of the topics they subscribe to; a new group epoch makes a new target
assignment (the assignor, storage/groups/assignors). Each member moves towards its target
on its own, heartbeat by heartbeat, without stopping the others:

- a partition the target takes from a member is first revoked: the member keeps its epoch
  (UNREVOKED_PARTITIONS) until a heartbeat reports it no longer owns it, or it is fenced
  when its rebalance timeout passes first;
- a partition the target gives a member is handed over only once no other member owns it
  or still has it to revoke (UNRELEASED_PARTITIONS until then); the member then takes the
  target's epoch.

A member is fenced (removed) when its session times out, and a heartbeat carrying an epoch
it does not have is refused (FENCED_MEMBER_EPOCH; the client rejoins at epoch 0). Offsets
are committed under the member epoch, or an older one for a partition the member has owned
since (KIP-1251); STALE_MEMBER_EPOCH otherwise.

I/O-free: calls take `now_ms`; `next_deadline_ms()` says when `tick()` is due; `revision`
changes whenever something worth persisting changed. Assignments are kept by topic name;
the topic metadata a heartbeat brings maps them to and from the clients' topic ids.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from storage.groups.assignors import ASSIGNORS, UNIFORM, Assignment
from storage.groups.consumer_model import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    ConsumerGroupSettings,
    ConsumerGroupState,
    ConsumerHeartbeat,
    HeartbeatResult,
    MemberState,
    TopicMetadata,
    topic_regex,
)
from storage.model import TopicPartition
from wire.errors import ErrorCode


@dataclass(slots=True)
class ConsumerMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    assigned: Assignment = field(default_factory=dict)
    revoking: Assignment = field(default_factory=dict)
    # The member epoch at which it was given each partition it owns ("topic:partition").
    assigned_epochs: dict[str, int] = field(default_factory=dict)
    # Not persisted: restart when the group is loaded.
    session_deadline_ms: int | None = None
    revocation_deadline_ms: int | None = None

    def subscribes_to(self, topic: str) -> bool:
        return topic in self.subscribed_topic_names or (
            bool(self.subscribed_topic_regex)
            and topic_regex(self.subscribed_topic_regex or "").fullmatch(topic) is not None)

    def owns(self, topic: str, partition: int) -> bool:
        return (partition in self.assigned.get(topic, ())
                or partition in self.revoking.get(topic, ()))

    def assigned_at(self, topic: str, partition: int) -> int:
        return self.assigned_epochs.get(f"{topic}:{partition}", self.member_epoch)

    def forget_epochs(self) -> None:
        """Keep the assignment epochs of the partitions it still owns, no others."""
        self.assigned_epochs = {key: epoch for key, epoch in self.assigned_epochs.items()
                                if self.owns(*_split(key))}


@dataclass(frozen=True, slots=True)
class ConsumerMemberSummary:
    member: ConsumerMember
    target: Assignment


class ConsumerGroup:
    def __init__(self, group_id: str, settings: ConsumerGroupSettings) -> None:
        self.group_id = group_id
        self.settings = settings
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, ConsumerMember] = {}
        self.target: dict[str, Assignment] = {}
        # Partition counts of the subscribed topics the target was computed from.
        self.subscribed_partitions: dict[str, int] = {}
        self.revision = 0
        self.dead = False

    # --- the heartbeat -------------------------------------------------------------------

    def heartbeat(self, now_ms: int, request: ConsumerHeartbeat,
                  topics: Mapping[str, TopicMetadata],
                  new_member_id: Callable[[], str]) -> HeartbeatResult:
        """`request` passed heartbeat_precheck; `topics` holds at least what
        `topics_needed(request)` names."""
        if request.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(now_ms, request, topics)
        owned = None if request.owned is None else _by_name(request.owned, topics)
        member, error = self._member_for(request, owned, new_member_id)
        if error is not None:
            return error
        assert member is not None
        joined = member.member_id not in self.members
        if joined:
            self.members[member.member_id] = member
        # One new group epoch for whatever this heartbeat changed, as Kafka bumps it.
        if self._update_member(member, request) or joined:
            self._bump_epoch()
        self._refresh_metadata(topics)
        if self.group_epoch > self.assignment_epoch:
            self._assign()
        before = member.assigned
        self._reconcile(now_ms, member, owned)
        member.session_deadline_ms = now_ms + self.settings.session_timeout_ms
        send = (request.member_epoch == JOIN_EPOCH or request.owned is not None
                or member.assigned != before)
        return HeartbeatResult(
            ErrorCode.NONE, None, member.member_id, member.member_epoch,
            self.settings.heartbeat_interval_ms,
            _by_id(member.assigned, topics) if send else None)

    def topics_needed(self, request: ConsumerHeartbeat) -> frozenset[str] | None:
        """The topics a heartbeat must see: every name the members and the request subscribe
        to (the ids a member reports owning are of those); None, every topic, while a regex
        is in use."""
        if request.subscribed_topic_regex or any(
                m.subscribed_topic_regex for m in self.members.values()):
            return None
        return frozenset(request.subscribed_topic_names or ()).union(
            *(m.subscribed_topic_names for m in self.members.values()))

    def _member_for(self, request: ConsumerHeartbeat, owned: Assignment | None,
                    new_member_id: Callable[[], str]
                    ) -> tuple[ConsumerMember | None, HeartbeatResult | None]:
        member = self.members.get(request.member_id)
        if member is not None:
            error = self._check_epoch(member, request.member_epoch, owned)
            return (member, None) if error is None else (None, error)
        if request.member_epoch != JOIN_EPOCH:
            return None, HeartbeatResult(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"Member {request.member_id} is not a member of group {self.group_id}.")
        if len(self.members) >= self.settings.max_size:
            return None, HeartbeatResult(
                ErrorCode.GROUP_MAX_SIZE_REACHED,
                f"The consumer group has reached its maximum capacity of "
                f"{self.settings.max_size} members.")
        member_id = request.member_id or new_member_id()
        member = ConsumerMember(member_id, request.instance_id, request.rack_id,
                                request.client_id, request.client_host,
                                request.rebalance_timeout_ms)
        if request.instance_id is not None:
            holder = self._static_member(request.instance_id)
            if holder is not None:
                if holder.member_epoch != STATIC_LEAVE_EPOCH:
                    return None, HeartbeatResult(
                        ErrorCode.UNRELEASED_INSTANCE_ID,
                        f"Static member {holder.member_id} with instance id "
                        f"{request.instance_id} is present in the consumer group.")
                # The static member that left comes back under a new member id: it takes
                # over its partitions and epoch, without a rebalance.
                self._replace(holder, member)
                return member, None
        return member, None  # joins the group once the heartbeat is taken

    def _check_epoch(self, member: ConsumerMember, epoch: int,
                     owned: Assignment | None) -> HeartbeatResult | None:
        if epoch == member.member_epoch:
            return None
        # The answer to the member's last heartbeat was lost: it may carry the previous
        # epoch as long as it owns nothing beyond what it is assigned now.
        if (epoch < member.member_epoch and epoch == member.previous_member_epoch
                and owned is not None and _is_subset(owned, member.assigned)):
            return None
        return HeartbeatResult(
            ErrorCode.FENCED_MEMBER_EPOCH,
            f"The consumer group member has a member epoch ({epoch}) different from the "
            f"one known by the group coordinator ({member.member_epoch}). The member must "
            f"abandon all its partitions and rejoin.")

    def _update_member(self, member: ConsumerMember, request: ConsumerHeartbeat) -> bool:
        """Apply what the heartbeat changes; True when the target assignment is affected."""
        changed = False
        if request.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = request.rebalance_timeout_ms
        if request.rack_id is not None:
            member.rack_id = request.rack_id
        member.client_id, member.client_host = request.client_id, request.client_host
        if request.subscribed_topic_names is not None:
            names = tuple(sorted(set(request.subscribed_topic_names)))
            changed |= names != member.subscribed_topic_names
            member.subscribed_topic_names = names
        if request.subscribed_topic_regex is not None:
            regex = request.subscribed_topic_regex or None
            changed |= regex != member.subscribed_topic_regex
            member.subscribed_topic_regex = regex
        if request.server_assignor is not None:
            changed |= request.server_assignor != member.server_assignor
            member.server_assignor = request.server_assignor
        return changed

    def _leave(self, now_ms: int, request: ConsumerHeartbeat,
               topics: Mapping[str, TopicMetadata]) -> HeartbeatResult:
        member = self.members.get(request.member_id)
        if member is None and request.instance_id is not None:
            member = self._static_member(request.instance_id)
        if member is None:
            return HeartbeatResult(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"Member {request.member_id} is not a member of group {self.group_id}.")
        if request.member_epoch == STATIC_LEAVE_EPOCH:
            # A static member keeps its partitions for its session timeout: it may come back
            # under its instance id (a rolling restart) without a rebalance.
            member.member_epoch = STATIC_LEAVE_EPOCH
            member.session_deadline_ms = now_ms + self.settings.session_timeout_ms
            self._touch()
        else:
            self._remove(member.member_id, topics)
        return HeartbeatResult(ErrorCode.NONE, None, request.member_id,
                               request.member_epoch, 0)

    # --- assignment ----------------------------------------------------------------------

    def _refresh_metadata(self, topics: Mapping[str, TopicMetadata]) -> None:
        counts = {name: meta.partitions for name, meta in topics.items()
                  if any(m.subscribes_to(name) for m in self.members.values())}
        if counts != self.subscribed_partitions:
            self.subscribed_partitions = counts
            self._bump_epoch()

    def _assign(self) -> None:
        subscriptions = {
            m.member_id: frozenset(t for t in self.subscribed_partitions if m.subscribes_to(t))
            for m in self.members.values()}
        assignor = ASSIGNORS[self.assignor_name]
        self.target = assignor(subscriptions, self.subscribed_partitions, self.target)
        self.assignment_epoch = self.group_epoch
        self._touch()

    @property
    def assignor_name(self) -> str:
        """The assignor most members ask for (Kafka's choice), else uniform."""
        asked: dict[str, int] = {}
        for m in self.members.values():
            if m.server_assignor is not None:
                asked[m.server_assignor] = asked.get(m.server_assignor, 0) + 1
        if not asked:
            return UNIFORM
        return max(sorted(asked), key=lambda name: asked[name])

    def _reconcile(self, now_ms: int, member: ConsumerMember,
                   owned: Assignment | None) -> None:
        """Move the member towards its target as far as the other members allow."""
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            if owned is None or _intersects(owned, member.revoking):
                return
            member.revoking = {}
            member.revocation_deadline_ms = None
            member.forget_epochs()
        elif (member.state is MemberState.STABLE
              and member.member_epoch == self.assignment_epoch):
            return
        target = self.target.get(member.member_id, {})
        keep = {t: ps & target.get(t, frozenset()) for t, ps in member.assigned.items()}
        revoke = {t: ps - target.get(t, frozenset()) for t, ps in member.assigned.items()}
        keep, revoke = _nonempty(keep), _nonempty(revoke)
        if revoke:
            member.assigned, member.revoking = keep, revoke
            member.forget_epochs()
            member.state = MemberState.UNREVOKED_PARTITIONS
            member.revocation_deadline_ms = now_ms + member.rebalance_timeout_ms
            self._touch()
            return
        assigned = {t: set(ps) for t, ps in keep.items()}
        unreleased = False
        for topic, partitions in target.items():
            for partition in partitions - keep.get(topic, frozenset()):
                if self._owned_by_another(member, topic, partition):
                    unreleased = True
                else:
                    assigned.setdefault(topic, set()).add(partition)
        new_assigned = _nonempty({t: frozenset(ps) for t, ps in assigned.items()})
        if member.member_epoch != self.assignment_epoch:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = self.assignment_epoch
        for topic, partitions in new_assigned.items():
            for partition in partitions - member.assigned.get(topic, frozenset()):
                member.assigned_epochs[f"{topic}:{partition}"] = member.member_epoch
        member.assigned = new_assigned
        member.forget_epochs()
        member.state = (MemberState.UNRELEASED_PARTITIONS if unreleased
                        else MemberState.STABLE)
        self._touch()

    def _owned_by_another(self, member: ConsumerMember, topic: str, partition: int) -> bool:
        return any(other is not member and other.owns(topic, partition)
                   for other in self.members.values())

    # --- membership ----------------------------------------------------------------------

    def _static_member(self, instance_id: str) -> ConsumerMember | None:
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)

    def _replace(self, old: ConsumerMember, new: ConsumerMember) -> None:
        del self.members[old.member_id]
        new.member_epoch = self.assignment_epoch if old.assigned or old.revoking else 0
        new.assigned, new.revoking = old.assigned, old.revoking
        new.assigned_epochs = dict(old.assigned_epochs)
        new.state = old.state
        new.subscribed_topic_names = old.subscribed_topic_names
        new.subscribed_topic_regex = old.subscribed_topic_regex
        new.server_assignor = old.server_assignor
        self.members[new.member_id] = new
        if old.member_id in self.target:
            self.target[new.member_id] = self.target.pop(old.member_id)
        self._touch()

    def _remove(self, member_id: str, topics: Mapping[str, TopicMetadata] | None = None
                ) -> None:
        del self.members[member_id]
        self.target.pop(member_id, None)
        self._bump_epoch()
        if topics is not None:
            self._refresh_metadata(topics)
        if not self.members:
            self.target = {}
            self.subscribed_partitions = {}

    def _bump_epoch(self) -> None:
        self.group_epoch += 1
        self._touch()

    def _touch(self) -> None:
        self.revision += 1

    # --- timers --------------------------------------------------------------------------

    def next_deadline_ms(self) -> int | None:
        deadlines = [d for m in self.members.values()
                     for d in (m.session_deadline_ms, m.revocation_deadline_ms) if d is not None]
        return min(deadlines, default=None)

    def tick(self, now_ms: int) -> None:
        """Fence members whose session expired or that did not revoke in time."""
        for member in list(self.members.values()):
            session = member.session_deadline_ms
            revocation = member.revocation_deadline_ms
            if ((session is not None and session <= now_ms)
                    or (revocation is not None and revocation <= now_ms)):
                self._remove(member.member_id)
        if self.group_epoch > self.assignment_epoch and self.members:
            self._assign()

    def restart_timers(self, now_ms: int) -> None:
        """After a load from Redis: every member gets a full session from now."""
        for member in self.members.values():
            member.session_deadline_ms = now_ms + self.settings.session_timeout_ms
            if member.state is MemberState.UNREVOKED_PARTITIONS:
                member.revocation_deadline_ms = now_ms + member.rebalance_timeout_ms

    # --- offsets and descriptions ----------------------------------------------------------

    def validate_commit(self, member_id: str, member_epoch: int, version: int,
                        partitions: Iterable[TopicPartition]
                        ) -> dict[TopicPartition, ErrorCode]:
        """The partitions Kafka would refuse to commit, with why. A commit from outside the
        group (epoch -1, no member) only while it is empty; otherwise a member by OffsetCommit
        v9+, at its epoch, or at an older epoch for a partition it has owned since then
        (KIP-1251: a commit sent before the member learnt its new epoch)."""
        tps = list(partitions)
        if member_epoch < 0 and not member_id and not self.members:
            return {}
        member = self.members.get(member_id)
        if member is None:
            return dict.fromkeys(tps, ErrorCode.UNKNOWN_MEMBER_ID)
        if version < 9:
            return dict.fromkeys(tps, ErrorCode.UNSUPPORTED_VERSION)
        if member_epoch == member.member_epoch:
            return {}
        if member_epoch > member.member_epoch:
            return dict.fromkeys(tps, ErrorCode.STALE_MEMBER_EPOCH)
        return {tp: ErrorCode.STALE_MEMBER_EPOCH for tp in tps
                if not member.owns(tp.topic, tp.partition)
                or member.assigned_at(tp.topic, tp.partition) > member_epoch}

    def validate_fetch(self, member_id: str | None, member_epoch: int) -> ErrorCode:
        if member_epoch < 0 and member_id is None:
            return ErrorCode.NONE
        return self.validate_member(member_id or "", member_epoch, version_ok=True)

    def validate_member(self, member_id: str, member_epoch: int, *, version_ok: bool
                        ) -> ErrorCode:
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if not version_ok:
            return ErrorCode.UNSUPPORTED_VERSION
        if member_epoch != member.member_epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return ErrorCode.NONE

    @property
    def state(self) -> ConsumerGroupState:
        if self.dead:
            return ConsumerGroupState.DEAD
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        if any(m.member_epoch != self.assignment_epoch or m.state is not MemberState.STABLE
               for m in self.members.values()):
            return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def subscribed_topics(self) -> frozenset[str]:
        return frozenset(self.subscribed_partitions)

    def describe_members(self) -> list[ConsumerMemberSummary]:
        return [ConsumerMemberSummary(m, self.target.get(m.member_id, {}))
                for m in self.members.values()]

    def abandon(self) -> list[int]:
        """Dropped from memory: no answer waits on a consumer group, so no ticket is owed."""
        self.dead = True
        return []


def _by_name(owned: Mapping[uuid.UUID, frozenset[int]], topics: Mapping[str, TopicMetadata]
             ) -> Assignment:
    names = {meta.topic_id: name for name, meta in topics.items()}
    # A topic id Kiln does not know (deleted since) owns nothing that can be reassigned.
    return {names[tid]: ps for tid, ps in owned.items() if tid in names and ps}


def _by_id(assigned: Assignment, topics: Mapping[str, TopicMetadata]
           ) -> dict[uuid.UUID, frozenset[int]]:
    return {topics[t].topic_id: ps for t, ps in sorted(assigned.items()) if t in topics}


def _split(key: str) -> tuple[str, int]:
    topic, _, partition = key.rpartition(":")
    return topic, int(partition)


def _is_subset(a: Assignment, b: Assignment) -> bool:
    return all(ps <= b.get(t, frozenset()) for t, ps in a.items())


def _intersects(a: Assignment, b: Assignment) -> bool:
    return any(a.get(t, frozenset()) & ps for t, ps in b.items())


def _nonempty(assignment: Mapping[str, frozenset[int]]) -> Assignment:
    return {t: ps for t, ps in assignment.items() if ps}
