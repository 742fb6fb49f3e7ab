"""A zombie writer: a Kiln process paused (SIGSTOP) in the middle of a hardening write, its
lease taken over by another Kiln process, then resumed (SIGCONT). What it still had to send
must not land in Kafka after its successor started: the hardened topic holds every
acknowledged record once (DESIGN.md §5, "a paused Kiln process that lost its ownership
cannot write after its successor took over").

The partition's leader learns a new producer epoch only from a write or a transaction
marker, so the successor fences with an aborted empty transaction before it reads where
hardening stopped (storage/hardened_store.py). Run against Apache Kafka; KILN_ZOMBIE_RUNS
repeats it (the issue's target is 20 of 20).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import confluent_kafka
import pytest
import redis

from cli.local_services import free_port
from tests.faults.kiln_process import KilnProcess
from tests.faults.records import Deliveries, read_partition, value_of
from tests.faults.test_kill9 import HARDENING_STARTED, assert_exactly_once_in_order

RECORDS = 150_000  # about 15 MB: a hardening pass of several seconds' writing
DELAY_MS = 1500
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
        run: int, redis_url: str, kafka_bootstrap: str, unique_topic: str, tmp_path: Path,
        rng: random.Random) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    first = KilnProcess(free_port(), redis_url, kafka_bootstrap, DELAY_MS,
                        tmp_path / "first.log")
    second = KilnProcess(free_port(), redis_url, kafka_bootstrap, DELAY_MS,
                         tmp_path / "second.log")
    try:
        # Given a Kiln hardening a backlog
        first.start()
        deliveries = produce_backlog(first.bootstrap, unique_topic)
        hardening = HARDENING_STARTED.format(topic=unique_topic)
        assert first.wait_for_log(hardening, 30), first.log_tail()

        # When it is paused in the middle of its writes, another Kiln takes the partition
        # over once the lease runs out and hardens the rest, and then the first goes on
        pause_at = rng.uniform(0.0, 0.4)
        time.sleep(pause_at)
        first.pause()
        second.start()
        assert second.wait_for_log(hardening, 30), second.log_tail()
        assert wait_until_hardened(redis_url, unique_topic, 60), second.log_tail()
        first.resume()
        time.sleep(2)  # what the first had in hand goes out (and is refused)
        first_exit = first.terminate()
        second_exit = second.terminate()
    finally:
        first.resume()
        first.stop()
        second.stop()

    # Then every acknowledged record is in Kafka once, in order
    print(f"paused {pause_at:.2f}s into the first pass; first log:\n{first.log_tail(1500)}")
    hardened = read_partition(kafka_bootstrap, unique_topic, timeout_s=60)
    assert (first_exit, second_exit) == (0, 0)
    assert len(deliveries.acked) == RECORDS
    assert_exactly_once_in_order(hardened, deliveries, RECORDS, idempotent=False)
    assert [r.seq for r in hardened] == list(range(RECORDS))


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
