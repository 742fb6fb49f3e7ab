"""Structured Streaming job over a hardened topic: Kiln's lineage decoded, duplicates dropped,
two Parquet outputs, each with its own checkpoint.

    python -m spark_examples.hardened_stream --bootstrap HOST:PORT --topic T \\
        --output DIR --checkpoint DIR [--available-now]
    spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0 \\
        spark_examples/hardened_stream.py --bootstrap ... (same arguments)

The topic is read with Spark's Kafka source (`format("kafka")`; `session.py` puts the
connector on the classpath). Kafka offsets along a hardened partition can skip: Kiln's
fence writes a transaction abort marker, which takes an offset, whenever a Kiln process
takes a partition over from one that may still be writing. The source steps over such
offsets (a consumer never sees markers) without calling them data loss, so the job keeps
`failOnDataLoss=true`: only records deleted before they were read fail it.

- `OUTPUT/records`: every Kiln record once — topic, partition, kiln_offset, kafka_offset,
  kiln_header (whether kiln_offset came from a `kiln.offset` header rather than being the
  Kafka offset), key, value, timestamp, headers (query `kiln-records`).
- `OUTPUT/counts`: records per topic, key and one-minute window of record time, each window
  written once the watermark (10 minutes behind the latest record time) has passed its end
  (query `kiln-counts`).

Both are Spark file sinks: a micro-batch's files become visible in the sink's log only with
the batch, and the checkpoint records which Kafka offsets each batch covered, so a job that
is stopped or killed at any moment and started again with the same checkpoint writes every
record exactly once (read the outputs with Spark, which follows the sink's log). Without
`--available-now` the job runs until stopped (Ctrl-C, SIGTERM); with it, it reads what is
in the topic when it starts and exits.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from spark_examples.pipeline import drop_duplicate_lineage, windowed_key_counts, with_lineage
from spark_examples.session import add_spark_arguments, job_session, read_stream, spark_conf

log = logging.getLogger(__name__)

RECORDS = "records"
COUNTS = "counts"
# Spark settings of the job, under any --conf: the dedup state grows with the records read
# in the dedup horizon, so it lives in RocksDB (on disk) rather than on the JVM heap.
JOB_CONF = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """What the job reads and where it writes; the defaults are the command line's."""

    bootstrap: str
    topics: str
    output: str
    checkpoint: str
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = 100_000
    isolation_level: str = "read_committed"
    fail_on_data_loss: bool = True
    trigger_interval: str = "5 seconds"
    window: str = "1 minute"
    lateness: str = "10 minutes"
    dedup_horizon: str = "10 minutes"


def source_options(settings: StreamSettings) -> dict[str, str]:
    """The Kafka source options of the job. `read_committed` (the default) hides records
    of aborted transactions, which Kiln never writes but other producers of the topic may;
    markers are invisible either way."""
    options = {
        "kafka.bootstrap.servers": settings.bootstrap,
        "subscribe": settings.topics,
        "startingOffsets": settings.starting_offsets,
        "includeHeaders": "true",
        "kafka.isolation.level": settings.isolation_level,
        "failOnDataLoss": str(settings.fail_on_data_loss).lower(),
    }
    if settings.max_offsets_per_trigger is not None:
        options["maxOffsetsPerTrigger"] = str(settings.max_offsets_per_trigger)
    return options


def output_path(settings: StreamSettings, name: str) -> str:
    return str(Path(settings.output) / name)


def start_queries(spark: SparkSession, settings: StreamSettings, *,
                  available_now: bool = False, outputs: Sequence[str] = (RECORDS, COUNTS)
                  ) -> list[StreamingQuery]:
    """Start the records and counts queries, or those named in `outputs`; each reads the
    topic with its own source."""
    def records() -> DataFrame:
        return with_lineage(read_stream(spark, source_options(settings)))

    def frame_of(name: str) -> DataFrame:
        if name == RECORDS:
            return drop_duplicate_lineage(records(), settings.dedup_horizon)
        if name == COUNTS:
            return windowed_key_counts(records(), settings.window, settings.lateness)
        raise ValueError(f"no output {name!r}: {RECORDS!r} or {COUNTS!r}")

    queries = []
    for name in outputs:
        frame = frame_of(name)
        writer = (frame.writeStream.queryName(f"kiln-{name}").format("parquet")
                  .outputMode("append")
                  .option("path", output_path(settings, name))
                  .option("checkpointLocation", str(Path(settings.checkpoint) / name)))
        if available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=settings.trigger_interval)
        queries.append(writer.start())
        log.info("started query kiln-%s: %s -> %s", name, settings.topics,
                 output_path(settings, name))
    return queries


def run_until_done(spark: SparkSession, queries: Sequence[StreamingQuery],
                   available_now: bool) -> int:
    """Wait for the queries (all of them to finish with --available-now, else for a stop
    signal or the first failure); stop the others; 0 if none failed."""
    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping the queries", signum)
        for query in queries:
            query.stop()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        if available_now:
            for query in queries:
                query.awaitTermination()
        else:
            spark.streams.awaitAnyTermination()
    except KeyboardInterrupt:
        log.info("interrupted: stopping the queries")
    except Exception as exc:  # a failed query; its error is logged below
        log.debug("a query ended with %r", exc)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for query in queries:
            if query.isActive:
                query.stop()
    failed = 0
    for query in queries:
        error = query.exception()
        if error is not None:
            failed += 1
            log.error("query %s failed: %s", query.name, error)
        progress = query.lastProgress
        if progress is not None:
            log.info("query %s: last batch %s, %s rows read in it, source offsets %s",
                     query.name, progress["batchId"], progress["numInputRows"],
                     progress["sources"][0]["endOffset"] if progress["sources"] else None)
    return 1 if failed else 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m spark_examples.hardened_stream",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers, HOST:PORT")
    parser.add_argument("--topic", required=True, help="hardened topic(s), comma-separated")
    parser.add_argument("--output", required=True, help="directory for the Parquet outputs")
    parser.add_argument("--checkpoint", required=True, help="directory for the checkpoints")
    parser.add_argument("--available-now", action="store_true",
                        help="read what is there now, then exit")
    parser.add_argument("--starting-offsets", default="earliest",
                        help="earliest, latest or JSON, for a new checkpoint (default earliest)")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=100_000,
                        help="records per micro-batch at most, 0 for no limit (default 100000)")
    parser.add_argument("--isolation-level", choices=("read_committed", "read_uncommitted"),
                        default="read_committed")
    parser.add_argument("--no-fail-on-data-loss", action="store_true",
                        help="read on when records were deleted before being read")
    parser.add_argument("--trigger-interval", default="5 seconds")
    parser.add_argument("--window", default="1 minute", help="count window (default 1 minute)")
    parser.add_argument("--lateness", default="10 minutes",
                        help="watermark delay of the counts (default 10 minutes)")
    parser.add_argument("--dedup-horizon", default="10 minutes",
                        help="how long after a record a copy of it is still recognised, in "
                             "processing time (default 10 minutes)")
    add_spark_arguments(parser)
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> StreamSettings:
    return StreamSettings(
        bootstrap=args.bootstrap, topics=args.topic, output=args.output,
        checkpoint=args.checkpoint, starting_offsets=args.starting_offsets,
        max_offsets_per_trigger=args.max_offsets_per_trigger or None,
        isolation_level=args.isolation_level,
        fail_on_data_loss=not args.no_fail_on_data_loss,
        trigger_interval=args.trigger_interval, window=args.window, lateness=args.lateness,
        dedup_horizon=args.dedup_horizon,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = settings_from(args)
    with job_session("kiln-hardened-stream", master=args.master,
                     conf={**JOB_CONF, **spark_conf(args.conf)}) as spark:
        queries = start_queries(spark, settings, available_now=args.available_now)
        return run_until_done(spark, queries, args.available_now)


if __name__ == "__main__":
    sys.exit(main())
