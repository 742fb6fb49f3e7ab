"""A zombie writer: a Kiln process paused (SIGSTOP) in the middle of a hardening write, its
lease taken over by another Kiln process, then resumed (SIGCONT). What it still had to send
must not land in Kafka after its successor started: the hardened topic holds every
acknowledged record once (DESIGN.md §5, "a paused Kiln process that lost its ownership
cannot write after its successor took over").

The first Kiln reaches Kafka through a relay that is held just before it is paused, so it is
paused with requests in hand however its writes are going; they land when it resumes. The
partition's leader learns a new producer epoch only from a write or a transaction marker,
so the successor fences with an aborted empty transaction before it reads where hardening
stopped (storage/hardened_store.py; tests/integration/test_hardened_store.py shows, with
requests landing between the successor's tail read and its first write, that without the
fence every record lands twice). Run against Apache Kafka; KILN_ZOMBIE_RUNS repeats it (the
issue's target is 20 of 20).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import confluent_kafka
import pytest
import redis

from tests.conftest import KafkaRelay
from tests.faults.kiln_process import takeover
from tests.faults.records import Deliveries, read_partition, value_of
from tests.faults.test_kill9 import HARDENING_STARTED, assert_exactly_once_in_order

RECORDS = 400_000  # about 40 MB: several passes, some seconds of writing
DELAY_MS = 1500  # the successor's: it hardens what is left on its own
RUNS = int(os.environ.get("KILN_ZOMBIE_RUNS", "2"))


def produce_backlog(bootstrap: str, topic: str) -> Deliveries:
    deliveries = Deliveries()
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "1",
                                         "enable.idempotence": False, "retries": 0,
                                         "linger.ms": 20, "batch.size": 1 << 20,
                                         "compression.type": "none"})
    for seq in range(RECORDS):
        while True:
            try:
                producer.produce(topic, value=value_of(seq), partition=0,
                                 on_delivery=deliveries.callback(seq))
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    return deliveries


@pytest.mark.parametrize("run", range(RUNS))
def test_a_paused_writer_lands_nothing_after_its_successor_took_over(
        run: int, redis_url: str, kafka_bootstrap: str, kafka_relay: KafkaRelay,
        unique_topic: str, tmp_path: Path, rng: random.Random) -> None:
    with takeover(redis_url, kafka_bootstrap, kafka_relay, tmp_path,
                  successor_delay_ms=DELAY_MS) as scene:
        first, second = scene.first, scene.second
        # Given a Kiln hardening a backlog all at once (an operator's flush), its writes to
        # Kafka slowed to 10 MB/s so that they take a few seconds
        kafka_relay.relay.throttle(10_000_000)
        first.start()
        deliveries = produce_backlog(first.bootstrap, unique_topic)
        flush = scene.start_flush(unique_topic, timeout_s=120)
        hardening = HARDENING_STARTED.format(topic=unique_topic)
        assert first.wait_for_log(hardening, 30), first.log_tail()

        # When it is paused in the middle of its writes with requests in hand, another Kiln
        # takes the partition over once the lease runs out and hardens the rest, and then
        # the first goes on and its requests land
        pause_at = int(RECORDS * rng.uniform(0.1, 0.7))
        in_kafka_at_pause = wait_for_high_watermark(kafka_bootstrap, unique_topic, pause_at)
        scene.pause_first()
        second.start()
        assert second.wait_for_log(hardening, 30), second.log_tail()
        assert wait_until_hardened(redis_url, unique_topic, 60), second.log_tail()
        scene.resume_first()
        time.sleep(2)
        flushed = flush.wait(60)
        first_exit = first.terminate()
        second_exit = second.terminate()

    # Then every acknowledged record is in Kafka once, in order
    print(f"paused with {in_kafka_at_pause} records in Kafka; first log:\n"
          f"{first.log_tail(1500)}")
    assert pause_at <= in_kafka_at_pause < RECORDS  # in the middle of its writes
    hardened = read_partition(kafka_bootstrap, unique_topic, timeout_s=60)
    assert (first_exit, second_exit, flushed) == (0, 0, 0)
    assert len(deliveries.acked) == RECORDS
    assert_exactly_once_in_order(hardened, deliveries, RECORDS, idempotent=False)
    assert [r.seq for r in hardened] == list(range(RECORDS))


def wait_for_high_watermark(bootstrap: str, topic: str, at_least: int, *,
                            timeout_s: float = 60,
                            isolation_level: str = "read_committed") -> int:
    """Poll partition 0's high watermark until it reaches `at_least`; returns it. What a
    read_committed consumer is told is the last stable offset: read_uncommitted counts the
    records of open transactions too."""
    with confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "zombie-watch",
                                   "isolation.level": isolation_level}) as consumer:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            _, high = consumer.get_watermark_offsets(
                confluent_kafka.TopicPartition(topic, 0), timeout=5, cached=False)
            if high >= at_least:
                return int(high)
            time.sleep(0.005)
    raise AssertionError(f"{topic}: fewer than {at_least} records in Kafka after {timeout_s} s")


def wait_until_hardened(redis_url: str, topic: str, timeout_s: float) -> bool:
    """Until the partition's hardened mark reaches its end."""
    client = redis.Redis.from_url(redis_url)
    meta = f"kiln:{{{topic}/0}}:meta"
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            state = client.hmget(meta, "next", "hardened")
            if state[0] is not None and state[0] == state[1]:
                return True
            time.sleep(0.1)
    finally:
        client.close()
    return False
