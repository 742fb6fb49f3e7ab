"""Spark's own Kafka source (`format("kafka")`, the spark-sql-kafka-0-10 connector) and Kiln's
compatible reader give the same rows, and the jobs choose the connector when it is there.

The connector cannot be downloaded on machines without Maven access, so this is the one
test allowed to skip; see tests/spark/conftest.py for putting it on the classpath.
Offsets are given as JSON, not `latest`: Spark's source asks ListOffsets for the end of a
partition, which tansu 0.6 answers wrongly.
"""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from spark_examples.lineage import encode_kiln_offset
from spark_examples.pipeline import with_lineage
from spark_examples.session import (
    KAFKA_FORMAT,
    choose_reader,
    connector_package,
    kafka_connector_available,
)
from tests.spark.records import BASE_TIMESTAMP_MS, Sent, create_topic, produce_records

pytestmark = pytest.mark.integration


def test_spark_kafka_source_and_the_compatible_reader_read_the_same(
        spark: SparkSession, kiln_reader: str, kafka_bootstrap: str, unique_topic: str) -> None:
    if not kafka_connector_available(spark):
        pytest.skip("the spark-sql-kafka connector is not on Spark's classpath (it is fetched "
                    f"from Maven: set KILN_TEST_SPARK_PACKAGES={connector_package()})")
    # Given records with Kiln's lineage in 2 partitions
    create_topic(kafka_bootstrap, unique_topic, 2)
    sent = [Sent(partition=i % 2, value=b"v%d" % i, key=b"k%d" % (i % 3),
                 headers=[("kiln.offset", encode_kiln_offset(i // 2))],
                 timestamp_ms=BASE_TIMESTAMP_MS + i) for i in range(40)]
    produce_records(kafka_bootstrap, unique_topic, sent)
    options = {"kafka.bootstrap.servers": kafka_bootstrap, "subscribe": unique_topic,
               "includeHeaders": "true",
               "startingOffsets": f'{{"{unique_topic}": {{"0": -2, "1": -2}}}}',
               "endingOffsets": f'{{"{unique_topic}": {{"0": 20, "1": 20}}}}'}
    # When both read the topic and the pipeline decodes the lineage
    columns = ["topic", "partition", "kiln_offset", "kafka_offset", "key", "value", "timestamp"]

    def decoded(source: str) -> list[tuple[object, ...]]:
        raw = spark.read.format(source).options(**options).load()
        return [tuple(r) for r in with_lineage(raw).select(*columns)
                .orderBy("partition", "kafka_offset").collect()]

    real, compatible = decoded(KAFKA_FORMAT), decoded(kiln_reader)
    # Then the rows are the same, and the jobs pick the connector
    assert len(real) == 40
    assert real == compatible
    assert choose_reader(spark, "auto") == KAFKA_FORMAT
