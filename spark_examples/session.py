"""The SparkSession the jobs run in, with Spark's Kafka connector on its classpath.

The jobs read Kafka with Spark's own Kafka source (`format("kafka")`, the spark-sql-kafka-0-10
connector), which PySpark does not ship. It reaches the session one of two ways:

- a plain `python -m spark_examples...` run (and the tests, and the benchmark):
  `build_session` puts the jars that scripts/setup.sh resolves from Maven Central into
  `.jvm/spark` (scripts/jvm/spark/pom.xml) on `spark.jars`;
- `spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:<Spark's version>`
  (compose/), or any `spark.jars.packages` given to the session: Spark resolves it then, and
  nothing is added here.

The connector must be built for the running Spark (`connector_package()`). A session
without it fails at once with `ConnectorMissing`, which says how to get it, rather than at
the first read.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pyspark
from pyspark import SparkConf, SparkContext
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

KAFKA_FORMAT = "kafka"
CONNECTOR_ARTIFACT = "spark-sql-kafka-0-10_2.13"
# Where scripts/setup.sh puts the connector's jars: beside this package in a source checkout
# (an editable install); an installed package has none there and must be given --packages.
CONNECTOR_DIR = Path(__file__).resolve().parents[1] / ".jvm" / "spark"


class ConnectorMissing(RuntimeError):
    """Spark's Kafka connector is not on the session's classpath, or not for this Spark."""


def connector_package(spark_version: str = pyspark.__version__) -> str:
    """The Maven coordinates of the Kafka connector for the running Spark."""
    return f"org.apache.spark:{CONNECTOR_ARTIFACT}:{spark_version}"


def connector_jars(folder: Path = CONNECTOR_DIR,
                   spark_version: str = pyspark.__version__) -> list[Path]:
    """The jars to put on `spark.jars`: the connector for `spark_version` and what it needs
    beyond PySpark's own jars (kafka-clients, commons-pool2, the token provider)."""
    wanted = f"{CONNECTOR_ARTIFACT}-{spark_version}.jar"
    jars = sorted(folder.glob("*.jar"))
    # Another Spark's connector beside it would be on the classpath too, and clash.
    connectors = [jar.name for jar in jars if jar.name.startswith(f"{CONNECTOR_ARTIFACT}-")]
    if connectors != [wanted]:
        raise ConnectorMissing(
            f"{folder} should hold {wanted} and no other connector, but holds "
            f"{connectors or 'none'}: run scripts/setup.sh, which resolves it from Maven "
            f"Central, or run the job with spark-submit --packages "
            f"{connector_package(spark_version)}")
    return jars


def build_session(app_name: str, *, master: str | None = None,
                  conf: Mapping[str, str] | None = None,
                  jars_folder: Path = CONNECTOR_DIR) -> SparkSession:
    """A SparkSession (the running one under spark-submit) that can read Kafka. Windows are
    computed in UTC.

    Without `master`, a plain `python` run is local (`local[*]`) and a spark-submit run has
    the master it was submitted with. For a local master, Spark's Python workers default to
    this interpreter (Spark starts them with $PYSPARK_PYTHON, else with whatever `python3`
    is on PATH, which may lack this package) and the driver listens on 127.0.0.1. On a
    cluster both are left to the deployment.
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
    if submitted is None and "spark.jars.packages" not in settings:
        # Only a JVM launched here takes jars now; under spark-submit it is already running.
        given = [j for j in settings.get("spark.jars", "").split(",") if j.strip()]
        settings["spark.jars"] = ",".join(
            [*given, *(str(jar) for jar in connector_jars(jars_folder))])
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    require_connector(spark)
    return spark


def _submitted_master() -> str | None:
    """The master spark-submit gave this driver; None when no spark-submit started it.

    Under spark-submit the JVM is already running (it started this process and said where
    in PYSPARK_GATEWAY_PORT), so its configuration can be read. Otherwise nothing may touch
    the JVM yet: launching it now would drop settings such as spark.driver.memory or
    spark.jars that only count at launch."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    SparkContext._ensure_initialized()
    master: str | None = SparkConf().get("spark.master", None)
    return master


def require_connector(spark: SparkSession) -> None:
    """Fail with `ConnectorMissing` unless `format("kafka")` resolves. A load without
    options fails either way: with the connector, on the missing subscription; without it,
    with Spark's AnalysisException that no source is called "kafka" (its error condition
    differs between Spark versions, so only its type is relied on)."""
    try:
        spark.read.format(KAFKA_FORMAT).load()
    except AnalysisException as exc:
        raise ConnectorMissing(
            "Spark's Kafka connector is not on the classpath; run scripts/setup.sh (it puts "
            "the connector's jars in .jvm/spark) or spark-submit --packages "
            f"{connector_package()} ({exc})") from None
    except Exception:  # the connector's own complaint about the missing options
        return


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


def read_stream(spark: SparkSession, options: Mapping[str, str]) -> DataFrame:
    return spark.readStream.format(KAFKA_FORMAT).options(**options).load()


def read_batch(spark: SparkSession, options: Mapping[str, str]) -> DataFrame:
    return spark.read.format(KAFKA_FORMAT).options(**options).load()


def add_spark_arguments(parser: argparse.ArgumentParser) -> None:
    """--master and --conf, shared by the jobs."""
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
