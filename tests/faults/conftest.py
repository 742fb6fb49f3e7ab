from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.kiln_process import KilnProcess, fresh_kiln_process

# Short, so kills land both before and after hardening writes.
HARDEN_DELAY_MS = 200


@pytest.fixture
def kiln_process(redis_url: str, kafka_bootstrap: str, tmp_path: Path
                 ) -> Iterator[KilnProcess]:
    """`kiln serve` as a child process on a free port (not started yet), with an empty
    Redis; killed in the end whatever happened."""
    with fresh_kiln_process(redis_url, kafka_bootstrap, tmp_path / "kiln.log",
                            HARDEN_DELAY_MS) as process:
        yield process


@pytest.fixture
def rng() -> random.Random:
    """Seeded randomness for fault timing; the seed is printed, and KILN_TEST_FAULT_SEED
    replays a run."""
    raw = os.environ.get("KILN_TEST_FAULT_SEED", "")
    seed = int(raw) if raw else random.SystemRandom().randrange(2**32)
    print(f"fault seed {seed} (replay with KILN_TEST_FAULT_SEED={seed})")
    return random.Random(seed)
