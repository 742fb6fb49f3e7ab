"""The hardening lease while a write runs (storage/hardener.py): a write that takes longer
than the lease keeps it, so no other Kiln process takes a live writer's partition over and
fences it; the records land once."""

from __future__ import annotations

import threading
import time

import confluent_kafka

from storage.log_queue import Lease
from storage.model import TopicPartition
from tests.conftest import KafkaRelay
from tests.faults.records import read_partition, value_of
from tests.kiln_harness import eventually, fresh_kiln

RECORDS = 6_000  # about 600 KB: at 60 KB/s, a write of some 10 s
LEASE_S = 4.0  # HardenerSettings.lease_ms


def test_a_write_slower_than_the_lease_keeps_it_and_lands_once(
        redis_url: str, kafka_relay: KafkaRelay, unique_topic: str) -> None:
    with fresh_kiln(redis_url, kafka_relay.bootstrap, harden_delay_ms=600_000) as kiln:
        # Given a backlog Kiln hardens through a Kafka that takes it in slowly
        producer = confluent_kafka.Producer({"bootstrap.servers": kiln.bootstrap,
                                             "acks": "1", "linger.ms": 20})
        for seq in range(RECORDS):
            producer.produce(unique_topic, value_of(seq), partition=0)
        assert producer.flush(30) == 0
        kafka_relay.relay.throttle(60_000)
        flushed: list[bool] = []
        flushing = threading.Thread(target=lambda: flushed.append(kiln.flush(timeout_s=90)))
        flushing.start()
        lease_key = f"kiln:{{{unique_topic}/0}}:lease"
        assert eventually(lambda: kiln.call(kiln.app.queue.redis.get(lease_key)) is not None)
        # When another process asks for the partition's lease, again and again, for twice
        # the lease's time while the write runs
        tp = TopicPartition(unique_topic, 0)
        answers = []
        deadline = time.monotonic() + 2 * LEASE_S
        while time.monotonic() < deadline:
            answers.append(kiln.call(kiln.app.queue.acquire_lease(tp, "intruder", 4_000)))
            time.sleep(0.25)
        still_writing = flushing.is_alive()
        kafka_relay.relay.throttle(None)
        flushing.join(90)
    # Then the writer kept the lease all along (the write outlasted it) and finished, and
    # every record is in Kafka once, in order
    assert still_writing
    assert set(answers) == {Lease.REFUSED}
    assert flushed == [True]
    hardened = read_partition(kafka_relay.bootstrap, unique_topic, timeout_s=60)
    assert [r.seq for r in hardened] == list(range(RECORDS))
