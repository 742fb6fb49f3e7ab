"""Redis killed (SIGKILL) and restarted while one producer per reliability level writes, in
each Redis durability mode Kiln documents: what every level's acknowledged records survive.

Each run writes its counts as JSON (KILN_FAULT_RESULTS, a directory; the test's own
temporary directory otherwise); `python -m tests.faults.durability_table DIR` renders them
as the table of docs/redis-durability.md, which is generated, never written by hand.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from cli.local_services import LocalRedis, LocalSentinel
from storage.model import Reliability
from tests.faults.records import ProducerLoop, read_partition
from tests.kiln_harness import eventually, start_kiln

MODES: dict[str, list[str]] = {
    "none": [],
    "aof-everysec": ["--appendonly", "yes", "--appendfsync", "everysec"],
    "aof-always": ["--appendonly", "yes", "--appendfsync", "always"],
}
LEVELS = [level.name.lower() for level in Reliability]
RATE = 300  # records/s per level


def create_level_topics(bootstrap: str, prefix: str) -> dict[str, str]:
    """One topic per level, whose default and maximum are that level."""
    topics = {level: f"{prefix}-{level}" for level in LEVELS}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([
        NewTopic(topic, 1, 1, config={"kiln.reliability": level, "kiln.max.reliability": level})
        for level, topic in topics.items()])
    for future in futures.values():
        future.result(30)
    return topics


def producer_config(level: str) -> dict[str, Any]:
    """acks=all (idempotent) asks for the topic's maximum, the assured level; the other
    levels are their topic's default, which acks=1 asks for. (Never retried: a retry that
    is not idempotent could store a record twice.)"""
    if level == "assured_persistent":
        return {"acks": "all", "enable.idempotence": True}
    return {"acks": "1", "enable.idempotence": False, "retries": 0}


def write_result(tmp_path: Path, mode: str, redis_args: list[str],
                 rows: list[dict[str, Any]]) -> None:
    out = Path(os.environ.get("KILN_FAULT_RESULTS", "") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"redis-durability-{mode}.json").write_text(json.dumps(
        {"mode": mode, "redis_args": redis_args, "levels": rows}, indent=2))


def levels_through_a_fault(redis_url: str, kafka_bootstrap: str, topic_prefix: str,
                           fault: Callable[[], None]) -> list[dict[str, Any]]:
    """One producer per level through Kiln (a delay longer than the run: nothing is
    hardened before the end), `fault` after about 2 s, 3 s more, then what was kept of
    what each producer was told: a row per level. Asserts nothing was hardened twice."""
    kiln = start_kiln(redis_url, kafka_bootstrap, harden_delay_ms=600_000)
    loops: dict[str, ProducerLoop] = {}
    try:
        topics = create_level_topics(kiln.bootstrap, topic_prefix)
        common = {"bootstrap.servers": kiln.bootstrap, "linger.ms": 5,
                  "message.timeout.ms": 120_000, "retry.backoff.ms": 100,
                  "retry.backoff.max.ms": 1000}
        loops = {level: ProducerLoop({**common, **producer_config(level)}, topic, rate=RATE,
                                     name=f"producer-{level}")
                 for level, topic in topics.items()}
        for loop in loops.values():
            loop.start()
        assert loops["best_effort"].wait_for_acks(RATE, timeout_s=30)
        time.sleep(1)
        at_risk = {level: set(loop.deliveries.acked) for level, loop in loops.items()}
        fault()
        time.sleep(3)
        for loop in loops.values():
            loop.stop_sending()
        # Every answer given on append is in before the records are counted
        undelivered = {level: loop.stop(flush_timeout_s=60) for level, loop in loops.items()
                       if level != "assured_persistent"}
        through_kiln = {level: {r.seq for r in read_partition(kiln.bootstrap, topic,
                                                              timeout_s=60)}
                        for level, topic in topics.items()}
        # Assured answers wait for hardening: harden until the producer has them all
        assured = loops["assured_persistent"]
        deadline = time.monotonic() + 90
        while True:
            assert kiln.flush(timeout_s=60)
            undelivered["assured_persistent"] = assured.stop(flush_timeout_s=0.5)
            if not undelivered["assured_persistent"] or time.monotonic() > deadline:
                break
        in_kafka = {level: [r.seq for r in read_partition(kafka_bootstrap, topics[level],
                                                          timeout_s=60)]
                    for level in LEVELS if Reliability.parse(level).persistent}
    finally:
        for loop in loops.values():
            loop.stop(flush_timeout_s=1)
        kiln.stop()

    for level, seqs in in_kafka.items():
        assert len(seqs) == len(set(seqs)), f"{level}: records hardened twice"
    rows = []
    for level, loop in loops.items():
        acked = set(loop.deliveries.acked)
        kept = through_kiln[level] | set(in_kafka.get(level, []))
        after = acked - at_risk[level]
        rows.append({"level": level,
                     "acknowledged_before_kill": len(at_risk[level]),
                     "lost_before_kill": len(at_risk[level] - kept),
                     "acknowledged_after_kill": len(after), "lost_after_kill": len(after - kept),
                     "lost": len(acked - kept), "undelivered": undelivered[level]})
    print(json.dumps(rows, indent=1))
    return rows


@pytest.mark.parametrize("mode", MODES)
def test_what_each_level_survives_when_redis_is_killed(
        mode: str, kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    # Given a Redis in this durability mode and a producer on each level's topic
    store = LocalRedis(extra_args=MODES[mode]).start()

    def kill_and_restart() -> None:
        store.kill()
        time.sleep(0.3)
        store.start()

    try:
        # When Redis is SIGKILLed, and restarted on the same files while they go on
        rows = levels_through_a_fault(store.url, kafka_bootstrap, unique_topic,
                                      kill_and_restart)
    finally:
        store.stop()
    write_result(tmp_path, mode, MODES[mode], rows)

    # Then an assured record is never lost; with every write on disk, no record is
    lost = {row["level"]: row["lost"] for row in rows}
    assert lost["assured_persistent"] == 0
    if mode == "aof-always":
        assert set(lost.values()) == {0}, lost
    assert all(row["acknowledged_after_kill"] > 0 for row in rows)


def test_what_each_level_survives_a_sentinel_failover(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    # Given a master, a replica in sync with it and a Sentinel watching them, Kiln
    # connected through the Sentinel
    master = LocalRedis(extra_args=["--repl-diskless-sync-delay", "0"]).start()
    replica = LocalRedis(extra_args=["--replicaof", "127.0.0.1", str(master.port)]).start()
    sentinel = LocalSentinel("kiln", master.port).start()
    try:
        assert eventually(lambda: redis.Redis(port=replica.port).info("replication")[
            "master_link_status"] == "up"), "the replica never synced"
        # When the master is SIGKILLed and the Sentinel promotes the replica
        rows = levels_through_a_fault(sentinel.url,
                                      kafka_bootstrap, unique_topic, master.kill)
        promoted = sentinel.master_port()
    finally:
        sentinel.stop()
        replica.stop()
        master.stop()
    write_result(tmp_path, "sentinel-failover", ["--replicaof", "(master)"], rows)

    # Then the replica is the master now, and an assured record is never lost
    assert promoted == replica.port
    assert {row["level"]: row["lost"] for row in rows}["assured_persistent"] == 0
    assert all(row["acknowledged_after_kill"] > 0 for row in rows)
