"""A zombie hardening lane: the Kiln process running the lane is paused (SIGSTOP) in the
middle of a pass, with produce requests of the pass's Kafka transaction in hand; another
Kiln takes the lane over once the paused one's heartbeat and lease run out, and hardens
everything; then the first resumes (SIGCONT) and its requests land. Kafka must refuse them
(the successor bumped the lane's producer epoch), and the paused lane must not finish
anything in Redis: a read_committed reader of the hardened topic finds every committed
transaction once and whole, in Kiln's order, and no aborted one.

The first Kiln reaches Kafka through a relay, slowed so that a pass takes seconds and held
just before the pause (as tests/faults/test_zombie.py does for a partition's own writer).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import confluent_kafka
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from tests.conftest import KafkaRelay
from tests.faults.kiln_process import takeover
from tests.faults.test_zombie import wait_for_high_watermark
from tests.txn_readers import read_messages

PARTITIONS = 2
TRANSACTIONS = 24  # every fourth aborted
RECORDS = 800  # per transaction, spread over both partitions
VALUE_BYTES = 1000
COMMITTED_PER_PARTITION = (TRANSACTIONS - TRANSACTIONS // 4) * RECORDS // PARTITIONS


def produce_transactions(bootstrap: str, topic: str) -> tuple[set[int], set[int]]:
    """Transaction n carries RECORDS values "n:i:<padding>"; (committed, aborted)."""
    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "transactional.id": f"zombie-{topic}",
        "linger.ms": 20, "compression.type": "none", "transaction.timeout.ms": 60_000})
    producer.init_transactions(30)
    committed, aborted = set(), set()
    padding = b"x" * VALUE_BYTES
    for n in range(1, TRANSACTIONS + 1):
        producer.begin_transaction()
        for i in range(RECORDS):
            while True:
                try:
                    producer.produce(topic, f"{n}:{i}:".encode() + padding,
                                     partition=i % PARTITIONS)
                    break
                except BufferError:
                    producer.poll(0.05)
        if n % 4 == 0:
            producer.abort_transaction(60)
            aborted.add(n)
        else:
            producer.commit_transaction(60)
            committed.add(n)
    return committed, aborted


def test_a_paused_lane_lands_nothing_after_its_successor_took_over(
        redis_url: str, kafka_bootstrap: str, kafka_relay: KafkaRelay, unique_topic: str,
        tmp_path: Path, rng: random.Random) -> None:
    # The first's delay never expires: it hardens only when asked to flush.
    with takeover(redis_url, kafka_bootstrap, kafka_relay, tmp_path,
                  successor_delay_ms=1500) as scene:
        first, second = scene.first, scene.second
        # Given committed and aborted transactions in Kiln (their commits answered from
        # Redis), and a flush that has the lane write them to Kafka at 3 MB/s
        first.start()
        admin = AdminClient({"bootstrap.servers": first.bootstrap})
        admin.create_topics([NewTopic(unique_topic, PARTITIONS, 1, config={
            "kiln.max.reliability": "reliable_persistent"})])[unique_topic].result(30)
        committed, aborted = produce_transactions(first.bootstrap, unique_topic)
        kafka_relay.relay.throttle(3_000_000)
        flush = scene.start_flush(unique_topic, timeout_s=180)

        # When the lane is paused in the middle of its pass, with requests in hand; another
        # Kiln takes the lane over and hardens everything; then the first goes on
        pause_at = int(COMMITTED_PER_PARTITION * rng.uniform(0.1, 0.7))
        in_kafka_at_pause = wait_for_high_watermark(kafka_bootstrap, unique_topic, pause_at,
                                                    timeout_s=90,
                                                    isolation_level="read_uncommitted")
        scene.pause_first()
        second.start()
        flushed = flush.wait(180)
        scene.resume_first()
        time.sleep(3)
        first_exit = first.terminate()
        second_exit = second.terminate()

    print(f"paused with {in_kafka_at_pause} records of partition 0 in Kafka; first log:\n"
          f"{first.log_tail(2000)}")
    assert pause_at <= in_kafka_at_pause < COMMITTED_PER_PARTITION  # in the middle of the pass
    assert (flushed, first_exit, second_exit) == (0, 0, 0)
    # Then Kafka's read_committed readers find each committed transaction once and whole,
    # in Kiln's order, and no aborted one
    read = read_messages(kafka_bootstrap, unique_topic, PARTITIONS, "read_committed",
                         expected=COMMITTED_PER_PARTITION * PARTITIONS, timeout_s=60)
    for partition, messages in read.items():
        ids = [tuple(int(x) for x in m.value().split(b":", 2)[:2]) for m in messages]
        assert ids == sorted(ids), f"partition {partition} out of Kiln's order"
        kiln_offsets = [dict(m.headers() or [])["kiln.offset"] for m in messages]
        assert len(set(kiln_offsets)) == len(kiln_offsets), f"partition {partition}: repeats"
    counts = Counter(int(m.value().split(b":", 1)[0])
                     for messages in read.values() for m in messages)
    assert set(counts) == committed, (sorted(set(counts) - committed),
                                      sorted(committed - set(counts)))
    assert not set(counts) & aborted
    assert all(c == RECORDS for c in counts.values()), counts

