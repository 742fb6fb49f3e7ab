"""Topic administration through Kiln with real admin clients (confluent-kafka's AdminClient,
kafka-python's KafkaAdminClient, raw requests where the exact answer matters): DeleteTopics,
CreatePartitions, CreateTopics, and the partition count of auto-created topics.

Each test looks at both sides afterwards: what Kiln holds (its registry and every Redis key of
the topic) and what Kafka holds (asked directly, not through Kiln). Where a request is
refused, the same request is sent to Kafka itself and the error codes compared."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import confluent_kafka
import pytest
import redis
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import NewTopic as ConfluentNewTopic  # type: ignore[attr-defined]
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewPartitions, NewTopic
from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from cli.local_kafka import LocalKafka
from storage.model import TopicPartition
from storage.topics import TopicGone
from tests.compat.clients import read_hardened
from tests.compat.java import commit_offsets, committed_offsets
from tests.conftest import KafkaRelay, SessionBroker, _start_local
from tests.integration.consumers import BEGINNING, consume_kafka_python
from tests.kiln_harness import RunningKiln, fresh_kiln
from tests.raw_client import RawClient, record_batch
from wire.errors import ErrorCode

ZERO_UUID = uuid.UUID(int=0)
KAFKA_BROKER_ID = 1  # node.id of the test brokers (cli/local_kafka.py)


# --- both sides, asked directly ---------------------------------------------------------------


def kafka_partitions(kafka_bootstrap: str, topic: str) -> int | None:
    """Kafka's partition count of `topic`, None when Kafka has no such topic."""
    found = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).topics
    return len(found[topic].partitions) if topic in found else None


def kiln_partitions(kiln: RunningKiln, topic: str) -> int | None:
    """The partition count Kiln's Metadata gives `topic` (asked without auto-creation)."""
    with KafkaAdminClient(bootstrap_servers=kiln.bootstrap) as admin:
        if topic not in admin.list_topics():
            return None
        [described] = admin.describe_topics([topic])
    return len(described["partitions"])


def redis_keys(client: redis.Redis, topic: str) -> list[bytes]:
    """Every per-partition key Kiln holds for `topic` (`kiln:{topic/partition}:...`)."""
    return sorted(client.scan_iter(f"kiln:{{{topic}/*"))


def request(bootstrap: str, body: Any, version: int, response: Any) -> Any:
    with RawClient(bootstrap, timeout_s=60) as client:
        return client.request(body, version, response)


def kiln_topic_id(kiln: RunningKiln, topic: str) -> uuid.UUID:
    """The id Kiln's Metadata gives `topic`."""
    answer = request(kiln.bootstrap, MetadataRequest[12](
        topics=[MetadataRequest.MetadataRequestTopic(name=topic, topic_id=ZERO_UUID)],
        allow_auto_topic_creation=False, include_topic_authorized_operations=False),
        12, MetadataResponse)
    [found] = answer.topics
    assert found.error_code == 0, found
    return uuid.UUID(str(found.topic_id))


def delete_request(names: list[str], ids: Sequence[uuid.UUID] = ()) -> Any:
    state = DeleteTopicsRequest.DeleteTopicState
    return DeleteTopicsRequest(
        topics=[state(name=name, topic_id=ZERO_UUID) for name in names]
        + [state(name=None, topic_id=topic_id) for topic_id in ids],
        topic_names=names, timeout_ms=30_000)


def create_request(name: str, partitions: int = -1, *, configs: dict[str, str] | None = None,
                   validate_only: bool = False) -> Any:
    creatable = CreateTopicsRequest.CreatableTopic
    return CreateTopicsRequest(
        topics=[creatable(name=name, num_partitions=partitions, replication_factor=-1,
                          assignments=[],
                          configs=[creatable.CreatableTopicConfig(name=k, value=v)
                                   for k, v in (configs or {}).items()])],
        timeout_ms=30_000, validate_only=validate_only)


def partitions_request(name: str, count: int, assignments: list[list[int]] | None = None,
                       validate_only: bool = False) -> Any:
    grown = CreatePartitionsRequest.CreatePartitionsTopic
    return CreatePartitionsRequest(
        topics=[grown(name=name, count=count, assignments=None if assignments is None else [
            grown.CreatePartitionsAssignment(broker_ids=brokers) for brokers in assignments])],
        timeout_ms=30_000, validate_only=validate_only)


def create_through(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([ConfluentNewTopic(topic, partitions, 1)]).values():
        future.result(30)


def produce(bootstrap: str, topic: str, per_partition: dict[int, int], prefix: bytes = b"v"
            ) -> None:
    """Records acknowledged on append (acks=1), one batch each."""
    with KafkaProducer(bootstrap_servers=bootstrap, acks=1) as producer:
        for partition, count in per_partition.items():
            for i in range(count):
                producer.send(topic, value=prefix + b"-%d-%d" % (partition, i),
                              partition=partition).get(timeout=15)


def buffered(kiln: RunningKiln, topic: str, partitions: int) -> list[int]:
    states = kiln.call(kiln.app.queue.states(
        [TopicPartition(topic, p) for p in range(partitions)]))
    return [state.buffered_records for state in states]


# --- DeleteTopics -----------------------------------------------------------------------------


def test_delete_drops_the_buffered_records_and_leaves_nothing_of_the_topic(
        slow_kiln: RunningKiln, redis_client: redis.Redis, kafka_bootstrap: str,
        unique_topic: str) -> None:
    # Given a 2-partition topic with 2 records hardened and 3 + 1 still buffered in Redis, a
    # durable subscription, and a group's committed offsets
    create_through(slow_kiln.bootstrap, unique_topic, 2)
    produce(slow_kiln.bootstrap, unique_topic, {0: 2})
    assert slow_kiln.flush()
    produce(slow_kiln.bootstrap, unique_topic, {0: 3, 1: 1})
    slow_kiln.call(slow_kiln.app.delivery.subscribe(unique_topic, "billing"))
    group = f"g-{uuid.uuid4().hex[:8]}"
    commit_offsets(slow_kiln.bootstrap, group, unique_topic, {0: 1, 1: 0})
    assert buffered(slow_kiln, unique_topic, 2) == [3, 1]
    assert redis_keys(redis_client, unique_topic) != []

    # When confluent-kafka's AdminClient deletes it through Kiln
    admin = AdminClient({"bootstrap.servers": slow_kiln.bootstrap})
    [future] = admin.delete_topics([unique_topic], operation_timeout=30).values()
    future.result(30)

    # Then neither Kafka nor Kiln has the topic, Redis holds no key of its partitions, its
    # registration, durable subscription and committed offsets are gone, and neither the
    # hardener's next scan nor a flush brings it back to Kafka
    assert kafka_partitions(kafka_bootstrap, unique_topic) is None
    assert kiln_partitions(slow_kiln, unique_topic) is None
    assert redis_keys(redis_client, unique_topic) == []
    assert redis_client.hget("kiln:topics", unique_topic) is None
    assert not [f for f in redis_client.hkeys("kiln:subscriptions")
                if f.startswith(unique_topic.encode() + b"/")]
    assert committed_offsets(slow_kiln.bootstrap, group) == {}
    assert slow_kiln.flush()
    time.sleep(slow_kiln.app.hardener._settings.topic_scan_s + 0.5)
    assert kafka_partitions(kafka_bootstrap, unique_topic) is None
    assert redis_keys(redis_client, unique_topic) == []


def test_a_topic_created_again_after_its_deletion_starts_at_offset_zero_with_its_own_records(
        slow_kiln: RunningKiln, redis_client: redis.Redis, kafka_bootstrap: str,
        unique_topic: str) -> None:
    # Given a topic that had 4 records hardened and 2 buffered, deleted through Kiln
    create_through(slow_kiln.bootstrap, unique_topic, 1)
    produce(slow_kiln.bootstrap, unique_topic, {0: 4}, prefix=b"old")
    assert slow_kiln.flush()
    produce(slow_kiln.bootstrap, unique_topic, {0: 2}, prefix=b"old-buffered")
    with KafkaAdminClient(bootstrap_servers=slow_kiln.bootstrap) as admin:
        admin.delete_topics([unique_topic])
        # When it is created again under the same name, and 2 records are produced and
        # hardened
        admin.create_topics([NewTopic(unique_topic, 1, 1)])
    produce(slow_kiln.bootstrap, unique_topic, {0: 2}, prefix=b"new")
    assert slow_kiln.flush()

    # Then Kiln serves only the 2 new records, at offsets 0 and 1, and Kafka's topic holds
    # exactly those, at Kiln offsets 0 and 1
    read = consume_kafka_python(slow_kiln.bootstrap, unique_topic, 0, BEGINNING, 2)
    assert [(r.offset, r.value) for r in read] == [(0, b"new-0-0"), (1, b"new-0-1")]
    hardened = read_hardened(kafka_bootstrap, unique_topic, 1)[0]
    assert [(r.kiln_offset, r.value) for r in hardened] == [(0, b"new-0-0"), (1, b"new-0-1")]


def test_a_hardening_pass_that_began_before_the_deletion_does_not_create_the_topic_again(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic deleted through Kiln, and the id it had while a hardening pass recovered
    create_through(slow_kiln.bootstrap, unique_topic, 2)
    produce(slow_kiln.bootstrap, unique_topic, {1: 2})
    config = slow_kiln.call(slow_kiln.app.catalog.registry.get(unique_topic))
    assert config is not None
    with KafkaAdminClient(bootstrap_servers=slow_kiln.bootstrap) as admin:
        admin.delete_topics([unique_topic])

    # When that pass makes sure Kafka has the topic before it writes (what the hardener's
    # recovery does)
    with pytest.raises(TopicGone) as gone:
        slow_kiln.call(slow_kiln.app.catalog.ensure_in_kafka(
            unique_topic, config.partitions, fresh=True, topic_id=config.topic_id))

    # Then it is told the topic is gone, and Kafka still has no such topic
    assert gone.value.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert kafka_partitions(kafka_bootstrap, unique_topic) is None


def test_a_topic_whose_deletion_is_under_way_is_not_created_in_kafka_by_the_hardener(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic still registered in Kiln whose Kafka topic is already deleted, with its
    # deletion noted as under way (the window between the two)
    create_through(slow_kiln.bootstrap, unique_topic, 1)
    config = slow_kiln.call(slow_kiln.app.catalog.registry.get(unique_topic))
    assert config is not None
    with KafkaAdminClient(bootstrap_servers=kafka_bootstrap) as kafka_admin:
        kafka_admin.delete_topics([unique_topic])
    slow_kiln.call(slow_kiln.app.catalog.registry.deletion_started(unique_topic, 1, 0))

    # When the hardener makes sure Kafka has the topic
    with pytest.raises(TopicGone):
        slow_kiln.call(slow_kiln.app.catalog.ensure_in_kafka(
            unique_topic, 1, fresh=True, topic_id=config.topic_id))

    # Then Kafka still has no such topic
    assert kafka_partitions(kafka_bootstrap, unique_topic) is None


def test_a_producer_waiting_for_its_records_to_be_safe_is_told_the_topic_is_gone(
        slow_kiln: RunningKiln, unique_topic: str) -> None:
    # Given an acks=all (assured) produce request waiting for its record to be hardened
    create_through(slow_kiln.bootstrap, unique_topic, 1)
    producer = RawClient(slow_kiln.bootstrap, timeout_s=60)
    answers: list[Any] = []
    waiting = threading.Thread(
        target=lambda: answers.append(producer.produce(unique_topic, 0, record_batch([b"x"]),
                                                       acks=-1)))
    waiting.start()
    deadline = time.monotonic() + 10
    while buffered(slow_kiln, unique_topic, 1) != [1] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert buffered(slow_kiln, unique_topic, 1) == [1]

    # When the topic is deleted through Kiln
    with KafkaAdminClient(bootstrap_servers=slow_kiln.bootstrap) as admin:
        admin.delete_topics([unique_topic])
    waiting.join(30)
    producer.close()

    # Then the producer is answered, well before its timeout, that the partition is unknown
    assert not waiting.is_alive()
    [answer] = answers
    assert (answer.error_code, answer.base_offset) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)


def test_a_topic_only_kafka_has_is_deleted_in_kafka(
        kiln: RunningKiln, redis_client: redis.Redis, kafka_bootstrap: str,
        unique_topic: str) -> None:
    # Given a topic created in Kafka, not through Kiln, that Kiln has not adopted
    create_through(kafka_bootstrap, unique_topic, 2)

    # When kafka-python's admin client deletes it through Kiln
    with KafkaAdminClient(bootstrap_servers=kiln.bootstrap) as admin:
        result = admin.delete_topics([unique_topic])

    # Then it is deleted in Kafka, and Kiln, which never had it, holds nothing of it
    assert [(t["name"], t["error_code"]) for t in result["topics"]] == [(unique_topic, 0)]
    assert kafka_partitions(kafka_bootstrap, unique_topic) is None
    assert redis_client.hget("kiln:topics", unique_topic) is None
    assert redis_keys(redis_client, unique_topic) == []


def test_a_topic_is_deleted_by_the_id_kiln_gives_it(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic created through Kiln, and its id as Kiln's Metadata gives it
    create_through(kiln.bootstrap, unique_topic, 1)
    topic_id = kiln_topic_id(kiln, unique_topic)

    # When kafka-python's admin client deletes it by that id (DeleteTopics v6)
    with KafkaAdminClient(bootstrap_servers=kiln.bootstrap) as admin:
        result = admin.delete_topics([topic_id])

    # Then the answer names the topic and its id, and neither side has it any more
    assert [(t["name"], t["topic_id"], t["error_code"]) for t in result["topics"]] == [
        (unique_topic, str(topic_id), 0)]
    assert kafka_partitions(kafka_bootstrap, unique_topic) is None
    assert kiln_partitions(kiln, unique_topic) is None


@pytest.mark.parametrize("version", [1, 5, 6])
def test_deleting_unknown_topics_is_refused_as_kafka_refuses_it(
        kiln: RunningKiln, kafka_bootstrap: str, version: int) -> None:
    # Given a name and (v6) an id that exist nowhere, and a name given twice
    missing, twice = f"missing-{uuid.uuid4().hex[:8]}", f"twice-{uuid.uuid4().hex[:8]}"
    ids = [uuid.uuid4()] if version >= 6 else []
    body = delete_request([missing, twice, twice], ids)

    # When the same DeleteTopics request goes to Kiln and to Kafka
    answers = [request(bootstrap, body, version, DeleteTopicsResponse)
               for bootstrap in (kiln.bootstrap, kafka_bootstrap)]

    # Then both answer each topic with the same error code
    kiln_codes, kafka_codes = (
        sorted((r.name or str(getattr(r, "topic_id", "")), r.error_code)
               for r in answer.responses) for answer in answers)
    assert kiln_codes == kafka_codes
    expected = {(missing, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                (twice, ErrorCode.INVALID_REQUEST)}
    expected |= {(str(i), ErrorCode.UNKNOWN_TOPIC_ID) for i in ids}
    assert set(kiln_codes) == expected


@pytest.fixture
def relayed_kiln(redis_url: str, kafka_relay: KafkaRelay) -> Iterator[RunningKiln]:
    """A fresh Kiln whose Kafka is reached through a relay the test can cut."""
    with fresh_kiln(redis_url, kafka_relay.bootstrap, harden_delay_ms=600_000) as running:
        yield running


def test_delete_while_kafka_is_unreachable_deletes_nothing(
        relayed_kiln: RunningKiln, kafka_relay: KafkaRelay, redis_client: redis.Redis,
        kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic with 2 records buffered, and Kafka cut off from Kiln
    create_through(relayed_kiln.bootstrap, unique_topic, 1)
    produce(relayed_kiln.bootstrap, unique_topic, {0: 2})
    kafka_relay.relay.stop()

    # When the topic is deleted through Kiln
    answer = request(relayed_kiln.bootstrap, delete_request([unique_topic]), 6,
                     DeleteTopicsResponse)

    # Then Kiln answers as a broker that cannot reach its controller, and the topic is
    # whole in Kiln (its records still buffered) and in Kafka
    assert [(r.name, r.error_code) for r in answer.responses] == [
        (unique_topic, ErrorCode.REQUEST_TIMED_OUT)]
    assert buffered(relayed_kiln, unique_topic, 1) == [2]
    assert redis_client.hget("kiln:topics", unique_topic) is not None
    assert redis_client.hget("kiln:topics:deleted", unique_topic) is None
    assert kafka_partitions(kafka_bootstrap, unique_topic) == 1


# --- CreatePartitions -------------------------------------------------------------------------


def test_added_partitions_exist_in_both_and_carry_records_to_kafka(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic with 2 partitions
    create_through(kiln.bootstrap, unique_topic, 2)

    # When kafka-python's admin client grows it to 4 through Kiln
    with KafkaAdminClient(bootstrap_servers=kiln.bootstrap) as admin:
        admin.create_partitions({unique_topic: NewPartitions(4)})

    # Then Kiln and Kafka both have 4 partitions; a record produced to the new partition 3
    # is read back through Kiln at offset 0 and is hardened to Kafka's partition 3
    assert (kiln_partitions(kiln, unique_topic), kafka_partitions(kafka_bootstrap,
                                                                   unique_topic)) == (4, 4)
    produce(kiln.bootstrap, unique_topic, {3: 1})
    read = consume_kafka_python(kiln.bootstrap, unique_topic, 3, BEGINNING, 1)
    assert [(r.offset, r.value) for r in read] == [(0, b"v-3-0")]
    assert kiln.flush()
    hardened = read_hardened(kafka_bootstrap, unique_topic, 4)
    assert [(r.kiln_offset, r.value) for r in hardened[3]] == [(0, b"v-3-0")]
    assert [len(hardened[p]) for p in range(3)] == [0, 0, 0]


@pytest.mark.parametrize(("count", "code"), [
    (2, ErrorCode.INVALID_PARTITIONS),  # the count it has
    (1, ErrorCode.INVALID_PARTITIONS),  # fewer
])
def test_a_count_that_is_not_an_increase_is_refused_as_kafka_refuses_it(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str, count: int,
        code: ErrorCode) -> None:
    # Given a 2-partition topic through Kiln, and one of the same name only in Kafka
    create_through(kiln.bootstrap, unique_topic, 2)
    twin = f"{unique_topic}-kafka"
    create_through(kafka_bootstrap, twin, 2)

    # When both are asked to have `count` partitions (Kiln's through Kiln)
    through_kiln = request(kiln.bootstrap, partitions_request(unique_topic, count), 3,
                           CreatePartitionsResponse).results[0]
    direct = request(kafka_bootstrap, partitions_request(twin, count), 3,
                     CreatePartitionsResponse).results[0]

    # Then both refuse with the same code and message, and nothing changed
    assert through_kiln.error_code == direct.error_code == code
    assert through_kiln.error_message == direct.error_message.replace(twin, unique_topic)
    assert kiln_partitions(kiln, unique_topic) == kafka_partitions(kafka_bootstrap,
                                                                   unique_topic) == 2


def test_partitions_of_an_unknown_topic_are_refused_as_kafka_refuses_them(
        kiln: RunningKiln, kafka_bootstrap: str) -> None:
    # When partitions are added to a topic that exists nowhere, through Kiln and directly
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    answers = [request(bootstrap, partitions_request(missing, 3), 3, CreatePartitionsResponse)
               for bootstrap in (kiln.bootstrap, kafka_bootstrap)]

    # Then both answer UNKNOWN_TOPIC_OR_PARTITION, and neither creates it
    assert [a.results[0].error_code for a in answers] == [
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION] * 2
    assert kafka_partitions(kafka_bootstrap, missing) is None


def test_validate_only_partitions_change_nothing(
        kiln: RunningKiln, redis_client: redis.Redis, kafka_bootstrap: str,
        unique_topic: str) -> None:
    # Given a 2-partition topic
    create_through(kiln.bootstrap, unique_topic, 2)

    # When 3 more partitions are asked for with validate_only
    answer = request(kiln.bootstrap, partitions_request(unique_topic, 5, validate_only=True),
                     3, CreatePartitionsResponse).results[0]

    # Then the request is valid, and both sides still have 2 partitions
    assert answer.error_code == ErrorCode.NONE
    assert kiln_partitions(kiln, unique_topic) == kafka_partitions(kafka_bootstrap,
                                                                   unique_topic) == 2
    assert redis_client.exists(f"kiln:{{{unique_topic}/2}}:meta") == 0


@pytest.mark.parametrize(("assignments", "code"), [
    ([[KAFKA_BROKER_ID], [KAFKA_BROKER_ID]], ErrorCode.NONE),
    ([[KAFKA_BROKER_ID]], ErrorCode.INVALID_REPLICA_ASSIGNMENT),  # one short
])
def test_manual_assignments_of_new_partitions_go_to_kafka(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str,
        assignments: list[list[int]], code: ErrorCode) -> None:
    # Given a 2-partition topic through Kiln, and one of the same name only in Kafka
    create_through(kiln.bootstrap, unique_topic, 2)
    twin = f"{unique_topic}-kafka"
    create_through(kafka_bootstrap, twin, 2)

    # When both are grown to 4 partitions with these assignments
    through_kiln = request(kiln.bootstrap, partitions_request(unique_topic, 4, assignments),
                           3, CreatePartitionsResponse).results[0]
    direct = request(kafka_bootstrap, partitions_request(twin, 4, assignments), 3,
                     CreatePartitionsResponse).results[0]

    # Then both answer alike, and Kiln and Kafka agree on the count
    assert through_kiln.error_code == direct.error_code == code
    expected = 4 if code is ErrorCode.NONE else 2
    assert kiln_partitions(kiln, unique_topic) == kafka_partitions(kafka_bootstrap,
                                                                   unique_topic) == expected


# --- CreateTopics -----------------------------------------------------------------------------


def test_a_topic_with_a_manual_replica_assignment_is_created_in_both(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # When kafka-python's admin client creates a topic with an assignment for 3 partitions
    with KafkaAdminClient(bootstrap_servers=kiln.bootstrap) as admin:
        result = admin.create_topics([NewTopic(unique_topic, replica_assignments={
            p: [KAFKA_BROKER_ID] for p in range(3)})])

    # Then it succeeds, and Kiln and Kafka both have the topic with 3 partitions
    assert [(t["name"], t["error_code"]) for t in result["topics"]] == [(unique_topic, 0)]
    assert kiln_partitions(kiln, unique_topic) == kafka_partitions(kafka_bootstrap,
                                                                   unique_topic) == 3


@pytest.mark.parametrize("validate_only", [False, True])
def test_an_invalid_kafka_config_creates_nothing_and_is_refused_as_kafka_refuses_it(
        kiln: RunningKiln, redis_client: redis.Redis, kafka_bootstrap: str,
        unique_topic: str, validate_only: bool) -> None:
    # Given a topic config whose value Kafka refuses
    configs = {"retention.ms": "soon", "kiln.harden": "all"}
    twin = f"{unique_topic}-kafka"

    # When the topic is created with it through Kiln, and (without Kiln's config) directly
    through_kiln = request(kiln.bootstrap, create_request(unique_topic, 2, configs=configs,
                                                          validate_only=validate_only),
                           7, CreateTopicsResponse).topics[0]
    direct = request(kafka_bootstrap, create_request(twin, 2, configs={
        "retention.ms": "soon"}, validate_only=validate_only), 7, CreateTopicsResponse).topics[0]

    # Then both refuse it with INVALID_CONFIG and Kafka's message, and nothing was created in
    # Kiln or in Kafka
    assert through_kiln.error_code == direct.error_code == ErrorCode.INVALID_CONFIG
    assert through_kiln.error_message == direct.error_message
    assert redis_client.hget("kiln:topics", unique_topic) is None
    assert redis_keys(redis_client, unique_topic) == []
    assert kafka_partitions(kafka_bootstrap, unique_topic) is None


def test_an_invalid_kiln_config_creates_nothing_anywhere(
        kiln: RunningKiln, redis_client: redis.Redis, kafka_bootstrap: str,
        unique_topic: str) -> None:
    # When confluent-kafka's AdminClient creates a topic with a Kiln config Kiln refuses
    admin = AdminClient({"bootstrap.servers": kiln.bootstrap})
    [future] = admin.create_topics([ConfluentNewTopic(unique_topic, 2, 1, config={
        "kiln.reliability": "sometimes", "retention.ms": "86400000"})]).values()
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        future.result(30)

    # Then it is refused with INVALID_CONFIG naming the config, and created nowhere
    error = refused.value.args[0]
    assert error.code() == confluent_kafka.KafkaError.INVALID_CONFIG
    assert "kiln.reliability: unknown reliability 'sometimes'" in error.str()
    assert redis_client.hget("kiln:topics", unique_topic) is None
    assert kafka_partitions(kafka_bootstrap, unique_topic) is None


def test_the_answer_carries_partitions_replication_and_configs_as_kafka_reports_them(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given what Kafka answers a validate-only creation with the same Kafka config
    configs = {"retention.ms": "86400000"}
    kafka_said = request(kafka_bootstrap, create_request(f"{unique_topic}-kafka", -1,
                                                         configs=configs, validate_only=True),
                         7, CreateTopicsResponse).topics[0]

    # When the topic is created through Kiln without a partition count, with Kiln's harden
    # policy among its configs
    answer = request(kiln.bootstrap, create_request(unique_topic, -1, configs={
        **configs, "kiln.harden": "all"}), 7, CreateTopicsResponse).topics[0]

    # Then the answer has Kafka's partition count and replication factor, Kafka's configs as
    # Kafka reports them, Kiln's own (the one given set on the topic, the others defaults),
    # and the id Kiln's Metadata gives the topic
    assert answer.error_code == ErrorCode.NONE
    assert (answer.num_partitions, answer.replication_factor) == (
        kafka_said.num_partitions, kafka_said.replication_factor)
    assert answer.num_partitions == kafka_partitions(kafka_bootstrap, unique_topic)
    by_name = {c.name: (c.value, c.config_source) for c in answer.configs}
    kafka_configs = {c.name: (c.value, c.config_source) for c in kafka_said.configs}
    assert {k: v for k, v in by_name.items() if not k.startswith("kiln.")} == kafka_configs
    assert by_name["retention.ms"] == ("86400000", 1)
    assert by_name["kiln.harden"] == ("all", 1)
    assert by_name["kiln.reliability"] == ("reliable_persistent", 5)
    assert uuid.UUID(str(answer.topic_id)) == kiln_topic_id(kiln, unique_topic)


# --- the partition count of auto-created topics -----------------------------------------------

NUM_PARTITIONS = 3


@pytest.fixture(scope="module")
def kafka_with_three_partitions(kafka_broker: SessionBroker) -> Iterator[str]:
    """An Apache Kafka whose num.partitions is 3 (the session's is 1, as Kafka's default)."""
    broker = LocalKafka(config={"num.partitions": str(NUM_PARTITIONS)}, heap="384m")
    _start_local(broker, "Apache Kafka (local, from .jvm/kafka)")
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def broker_num_partitions(kafka_bootstrap: str) -> int:
    """num.partitions as the broker itself describes it (DescribeConfigs)."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    resource = confluent_kafka.admin.ConfigResource(  # type: ignore[attr-defined]
        "broker", str(KAFKA_BROKER_ID))
    config = admin.describe_configs([resource])[resource].result(15)
    return int(config["num.partitions"].value)


@pytest.mark.parametrize(("default_partitions", "expected"), [
    ("kafka", NUM_PARTITIONS),  # the default: Kafka's num.partitions
    ("2", 2),  # the operator's own
])
def test_an_auto_created_topic_gets_the_default_partition_count(
        redis_url: str, kafka_with_three_partitions: str, unique_topic: str,
        default_partitions: str, expected: int) -> None:
    # Given a Kiln in front of a Kafka whose num.partitions is 3, with Kiln's own default
    # unset or set to 2
    assert broker_num_partitions(kafka_with_three_partitions) == NUM_PARTITIONS
    with fresh_kiln(redis_url, kafka_with_three_partitions,
                    default_partitions=default_partitions) as kiln:
        # When a producer sends to a topic nobody created
        produce(kiln.bootstrap, unique_topic, {0: 1})

        # Then Kiln created it with that many partitions, in Kiln and in Kafka
        assert kiln_partitions(kiln, unique_topic) == expected
        assert kafka_partitions(kafka_with_three_partitions, unique_topic) == expected
