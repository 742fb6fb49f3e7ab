"""Transactional producers and read_committed consumers of several clients through Kiln:
the Java producer (kafka-producer-perf-test, transactionally), kafka-python and aiokafka.
Each commits some transactions and aborts others; a read_committed reader of another client
must see exactly the committed records, in order, and a read_uncommitted one every record.
(librdkafka's are in tests/integration/test_transactions.py.) And what operators see of
open transactions with Kafka's kafka-transactions and `kiln transactions`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import kafka
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.compat.java import PRODUCER_PERF, TRANSACTIONS, run_tool
from tests.kiln_harness import RunningKiln, fresh_kiln

# Kiln's delay never expires during a test: every read is served from the log queue.
HARDEN_DELAY_MS = 30 * 60 * 1000
KILN = str(Path(sys.executable).with_name("kiln"))


@pytest.fixture(scope="module")
def txn_kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=HARDEN_DELAY_MS,
                    transactions_enabled=True, group_initial_rebalance_delay_ms=0) as running:
        yield running


def create_topic(kiln: RunningKiln, topic: str, partitions: int = 1, *,
                 in_redis: bool = False) -> str:
    """With `in_redis`, producers get at most reliable_persistent: a transaction stays in
    the log queue for the delay, aborted records with it (the lane drops them as it hardens
    past them: a read_uncommitted reader sees them only until then)."""
    config = {"kiln.max.reliability": "reliable_persistent"} if in_redis else {}
    admin = AdminClient({"bootstrap.servers": kiln.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=config)])[topic].result(30)
    return topic


def read_kafka_python(kiln: RunningKiln, topic: str, isolation: str, expected: int,
                      timeout_s: float = 20) -> list[bytes]:
    """Partition 0's values from the start, until `expected` arrived and 0.5 s more."""
    consumer = kafka.KafkaConsumer(bootstrap_servers=kiln.bootstrap, isolation_level=isolation,
                                   enable_auto_commit=False, auto_offset_reset="earliest")
    tp = kafka.TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    extra: float | None = None
    try:
        while time.monotonic() < (extra or deadline):
            for batch in consumer.poll(timeout_ms=200).values():
                values.extend(r.value for r in batch)
            if extra is None and len(values) >= expected:
                extra = time.monotonic() + 0.5
    finally:
        consumer.close()
    return values


async def read_aiokafka(kiln: RunningKiln, topic: str, isolation: str, expected: int,
                        timeout_s: float = 20) -> list[bytes]:
    consumer = AIOKafkaConsumer(bootstrap_servers=kiln.bootstrap, isolation_level=isolation,
                                enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    tp = AioTopicPartition(topic, 0)
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(values) < expected and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                values.extend(r.value for r in batch if r.value is not None)
        for batch in (await consumer.getmany(timeout_ms=500)).values():
            values.extend(r.value for r in batch if r.value is not None)
    finally:
        await consumer.stop()
    return values


def test_the_java_producer_writes_transactions_that_read_committed_readers_see_whole(
        txn_kiln: RunningKiln, unique_topic: str) -> None:
    topic = create_topic(txn_kiln, unique_topic)
    # When kafka-producer-perf-test sends 3000 records in transactions of 50 ms
    run = run_tool(PRODUCER_PERF, "--bootstrap-server", txn_kiln.bootstrap,
                   "--topic", topic, "--num-records", "3000", "--record-size", "100",
                   "--throughput", "-1", "--transactional-id", f"java-{topic}",
                   "--transaction-duration-ms", "50", timeout_s=120)
    # Then it succeeds, and a read_committed reader of another client reads every record
    assert run.returncode == 0, run
    assert len(read_kafka_python(txn_kiln, topic, "read_committed", 3000)) == 3000


def test_kafka_pythons_transactions_are_read_by_aiokafka_as_committed(
        txn_kiln: RunningKiln, unique_topic: str) -> None:
    topic = create_topic(txn_kiln, unique_topic, in_redis=True)
    # Given kafka-python's transactional producer committing, aborting, committing
    producer = kafka.KafkaProducer(bootstrap_servers=txn_kiln.bootstrap,
                                   transactional_id=f"kp-{topic}")
    producer.init_transactions()
    for name, commit in (("a", True), ("b", False), ("c", True)):
        producer.begin_transaction()
        for i in range(3):
            producer.send(topic, f"{name}{i}".encode(), partition=0)
        producer.flush()
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
    producer.close()

    # When aiokafka reads the partition with each isolation level
    committed = asyncio.run(read_aiokafka(txn_kiln, topic, "read_committed", 6))
    everything = asyncio.run(read_aiokafka(txn_kiln, topic, "read_uncommitted", 9))

    # Then
    assert committed == [b"a0", b"a1", b"a2", b"c0", b"c1", b"c2"]
    assert everything == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2", b"c0", b"c1", b"c2"]


def test_aiokafkas_transactions_are_read_by_kafka_python_as_committed(
        txn_kiln: RunningKiln, unique_topic: str) -> None:
    topic = create_topic(txn_kiln, unique_topic)

    async def produce() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=txn_kiln.bootstrap,
                                    transactional_id=f"aio-{topic}")
        await producer.start()
        try:
            async with producer.transaction():
                for i in range(3):
                    await producer.send_and_wait(topic, f"a{i}".encode(), partition=0)
            await producer.begin_transaction()
            await producer.send_and_wait(topic, b"b0", partition=0)
            await producer.abort_transaction()
            async with producer.transaction():
                await producer.send_and_wait(topic, b"c0", partition=0)
        finally:
            await producer.stop()

    # Given aiokafka's transactional producer committing, aborting, committing
    asyncio.run(produce())
    # When kafka-python reads it read_committed
    committed = read_kafka_python(txn_kiln, topic, "read_committed", 4)
    # Then
    assert committed == [b"a0", b"a1", b"a2", b"c0"]


def kiln_cli(*args: str, redis_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KILN, *args, "--redis-url", redis_url], capture_output=True,
                          text=True, timeout=30, check=False)


def test_operators_list_describe_and_abort_open_transactions(
        txn_kiln: RunningKiln, unique_topic: str) -> None:
    topic = create_topic(txn_kiln, unique_topic, partitions=2)
    tid = f"ops-{topic}"
    # Given a transaction left open over two partitions
    producer = confluent_kafka.Producer({"bootstrap.servers": txn_kiln.bootstrap,
                                         "transactional.id": tid})
    producer.init_transactions(30)
    producer.begin_transaction()
    for p in range(2):
        producer.produce(topic, b"open", partition=p)
    assert producer.flush(30) == 0

    # When operators ask with Kafka's kafka-transactions and with Kiln's CLI
    listed = run_tool(TRANSACTIONS, "--bootstrap-server", txn_kiln.bootstrap, "list")
    described = run_tool(TRANSACTIONS, "--bootstrap-server", txn_kiln.bootstrap, "describe",
                         "--transactional-id", tid)
    cli = kiln_cli("transactions", "list", "--state", "Ongoing", "--json",
                   redis_url=txn_kiln.settings.redis_url)
    # ... and then abort it with Kiln's CLI
    aborted = kiln_cli("transactions", "abort", tid, "--json",
                       redis_url=txn_kiln.settings.redis_url)
    with pytest.raises(confluent_kafka.KafkaException) as fenced:
        producer.commit_transaction(10)

    # Then each shows the open transaction, its producer and its partitions
    assert listed.returncode == 0, listed
    assert any(line.split()[:1] == [tid] and "Ongoing" in line for line in listed.lines), listed
    assert described.returncode == 0, described
    row = dict(zip(described.lines[0].split(), described.lines[1].split(), strict=False))
    assert row["TransactionalId"] == tid and row["TransactionState"] == "Ongoing", described
    assert f"{topic}-0" in described.output and f"{topic}-1" in described.output, described
    assert cli.returncode == 0, cli.stderr
    rows = [r for r in json.loads(cli.stdout) if r["transactional_id"] == tid]
    assert [(r["state"], r["partitions"], r["coordinator"]) for r in rows] == [
        ("Ongoing", 2, txn_kiln.app.node_id)]
    # ... and after the abort, its state and an epoch that fences the producer
    assert aborted.returncode == 0, aborted.stderr
    after = json.loads(aborted.stdout)[0]
    assert (after["state"], after["epoch"]) == ("CompleteAbort", rows[0]["epoch"] + 1)
    assert fenced.value.args[0].fatal()
    assert asyncio.run(read_aiokafka(txn_kiln, topic, "read_committed", 0)) == []
