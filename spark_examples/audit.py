"""Batch audit of a hardened topic: per partition, the Kiln offsets present (count, lowest,
highest), the gaps between them and the offsets present more than once — how an operator
checks that hardening lost and duplicated nothing.

    python -m spark_examples.audit --bootstrap HOST:PORT --topic T [--json]
    spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0 \\
        spark_examples/audit.py --bootstrap HOST:PORT --topic T --json

The topic is read with Spark's Kafka source from its earliest to its latest offsets,
read_uncommitted by default so that every data record physically there is counted
(transaction markers, such as those of Kiln's fence, take Kafka offsets but are no
records: they leave gaps in Kafka offsets, never in Kiln offsets). `--json` prints one JSON
document on stdout (see `audit_report.report_json`); otherwise a table. Gaps and duplicates
are findings, not errors: the exit status is 0 whenever the audit ran. Which gaps are expected:
`audit_report.py`, and docs/spark.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from spark_examples.audit_report import PartitionAudit, partition_audit, render_table, report_json
from spark_examples.pipeline import (
    duplicated_offsets,
    partition_totals,
    present_ranges,
    with_lineage,
)
from spark_examples.session import (
    KAFKA_FORMAT,
    add_spark_arguments,
    job_session,
    read_batch,
    spark_conf,
)

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 1000


def audit_options(bootstrap: str, topics: str, isolation_level: str = "read_uncommitted"
                  ) -> dict[str, str]:
    """Kafka source options for reading a whole topic (or comma-separated topics) once."""
    return {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topics,
        "startingOffsets": "earliest",
        "endingOffsets": "latest",
        "includeHeaders": "true",
        "kafka.isolation.level": isolation_level,
        "failOnDataLoss": "true",
    }


def run_audit(spark: SparkSession, options: Mapping[str, str],
              limit: int = DEFAULT_LIMIT) -> list[PartitionAudit]:
    """Read the topic once and return each partition's findings, listing at most `limit`
    gaps and duplicated offsets per partition (the counts are always complete)."""
    records = (with_lineage(read_batch(spark, options))
               .select("topic", "partition", "kiln_offset", "kiln_header")
               .persist())
    try:
        totals = partition_totals(records).collect()
        runs, run_counts = _first_per_partition(present_ranges(records), "first", limit + 1)
        dups, dup_counts = _first_per_partition(duplicated_offsets(records), "kiln_offset",
                                                limit)
    finally:
        records.unpersist()
    audits = []
    for row in totals:
        key = (row["topic"], row["partition"])
        audits.append(partition_audit(
            row.asDict(),
            [(r["first"], r["last"]) for r in runs.get(key, [])],
            run_counts.get(key, 0),
            [(r["kiln_offset"], r["copies"]) for r in dups.get(key, [])],
            dup_counts.get(key, 0),
            limit,
        ))
    return audits


def _first_per_partition(frame: DataFrame, order_by: str, limit: int
                         ) -> tuple[dict[tuple[str, int], list[Any]], dict[tuple[str, int], int]]:
    """The first `limit` rows of each partition (by `order_by`), and each one's row count;
    only that much reaches the driver, however many gaps or duplicates there are."""
    by_partition = Window.partitionBy("topic", "partition")
    ranked = (frame.withColumn("_rank", F.row_number().over(by_partition.orderBy(order_by)))
              .withColumn("_rows", F.count(F.lit(1)).over(by_partition))
              .where(F.col("_rank") <= limit)
              .orderBy("topic", "partition", order_by)
              .collect())
    listed: dict[tuple[str, int], list[Any]] = {}
    counts: dict[tuple[str, int], int] = {}
    for row in ranked:
        key = (row["topic"], row["partition"])
        listed.setdefault(key, []).append(row)
        counts[key] = row["_rows"]
    return listed, counts


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m spark_examples.audit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers, HOST:PORT")
    parser.add_argument("--topic", required=True, help="hardened topic(s), comma-separated")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--isolation-level", choices=("read_uncommitted", "read_committed"),
                        default="read_uncommitted")
    parser.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                        help="gaps and duplicates listed per partition (default %(default)s)")
    add_spark_arguments(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # spark-submit merges the Python driver's stderr into its stdout: with --json, only
    # warnings may be logged beside the document.
    logging.basicConfig(level=logging.WARNING if args.json else logging.INFO,
                        stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    with job_session("kiln-audit", master=args.master, conf=spark_conf(args.conf)) as spark:
        options = audit_options(args.bootstrap, args.topic, args.isolation_level)
        audits = run_audit(spark, options, args.limit)
    if args.json:
        print(json.dumps(report_json(audits, topic=args.topic, bootstrap=args.bootstrap,
                                     reader=KAFKA_FORMAT,
                                     isolation_level=args.isolation_level), indent=2))
    else:
        print(render_table(audits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
