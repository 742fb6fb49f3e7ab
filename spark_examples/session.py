"""The SparkSession the jobs run in, and which Kafka reader they use.

Spark's own Kafka source (`format("kafka")`, the spark-sql-kafka-0-10 connector) is used
whenever it is on the classpath, e.g. with
`spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version>`.
Where it is not (no Maven access), the jobs register Kiln's compatible reader
(`kafka_source.py`, `format("kiln-kafka")`) and log that they do. Both take the same options
and give the same schema, so everything downstream (`pipeline.py`) is the same.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Literal

import pyspark
from pyspark import SparkConf, SparkContext
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.readwriter import DataStreamReader

log = logging.getLogger(__name__)

ReaderChoice = Literal["auto", "kafka", "kiln"]
KAFKA_FORMAT = "kafka"
KILN_FORMAT = "kiln-kafka"  # kafka_source.SOURCE_NAME
CONNECTOR_MISSING = "KAFKA_DATA_SOURCE_NOT_ENABLED"
FALLBACK_MESSAGE = ("using Kiln's compatible Kafka reader: the spark-sql-kafka connector is "
                    "not on the classpath")


def connector_package() -> str:
    """The Maven coordinates of the Kafka connector for the running Spark."""
    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"


def build_session(app_name: str, *, master: str | None = None,
                  conf: Mapping[str, str] | None = None) -> SparkSession:
    """A SparkSession (the running one under spark-submit). Windows are computed in UTC.

    Without `master`, a plain `python` run is local (`local[*]`) and a spark-submit run has
    the master it was submitted with. For a local master, Spark's Python workers default to
    this interpreter (Spark starts them with $PYSPARK_PYTHON, else with whatever `python3`
    is on PATH, which often lacks pyarrow and this package) and the driver listens on
    127.0.0.1. On a cluster both are left to the deployment.
    """
    submitted = _submitted_master()
    effective = master or submitted or "local[*]"
    builder = SparkSession.builder.appName(app_name)
    if master or submitted is None:
        builder = builder.master(effective)
    settings = {"spark.sql.session.timeZone": "UTC"}
    if effective.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        settings.update({"spark.driver.bindAddress": "127.0.0.1",
                         "spark.driver.host": "127.0.0.1"})
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _submitted_master() -> str | None:
    """The master spark-submit gave this driver; None when no spark-submit started it.

    Under spark-submit the JVM is already running (it started this process and said where
    in PYSPARK_GATEWAY_PORT), so its configuration can be read. Otherwise nothing may touch
    the JVM yet: launching it now would drop settings such as spark.driver.memory or
    spark.jars.packages that only count at launch."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    SparkContext._ensure_initialized()
    master: str | None = SparkConf().get("spark.master", None)
    return master


@contextlib.contextmanager
def job_session(app_name: str, *, master: str | None = None,
                conf: Mapping[str, str] | None = None) -> Iterator[SparkSession]:
    """`build_session` for a job's main(): stopped at the end only if the job started it
    (a job called from a running application leaves that application's session alone)."""
    running = SparkSession.getActiveSession()
    spark = build_session(app_name, master=master, conf=conf)
    try:
        yield spark
    finally:
        if running is None:
            spark.stop()


def kafka_connector_available(spark: SparkSession) -> bool:
    """Whether `format("kafka")` resolves: a load without options fails either way, but
    only a missing connector fails with KAFKA_DATA_SOURCE_NOT_ENABLED."""
    try:
        spark.read.format(KAFKA_FORMAT).load()
    except AnalysisException as exc:
        return exc.getCondition() != CONNECTOR_MISSING
    except Exception:  # the connector's own complaint about the missing options
        return True
    return True


def choose_reader(spark: SparkSession, preference: ReaderChoice = "auto") -> str:
    """The format name to read Kafka with; registers Kiln's reader when it is the one."""
    if preference == "kiln":
        register_compatible_reader(spark)
        log.info("using Kiln's compatible Kafka reader (asked for)")
        return KILN_FORMAT
    if kafka_connector_available(spark):
        log.info("using Spark's Kafka source (spark-sql-kafka connector)")
        return KAFKA_FORMAT
    if preference == "kafka":
        raise RuntimeError("the spark-sql-kafka connector is not on Spark's classpath; run "
                           f"with spark-submit --packages {connector_package()}")
    register_compatible_reader(spark)
    log.info(FALLBACK_MESSAGE)
    return KILN_FORMAT


def register_compatible_reader(spark: SparkSession) -> None:
    # Imported only now: with Spark's own connector the jobs need neither kafka-python nor
    # aiokafka on the driver.
    from spark_examples.kafka_source import KafkaCompatibleSource

    assert KafkaCompatibleSource.name() == KILN_FORMAT
    spark.dataSource.register(KafkaCompatibleSource)


def read_stream(spark: SparkSession, source_format: str, options: Mapping[str, str]
                ) -> DataFrame:
    reader: DataStreamReader = spark.readStream.format(source_format)
    return reader.options(**options).load()


def read_batch(spark: SparkSession, source_format: str, options: Mapping[str, str]
               ) -> DataFrame:
    return spark.read.format(source_format).options(**options).load()


def add_spark_arguments(parser: argparse.ArgumentParser) -> None:
    """--reader, --master and --conf, shared by the jobs."""
    parser.add_argument("--reader", choices=("auto", "kafka", "kiln"), default="auto",
                        help="auto: Spark's Kafka source when its connector is on the "
                             "classpath, else Kiln's compatible reader (default)")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, or local[*])")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark configuration (repeatable)")


def spark_conf(pairs: Sequence[str]) -> dict[str, str]:
    """`--conf KEY=VALUE` pairs as a mapping, over the jobs' defaults (no progress bar: the
    jobs' output is for scripts and logs)."""
    conf = {"spark.ui.showConsoleProgress": "false"}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--conf wants KEY=VALUE, got {pair!r}")
        conf[key.strip()] = value.strip()
    return conf
