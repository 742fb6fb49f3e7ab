"""Which topics a classic group's members subscribe to, read from their JoinGroup metadata.

OffsetDelete refuses to delete the offsets of a topic the group's members are subscribed to
(GROUP_SUBSCRIBED_TO_TOPIC). Kafka's coordinator learns the subscriptions from the member
metadata of the group's protocol when its type is "consumer" (the ConsumerProtocol
subscription, whose version 0 fields prefix every later version); for any other protocol
type it knows none. When it cannot tell (no protocol chosen yet, metadata it cannot parse)
a consumer group counts as subscribed to every topic. I/O-free.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

CONSUMER_PROTOCOL_TYPE = "consumer"

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


def subscription_topics(metadata: bytes) -> list[str]:
    """The topics of a ConsumerProtocol subscription (version, then the v0 topic array);
    ValueError when the bytes are not one."""
    try:
        pos = _INT16.size  # the version: every version starts with the v0 fields
        count = _INT32.unpack_from(metadata, pos)[0]
        pos += _INT32.size
        if count < 0:
            raise ValueError("null topic array")
        topics = []
        for _ in range(count):
            size = _INT16.unpack_from(metadata, pos)[0]
            pos += _INT16.size
            if size < 0 or pos + size > len(metadata):
                raise ValueError("topic name runs past the metadata")
            topics.append(metadata[pos:pos + size].decode())
            pos += size
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"not a consumer subscription: {exc}") from exc
    return topics


def subscribed_topics(protocol_type: str | None, protocol_name: str | None,
                      member_metadata: Iterable[bytes]) -> frozenset[str] | None:
    """Every topic some member subscribes to; None when it cannot be known (Kafka's
    `computeSubscribedTopics`). A group with no members subscribes to nothing."""
    if protocol_type != CONSUMER_PROTOCOL_TYPE:
        return None
    metadata = list(member_metadata)
    if not metadata:
        return frozenset()
    if protocol_name is None:
        return None
    try:
        return frozenset(topic for m in metadata for topic in subscription_topics(m))
    except ValueError:
        return None


def is_subscribed(topic: str, protocol_type: str | None, protocol_name: str | None,
                  member_metadata: Iterable[bytes]) -> bool:
    """Kafka's `isSubscribedToTopic`: a consumer group whose subscriptions are unknown is
    taken as subscribed; a group of another protocol type never is."""
    topics = subscribed_topics(protocol_type, protocol_name, member_metadata)
    if topics is None:
        return protocol_type == CONSUMER_PROTOCOL_TYPE
    return topic in topics
