"""The hardening lane: transactions through Kiln reach the hardened Kafka topic whole, each
committed one exactly once, aborted ones never, read by a read_committed consumer of Kafka
itself; records written before and after them (by the partition's own hardener, then by the
lane) keep their Kiln offsets in order; wholly delivered transactions are not written."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from storage.model import TopicPartition as StorageTopicPartition
from tests.conftest import KafkaRelay
from tests.kiln_harness import RunningKiln, eventually, fresh_kiln, sync_redis
from tests.txn_readers import read_messages, read_to_end
from wire.lineage import lineage_offset

PARTITIONS = 2


@pytest.fixture
def kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    """Kiln with transactions on; its delay (10 minutes) never expires during a test: what
    reaches Kafka is what a flush hardens."""
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=600_000,
                    transactions_enabled=True) as running:
        yield running


def create_topic(kiln: RunningKiln, name: str, **config: str) -> str:
    admin = AdminClient({"bootstrap.servers": kiln.bootstrap})
    admin.create_topics([NewTopic(name, PARTITIONS, 1, config=config)])[name].result(30)
    return name


@pytest.fixture
def topic(kiln: RunningKiln, unique_topic: str) -> str:
    """Producers get at most reliable_persistent: commits are answered before they are
    hardened, and what reaches Kafka is what a flush hardens."""
    return create_topic(kiln, unique_topic, **{"kiln.max.reliability": "reliable_persistent"})


def transactional_producer(kiln: RunningKiln) -> Producer:
    producer = Producer({"bootstrap.servers": kiln.bootstrap,
                         "transactional.id": f"lane-{uuid.uuid4().hex[:8]}", "linger.ms": 5})
    producer.init_transactions(30)
    return producer


def plain_producer(kiln: RunningKiln) -> Producer:
    """Non-transactional, acks=1 (reliable_persistent): answered before it is hardened."""
    return Producer({"bootstrap.servers": kiln.bootstrap, "linger.ms": 5, "acks": 1})


def send(producer: Producer, topic: str, values: list[str]) -> None:
    for i, value in enumerate(values):
        producer.produce(topic, value.encode(), partition=i % PARTITIONS)
    producer.flush(30)


def transaction(producer: Producer, topic: str, name: str, size: int, *, commit: bool
                ) -> list[str]:
    producer.begin_transaction()
    values = [f"{name}.{i}" for i in range(size)]
    send(producer, topic, values)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)
    return values


def hardened(kafka_bootstrap: str, topic: str, timeout_s: float = 20,
             expected: int | None = None) -> dict[int, list[tuple[int, str]]]:
    """Per partition, (Kiln offset, value) of every record a read_committed consumer of the
    hardened topic in Kafka reads, in Kafka order (once `expected` arrived, when given:
    Kafka writes its markers just after it answered the lane's commit)."""
    read = read_messages(kafka_bootstrap, topic, PARTITIONS, "read_committed",
                         expected=expected, timeout_s=timeout_s)
    return {p: [(lineage_offset(m.headers(), m.offset()), m.value().decode())
                for m in messages] for p, messages in read.items()}


def in_partitions(values: list[str]) -> dict[int, list[str]]:
    """Where `send` puts values: round robin over the partitions."""
    return {p: values[p::PARTITIONS] for p in range(PARTITIONS)}


def assert_in_kiln_order(read: dict[int, list[tuple[int, str]]]) -> None:
    for partition, records in read.items():
        offsets = [offset for offset, _ in records]
        assert offsets == sorted(set(offsets)), f"partition {partition}: {offsets}"


def test_committed_transactions_are_hardened_whole_and_aborted_ones_never(
        kiln: RunningKiln, topic: str, kafka_bootstrap: str) -> None:
    # Given committed and aborted transactions over both partitions, with records of a
    # plain producer before, between and after them
    plain = plain_producer(kiln)
    producer = transactional_producer(kiln)
    expected: list[str] = []
    for round_ in range(3):
        before = [f"plain{round_}.{i}" for i in range(4)]
        send(plain, topic, before)
        expected += before
        expected += transaction(producer, topic, f"c{round_}", 6, commit=True)
        transaction(producer, topic, f"a{round_}", 4, commit=False)
    after = [f"plain.after.{i}" for i in range(4)]
    send(plain, topic, after)
    expected += after

    # When Kiln hardens everything it holds
    assert kiln.flush()

    # Then Kafka's read_committed readers find every committed transaction and plain record
    # once, in Kiln's order, and no aborted record
    read = hardened(kafka_bootstrap, topic)
    assert {p: [v for _, v in records] for p, records in read.items()} == \
        in_partitions(expected)
    assert_in_kiln_order(read)
    # ... and the log queue holds nothing more, every record counted once
    states = kiln.call(kiln.app.queue.states(
        [StorageTopicPartition(topic, p) for p in range(PARTITIONS)]))
    assert [s.buffered_records for s in states] == [0, 0]
    assert sum(s.hardened_records for s in states) == len(expected)
    # ... and a Kiln reader (now reading Kafka through Kiln) sees the same
    through_kiln = read_to_end(kiln.bootstrap, topic, PARTITIONS, "read_committed",
                               expected=len(expected))
    assert sorted(v for records in through_kiln.values() for _, v in records) == \
        sorted(expected)



def commit_group(kiln: RunningKiln, topic: str, group: str, offsets: dict[int, int]) -> None:
    consumer = Consumer({"bootstrap.servers": kiln.bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()],
                        asynchronous=False)
    finally:
        consumer.close()


def test_a_wholly_delivered_transaction_is_not_hardened_and_a_partly_delivered_one_is_whole(
        kiln: RunningKiln, topic: str, kafka_bootstrap: str) -> None:
    # Given a durable subscription of the topic and two committed transactions of 6 records
    # (3 per partition: records at offsets 0-2 and 4-6 of each, markers at 3 and 7)
    kiln.call(kiln.app.delivery.subscribe(topic, "billing"))
    producer = transactional_producer(kiln)
    transaction(producer, topic, "first", 6, commit=True)
    second = transaction(producer, topic, "second", 6, commit=True)

    # When the subscription commits past the first in both partitions, and past the second
    # in partition 0 only
    commit_group(kiln, topic, "billing", {0: 8, 1: 4})
    # ... and Kiln hardens what it holds
    assert kiln.flush()

    # Then Kafka holds the second transaction whole (its delivered half too) and nothing of
    # the first
    read = hardened(kafka_bootstrap, topic)
    assert {p: [v for _, v in records] for p, records in read.items()} == \
        in_partitions(second)
    states = kiln.call(kiln.app.queue.states(
        [StorageTopicPartition(topic, p) for p in range(PARTITIONS)]))
    # (the marker that ends each partition stays: it moves readers at the end past it)
    assert [s.buffered_records for s in states] == [1, 1]
    assert sum(s.hardened_records for s in states) == 6
    assert sum(s.delivered_records for s in states) == 6


def test_the_lane_takes_a_partition_over_from_its_own_hardener_without_a_gap_or_a_repeat(
        kiln: RunningKiln, topic: str, kafka_bootstrap: str) -> None:
    # Given plain records hardened by each partition's own hardener
    plain = plain_producer(kiln)
    first = [f"before.{i}" for i in range(6)]
    send(plain, topic, first)
    assert kiln.flush()
    # ... then a transaction and more plain records
    producer = transactional_producer(kiln)
    txn = transaction(producer, topic, "txn", 4, commit=True)
    after = [f"after.{i}" for i in range(4)]
    send(plain, topic, after)

    # When Kiln hardens them (the lane now)
    assert kiln.flush()

    # Then Kafka holds everything once, in Kiln's order
    read = hardened(kafka_bootstrap, topic)
    assert {p: [v for _, v in records] for p, records in read.items()} == \
        in_partitions(first + txn + after)
    assert_in_kiln_order(read)
    # ... and the next transactions keep going to Kafka through the lane
    more = transaction(producer, topic, "more", 4, commit=True)
    assert kiln.flush()
    read = hardened(kafka_bootstrap, topic)
    assert {p: [v for _, v in records] for p, records in read.items()} == \
        in_partitions(first + txn + after + more)


def test_an_assured_commit_is_answered_once_the_transaction_is_in_kafka(
        kiln: RunningKiln, unique_topic: str, kafka_bootstrap: str) -> None:
    # Given a transactional producer (acks=all: assured_persistent, which the topic lets
    # producers ask for) and Kiln's delay of 10 minutes
    topic = create_topic(kiln, unique_topic)
    producer = transactional_producer(kiln)

    # When it commits a transaction
    values = transaction(producer, topic, "assured", 6, commit=True)

    # Then the commit was answered only once Kafka had it: its read_committed readers see it
    # whole without a flush
    read = hardened(kafka_bootstrap, topic, timeout_s=5, expected=len(values))
    assert {p: [v for _, v in records] for p, records in read.items()} == \
        in_partitions(values)


def test_a_reliable_persistent_commit_is_answered_before_it_is_hardened(
        kiln: RunningKiln, topic: str, kafka_bootstrap: str) -> None:
    # Given a topic whose producers get at most reliable_persistent
    producer = transactional_producer(kiln)

    # When a transaction commits
    values = transaction(producer, topic, "later", 6, commit=True)

    # Then Kafka holds nothing of it yet (the delay has not passed), and all of it after a
    # flush
    assert hardened(kafka_bootstrap, topic, timeout_s=5) == {0: [], 1: []}
    assert kiln.flush()
    read = hardened(kafka_bootstrap, topic)
    assert {p: [v for _, v in records] for p, records in read.items()} == \
        in_partitions(values)


def test_an_assured_commit_is_not_answered_while_kafka_is_away_and_is_once_it_is_back(
        redis_url: str, kafka_bootstrap: str, kafka_relay: KafkaRelay,
        unique_topic: str) -> None:
    with fresh_kiln(redis_url, kafka_relay.bootstrap, harden_delay_ms=600_000,
                    transactions_enabled=True) as running:
        # Given a transactional producer through a Kiln whose Kafka goes away
        topic = create_topic(running, unique_topic)
        producer = transactional_producer(running)
        transaction(producer, topic, "before", 2, commit=True)
        kafka_relay.relay.stop()

        # When it commits a transaction (acks=all: assured)
        producer.begin_transaction()
        send(producer, topic, ["during.0", "during.1"])
        with pytest.raises(KafkaException) as unanswered:
            producer.commit_transaction(5)
        # ... and commits again once Kafka is back
        kafka_relay.relay.start()
        producer.commit_transaction(30)

    # Then the first try was left unanswered, retriably, and once answered the transaction
    # is in Kafka, once
    assert unanswered.value.args[0].retriable()
    read = hardened(kafka_bootstrap, topic)
    assert {p: [v for _, v in records] for p, records in read.items()} == \
        {0: ["before.0", "during.0"], 1: ["before.1", "during.1"]}


def test_a_commit_listed_while_a_pass_reads_the_partitions_is_hardened_by_the_next_pass(
        kiln: RunningKiln, unique_topic: str, kafka_bootstrap: str, redis_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a lane holding a topic's partitions (a first transaction hardened)
    topic = create_topic(kiln, unique_topic)
    producer = transactional_producer(kiln)
    first = transaction(producer, topic, "first", 4, commit=True)
    # ... and a lane pass that, once it has read the partitions' lists of committed
    # transactions, waits until another commit has been listed in them and named to the
    # lane (the coordinator's order)
    lane_list = sync_redis(redis_url)
    assert eventually(lambda: not lane_list.hlen("kiln:{lane:default}:committed"))
    reading, listed = threading.Event(), threading.Event()
    read_lists = kiln.app.queue.committed_transactions

    async def read_then_wait(tps: list[StorageTopicPartition]) -> Any:
        read = await read_lists(tps)
        if not reading.is_set():
            reading.set()
            while not listed.is_set():
                await asyncio.sleep(0.01)
        return read

    monkeypatch.setattr(kiln.app.queue, "committed_transactions", read_then_wait)
    assert reading.wait(10)

    # When a transaction commits then
    outcome: list[BaseException | list[str]] = []
    committer = threading.Thread(target=lambda: outcome.append(
        attempt(lambda: transaction(producer, topic, "second", 4, commit=True))))
    committer.start()
    deadline = time.monotonic() + 20
    while not lane_list.hlen("kiln:{lane:default}:committed") and time.monotonic() < deadline:
        time.sleep(0.01)
    listed.set()
    committer.join(60)

    # Then the commit is answered, and both transactions are in Kafka whole (the pass that
    # had read the lists before the commit did not take it for one decided earlier)
    assert isinstance(outcome[0], list), outcome
    read = hardened(kafka_bootstrap, topic, timeout_s=5, expected=len(first + outcome[0]))
    assert {p: [v for _, v in records] for p, records in read.items()} == \
        in_partitions(first + outcome[0])


def attempt(action: Callable[[], list[str]]) -> BaseException | list[str]:
    try:
        return action()
    except BaseException as exc:
        return exc
