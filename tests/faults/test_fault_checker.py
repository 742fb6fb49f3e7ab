"""The randomized fault checker (tests/faults/checker.py), a short run: faults of every kind
at random moments under load, then the whole history checked. A long run is
`python -m bench.fault_check` (KILN_FAULT_CHECK_S sets this run's length)."""

from __future__ import annotations

import os
import random
from pathlib import Path

from tests.conftest import KafkaRelay
from tests.faults.checker import CheckerConfig, RelayedBroker, run_checker


def test_random_faults_lose_duplicate_and_reorder_nothing(
        rng: random.Random, tmp_path: Path, kafka_bootstrap: str, kafka_relay: KafkaRelay
        ) -> None:
    duration_s = float(os.environ.get("KILN_FAULT_CHECK_S", "60"))
    broker = RelayedBroker(kafka_bootstrap, kafka_relay.bootstrap, kafka_relay.relay)
    report = run_checker(CheckerConfig(duration_s=duration_s, seed=rng.randrange(2**32),
                                       workdir=tmp_path, broker=broker), progress=print)
    print(report.table())

    assert report.anomalies == []
    assert sum(report.faults.values()) >= duration_s / 10
    assert report.counts["assured_acknowledged"] > 0
    assert report.counts["reliable_acknowledged"] > 0
    assert report.counts["held_acknowledged"] > 0
