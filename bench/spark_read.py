"""How fast Spark's Kafka source (the spark-sql-kafka connector the jobs read with) and the
streaming job read a hardened topic, against a confluent-kafka consumer reading the same
topic straight from Kafka, in one run.

Fresh local services: Redis, Apache Kafka (KRaft, one node, from .jvm/kafka) and Kiln
(`python -m cli serve`). N records of 100 B are produced through Kiln (confluent-kafka,
acks=1) and hardened into a fresh topic (one partition by default); Kiln is then stopped,
and the topic is read from Kafka, from its earliest offset, by:

1. confluent   a confluent-kafka (librdkafka) consumer, assign mode, a Python loop over
               `consume()`; records/s from the first call to the last record.
2. spark       a local SparkSession (`local[2]`: one executor) with the connector from
               .jvm/spark (`spark_examples.session`), `Trigger.AvailableNow`,
               `includeHeaders=true`, no rate limit:
               - `source`: `readStream.format("kafka")` straight into Spark's `noop` sink
                 (the connector's rate);
               - `job`: the streaming job's records query (`hardened_stream.py`: lineage
                 decoded, duplicates dropped in RocksDB, Parquet with a checkpoint).
               Each is run once to warm the JVM up, then `--repeats` times; per run,
               records/s from `start()` until the query ends (`wall`, with the query's
               start-up) and over its micro-batches only (`batches`). Medians are reported.

Prints one JSON document on stdout and a table on stderr (`--json`: the JSON only). Spark,
the consumer, Kafka, Redis and (while producing) Kiln all share this machine's cores.

    python -m bench.spark_read               # 1,000,000 records, a few minutes
    python -m bench.spark_read --quick       # 200,000 records
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyspark
from confluent_kafka import OFFSET_BEGINNING, Consumer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from bench.produce import (
    KilnProcess,
    kiln_source,
    new_topic_name,
    produce_n,
    progress_log,
    publish,
    tool_versions,
    wait_hardened,
)
from cli.local_kafka import KAFKA_VERSION, LocalKafka
from cli.local_services import LocalRedis
from spark_examples.hardened_stream import JOB_CONF, RECORDS, StreamSettings, start_queries
from spark_examples.session import build_session, connector_package, read_stream

VALUE_BYTES = 100
HARDEN_DELAY_MS = 200


def hardened_topic(workdir: Path, bootstrap: str, records: int, partitions: int) -> str:
    """A fresh topic on Kafka at `bootstrap` holding `records` records of 100 B, produced
    through a Kiln (with a Redis of its own) that is stopped once all are hardened."""
    redis = LocalRedis().start()
    kiln: KilnProcess | None = None
    try:
        kiln = KilnProcess(redis.url, bootstrap, HARDEN_DELAY_MS, workdir=workdir)
        topic = new_topic_name("spark")
        admin = AdminClient({"bootstrap.servers": kiln.bootstrap, "log_level": 3})
        for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
            future.result(timeout=15)
        produced = produce_n(kiln.bootstrap, topic, records, b"x" * VALUE_BYTES, "1")
        if produced["errors"]:
            raise RuntimeError(f"producing failed: {produced['first_error']}")
        wait_hardened(bootstrap, topic, records, partitions)
        return topic
    finally:
        # The readers read Kafka alone; Kiln's and Redis' CPU is not needed any more.
        if kiln is not None:
            kiln.stop(timeout_s=30.0)
        redis.stop()


def confluent_read(bootstrap: str, topic: str, records: int, partitions: int
                   ) -> dict[str, Any]:
    """Every partition from its earliest offset with librdkafka (settings as
    bench/consume.py's)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}",
                         "enable.auto.commit": False, "log_level": 3,
                         "fetch.max.bytes": 52_428_800})
    consumer.assign([CkTopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    received = 0
    started = time.perf_counter()
    deadline = time.monotonic() + 600
    while received < records and time.monotonic() < deadline:
        received += sum(1 for m in consumer.consume(10_000, 0.5) if m.error() is None)
    seconds = time.perf_counter() - started
    consumer.close()
    return {"records": received, "seconds": round(seconds, 3),
            "records_per_s": round(received / seconds)}


def spark_run(spark: SparkSession, kind: str, bootstrap: str, topic: str, workdir: Path
              ) -> dict[str, Any]:
    """One AvailableNow run of the source alone (`source`) or of the job's records query
    (`job`), on a fresh checkpoint."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=workdir))
    settings = StreamSettings(bootstrap=bootstrap, topics=topic,
                              output=str(run_dir / "output"),
                              checkpoint=str(run_dir / "checkpoint"),
                              max_offsets_per_trigger=None)
    started = time.perf_counter()
    if kind == "source":
        options = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                   "startingOffsets": "earliest", "includeHeaders": "true"}
        query = (read_stream(spark, options).writeStream.format("noop")
                 .trigger(availableNow=True)
                 .option("checkpointLocation", settings.checkpoint).start())
    else:
        query = start_queries(spark, settings, available_now=True, outputs=[RECORDS])[0]
    query.awaitTermination()
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"{kind} query failed: {query.exception()}")
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    batch_s = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"records": rows, "wall_seconds": round(seconds, 3),
            "wall_records_per_s": round(rows / seconds),
            "batches": len(progress), "batch_seconds": round(batch_s, 3),
            "batch_records_per_s": round(rows / batch_s) if batch_s else None}


def bench_spark(args: argparse.Namespace, bootstrap: str, topic: str, workdir: Path,
                log: Callable[[str], None]) -> dict[str, Any]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    started = time.perf_counter()
    spark = build_session("kiln-bench-spark-read", master=args.master, conf={
        **JOB_CONF, "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    session_s = time.perf_counter() - started
    out: dict[str, Any] = {"master": args.master, "connector": connector_package(),
                           "session_start_seconds": round(session_s, 1)}
    try:
        for kind in ("source", "job"):
            spark_run(spark, kind, bootstrap, topic, workdir)  # warm-up
            runs = [spark_run(spark, kind, bootstrap, topic, workdir)
                    for _ in range(args.repeats)]
            if any(r["records"] != args.records for r in runs):
                raise RuntimeError(f"{kind}: read {[r['records'] for r in runs]} records, "
                                   f"expected {args.records}")
            out[kind] = {
                "runs": runs,
                "wall_records_per_s": round(statistics.median(
                    r["wall_records_per_s"] for r in runs)),
                "batch_records_per_s": round(statistics.median(
                    r["batch_records_per_s"] for r in runs)),
            }
            log(f"spark {kind}: {out[kind]['wall_records_per_s']:,} records/s (wall), "
                f"{out[kind]['batch_records_per_s']:,} in micro-batches")
    finally:
        spark.stop()
    return out


def run(args: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "kiln": kiln_source(),
        "tools": {**tool_versions(), "pyspark": pyspark.__version__, "kafka": KAFKA_VERSION},
        "records": args.records, "value_bytes": VALUE_BYTES, "partitions": args.partitions,
        "machine": {"cpus": os.cpu_count(), "load_average_1m": os.getloadavg()[0]},
    }
    kafka = LocalKafka().start()
    try:
        topic = hardened_topic(workdir, kafka.bootstrap, args.records, args.partitions)
        log(f"{args.records:,} records of {VALUE_BYTES} B hardened into {topic} "
            f"(Apache Kafka {KAFKA_VERSION})")
        confluent = confluent_read(kafka.bootstrap, topic, args.records, args.partitions)
        if confluent["records"] != args.records:
            raise RuntimeError(f"confluent-kafka read {confluent['records']} records, "
                               f"expected {args.records}")
        log(f"confluent-kafka consumer: {confluent['records_per_s']:,} records/s")
        doc["confluent_kafka"] = confluent
        doc["spark"] = bench_spark(args, kafka.bootstrap, topic, workdir, log)
    finally:
        kafka.stop()
    direct = doc["confluent_kafka"]["records_per_s"]
    doc["ratios"] = {
        f"spark_{kind}_{rate}_to_confluent": round(doc["spark"][kind][f"{rate}_records_per_s"]
                                                   / direct, 3)
        for kind in ("source", "job") for rate in ("wall", "batch")}
    doc["load_average_1m_after"] = os.getloadavg()[0]
    return doc


def table(doc: dict[str, Any]) -> str:
    direct = doc["confluent_kafka"]["records_per_s"]
    lines = [f"read {doc['records']:,} x {doc['value_bytes']} B from a hardened topic "
             f"({doc['partitions']} partition(s)) on Apache Kafka {doc['tools']['kafka']}, "
             f"{doc['machine']['cpus']} CPUs, load {doc['machine']['load_average_1m']:.1f} "
             f"before / {doc['load_average_1m_after']:.1f} after",
             f"  {'reader':52} {'records/s':>10} {'vs confluent':>13}"]

    def row(name: str, rate: int) -> None:
        lines.append(f"  {name:52} {rate:>10,} {rate / direct:>13.2f}")

    row("confluent-kafka consumer", direct)
    spark = doc["spark"]
    for kind, label in (("source", "Spark Kafka source -> noop"),
                        ("job", "hardened_stream records -> Parquet")):
        row(f"{label} (whole query)", spark[kind]["wall_records_per_s"])
        row(f"{label} (micro-batches)", spark[kind]["batch_records_per_s"])
    lines.append(f"  {spark['connector']}; SparkSession start "
                 f"{spark['session_start_seconds']} s (not counted)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_read", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="measured Spark runs each")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument("--quick", action="store_true", help="200,000 records, 2 repeats")
    parser.add_argument("--json", action="store_true", help="print only the JSON document")
    parser.add_argument("--output", type=Path, help="also write the JSON document here")
    args = parser.parse_args(argv)
    if args.quick:
        args.records, args.repeats = 200_000, 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = progress_log(args.json)

    with tempfile.TemporaryDirectory(prefix="kiln-bench-spark-") as workdir:
        doc = run(args, Path(workdir), log)
    publish(doc, args.output, args.json, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
