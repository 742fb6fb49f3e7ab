"""Redis losing its data while acks=all producers wait: every record a producer was told is
safe must be in Kafka afterwards, however Kiln reissues offsets after the loss."""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

from cli.app import StartupError
from cli.local_services import LocalRedis
from tests.faults.records import NumberedLoop, read_partition
from tests.integration.test_produce_harden import kiln_offset, read_hardened
from tests.kiln_harness import start_kiln
from tests.raw_client import RawClient, record_batch
from wire.errors import ErrorCode

SECOND_PRODUCER = 10_000_000  # its records are value_of(SECOND_PRODUCER + n)


def test_acks_all_records_told_safe_survive_redis_losing_its_data(
        kafka_bootstrap: str, unique_topic: str) -> None:
    # Given two acks=all producers (one idempotent) on one partition, and a 3 s delay so
    # that thousands of acknowledged-later records wait in Redis
    store = LocalRedis().start()
    kiln = start_kiln(store.url, kafka_bootstrap, harden_delay_ms=3000)
    common = {"bootstrap.servers": kiln.bootstrap, "acks": "all", "linger.ms": 5,
              "message.timeout.ms": 120_000}
    loops = [NumberedLoop({**common, "enable.idempotence": True}, unique_topic, 0, 1000),
             NumberedLoop(dict(common), unique_topic, SECOND_PRODUCER, 1000)]
    try:
        for loop in loops:
            loop.start()
        for loop in loops:
            assert loop.wait_for_acks(500, timeout_s=30), "no acks before the fault"
        time.sleep(1.5)  # more records appended than hardened

        # When Redis is SIGKILLed and comes back empty on the same port while both go on
        store.kill()
        time.sleep(0.3)
        store.start()
        time.sleep(4)
        for loop in loops:
            loop.stop_sending()
        undelivered = [loop.stop(flush_timeout_s=90) for loop in loops]
        assert kiln.flush(timeout_s=60)
        hardened = read_partition(kafka_bootstrap, unique_topic, 0, timeout_s=60)
    finally:
        for loop in loops:
            loop.stop(flush_timeout_s=1)
        kiln.stop()
        store.stop()

    # Then every record a producer was told is safe is in Kafka
    acknowledged = loops[0].acknowledged() | loops[1].acknowledged()
    in_kafka = {record.seq for record in hardened}
    missing = sorted(acknowledged - in_kafka)
    assert undelivered == [0, 0]
    assert len(acknowledged) > 4000
    assert missing == [], f"{len(missing)} acknowledged records lost, e.g. {missing[:5]}"
    # and Kiln offsets in Kafka never repeat: no record hides behind a reissued offset
    offsets = [record.kiln_offset for record in hardened]
    assert offsets == sorted(set(offsets))


def wait_assured_in_background(bootstrap: str, topic: str, values: list[bytes],
                               answers: dict[str, Any], redis_url: str, entries: int
                               ) -> threading.Thread:
    """An acks=all produce of `values` in a thread (its answer goes to answers["assured"]),
    returned once its batch is in Redis (the partition's log holds `entries` batches)."""
    waiting = threading.Thread(target=lambda: answers.update(assured=RawClient(
        bootstrap, timeout_s=30).produce(topic, 0, record_batch(values), acks=-1)))
    waiting.start()
    log_key = f"kiln:{{{topic}/0}}:log"
    deadline = time.monotonic() + 10
    while redis.Redis.from_url(redis_url).xlen(log_key) < entries and time.monotonic() < deadline:
        time.sleep(0.02)
    return waiting


def produce_until_accepted(bootstrap: str, topic: str, values: list[bytes]) -> Any:
    """Produce (acks=1) again and again until Redis is back and the batch is taken."""
    client = RawClient(bootstrap)
    deadline = time.monotonic() + 20
    while True:
        answer = client.produce(topic, 0, record_batch(values))
        if answer.error_code == 0 or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)


def test_an_assured_answer_is_never_given_for_records_redis_lost(
        kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a partition whose offset 0 is hardened, and an acks=all producer waiting on
    # records at offsets 1-5 that only Redis holds (the delay is long)
    store = LocalRedis().start()
    kiln = start_kiln(store.url, kafka_bootstrap, harden_delay_ms=600_000)
    answers: dict[str, Any] = {}
    try:
        first = RawClient(kiln.bootstrap)
        assert first.produce(unique_topic, 0, record_batch([b"hardened"])).error_code == 0
        assert kiln.flush()
        waiting = wait_assured_in_background(kiln.bootstrap, unique_topic,
                                             [b"lost-%d" % i for i in range(5)], answers,
                                             store.url, entries=1)

        # When Redis comes back empty and another producer's records take the offsets
        # after what Kafka holds, and are hardened
        store.kill()
        store.start()
        answers["other"] = produce_until_accepted(kiln.bootstrap, unique_topic,
                                                  [b"new-%d" % i for i in range(10)])
        assert kiln.flush()
        waiting.join(30)
        records = read_hardened(kafka_bootstrap, unique_topic, 0, 11)
    finally:
        kiln.stop()
        store.stop()

    # Then the waiting producer is told to send again (retriable), never that its records
    # are safe; the other producer's records follow what Kafka held, after the offset the
    # fence's abort marker took (the lost incarnation's hardener may have been writing), so
    # their Kafka offsets are still their Kiln offsets
    assert answers["assured"].error_code == ErrorCode.KAFKA_STORAGE_ERROR
    assert answers["other"].base_offset == 2
    assert [r.value for r in records] == [b"hardened"] + [b"new-%d" % i for i in range(10)]
    assert [kiln_offset(r) for r in records] == [0, *range(2, 12)]
    assert [r.offset for r in records] == [0, *range(2, 12)]


def test_no_assured_answer_for_records_a_redis_restored_from_an_older_file_lacks(
        kafka_bootstrap: str, unique_topic: str) -> None:
    # Given 10 records in a Redis snapshot, and an acks=all producer waiting on 5 records
    # appended after it (offsets 10-14, the delay is long)
    store = LocalRedis().start()
    kiln = start_kiln(store.url, kafka_bootstrap, harden_delay_ms=600_000)
    answers: dict[str, Any] = {}
    saved = [b"saved-%d" % i for i in range(10)]
    new = [b"new-%d" % i for i in range(10)]
    try:
        first = RawClient(kiln.bootstrap)
        assert first.produce(unique_topic, 0, record_batch(saved)).error_code == 0
        redis.Redis.from_url(store.url).save()
        waiting = wait_assured_in_background(kiln.bootstrap, unique_topic,
                                             [b"unsaved-%d" % i for i in range(5)], answers,
                                             store.url, entries=2)

        # When Redis restarts from the snapshot (its partition state is older, with the same
        # incarnation) and another producer's records take the offsets after it
        store.kill()
        store.start()
        answers["other"] = produce_until_accepted(kiln.bootstrap, unique_topic, new)
        assert kiln.flush()
        waiting.join(30)
        records = read_hardened(kafka_bootstrap, unique_topic, 0, 20)
    finally:
        kiln.stop()
        store.stop()

    # Then the waiting producer is told to send again, never that its records are safe
    assert answers["assured"].error_code == ErrorCode.KAFKA_STORAGE_ERROR
    assert answers["other"].base_offset == 10
    assert [r.value for r in records] == saved + new
    assert [kiln_offset(r) for r in records] == list(range(20))


def test_kiln_refuses_to_start_on_a_redis_that_evicts_keys(kafka_bootstrap: str) -> None:
    # Given a Redis with a memory limit and an evicting policy
    store = LocalRedis().start()
    try:
        client = redis.Redis.from_url(store.url)
        client.config_set("maxmemory", "64mb")
        client.config_set("maxmemory-policy", "allkeys-lru")

        # When Kiln starts on it
        try:
            start_kiln(store.url, kafka_bootstrap).stop()
            refused = ""
        except StartupError as exc:
            refused = str(exc)
    finally:
        store.stop()

    # Then it refuses, naming the policy and the fix
    assert "maxmemory-policy allkeys-lru" in refused
    assert "set maxmemory-policy noeviction" in refused
