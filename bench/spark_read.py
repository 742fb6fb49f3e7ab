"""How fast the Spark streaming job reads a hardened topic with Kiln's compatible Kafka reader,
against plain Kafka consumers reading the same topic, in one run.

Fresh local services (Redis, a tansu broker, Kiln as `python -m cli serve`); N records of
100 B are produced through Kiln (confluent-kafka, acks=1) and hardened into a fresh topic
(one partition by default), then read back from the broker, from offset 0, by:

1. consumers    confluent-kafka (librdkafka) and kafka-python's KafkaConsumer, assign mode;
                records/s from the first poll to the last record.
2. spark        a local SparkSession (`local[2]`: one executor), Kiln's compatible reader,
                `Trigger.AvailableNow`, `includeHeaders=true`, no rate limit:
                - `source`: the stream straight into Spark's `noop` sink (the reader's rate);
                - `job`: the streaming job's records query (`hardened_stream.py`: lineage
                  decoded, duplicates dropped, Parquet with a checkpoint).
                Each is run once to warm the JVM and the Python workers, then `--repeats`
                times; per run, records/s from `start()` until the query ends (`wall`, with
                the query's start-up) and over its micro-batches only (`batches`).

Prints one JSON document on stdout and a table on stderr (`--json`: the JSON only). Spark,
the consumers, Kiln, Redis and the broker all share this machine's cores.

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
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition
from pyspark.sql import SparkSession

from bench.produce import (
    Stack,
    fetch_high_watermark,
    kiln_source,
    new_topic_name,
    produce_n,
    progress_log,
    publish,
    tool_versions,
)
from spark_examples.hardened_stream import JOB_CONF, RECORDS, StreamSettings, start_queries
from spark_examples.session import build_session, choose_reader

VALUE_BYTES = 100
HARDEN_DELAY_MS = 200
TARGET_RECORDS_PER_S = 100_000


def hardened_topic(stack: Stack, records: int, partitions: int) -> str:
    """A fresh topic with `records` records of 100 B produced through Kiln, all hardened."""
    assert stack.broker is not None
    topic = new_topic_name("spark")
    admin = AdminClient({"bootstrap.servers": stack.endpoint, "log_level": 3})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=15)
    produced = produce_n(stack.endpoint, topic, records, b"x" * VALUE_BYTES, "1")
    if produced["errors"]:
        raise RuntimeError(f"producing failed: {produced['first_error']}")
    deadline = time.monotonic() + 300
    while sum(fetch_high_watermark(stack.broker.bootstrap, topic, p)
              for p in range(partitions)) < records:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topic}: not all {records} records hardened in 300 s")
        time.sleep(0.2)
    return topic


def confluent_read(bootstrap: str, topic: str, records: int, partitions: int
                   ) -> dict[str, Any]:
    """Every partition from offset 0 with librdkafka (settings as bench/consume.py's)."""
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


def kafka_python_read(bootstrap: str, topic: str, records: int, partitions: int
                      ) -> dict[str, Any]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             group_id=None, fetch_max_bytes=52_428_800,
                             max_partition_fetch_bytes=8 * 1024 * 1024,
                             max_poll_records=100_000)
    tps = [KpTopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 0)
    received = 0
    started = time.perf_counter()
    deadline = time.monotonic() + 600
    while received < records and time.monotonic() < deadline:
        for batch in consumer.poll(1000).values():
            received += len(batch)
    seconds = time.perf_counter() - started
    consumer.close()
    return {"records": received, "seconds": round(seconds, 3),
            "records_per_s": round(received / seconds)}


def spark_run(spark: SparkSession, source: str, kind: str, bootstrap: str, topic: str,
              workdir: Path) -> dict[str, Any]:
    """One AvailableNow run of the source alone (`source`) or of the job's records query
    (`job`), on a fresh checkpoint."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=workdir))
    options = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
               "startingOffsets": "earliest", "includeHeaders": "true"}
    started = time.perf_counter()
    if kind == "source":
        query = (spark.readStream.format(source).options(**options).load()
                 .writeStream.format("noop").trigger(availableNow=True)
                 .option("checkpointLocation", str(run_dir / "checkpoint")).start())
    else:
        settings = StreamSettings(bootstrap=bootstrap, topics=topic,
                                  output=str(run_dir / "output"),
                                  checkpoint=str(run_dir / "checkpoint"),
                                  max_offsets_per_trigger=None)
        query = start_queries(spark, source, settings, available_now=True,
                              outputs=[RECORDS])[0]
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
    out: dict[str, Any] = {"master": args.master, "session_start_seconds": round(session_s, 1)}
    try:
        source = choose_reader(spark, "kiln")
        for kind in ("source", "job"):
            spark_run(spark, source, kind, bootstrap, topic, workdir)  # warm-up
            runs = [spark_run(spark, source, kind, bootstrap, topic, workdir)
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
        "tools": {**tool_versions(), "pyspark": pyspark.__version__},
        "records": args.records, "value_bytes": VALUE_BYTES, "partitions": args.partitions,
        "machine": {"cpus": os.cpu_count(), "load_average_1m": os.getloadavg()[0]},
    }
    stack = Stack.start(workdir, kiln_delay_ms=HARDEN_DELAY_MS)
    try:
        assert stack.broker is not None
        topic = hardened_topic(stack, args.records, args.partitions)
        bootstrap = stack.broker.bootstrap
        stack.stop_kiln()  # the readers read the broker; Kiln's CPU is not needed any more
        log(f"{args.records:,} records of {VALUE_BYTES} B hardened into {topic}")
        consumers = {"confluent_kafka": confluent_read(bootstrap, topic, args.records,
                                                       args.partitions)}
        log(f"confluent-kafka consumer: {consumers['confluent_kafka']['records_per_s']:,} "
            "records/s")
        consumers["kafka_python"] = kafka_python_read(bootstrap, topic, args.records,
                                                      args.partitions)
        log(f"kafka-python consumer: {consumers['kafka_python']['records_per_s']:,} records/s")
        doc["consumers"] = consumers
        doc["spark"] = bench_spark(args, bootstrap, topic, workdir, log)
    finally:
        stack.close()
    direct = doc["consumers"]["confluent_kafka"]["records_per_s"]
    doc["ratios"] = {
        f"spark_{kind}_{rate}_to_confluent": round(doc["spark"][kind][f"{rate}_records_per_s"]
                                                   / direct, 3)
        for kind in ("source", "job") for rate in ("wall", "batch")}
    doc["target_records_per_s"] = TARGET_RECORDS_PER_S
    doc["target_met"] = doc["spark"]["source"]["wall_records_per_s"] >= TARGET_RECORDS_PER_S
    doc["load_average_1m_after"] = os.getloadavg()[0]
    return doc


def table(doc: dict[str, Any]) -> str:
    direct = doc["consumers"]["confluent_kafka"]["records_per_s"]
    lines = [f"read {doc['records']:,} x {doc['value_bytes']} B from a hardened topic "
             f"({doc['partitions']} partition(s)), {doc['machine']['cpus']} CPUs, load "
             f"{doc['machine']['load_average_1m']:.1f} before / "
             f"{doc['load_average_1m_after']:.1f} after",
             f"  {'reader':44} {'records/s':>10} {'vs confluent':>13}"]

    def row(name: str, rate: int) -> None:
        lines.append(f"  {name:44} {rate:>10,} {rate / direct:>13.2f}")

    row("confluent-kafka consumer", direct)
    row("kafka-python KafkaConsumer", doc["consumers"]["kafka_python"]["records_per_s"])
    spark = doc["spark"]
    for kind, label in (("source", "Spark, compatible reader -> noop"),
                        ("job", "Spark, hardened_stream records -> Parquet")):
        row(f"{label} (wall)", spark[kind]["wall_records_per_s"])
        row(f"{label} (batches)", spark[kind]["batch_records_per_s"])
    lines.append(f"  SparkSession start {spark['session_start_seconds']} s (not counted); "
                 f"target {doc['target_records_per_s']:,} records/s "
                 f"{'met' if doc['target_met'] else 'NOT met'} by the reader (wall)")
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
