"""Delivered records leave the log queue without being written to Kafka; assured acks are
answered by delivery or hardening, whichever comes first.

Commits are mostly reported to Kiln's Delivery directly here, as the group coordinator does
after each OffsetCommit by a member; the tests of standalone commits send OffsetCommit over
the wire. tests/compat drives the same path with real consumer groups.
"""

from __future__ import annotations

import dataclasses

import confluent_kafka
import pytest
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import InvalidConfigurationError
from kafka.protocol.consumer import LeaveGroupRequest, LeaveGroupResponse

from storage.log_queue import PartitionState
from storage.model import TopicPartition
from tests.integration.test_groups import commit as commit_over_the_wire
from tests.integration.test_groups import fetch_offsets, stable_single_member_group
from tests.integration.test_produce_harden import kiln_offset, read_hardened
from tests.kiln_harness import RunningKiln, eventually
from tests.raw_client import RawClient


def produce(kiln: RunningKiln, topic: str, count: int, *, batch: bool = True) -> list[int]:
    """`count` records to partition 0 with acks=1; their Kiln offsets. With batch=True they
    travel as one record batch, else as one batch each."""
    producer = KafkaProducer(bootstrap_servers=kiln.bootstrap, acks=1, linger_ms=1000,
                             batch_size=1 << 20)
    offsets = []
    if batch:
        futures = [producer.send(topic, value=b"record-%d" % i, partition=0)
                   for i in range(count)]
        producer.flush()
        offsets = [f.get(timeout=10).offset for f in futures]
    for i in range(0 if batch else count):
        future = producer.send(topic, value=b"record-%d" % i, partition=0)
        producer.flush()
        offsets.append(future.get(timeout=10).offset)
    producer.close()
    return offsets


def commit(kiln: RunningKiln, group: str, topic: str, offset: int) -> None:
    """As the coordinator reports a commit by a member of the group's current generation."""
    kiln.call(kiln.app.delivery.committed(group, {TopicPartition(topic, 0): offset},
                                          by_member=True))


def state(kiln: RunningKiln, topic: str) -> PartitionState:
    return kiln.call(kiln.app.queue.state(TopicPartition(topic, 0)))


def set_policy(kiln: RunningKiln, topic: str, **changes: object) -> None:
    async def update() -> None:
        config = await kiln.app.catalog.lookup(topic, allow_create=False)
        assert config is not None
        await kiln.app.catalog.registry.update(dataclasses.replace(config, **changes))  # type: ignore[arg-type]
    kiln.call(update())


def test_records_committed_by_every_durable_subscription_are_dropped_unwritten(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given 200 buffered records and one durable subscription (registered by its first commit)
    offsets = produce(slow_kiln, unique_topic, 200, batch=False)
    commit(slow_kiln, "readers", unique_topic, 0)

    # When the group commits everything
    commit(slow_kiln, "readers", unique_topic, 200)
    after = state(slow_kiln, unique_topic)
    flushed = slow_kiln.flush()

    # Then nothing is buffered, nothing reached Kafka, and the counters say why
    assert offsets == list(range(200))
    assert (after.buffered_records, after.buffered_bytes) == (0, 0)
    assert after.delivered_offset == 200
    assert after.delivered_records == 200
    assert flushed
    assert read_hardened(kafka_bootstrap, unique_topic, 0, 0, timeout_s=1) == []
    assert state(slow_kiln, unique_topic).hardened_records == 0


def test_only_the_undelivered_part_of_a_straddling_batch_is_hardened(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given one batch of 100 records, of which the durable subscription committed 40
    produce(slow_kiln, unique_topic, 100, batch=True)
    commit(slow_kiln, "readers", unique_topic, 40)
    kept = state(slow_kiln, unique_topic)

    # When the survivors are hardened
    assert slow_kiln.flush()

    # Then the batch stayed whole in Redis until then, and Kafka got offsets 40..99 only
    records = read_hardened(kafka_bootstrap, unique_topic, 0, 60)
    assert kept.buffered_records == 100
    assert [kiln_offset(r) for r in records] == list(range(40, 100))
    assert [r.value for r in records] == [b"record-%d" % i for i in range(40, 100)]
    final = state(slow_kiln, unique_topic)
    assert (final.hardened_records, final.delivered_records) == (60, 40)
    assert (final.buffered_records, final.buffered_bytes) == (0, 0)


def test_the_slowest_durable_subscription_decides(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given two durable subscriptions, one at 150 and one at 50
    produce(slow_kiln, unique_topic, 200, batch=False)
    for group in ("fast", "slow"):
        slow_kiln.call(slow_kiln.app.delivery.subscribe(unique_topic, group))
    commit(slow_kiln, "fast", unique_topic, 150)
    commit(slow_kiln, "slow", unique_topic, 50)

    # When the survivors are hardened
    middle = state(slow_kiln, unique_topic)
    assert slow_kiln.flush()

    # Then only what both read was dropped
    records = read_hardened(kafka_bootstrap, unique_topic, 0, 150)
    assert middle.delivered_offset == 50
    assert middle.buffered_records == 150
    assert [kiln_offset(r) for r in records] == list(range(50, 200))


def test_a_commit_beyond_the_high_watermark_delivers_only_what_exists(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given 10 records and a group that commits offset 1000
    produce(slow_kiln, unique_topic, 10, batch=False)
    commit(slow_kiln, "eager", unique_topic, 1000)

    # When 10 more are produced and hardened
    produce(slow_kiln, unique_topic, 10, batch=False)
    assert slow_kiln.flush()

    # Then the later records were not taken as delivered
    records = read_hardened(kafka_bootstrap, unique_topic, 0, 10)
    assert [kiln_offset(r) for r in records] == list(range(10, 20))


def test_harden_all_keeps_delivered_records_for_kafka(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic created with the policy to harden everything, and a durable
    # subscription that read all
    admin = KafkaAdminClient(bootstrap_servers=slow_kiln.bootstrap)
    admin.create_topics([NewTopic(unique_topic, 1, 1,
                                  topic_configs={"kiln.harden": "all"})])
    admin.close()
    produce(slow_kiln, unique_topic, 50, batch=False)
    commit(slow_kiln, "readers", unique_topic, 50)
    buffered = state(slow_kiln, unique_topic).buffered_records

    # When the buffer is hardened
    assert slow_kiln.flush()

    # Then every record reached Kafka
    records = read_hardened(kafka_bootstrap, unique_topic, 0, 50)
    assert buffered == 50
    assert [kiln_offset(r) for r in records] == list(range(50))


def test_a_topic_without_auto_subscription_ignores_unregistered_groups(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic that only counts operator-registered subscriptions
    produce(slow_kiln, unique_topic, 30, batch=False)
    set_policy(slow_kiln, unique_topic, auto_subscribe=False)

    # When an unregistered group commits everything, then a registered one commits 10
    commit(slow_kiln, "visitor", unique_topic, 30)
    untouched = state(slow_kiln, unique_topic)
    slow_kiln.call(slow_kiln.app.delivery.subscribe(unique_topic, "registered"))
    commit(slow_kiln, "registered", unique_topic, 10)

    # Then only the registered group's progress counts
    assert untouched.delivered_offset == 0
    assert untouched.buffered_records == 30
    assert state(slow_kiln, unique_topic).buffered_records == 20


def test_removing_a_subscription_lets_the_others_decide(
        slow_kiln: RunningKiln, unique_topic: str) -> None:
    # Given two durable subscriptions, one stuck at 0
    produce(slow_kiln, unique_topic, 40, batch=False)
    commit(slow_kiln, "stuck", unique_topic, 0)
    commit(slow_kiln, "reader", unique_topic, 40)
    held = state(slow_kiln, unique_topic).buffered_records

    # When the stuck one is removed
    removed = slow_kiln.call(slow_kiln.app.delivery.unsubscribe(unique_topic, "stuck"))

    # Then the remaining subscription's commit delivers everything
    assert removed
    assert held == 40
    after = state(slow_kiln, unique_topic)
    assert (after.delivered_offset, after.buffered_records) == (40, 0)


def send_assured(kiln: RunningKiln, topic: str
                 ) -> tuple[confluent_kafka.Producer, list[tuple[object, int]]]:
    """One record sent with acks=all, appended and left waiting; the producer and the list
    its delivery report goes to."""
    appended_before = state(kiln, topic).next_offset
    producer = confluent_kafka.Producer({"bootstrap.servers": kiln.bootstrap,
                                         "acks": "all", "enable.idempotence": True})
    reports: list[tuple[object, int]] = []
    producer.produce(topic, value=b"assured", partition=0,
                     on_delivery=lambda err, msg: reports.append((err, msg.offset())))
    producer.poll(0)
    assert eventually(lambda: state(kiln, topic).next_offset > appended_before)
    producer.poll(0)
    return producer, reports


def test_an_assured_ack_is_answered_by_delivery_before_the_delay(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a durable subscription and an acks=all producer waiting on a 60 s delay
    produce(slow_kiln, unique_topic, 1, batch=False)
    commit(slow_kiln, "readers", unique_topic, 1)
    producer, reports = send_assured(slow_kiln, unique_topic)
    waiting = list(reports)

    # When the subscription commits past the record
    commit(slow_kiln, "readers", unique_topic, 2)
    producer.flush(10)

    # Then the producer is answered without the record being hardened
    assert waiting == []
    assert reports == [(None, 1)]
    assert read_hardened(kafka_bootstrap, unique_topic, 0, 0, timeout_s=1) == []


def test_an_assured_ack_is_answered_by_hardening_when_no_one_reads(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given an acks=all producer, a durable subscription that does not read, a 60 s delay
    produce(slow_kiln, unique_topic, 1, batch=False)
    commit(slow_kiln, "idle", unique_topic, 0)
    producer, reports = send_assured(slow_kiln, unique_topic)
    waiting = list(reports)

    # When the buffer is hardened
    assert slow_kiln.flush()
    producer.flush(10)

    # Then the producer is answered, and the record is in Kafka
    assert waiting == []
    assert reports == [(None, 1)]
    records = read_hardened(kafka_bootstrap, unique_topic, 0, 2)
    assert [kiln_offset(r) for r in records] == [0, 1]


def test_a_bad_kiln_topic_config_is_refused_at_creation(slow_kiln: RunningKiln,
                                                         unique_topic: str) -> None:
    with (KafkaAdminClient(bootstrap_servers=slow_kiln.bootstrap) as admin,
          pytest.raises(InvalidConfigurationError, match=r"kiln\.harden")):
        admin.create_topics([NewTopic(unique_topic, 1, 1,
                                      topic_configs={"kiln.harden": "sometimes"})])

    assert slow_kiln.call(slow_kiln.app.catalog.registry.get(unique_topic)) is None


# --- who may move the delivered mark ------------------------------------------------------


def leave(client: RawClient, group: str, member_id: str) -> int:
    answer = client.request(LeaveGroupRequest[0](group_id=group, member_id=member_id), 0,
                            LeaveGroupResponse)
    return int(answer.error_code)


def auto_subscribed_then_empty(client: RawClient, group: str, topic: str) -> None:
    """`group` becomes a durable subscription of `topic` by a member's commit at 0, then its
    only member leaves: the group is Empty, as when its consumers are down."""
    member, generation = stable_single_member_group(client, group)
    assert commit_over_the_wire(client, group, {(topic, 0): 0}, generation, member) == {
        (topic, 0): 0}
    assert leave(client, group, member) == 0


def test_a_standalone_commit_does_not_drop_records_of_an_auto_registered_subscription(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given 50 buffered records and a durable subscription its group registered itself,
    # whose consumers are gone
    produce(slow_kiln, unique_topic, 50, batch=False)
    with RawClient(slow_kiln.bootstrap) as client:
        auto_subscribed_then_empty(client, "billing", unique_topic)

        # When any client commits the end offset for the group without joining it
        codes = commit_over_the_wire(client, "billing", {(unique_topic, 0): 50})
        fetched = fetch_offsets(client, "billing", [(unique_topic, 0)])
    kept = state(slow_kiln, unique_topic)
    flushed = slow_kiln.flush()

    # Then the commit is stored as Kafka stores it, but every record stays and reaches Kafka
    assert codes == {(unique_topic, 0): 0}
    assert fetched == {(unique_topic, 0): (50, "at 50")}
    assert (kept.buffered_records, kept.delivered_offset, kept.delivered_records) == (50, 0, 0)
    assert flushed
    records = read_hardened(kafka_bootstrap, unique_topic, 0, 50)
    assert [kiln_offset(r) for r in records] == list(range(50))


def test_a_member_commit_still_avoids_the_write(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given 50 buffered records and a stable group with one member
    produce(slow_kiln, unique_topic, 50, batch=False)
    with RawClient(slow_kiln.bootstrap) as client:
        member, generation = stable_single_member_group(client, "billing")

        # When the member commits the end offset
        codes = commit_over_the_wire(client, "billing", {(unique_topic, 0): 50}, generation,
                                     member)
    after = state(slow_kiln, unique_topic)
    flushed = slow_kiln.flush()

    # Then the group is a durable subscription and nothing was written to Kafka
    subscriptions = slow_kiln.call(slow_kiln.app.delivery.subscriptions())
    assert codes == {(unique_topic, 0): 0}
    assert subscriptions[unique_topic]["billing"].source == "auto"
    assert (after.buffered_records, after.delivered_records) == (0, 50)
    assert flushed
    assert read_hardened(kafka_bootstrap, unique_topic, 0, 0, timeout_s=1) == []


@pytest.mark.parametrize("how", ["registered", "made explicit"])
def test_a_standalone_commit_counts_for_an_operator_registered_subscription(
        slow_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str, how: str) -> None:
    # Given 50 buffered records and a subscription the operator registered (from scratch,
    # or over one the group had registered itself), with no member in the group
    produce(slow_kiln, unique_topic, 50, batch=False)
    with RawClient(slow_kiln.bootstrap) as client:
        if how == "made explicit":
            auto_subscribed_then_empty(client, "billing", unique_topic)
        made = slow_kiln.call(slow_kiln.app.delivery.subscribe(unique_topic, "billing"))

        # When a standalone commit (an assign-mode consumer, a tool) commits the end offset
        codes = commit_over_the_wire(client, "billing", {(unique_topic, 0): 50})
    after = state(slow_kiln, unique_topic)
    flushed = slow_kiln.flush()

    # Then it delivers every record: none is written to Kafka
    subscriptions = slow_kiln.call(slow_kiln.app.delivery.subscriptions())
    assert made
    assert codes == {(unique_topic, 0): 0}
    assert subscriptions[unique_topic]["billing"].source == "operator"
    assert (after.buffered_records, after.delivered_records) == (0, 50)
    assert flushed
    assert read_hardened(kafka_bootstrap, unique_topic, 0, 0, timeout_s=1) == []


def test_a_standalone_commit_never_registers_a_subscription(
        slow_kiln: RunningKiln, unique_topic: str) -> None:
    # Given 20 buffered records on a topic that lets groups subscribe themselves
    produce(slow_kiln, unique_topic, 20, batch=False)
    with RawClient(slow_kiln.bootstrap) as client:
        # When a group nobody joined is committed to without group management
        codes = commit_over_the_wire(client, "visitor", {(unique_topic, 0): 20})

    # Then the commit is stored, yet the group is no durable subscription, nothing delivered
    subscriptions = slow_kiln.call(slow_kiln.app.delivery.subscriptions())
    assert codes == {(unique_topic, 0): 0}
    assert "visitor" not in subscriptions.get(unique_topic, {})
    after = state(slow_kiln, unique_topic)
    assert (after.buffered_records, after.delivered_offset) == (20, 0)
