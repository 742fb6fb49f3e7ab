"""Fixtures of the Spark pipeline tests: one local SparkSession for the whole test session
(Spark takes 6-15 s to start) with Spark's Kafka connector on its classpath (the jars
scripts/setup.sh resolves into .jvm/spark, as the jobs take them), and Kiln as a killable
child process.

The session runs `local[2]` with the UI off and two shuffle partitions; Spark's Python
workers run this interpreter (`PYSPARK_PYTHON`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_examples.session import build_session
from tests.conftest import _unavailable
from tests.faults.kiln_process import KilnProcess, fresh_kiln_process

HARDEN_DELAY_MS = 200


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        # Small test checkpoints: no need to keep 100 batches of metadata.
        "spark.sql.streaming.minBatchesToRetain": "10",
    }
    try:
        session = build_session("kiln-tests", master="local[2]", conf=conf)
    except Exception as exc:  # no Java, no connector: a failure in CI, a skip elsewhere
        _unavailable("Spark (local session)", repr(exc))
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def kiln_process(redis_url: str, kafka_bootstrap: str, tmp_path: Path) -> Iterator[KilnProcess]:
    """`kiln serve` as a child process on a free port (not started yet), with an empty
    Redis; killed in the end whatever happened."""
    with fresh_kiln_process(redis_url, kafka_bootstrap, tmp_path / "kiln.log",
                            HARDEN_DELAY_MS) as process:
        yield process
