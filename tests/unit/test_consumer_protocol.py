"""Which topics a classic group subscribes to, as OffsetDelete decides it (Kafka's
ClassicGroup.isSubscribedToTopic), from member metadata encoded by a real client library."""

from __future__ import annotations

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from storage.groups.consumer_protocol import (
    is_subscribed,
    subscribed_topics,
    subscription_topics,
)


def subscription(version: int, topics: list[str], user_data: bytes = b"") -> bytes:
    return bytes(ConsumerProtocolMemberMetadata(version, topics, user_data).encode())


@pytest.mark.parametrize("version", [0, 1, 3])
def test_the_topics_of_any_subscription_version_are_read_from_its_v0_prefix(
        version: int) -> None:
    # Given a subscription a client encoded, with user data after the topics
    metadata = subscription(version, ["orders", "ünïcödé"], b"user data")
    # When its topics are read
    topics = subscription_topics(metadata)
    # Then they are the subscribed ones, in order
    assert topics == ["orders", "ünïcödé"]


@pytest.mark.parametrize("metadata", [b"", b"\x00\x00", b"meta", b"\x00\x00\x00\x00\x00\x01"
                                      b"\x00\x09ab"])
def test_metadata_that_is_no_subscription_is_refused(metadata: bytes) -> None:
    # When bytes that are not a whole subscription are read, Then it is a ValueError
    with pytest.raises(ValueError, match=r"subscription|metadata|topic"):
        subscription_topics(metadata)


def test_a_consumer_group_subscribes_to_every_topic_of_every_member() -> None:
    # Given two members of a consumer group subscribed to different topics
    members = [subscription(0, ["a", "b"]), subscription(1, ["c"])]
    # When the group's subscriptions are asked for, Then they are the union
    assert subscribed_topics("consumer", "range", members) == frozenset({"a", "b", "c"})
    assert is_subscribed("c", "consumer", "range", members)
    assert not is_subscribed("d", "consumer", "range", members)


def test_when_the_subscriptions_cannot_be_known_a_consumer_group_counts_as_subscribed(
        ) -> None:
    # Given consumer groups whose metadata cannot be read or whose protocol is not chosen,
    # a group of another protocol type, and a group without members
    unreadable = ("consumer", "range", [b"meta"])
    unchosen = ("consumer", None, [subscription(0, ["a"])])
    connect = ("connect", "sessioned", [b"anything"])
    empty = ("consumer", None, [])
    # Then the consumer groups count as subscribed to any topic, the other type to none,
    # and a group without members to none
    assert [is_subscribed("x", *case) for case in (unreadable, unchosen, connect, empty)] == [
        True, True, False, False]
