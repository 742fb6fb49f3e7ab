"""Kiln killed with SIGKILL while producers write and the hardener works, then restarted on
the same port: the hardened Kafka topic must hold every acknowledged record exactly once, in
the order it was sent, with strictly increasing Kiln offsets (DESIGN.md section 6: "nothing
acknowledged is lost, nothing hardened twice"). Kills land on both write paths: client
batches forwarded whole (Kafka offset = Kiln offset) and records re-encoded with a
`kiln.offset` header (after records were dropped).

The kill moments come from a seeded random generator whose seed the test prints.

A restarted Kiln cannot harden a partition until the crashed process's lease on it in Redis
runs out (10 s), so the schedules below keep the number of lease waits small.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from storage.model import Reliability
from tests.faults.conftest import HARDEN_DELAY_MS
from tests.faults.kiln_process import KilnProcess, fresh_kiln_process, kiln_executable
from tests.faults.records import (
    Deliveries,
    HardenedRecord,
    ProducerLoop,
    read_partition,
    value_of,
)

# When this process has taken the partition's hardening lease and recovered its position.
HARDENING_STARTED = "hardening {topic}/0 from Kiln offset"
LEASE_WAIT_S = 15  # the 10 s lease of a killed process, and some margin

_RETRYING = {
    "message.timeout.ms": 120_000,
    "request.timeout.ms": 30_000,
    "retry.backoff.ms": 50,
    "retry.backoff.max.ms": 500,
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 500,
    "linger.ms": 5,
}
PRODUCER_MODES: dict[str, dict[str, Any]] = {
    # The idempotent producer retries forever and never duplicates: every record must arrive,
    # once. (Every client refuses idempotence with acks=1.)
    "idempotent-acks-all": {"enable.idempotence": True, "acks": "all", **_RETRYING},
    # Without idempotence a retry may duplicate, so this one never retries: a record whose
    # report failed may or may not be there, one that succeeded must be there once.
    "acks-1-no-retries": {"enable.idempotence": False, "acks": "1", "retries": 0,
                          "max.in.flight.requests.per.connection": 5, **_RETRYING},
}


def assert_exactly_once_in_order(hardened: list[HardenedRecord], deliveries: Deliveries,
                                 sent: int, idempotent: bool) -> None:
    seqs = [r.seq for r in hardened]
    twice = sorted(s for s, n in Counter(seqs).items() if n > 1)
    assert not twice, f"{len(twice)} records hardened more than once, first {twice[:10]}"
    missing = sorted(set(deliveries.acked) - set(seqs))
    assert not missing, f"{len(missing)} acknowledged records missing, first {missing[:10]}"
    offsets = [r.kiln_offset for r in hardened]
    assert seqs == sorted(seqs), "records out of send order"
    backwards = [(a, b) for a, b in pairwise(offsets) if b <= a]
    assert not backwards, f"Kiln offsets not strictly increasing: {backwards[:5]}"
    told = {r.seq: (deliveries.acked[r.seq], r.kiln_offset) for r in hardened
            if r.seq in deliveries.acked and deliveries.acked[r.seq] != r.kiln_offset}
    assert not told, f"Kiln offset differs from the offset the producer was given: {told}"
    if idempotent:
        assert not deliveries.failed, f"idempotent deliveries failed: {deliveries.failed}"
        assert seqs == list(range(sent))
        assert offsets == list(range(sent))


@pytest.mark.parametrize("mode", list(PRODUCER_MODES))
def test_kill9_at_random_moments_neither_loses_nor_duplicates(
        kiln_process: KilnProcess, kafka_bootstrap: str, unique_topic: str,
        rng: random.Random, mode: str) -> None:
    # Given Kiln and a producer sending continuously
    kiln_process.start()
    producer = ProducerLoop({"bootstrap.servers": kiln_process.bootstrap,
                             **PRODUCER_MODES[mode]}, unique_topic)
    producer.start()
    hardening = HARDENING_STARTED.format(topic=unique_topic)
    schedule: list[str] = []
    try:
        assert producer.wait_for_acks(1, 20, fail_fast=True), (
            f"nothing delivered through Kiln: {producer.deliveries.failed or producer.error}")
        # When Kiln is killed four times: twice while it hardens (it holds the lease and
        # recovered), twice at any moment (it may still be waiting for the lease)
        for phase in ("hardening", "anytime", "hardening", "anytime"):
            if phase == "hardening":
                holds = kiln_process.wait_for_log(hardening, LEASE_WAIT_S)
                pause = rng.uniform(0.05, 1.5)
                phase += "" if holds else " (lease not seen)"
            else:
                pause = rng.uniform(0.0, 2.0)
            time.sleep(pause)
            acked, failed = producer.deliveries.counts()
            kiln_process.kill()
            schedule.append(f"{phase} +{pause:.2f}s: sent {producer.sent}, acked {acked}, "
                            f"failed {failed}")
            time.sleep(rng.uniform(0.0, 0.5))
            kiln_process.start()
        # ... and the producer gets records through the last restart
        acked_before = producer.deliveries.counts()[0]
        assert producer.wait_for_acks(acked_before + 100, LEASE_WAIT_S + 20), (
            "no progress after the last restart")
    finally:
        undelivered = producer.stop(flush_timeout_s=150)
        print("kills:", *schedule, sep="\n  ")
    # Then, after a planned shutdown (which hardens everything buffered) ...
    exit_code = kiln_process.terminate()
    assert producer.error is None, producer.error
    assert undelivered == 0
    assert exit_code == 0, kiln_process.log_tail()
    assert kiln_process.starts == 5
    # ... the topic holds every acknowledged record once, in order
    hardened = read_partition(kafka_bootstrap, unique_topic)
    print(f"sent {producer.sent}, acked {len(producer.deliveries.acked)}, failed "
          f"{len(producer.deliveries.failed)}, hardened {len(hardened)}")
    assert_exactly_once_in_order(hardened, producer.deliveries, producer.sent,
                                 idempotent=mode == "idempotent-acks-all")


def drop_first_records(kiln_process: KilnProcess, redis_url: str, topic: str,
                       count: int) -> None:
    """Make a topic's Kafka offsets trail its Kiln offsets from the start: `count` records
    at best_effort, which is never hardened, then the topic back to reliable_persistent."""
    admin = AdminClient({"bootstrap.servers": kiln_process.bootstrap})
    created = admin.create_topics([NewTopic(topic, 1, config={
        "kiln.reliability": "best_effort"})])
    created[topic].result(30)
    producer = confluent_kafka.Producer({"bootstrap.servers": kiln_process.bootstrap,
                                         "acks": "1", "enable.idempotence": False})
    for i in range(count):
        producer.produce(topic, value=b"dropped-%d" % i, partition=0)
    assert producer.flush(30) == 0
    altered = subprocess.run([kiln_executable(), "topics", "alter", topic, "--reliability",
                              "reliable_persistent", "--redis-url", redis_url],
                             capture_output=True, text=True, timeout=60, check=False)
    assert altered.returncode == 0, altered.stderr
    time.sleep(1.5)  # running Kiln processes pick a topic change up within a second


@pytest.mark.parametrize("lineage", ["forwarded", "headers"])
def test_kill9_while_a_backlog_is_hardened_duplicates_nothing(
        kiln_process: KilnProcess, redis_url: str, kafka_bootstrap: str, unique_topic: str,
        rng: random.Random, lineage: str) -> None:
    """Kills land inside hardening passes: after some of a pass's batches reached Kafka and
    before Redis was trimmed. A restarted Kiln waits for the lease while a burst is appended,
    then hardens the whole backlog at once (several 1 MB batches, then one trim); the kill
    comes a random moment after it took the lease. `headers`: the topic's first records were
    dropped, so every hardened record is re-encoded with its Kiln offset."""
    burst = 30_000
    dropped = 10 if lineage == "headers" else 0
    producer = confluent_kafka.Producer({
        "bootstrap.servers": kiln_process.bootstrap, "acks": "1", "linger.ms": 5,
        "enable.idempotence": False, "retries": 0, "message.timeout.ms": 30_000,
        "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500,
    })
    deliveries = Deliveries()
    sent = 0
    hardening = HARDENING_STARTED.format(topic=unique_topic)
    schedule: list[str] = []

    def send_burst(count: int) -> None:
        nonlocal sent
        for _ in range(count):
            while True:
                try:
                    producer.produce(unique_topic, value=value_of(sent), partition=0,
                                     on_delivery=deliveries.callback(sent))
                    break
                except BufferError:
                    producer.poll(0.05)
            sent += 1
            if sent % 1000 == 0:
                producer.poll(0)
        assert producer.flush(30) == 0

    # Given a first Kiln hardening the topic as the records' delay runs out
    kiln_process.start()
    if dropped:
        drop_first_records(kiln_process, redis_url, unique_topic, dropped)
    send_burst(1)
    assert kiln_process.wait_for_log(hardening, LEASE_WAIT_S), kiln_process.log_tail()
    began = time.monotonic()
    send_burst(burst)
    flushed = time.monotonic()
    # When it is killed while that burst is hardened, and twice more inside the first
    # hardening pass of a restarted Kiln over a backlog
    kill_at = rng.uniform(began, flushed + 0.05) + HARDEN_DELAY_MS / 1000
    time.sleep(max(0.0, kill_at - time.monotonic()))
    kiln_process.kill()
    schedule.append(f"progressive: {kill_at - began:.2f}s after the burst began")
    for _ in range(2):
        kiln_process.start()
        send_burst(burst)
        assert kiln_process.wait_for_log(hardening, LEASE_WAIT_S), (
            f"Kiln did not log {hardening!r} (taking the lease) in time; if that log line "
            f"changed, update HARDENING_STARTED. Log:\n{kiln_process.log_tail()}")
        pause = rng.uniform(0.0, 0.15)
        time.sleep(pause)
        kiln_process.kill()
        schedule.append(f"backlog: {pause:.2f}s after the lease was taken")
    print("kills:", *schedule, sep="\n  ")
    # Then a restarted Kiln's planned shutdown hardens the rest, and nothing is there twice
    kiln_process.start()
    exit_code = kiln_process.terminate()
    assert exit_code == 0, kiln_process.log_tail()
    assert not deliveries.failed, f"{len(deliveries.failed)} deliveries failed"
    hardened = read_partition(kafka_bootstrap, unique_topic)
    assert_exactly_once_in_order(hardened, deliveries, sent, idempotent=False)
    assert [r.seq for r in hardened] == list(range(sent))
    assert [r.kiln_offset for r in hardened] == list(range(dropped, dropped + sent))
    # A Kiln taking over from one that was killed fences with an abort marker, which takes
    # a Kafka offset: at most one gap per kill (3), records after it carry kiln.offset. The
    # first kill may come before the first write landed: the first record then follows a
    # marker (the fencing id was taken, so its successor fences)
    kafka_offsets = [r.kafka_offset for r in hardened]
    assert kafka_offsets[0] <= 1
    assert all(b > a for a, b in pairwise(kafka_offsets))
    assert kafka_offsets[-1] - (sent - 1) <= 3


NONPERSISTENT = [level.name.lower() for level in Reliability if not level.persistent]


def test_kill9_keeps_what_the_nonpersistent_levels_acknowledged_while_redis_is_up(
        redis_url: str, kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    # Given one producer per non-persistent level, on topics whose level it is, and a delay
    # longer than the test (those levels are never hardened: Redis is all they have)
    with fresh_kiln_process(redis_url, kafka_bootstrap, tmp_path / "kiln.log",
                            600_000) as kiln:
        kiln.start()
        topics = {level: f"{unique_topic}-{level}" for level in NONPERSISTENT}
        admin = AdminClient({"bootstrap.servers": kiln.bootstrap})
        for future in admin.create_topics([
                NewTopic(topic, 1, 1, config={"kiln.reliability": level})
                for level, topic in topics.items()]).values():
            future.result(30)
        loops = {level: ProducerLoop({"bootstrap.servers": kiln.bootstrap,
                                      **PRODUCER_MODES["acks-1-no-retries"]},
                                     topic, rate=300, name=f"producer-{level}")
                 for level, topic in topics.items()}
        for loop in loops.values():
            loop.start()
        try:
            assert all(loop.wait_for_acks(300, timeout_s=30) for loop in loops.values())
            before = {level: len(loop.deliveries.acked) for level, loop in loops.items()}

            # When Kiln is SIGKILLed and started again while they write
            kiln.kill()
            kiln.start()
            time.sleep(2)
            for loop in loops.values():
                assert loop.stop(flush_timeout_s=60) == 0
            read_back = {level: read_partition(kiln.bootstrap, topic, timeout_s=60)
                         for level, topic in topics.items()}
            in_kafka = {level: read_partition(kafka_bootstrap, topic, timeout_s=30)
                        for level, topic in topics.items()}
        finally:
            for loop in loops.values():
                loop.stop(flush_timeout_s=1)

    # Then every record acknowledged before and after the kill is read back through Kiln,
    # once, in send order, at the offset its producer was told; none is in Kafka
    for level, loop in loops.items():
        acked = loop.deliveries.acked
        records = read_back[level]
        assert len(acked) > before[level], level
        assert [r.seq for r in records if r.seq in acked] == sorted(acked), level
        assert len({r.seq for r in records}) == len(records), level
        assert all(acked[r.seq] == r.kiln_offset for r in records if r.seq in acked), level
        assert in_kafka[level] == [], level
