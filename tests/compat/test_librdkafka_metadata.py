"""librdkafka's Metadata request for every topic, through Kiln.

librdkafka (confluent-kafka 2.16) asks for every topic at Metadata v9+ by leaving the 4-byte
placeholder of the topics array count as it is: its first byte (0) reads as a null compact
array, "every topic", and the other three trail behind the request's fields. Kafka's broker
reads the fields and ignores what trails, and so does Kiln (it closed the connection before:
"malformed request ... METADATA v12: body is 7 bytes, the fields take 4").
AdminClient.list_topics() without a topic, and a regex subscription, take this path.
"""

from __future__ import annotations

from confluent_kafka.admin import AdminClient

from tests.compat.clients import create_topic_confluent
from tests.kiln_harness import RunningKiln


def test_librdkafka_lists_every_topic_through_kiln(kiln: RunningKiln,
                                                   unique_topic: str) -> None:
    # Given a 2-partition topic created through Kiln
    create_topic_confluent(kiln.bootstrap, unique_topic, 2)
    # When librdkafka asks for the metadata of every topic
    found = AdminClient({"bootstrap.servers": kiln.bootstrap}).list_topics(timeout=10).topics
    # Then the topic is among them, with its partitions
    assert unique_topic in found
    assert len(found[unique_topic].partitions) == 2
