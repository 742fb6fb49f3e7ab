"""Kiln ended at each crash point of the transaction coordinator and the hardening lane
(storage/faults.py) while a transactional producer commits and aborts transactions, then
restarted: between two writes that only make sense together, where a random kill -9
rarely lands. Through Kiln and, once Kiln hardened everything, in Kafka itself, every
acknowledged commit must be read whole and once, and no aborted transaction at all.

Which passage through the point ends Kiln comes from the seeded generator (the seed is
printed).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from storage.faults import CRASH_EXIT_CODE
from tests.faults.kiln_process import fresh_kiln_process, kiln_cli
from tests.faults.txn_loop import PARTITIONS, TransactionLoop, check, read_committed

CRASH_POINTS = [
    # The coordinator: a decision saved, its markers not written yet (also: a registration
    # saved, not yet made at the partitions).
    "txn.saved",
    # Markers written at every partition; the lane not yet told which partitions hold the
    # committed transaction, the groups' offsets not yet committed.
    "txn.marked",
    # Everything done but recording the transaction complete.
    "txn.before_complete",
    # The lane: a pass produced to Kafka inside its Kafka transaction, not committed.
    "lane.before_end_txn",
    # Kafka has the pass's commit; Redis does not know it (assured commits still wait).
    "lane.committed",
    # The transactions settled in Redis; no partition's pass finished.
    "lane.settled",
    # One partition's pass finished in Redis, the others not.
    "lane.finishing",
]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crash_at_each_point_leaves_every_transaction_whole_or_absent(
        point: str, redis_url: str, kafka_bootstrap: str, unique_topic: str, tmp_path: Path,
        rng: random.Random) -> None:
    passage = rng.randint(2, 6)
    # A short delay: the lane hardens (and so reaches its points) while transactions flow.
    with fresh_kiln_process(redis_url, kafka_bootstrap, tmp_path / "kiln.log", 300) as kiln:
        kiln.start(crash_at=f"{point}:{passage}")
        admin = AdminClient({"bootstrap.servers": kiln.bootstrap})
        admin.create_topics([NewTopic(unique_topic, PARTITIONS, 1)])[unique_topic].result(30)
        loop = TransactionLoop(kiln.bootstrap, unique_topic)
        loop.start()
        crashed_at = 0
        try:
            # Given transactions flowing; when Kiln ends itself at the point
            assert kiln.exit_code(90) == CRASH_EXIT_CODE, (
                f"{point}:{passage} not reached: {kiln.log_tail()}")
            assert f"crash point {point} reached" in kiln.current_log()
            crashed_at = len(loop.committed)
            # ... and is started again, transactions commit again
            kiln.start()
            deadline = time.monotonic() + 60
            while len(loop.committed) < crashed_at + 5 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert len(loop.committed) >= crashed_at + 5, f"no progress: {loop.errors[-5:]}"
        finally:
            loop.stop()
            print(f"crashed at {point}:{passage} after {crashed_at} commits")
            print("errors:", *loop.errors[:20], sep="\n  ")
        # Then a read_committed reader of Kiln finds each transaction whole or not at all
        check(read_committed(kiln.bootstrap, unique_topic), loop)
        # ... and once everything is hardened, so does one of Kafka itself
        kiln_cli(redis_url, "flush", unique_topic, "--timeout", "60", timeout_s=90)
        check(read_committed(kafka_bootstrap, unique_topic), loop)
