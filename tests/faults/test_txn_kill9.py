"""Kiln killed with SIGKILL while a transactional producer commits and aborts transactions
over three partitions and the hardening lane writes them to Kafka, then restarted on the
same port: a read_committed reader must find every transaction whose commit was
acknowledged, each exactly once and whole, and of the others none or all of its records (a
commit whose answer the kill swallowed may have happened) — never part of one, never an
aborted one. Both through Kiln and, once Kiln hardened everything, in Kafka itself.

The kill moments come from a seeded random generator whose seed the test prints.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
import redis
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from tests.faults.kiln_process import KilnProcess, fresh_kiln_process, kiln_cli
from tests.faults.txn_loop import PARTITIONS, TransactionLoop, check, read_committed

KILLS = 4
# The target is 50 runs (0 partial transactions): KILN_TXN_KILL9_RUNS=50.
RUNS = int(os.environ.get("KILN_TXN_KILL9_RUNS", "1"))


@pytest.mark.parametrize("repeat", range(RUNS))
def test_kill9_during_transactions_leaves_each_whole_or_absent(
        repeat: int, redis_url: str, kafka_bootstrap: str, unique_topic: str, tmp_path: Path,
        rng: random.Random) -> None:
    # A short delay: the lane hardens transactions while Kiln is killed.
    with fresh_kiln_process(redis_url, kafka_bootstrap, tmp_path / "kiln.log", 300) as kiln:
        loop = run(kiln, unique_topic, rng, redis_url)
        # Then a read_committed reader of Kiln finds each transaction whole or not at all
        check(read_committed(kiln.bootstrap, unique_topic), loop)
        # ... and once everything is hardened, so does one of Kafka itself
        kiln_cli(redis_url, "flush", unique_topic, "--timeout", "60", timeout_s=90)
        check(read_committed(kafka_bootstrap, unique_topic), loop)


def run(kiln: KilnProcess, topic: str, rng: random.Random, redis_url: str) -> TransactionLoop:
    kiln.start()
    admin = AdminClient({"bootstrap.servers": kiln.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    loop = TransactionLoop(kiln.bootstrap, topic)
    loop.start()
    schedule = []
    try:
        # Given transactions flowing; when Kiln is killed at random moments and restarted
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.3, 2.0))
            schedule.append(f"kill after {loop.attempts} attempts, "
                            f"{len(loop.committed)} committed")
            kiln.kill()
            time.sleep(rng.uniform(0.0, 0.5))
            kiln.start()
        # ... and transactions commit after the last restart
        before = len(loop.committed)
        deadline = time.monotonic() + 60
        while len(loop.committed) < before + 5 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(loop.committed) >= before + 5, (
            f"no progress: {loop.errors[-5:]}\n{stuck_state(redis_url, topic)}\n"
            f"{kiln.log_tail(3000)}")
    finally:
        loop.stop()
        print("kills:", *schedule, sep="\n  ")
        print("errors:", *loop.errors[:20], sep="\n  ")
    # (open transactions left by the last producer end by its timeout at the latest)
    time.sleep(1)
    return loop


def stuck_state(redis_url: str, topic: str) -> str:
    """What operators would look at when transactions stop committing."""
    views = [kiln_cli(redis_url, *args) for args in (
        ("transactions", "list", "--json"), ("transactions", "lane", "--json"),
        ("status", topic, "--json"))]
    client = redis.Redis.from_url(redis_url)
    keys = {key.decode(): client.type(key).decode()
            for key in client.scan_iter(match=f"kiln:{{{topic}/*")}
    dumps = []
    for key, kind in sorted(keys.items()):
        if kind == "zset":
            dumps.append(f"{key} {client.zrange(key, 0, -1, withscores=True)}")
        elif kind == "hash":
            dumps.append(f"{key} {client.hgetall(key)}")
    lane = {key.decode(): client.hgetall(key) for key in client.scan_iter(match="kiln:{lane:*")
            if client.type(key) == b"hash"}
    return "\n".join([*views, *dumps, f"lane: {lane}"])

