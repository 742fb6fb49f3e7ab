"""The audit job, reading with Spark's Kafka source, finds what a broken hardener would leave:
records written straight to the broker with `kiln.offset` headers that skip offsets and
repeat one."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import SparkSession

from spark_examples import audit
from spark_examples.audit import audit_options, run_audit
from tests.spark.records import Sent, create_topic, produce_records
from wire.lineage import kiln_offset_header

pytestmark = pytest.mark.integration


def hardened(partition: int, kiln_offset: int | None) -> Sent:
    headers = [] if kiln_offset is None else [kiln_offset_header(kiln_offset)]
    return Sent(partition=partition, value=b"%d@%s" % (partition, str(kiln_offset).encode()),
                headers=headers)


def write_gap_and_duplicate(bootstrap: str, topic: str) -> None:
    """Partition 0: Kiln offsets 0-9 without 4-6, 8 twice. Partition 1: 0-4, then a record
    without a kiln.offset header (Kafka offset 5, so Kiln offset 5)."""
    create_topic(bootstrap, topic, 2)
    zero = [hardened(0, o) for o in (0, 1, 2, 3, 7, 8, 8, 9)]
    one = [*(hardened(1, o) for o in range(5)), hardened(1, None)]
    produce_records(bootstrap, topic, zero + one)


def test_audit_reports_the_gap_and_the_duplicate(
        spark: SparkSession, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic with a gap and a duplicate in partition 0
    write_gap_and_duplicate(kafka_bootstrap, unique_topic)
    # When it is audited
    audits = run_audit(spark, audit_options(kafka_bootstrap, unique_topic))
    # Then
    assert [a.as_json() for a in audits] == [
        {"topic": unique_topic, "partition": 0, "records": 8,
         "kiln_offsets": {"count": 7, "min": 0, "max": 9}, "without_kiln_header": 0,
         "gaps": [[4, 6]], "gap_count": 1, "missing": 3,
         "duplicates": [{"kiln_offset": 8, "copies": 2}], "duplicated_offsets": 1,
         "duplicate_records": 1, "listing_truncated": False},
        {"topic": unique_topic, "partition": 1, "records": 6,
         "kiln_offsets": {"count": 6, "min": 0, "max": 5}, "without_kiln_header": 1,
         "gaps": [], "gap_count": 0, "missing": 0,
         "duplicates": [], "duplicated_offsets": 0,
         "duplicate_records": 0, "listing_truncated": False},
    ]


def test_header_less_records_then_header_records_audit_clean(
        spark: SparkSession, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given what Kiln writes now: header-less records whose Kafka offsets are their Kiln
    # offsets, then, once Kiln dropped records, records with larger Kiln offsets in headers.
    # Partition 0: Kafka 0-3 header-less, then Kiln offsets 7-9 at Kafka 4-6 (4-6 dropped).
    # Partition 1: Kafka 0-2 header-less, then Kiln offsets 3-4 in headers at Kafka 3-4.
    create_topic(kafka_bootstrap, unique_topic, 2)
    zero = [*(hardened(0, None) for _ in range(4)), *(hardened(0, o) for o in (7, 8, 9))]
    one = [*(hardened(1, None) for _ in range(3)), hardened(1, 3), hardened(1, 4)]
    kafka_offsets = produce_records(kafka_bootstrap, unique_topic, zero + one)
    assert kafka_offsets == [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4]
    # When it is audited
    audits = run_audit(spark, audit_options(kafka_bootstrap, unique_topic))
    # Then the Kiln offsets are those, with only the dropped ones as a gap, no duplicate
    # (header Kiln offsets 7-9 do not collide with the Kafka offsets 4-6 they sit at), and
    # the header-less records counted apart
    assert [a.as_json() for a in audits] == [
        {"topic": unique_topic, "partition": 0, "records": 7,
         "kiln_offsets": {"count": 7, "min": 0, "max": 9}, "without_kiln_header": 4,
         "gaps": [[4, 6]], "gap_count": 1, "missing": 3,
         "duplicates": [], "duplicated_offsets": 0,
         "duplicate_records": 0, "listing_truncated": False},
        {"topic": unique_topic, "partition": 1, "records": 5,
         "kiln_offsets": {"count": 5, "min": 0, "max": 4}, "without_kiln_header": 3,
         "gaps": [], "gap_count": 0, "missing": 0,
         "duplicates": [], "duplicated_offsets": 0,
         "duplicate_records": 0, "listing_truncated": False},
    ]


def test_audit_command_prints_json_for_scripts(
        spark: SparkSession, kafka_bootstrap: str, unique_topic: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Given the same kind of topic
    write_gap_and_duplicate(kafka_bootstrap, unique_topic)
    # When the audit command runs with --json (in this process: its session is the tests')
    status = audit.main(["--bootstrap", kafka_bootstrap, "--topic", unique_topic,
                         "--json", "--limit", "10"])
    # Then it read with Spark's Kafka source and printed one JSON document
    assert status == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["reader"] == "kafka"
    assert doc["topic"] == unique_topic
    assert doc["totals"] == {"partitions": 2, "records": 14, "missing": 3,
                             "duplicate_records": 1, "without_kiln_header": 1}
    assert doc["partitions"][0]["gaps"] == [[4, 6]]
    assert doc["partitions"][0]["duplicates"] == [{"kiln_offset": 8, "copies": 2}]
    # ... and left the running session alone
    assert spark.range(3).count() == 3
