"""Fixtures of the Spark pipeline tests: one local SparkSession for the whole test session
(Spark takes 6-15 s to start), Kiln's compatible reader registered in it, and Kiln as a
killable child process.

The session runs `local[2]` with the UI off and two shuffle partitions. Spark's Python
workers run this interpreter (`PYSPARK_PYTHON`), which has this project installed, so they
can import `spark_examples.kafka_source`.

To also run the test of Spark's own Kafka source, put the connector on the session's
classpath: `KILN_TEST_SPARK_PACKAGES=org.apache.spark:spark-sql-kafka-0-10_2.13:4.3.0`
(resolved from Maven) or `KILN_TEST_SPARK_JARS=/path/a.jar,/path/b.jar`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_examples.session import build_session, choose_reader
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
    packages = os.environ.get("KILN_TEST_SPARK_PACKAGES")
    jars = os.environ.get("KILN_TEST_SPARK_JARS")
    if packages:
        conf["spark.jars.packages"] = packages
    if jars:
        conf["spark.jars"] = jars
    try:
        session = build_session("kiln-tests", master="local[2]", conf=conf)
    except Exception as exc:  # no Java, no pyspark: a failure in CI, a skip elsewhere
        _unavailable("Spark (local session)", repr(exc))
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def kiln_reader(spark: SparkSession) -> str:
    """The format name of Kiln's compatible reader, registered in the session."""
    return choose_reader(spark, "kiln")


@pytest.fixture
def kiln_process(redis_url: str, kafka_bootstrap: str, tmp_path: Path) -> Iterator[KilnProcess]:
    """`kiln serve` as a child process on a free port (not started yet), with an empty
    Redis; killed in the end whatever happened."""
    with fresh_kiln_process(redis_url, kafka_bootstrap, tmp_path / "kiln.log",
                            HARDEN_DELAY_MS) as process:
        yield process
