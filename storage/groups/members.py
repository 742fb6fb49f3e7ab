"""One member of a classic group, and the choice of the group's protocol among its members."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from storage.groups.model import Protocol


@dataclass(slots=True, eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[Protocol, ...]
    assignment: bytes = b""
    # Tickets of the JoinGroup / SyncGroup answers this member is waiting for.
    join_ticket: int | None = None
    sync_ticket: int | None = None
    # Joined in the current rebalance and not yet through it: expires on the new-member
    # join timeout rather than being exempt while it waits.
    is_new: bool = False
    # When the member is removed unless a heartbeat (or a completed join/sync) comes first.
    expires_at_ms: int | None = None

    @property
    def awaiting_join(self) -> bool:
        return self.join_ticket is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_ticket is not None

    @property
    def protocol_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.protocols)

    def metadata(self, protocol_name: str | None) -> bytes:
        for protocol in self.protocols:
            if protocol.name == protocol_name:
                return protocol.metadata
        return b""

    def vote(self, candidates: set[str]) -> str | None:
        """The member's most preferred protocol among `candidates`."""
        return next((name for name in self.protocol_names if name in candidates), None)

    def expires_now(self) -> bool:
        """Kafka's `!hasSatisfiedHeartbeat` at the session deadline: a member waiting in a
        rebalance is not expired by its session timeout (the rebalance timeout bounds it),
        unless it is new to this rebalance."""
        return self.is_new or not (self.awaiting_join or self.awaiting_sync)


def select_protocol(members: Iterable[Member]) -> str | None:
    """A protocol every member supports, chosen by the members' votes (Kafka's
    `selectProtocol`); a tie goes to the protocol that got its first vote earliest."""
    listed = list(members)
    if not listed:
        return None
    candidates = set(listed[0].protocol_names)
    for member in listed[1:]:
        candidates &= set(member.protocol_names)
    votes = Counter(vote for m in listed if (vote := m.vote(candidates)) is not None)
    if not votes:
        return None
    return votes.most_common(1)[0][0]


def supported_by_all(members: Iterable[Member], names: Iterable[str]) -> bool:
    """Whether one of `names` is supported by every member (Kafka's `supportsProtocols` for
    a group that is not empty)."""
    listed = list(members)
    return any(all(name in m.protocol_names for m in listed) for name in names)
