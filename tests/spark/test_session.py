"""Which jars put Spark's Kafka connector on the jobs' classpath, and the error when they are
missing; no Spark started."""

from __future__ import annotations

import re
from pathlib import Path

import pyspark
import pytest

from spark_examples.session import (
    CONNECTOR_DIR,
    ConnectorMissing,
    build_session,
    connector_jars,
    connector_package,
)

PYSPARK_JARS = Path(pyspark.__file__).parent / "jars"


def artifact(jar: Path) -> str:
    """A jar's artifact name without its version (`kafka-clients-3.9.2.jar` -> kafka-clients)."""
    return re.sub(r"-\d[^-]*\.jar$", "", jar.name)


def test_setup_resolved_the_connector_of_the_installed_pyspark_and_nothing_pyspark_ships() -> None:
    # Given the jars scripts/setup.sh resolved from scripts/jvm/spark/pom.xml
    # When the session looks for the connector of the installed PySpark
    jars = connector_jars()
    # Then it is there, at PySpark's version, with only what PySpark lacks
    version = pyspark.__version__
    assert {artifact(j) for j in jars} == {
        "spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13", "kafka-clients",
        "commons-pool2"}
    assert {j.name for j in jars} >= {f"spark-sql-kafka-0-10_2.13-{version}.jar",
                                      f"spark-token-provider-kafka-0-10_2.13-{version}.jar"}
    shipped = {artifact(j) for j in PYSPARK_JARS.glob("*.jar")}
    assert not {artifact(j) for j in jars} & shipped
    assert all(j.parent == CONNECTOR_DIR for j in jars)
    assert connector_package() == f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"


def test_without_the_jars_a_job_fails_at_once_saying_how_to_get_them(tmp_path: Path) -> None:
    # Given an empty jars folder
    # When a job builds its session (before any JVM starts)
    with pytest.raises(ConnectorMissing) as raised:
        build_session("kiln-no-connector", master="local[1]", jars_folder=tmp_path)
    # Then the error names both ways to the connector
    assert "run scripts/setup.sh" in str(raised.value)
    assert f"--packages {connector_package()}" in str(raised.value)


def test_a_connector_of_another_spark_version_does_not_count(tmp_path: Path) -> None:
    # Given the jars of a connector built for another Spark
    (tmp_path / "spark-sql-kafka-0-10_2.13-3.5.1.jar").write_bytes(b"")
    (tmp_path / "kafka-clients-3.4.1.jar").write_bytes(b"")
    # When the connector for 4.2.0 is looked for, Then it is missing, and the error says what
    # was found instead
    with pytest.raises(ConnectorMissing, match=r"holds \['spark-sql-kafka-0-10_2\.13-3\.5\.1"):
        connector_jars(tmp_path, spark_version="4.2.0")
    # ... and beside the right one it is still refused (both would be on the classpath)
    (tmp_path / "spark-sql-kafka-0-10_2.13-4.2.0.jar").write_bytes(b"")
    with pytest.raises(ConnectorMissing, match="no other connector"):
        connector_jars(tmp_path, spark_version="4.2.0")
    (tmp_path / "spark-sql-kafka-0-10_2.13-3.5.1.jar").unlink()
    assert [j.name for j in connector_jars(tmp_path, spark_version="4.2.0")] == [
        "kafka-clients-3.4.1.jar", "spark-sql-kafka-0-10_2.13-4.2.0.jar"]
