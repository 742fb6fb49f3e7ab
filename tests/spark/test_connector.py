"""Spark's Kafka source (the spark-sql-kafka connector, read the way the jobs read) on what Kiln
leaves in a hardened topic: `kiln.offset` headers, and the abort markers of Kiln's fence,
which take Kafka offsets and hold no record.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_examples.audit import audit_options, run_audit
from spark_examples.hardened_stream import RECORDS, StreamSettings, start_queries
from spark_examples.pipeline import with_lineage
from spark_examples.session import read_batch
from tests.spark.records import (
    Sent,
    create_topic,
    end_offsets,
    kiln_fence,
    produce_records,
    seq_of,
    value_of,
)
from wire.lineage import encode_kiln_offset, kiln_offset_header, kiln_offset_of, lineage_offset

pytestmark = pytest.mark.integration


def run_stream(spark: SparkSession, settings: StreamSettings) -> list[int]:
    """The job's records query with Trigger.AvailableNow, from its checkpoint; the records
    each micro-batch read."""
    [query] = start_queries(spark, settings, available_now=True, outputs=[RECORDS])
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def hardened(partition: int, seq: int, kiln_offset: int | None = None) -> Sent:
    headers = [] if kiln_offset is None else [kiln_offset_header(kiln_offset)]
    return Sent(partition=partition, value=value_of(seq), headers=headers)


def test_the_job_and_the_audit_step_over_kiln_fence_markers(
        spark: SparkSession, kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    settings = StreamSettings(bootstrap=kafka_bootstrap, topics=unique_topic,
                              output=str(tmp_path / "out"), checkpoint=str(tmp_path / "cp"))
    # Given a topic as Kiln leaves it after takeovers: partition 0 holds Kiln offsets 0-3
    # at Kafka offsets 0-3, then a fence marker; partition 1 only a fence marker (taken over
    # before anything was hardened)
    create_topic(kafka_bootstrap, unique_topic, 2)
    produce_records(kafka_bootstrap, unique_topic, [hardened(0, s) for s in range(4)])
    kiln_fence(kafka_bootstrap, unique_topic, 0)
    kiln_fence(kafka_bootstrap, unique_topic, 1)
    assert end_offsets(kafka_bootstrap, unique_topic, 2) == [5, 1]
    # When the streaming job reads it (its ranges end on the markers; partition 1's holds
    # nothing else) ...
    first = run_stream(spark, settings)
    # ... then Kiln hardens more after the fences, with Kiln offsets in headers, and fences
    # partition 0 once more, and the job runs again from its checkpoint
    produce_records(kafka_bootstrap, unique_topic, [
        *(hardened(0, s, kiln_offset=s) for s in range(4, 7)),
        *(hardened(1, s, kiln_offset=s - 7) for s in range(7, 10))])
    kiln_fence(kafka_bootstrap, unique_topic, 0)
    assert end_offsets(kafka_bootstrap, unique_topic, 2) == [9, 4]
    second = run_stream(spark, settings)
    # Then the job read every record once, no marker as a record and no loss reported
    assert (sum(first), sum(second)) == (4, 6)
    rows = spark.read.parquet(str(tmp_path / "out" / RECORDS)).select(
        "partition", "kafka_offset", "kiln_offset", "kiln_header", "value").collect()
    assert sorted((r["partition"], r["kafka_offset"], r["kiln_offset"], r["kiln_header"],
                   seq_of(r["value"])) for r in rows) == [
        (0, 0, 0, False, 0), (0, 1, 1, False, 1), (0, 2, 2, False, 2), (0, 3, 3, False, 3),
        (0, 5, 4, True, 4), (0, 6, 5, True, 5), (0, 7, 6, True, 6),
        (1, 1, 0, True, 7), (1, 2, 1, True, 8), (1, 3, 2, True, 9)]
    # ... and the audit, reading the whole topic, finds no gap in Kiln offsets and no copy
    audits = run_audit(spark, audit_options(kafka_bootstrap, unique_topic))
    assert [(a.partition, a.records, a.min_offset, a.max_offset, a.gap_count,
             a.duplicate_records, a.without_kiln_header) for a in audits] == [
        (0, 7, 0, 6, 0, 0, 4), (1, 3, 0, 2, 0, 0, 0)]


def test_lineage_column_agrees_with_the_header_rule(
        spark: SparkSession, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given records with every kind of kiln.offset header, well-formed or not
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
    # When Spark's Kafka source reads them and the pipeline decodes the lineage
    raw = read_batch(spark, {"kafka.bootstrap.servers": kafka_bootstrap,
                             "subscribe": unique_topic, "includeHeaders": "true"})
    got = [(row["kiln_offset"], row["kiln_header"]) for row in
           with_lineage(raw).orderBy("kafka_offset").collect()]
    # Then the Spark expression and the Python rule agree on every record
    expected = [(lineage_offset(h, i), kiln_offset_of(h) is not None)
                for i, h in enumerate(variants)]
    assert got == expected
    assert got == [(7, True), (1, False), (90, True), (3, True), (4, False), (5, False),
                   (2**62, True)]
