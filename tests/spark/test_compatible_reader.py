"""Kiln's compatible Kafka reader in a real SparkSession against a real broker (tansu),
records written straight to it: the Kafka source's schema, every record with its fields,
offsets (earliest, latest, JSON), maxOffsetsPerTrigger, checkpointed restarts,
read_committed and data loss.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_examples.kafka_source import kafka_schema
from spark_examples.lineage import encode_kiln_offset, kiln_offset_of, lineage_offset
from spark_examples.pipeline import with_lineage
from tests.spark.records import BASE_TIMESTAMP_MS, Sent, create_topic, produce_records

pytestmark = pytest.mark.integration

SPARK_KAFKA_SCHEMA = ("struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
                      "timestamp:timestamp,timestampType:int>")
HEADERS_TYPE = "array<struct<key:string,value:binary>>"


def options(bootstrap: str, topic: str, **extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **extra}


def rows_of(frame: DataFrame) -> list[tuple[Any, ...]]:
    """Rows as plain tuples, timestamps as microseconds since the epoch, by partition and
    offset."""
    columns = [F.col(c) if c != "timestamp" else F.unix_micros("timestamp").alias("timestamp")
               for c in frame.columns]
    return [tuple(row) for row in frame.select(*columns).orderBy("partition", "offset").collect()]


def stream_to_parquet(spark: SparkSession, source: str, opts: dict[str, str], out: Path
                      ) -> list[int]:
    """Run a stream with Trigger.AvailableNow into Parquet at `out` (checkpoint beside it);
    the number of records each micro-batch read."""
    query = (spark.readStream.format(source).options(**opts).load()
             .writeStream.format("parquet").option("path", str(out / "data"))
             .option("checkpointLocation", str(out / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def test_batch_read_gives_the_kafka_source_schema_and_every_record(
        spark: SparkSession, kiln_reader: str, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given 60 records in 3 partitions, some without key, some with headers (one null value)
    create_topic(kafka_bootstrap, unique_topic, 3)
    sent = [Sent(partition=i % 3, value=b"v%d" % i, key=None if i % 5 == 0 else b"k%d" % i,
                 headers=[("kiln.offset", encode_kiln_offset(i)), ("n", None)] if i % 2 else [],
                 timestamp_ms=BASE_TIMESTAMP_MS + i) for i in range(60)]
    offsets = produce_records(kafka_bootstrap, unique_topic, sent)
    # When the topic is read with and without includeHeaders
    with_headers = spark.read.format(kiln_reader).options(
        **options(kafka_bootstrap, unique_topic, includeHeaders="true")).load()
    plain = spark.read.format(kiln_reader).options(
        **options(kafka_bootstrap, unique_topic)).load()
    # Then the schemas are Spark's Kafka source's
    assert plain.schema.simpleString() == SPARK_KAFKA_SCHEMA
    assert with_headers.schema.simpleString() == SPARK_KAFKA_SCHEMA[:-1] + \
        f",headers:{HEADERS_TYPE}>"
    assert with_headers.schema == kafka_schema(include_headers=True)
    # ... and every record is there once, with its fields
    expected = sorted(
        ((s.key, s.value, unique_topic, s.partition, offsets[i],
          (s.timestamp_ms or 0) * 1000, 0,
          [(k, v) for k, v in s.headers]) for i, s in enumerate(sent)),
        key=lambda r: (r[3], r[4]))
    got = [(*row[:7], [(h["key"], h["value"]) for h in row[7]])
           for row in rows_of(with_headers)]
    assert got == expected
    assert rows_of(plain) == [row[:7] for row in expected]


def test_offsets_as_json_with_earliest_and_latest_markers(
        spark: SparkSession, kiln_reader: str, kafka_bootstrap: str, unique_topic: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, 2)
    produce_records(kafka_bootstrap, unique_topic,
                    [Sent(partition=i % 2, value=b"v%d" % i) for i in range(20)])
    frame = spark.read.format(kiln_reader).options(**options(
        kafka_bootstrap, unique_topic,
        startingOffsets=f'{{"{unique_topic}": {{"0": 2, "1": -2}}}}',
        endingOffsets=f'{{"{unique_topic}": {{"0": 5, "1": -1}}}}')).load()
    got = [(row["partition"], row["offset"]) for row in
           frame.select("partition", "offset").orderBy("partition", "offset").collect()]
    assert got == [(0, 2), (0, 3), (0, 4)] + [(1, o) for o in range(10)]


def test_stream_respects_max_offsets_per_trigger_and_resumes_from_its_checkpoint(
        spark: SparkSession, kiln_reader: str, kafka_bootstrap: str, unique_topic: str,
        tmp_path: Path) -> None:
    # Given 300 records in 2 partitions (200 in partition 0, 100 in partition 1)
    create_topic(kafka_bootstrap, unique_topic, 2)
    produce_records(kafka_bootstrap, unique_topic,
                    [Sent(partition=0 if i % 3 else 1, value=b"a%d" % i) for i in range(300)])
    opts = options(kafka_bootstrap, unique_topic, startingOffsets="earliest",
                   maxOffsetsPerTrigger="70")
    # When a stream reads them 70 at a time, then more arrive and it runs again
    first = stream_to_parquet(spark, kiln_reader, opts, tmp_path)
    produce_records(kafka_bootstrap, unique_topic,
                    [Sent(partition=i % 2, value=b"b%d" % i) for i in range(40)])
    second = stream_to_parquet(spark, kiln_reader, opts, tmp_path)
    # Then each micro-batch took at most 70, the restart read only the new records, and the
    # output holds every record once
    assert first == [69, 69, 69, 69, 24]  # 70 shared 2:1, each share rounded down (as Spark)
    assert second == [40]
    values = sorted(row["value"] for row in
                    spark.read.parquet(str(tmp_path / "data")).select("value").collect())
    assert values == sorted([b"a%d" % i for i in range(300)] + [b"b%d" % i for i in range(40)])


def test_a_new_stream_at_latest_reads_only_what_comes_after_it_started(
        spark: SparkSession, kiln_reader: str, kafka_bootstrap: str, unique_topic: str,
        tmp_path: Path) -> None:
    create_topic(kafka_bootstrap, unique_topic, 2)
    produce_records(kafka_bootstrap, unique_topic,
                    [Sent(partition=i % 2, value=b"old%d" % i) for i in range(10)])
    opts = {"kafka.bootstrap.servers": kafka_bootstrap, "subscribePattern": f"{unique_topic}.*",
            "startingOffsets": "latest"}
    before = stream_to_parquet(spark, kiln_reader, opts, tmp_path)
    produce_records(kafka_bootstrap, unique_topic,
                    [Sent(partition=i % 2, value=b"new%d" % i) for i in range(6)])
    after = stream_to_parquet(spark, kiln_reader, opts, tmp_path)
    assert before == []
    assert after == [6]
    values = sorted(row["value"] for row in spark.read.parquet(str(tmp_path / "data")).collect())
    assert values == sorted(b"new%d" % i for i in range(6))


def test_read_committed_stops_before_an_open_transaction(
        spark: SparkSession, kiln_reader: str, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given 5 plain records, then an open transaction of 3 records
    create_topic(kafka_bootstrap, unique_topic, 1)
    produce_records(kafka_bootstrap, unique_topic,
                    [Sent(partition=0, value=b"plain%d" % i) for i in range(5)])
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_bootstrap,
                                         "transactional.id": f"tx-{unique_topic}",
                                         "log_level": 3})
    producer.init_transactions(15)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(unique_topic, value=b"txn%d" % i, partition=0)
    assert producer.flush(15) == 0

    def values(isolation: str) -> list[bytes]:
        frame = spark.read.format(kiln_reader).options(**options(
            kafka_bootstrap, unique_topic, **{"kafka.isolation.level": isolation})).load()
        return [row["value"] for row in frame.orderBy("offset").collect()]

    # Then read_committed sees the plain records only, read_uncommitted all of them
    plain = [b"plain%d" % i for i in range(5)]
    txn = [b"txn%d" % i for i in range(3)]
    assert values("read_committed") == plain
    assert values("read_uncommitted") == plain + txn
    # ... and once committed, read_committed sees the transaction too
    producer.commit_transaction(15)
    assert values("read_committed") == plain + txn


def test_lineage_column_agrees_with_the_header_rule(
        spark: SparkSession, kiln_reader: str, kafka_bootstrap: str, unique_topic: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, 1)
    variants: list[list[tuple[str, bytes | None]]] = [
        [("kiln.offset", encode_kiln_offset(7))],
        [],
        [("kiln.offset", encode_kiln_offset(1)), ("kiln.offset", encode_kiln_offset(90))],
        [("kiln.offset", encode_kiln_offset(3)), ("kiln.offset", b"short")],
        [("kiln.offset", b"\xff" * 8)],  # negative: not Kiln's
        [("kiln.offset", None), ("other", encode_kiln_offset(5))],
        [("kiln.offset", encode_kiln_offset(2**62))],
    ]
    produce_records(kafka_bootstrap, unique_topic,
                    [Sent(partition=0, value=b"x", headers=h) for h in variants])
    raw = spark.read.format(kiln_reader).options(
        **options(kafka_bootstrap, unique_topic, includeHeaders="true")).load()
    got = [(row["kiln_offset"], row["kiln_header"]) for row in
           with_lineage(raw).orderBy("kafka_offset").collect()]
    expected = [(lineage_offset(h, i), kiln_offset_of(h) is not None)
                for i, h in enumerate(variants)]
    assert got == expected
    assert got == [(7, True), (1, False), (90, True), (3, True), (4, False), (5, False),
                   (2**62, True)]


def test_offsets_beyond_the_end_are_data_loss_unless_allowed(
        spark: SparkSession, kiln_reader: str, kafka_bootstrap: str, unique_topic: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, 1)
    produce_records(kafka_bootstrap, unique_topic, [Sent(partition=0, value=b"x")] * 3)
    beyond = options(kafka_bootstrap, unique_topic,
                     startingOffsets=f'{{"{unique_topic}": {{"0": 50}}}}')
    with pytest.raises(Exception, match="offset went back from 50 to 3"):
        spark.read.format(kiln_reader).options(**beyond).load().collect()
    allowed = spark.read.format(kiln_reader).options(**beyond, failOnDataLoss="false").load()
    assert allowed.count() == 0
