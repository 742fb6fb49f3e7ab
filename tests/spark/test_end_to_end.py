"""Producers -> Kiln -> hardened topic -> the streaming job -> Parquet, and the audit, checked
against what the producer was told: every acknowledged record exactly once, across a kill -9
of Kiln and a kill -9 of the Spark job (a `python -m spark_examples.hardened_stream` process)
in mid-stream, which is then resumed from its checkpoint (issue 5's target). Both jobs read
with Spark's Kafka source (the spark-sql-kafka connector from .jvm/spark).

A restarted Kiln hardens a partition only once the killed process's lease has run out (10 s),
so the producer's acknowledgements (acks=all: given once hardened) pause that long; it then
fences the partition, and the abort marker takes a Kafka offset that holds no record: the
job and the audit read across that gap.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_examples.audit import audit_options, run_audit
from spark_examples.hardened_stream import RECORDS, StreamSettings, start_queries
from tests.faults.kiln_process import KilnProcess
from tests.spark.records import (
    KeyedProducerLoop,
    Sent,
    create_topic,
    end_offsets,
    key_of,
    produce_records,
    seq_of,
    timestamp_of,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 2
WINDOW_MS = 1000
CLOSING_KEY = b"closing"


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class JobProcess:
    """`python -m spark_examples.hardened_stream` (a micro-batch every second) as a child
    process in its own session, so that SIGKILL takes its JVM along."""

    def __init__(self, settings: StreamSettings, log_path: Path) -> None:
        command = [
            sys.executable, "-m", "spark_examples.hardened_stream",
            "--bootstrap", settings.bootstrap, "--topic", settings.topics,
            "--output", settings.output, "--checkpoint", settings.checkpoint,
            "--trigger-interval", settings.trigger_interval,
            "--max-offsets-per-trigger", str(settings.max_offsets_per_trigger),
            "--window", settings.window, "--lateness", settings.lateness,
            "--master", "local[2]", "--conf", "spark.ui.enabled=false",
            "--conf", "spark.sql.shuffle.partitions=2",
        ]  # fmt: skip
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.commits = Path(settings.checkpoint) / RECORDS / "commits"

    def committed_batches(self) -> int:
        """Micro-batches of the records query that its sink committed."""
        if not self.commits.is_dir():
            return 0
        return sum(1 for f in self.commits.iterdir() if f.name.isdigit())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def kill(self) -> None:
        """SIGKILL to the job's process group (the Python driver and its JVM)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._log.close()


def close_windows(bootstrap: str, topic: str, after_seq: int) -> int:
    """One record five minutes of record time after the others, through Kiln: the counts'
    watermark (one minute behind) then passes every window of the test's records. Returns
    the Kiln offset the producer was told."""
    [offset] = produce_records(bootstrap, topic, [
        Sent(partition=0, value=b"closing", key=CLOSING_KEY,
             timestamp_ms=timestamp_of(after_seq) + 300_000)])
    return offset


def assert_in_kiln_order(rows: Sequence[tuple[int, int, int]]) -> None:
    """(partition, kafka_offset, kiln_offset): Kiln offsets rise along each partition."""
    for partition in range(PARTITIONS):
        along = [kiln for p, _, kiln in sorted(rows) if p == partition]
        backwards = [(a, b) for a, b in pairwise(along) if b <= a]
        assert not backwards, f"partition {partition}: kiln offsets not rising: {backwards[:5]}"


def test_every_acknowledged_record_reaches_parquet_once_across_kill9s(
        spark: SparkSession, kiln_process: KilnProcess,
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    settings = StreamSettings(
        bootstrap=kafka_bootstrap, topics=unique_topic, output=str(tmp_path / "output"),
        checkpoint=str(tmp_path / "checkpoint"), max_offsets_per_trigger=300,
        trigger_interval="1 second", window="1 second", lateness="1 minute")
    # Given Kiln, a two-partition topic, and a producer sending through Kiln
    kiln_process.start()
    create_topic(kiln_process.bootstrap, unique_topic, PARTITIONS)
    producer = KeyedProducerLoop(kiln_process.bootstrap, unique_topic, PARTITIONS, rate=300)
    producer.start()
    job: JobProcess | None = None
    try:
        assert producer.wait_for_acks(100, 30), f"nothing acknowledged: {producer.failed}"
        # ... and the streaming job reading the hardened topic, as a process of its own
        job = JobProcess(settings, tmp_path / "job.log")
        running = job
        wait_until(lambda: running.committed_batches() > 0 or not running.alive(), 120,
                   "the job to commit a micro-batch")
        assert job.alive(), job.log_tail()
        # When Kiln is killed with SIGKILL while records flow, and started again
        kiln_process.kill()
        kiln_process.start()
        acked = producer.acked_count()
        assert producer.wait_for_acks(acked + 300, 60), "no acknowledgements after the kill"
        # ... and the Spark job is killed with SIGKILL in mid-stream, the producer going on
        committed = job.committed_batches()
        wait_until(lambda: running.committed_batches() > committed + 1, 60,
                   "the job to commit micro-batches hardened after Kiln's restart")
        job.kill()
        assert producer.wait_for_acks(producer.acked_count() + 200, 30)
    finally:
        undelivered = producer.stop(flush_timeout_s=120)
        if job is not None:
            job.kill()
    assert undelivered == 0 and producer.error is None and not producer.failed
    closing_offset = close_windows(kiln_process.bootstrap, unique_topic, producer.sent)
    # ... and Kiln shuts down as planned (hardening what it holds), and the job is started
    # again from its checkpoint to read what is left (here, in the tests' session; in one
    # micro-batch, so that the closing record cannot make records of partition 1 late)
    assert kiln_process.terminate() == 0, kiln_process.log_tail()
    queries = start_queries(spark, replace(settings, max_offsets_per_trigger=None),
                            available_now=True)
    for query in queries:
        query.awaitTermination(180)
        assert query.exception() is None, query.exception()

    # Then the records output holds every acknowledged record exactly once, as sent
    output = spark.read.parquet(str(tmp_path / "output" / "records")).select(
        "partition", "kafka_offset", "kiln_offset", "kiln_header", "key", "value",
        F.unix_millis("timestamp").alias("timestamp")).collect()
    records = [r for r in output if r["key"] != CLOSING_KEY]
    seqs = [seq_of(r["value"]) for r in records]
    twice = sorted(s for s, n in Counter(seqs).items() if n > 1)
    assert not twice, f"{len(twice)} records written twice, first {twice[:10]}"
    told = producer.acked  # seq -> (partition, Kiln offset): a copy, taken once
    missing = sorted(set(told) - set(seqs))
    assert not missing, f"{len(missing)} acknowledged records missing, first {missing[:10]}"
    assert sorted(seqs) == list(range(producer.sent))
    # ... each with the Kiln offset the producer was told, whether the record carries it in a
    # kiln.offset header or as its Kafka offset (likely here: nothing consumes the topic
    # through Kiln, so Kiln drops no record and Kafka's offsets stay equal to Kiln's)
    wrong = [(seq_of(r["value"]), r) for r in records
             if (r["partition"], r["kiln_offset"]) != told[seq_of(r["value"])]
             or r["key"] != key_of(seq_of(r["value"]))
             or r["timestamp"] != timestamp_of(seq_of(r["value"]))]
    assert not wrong, f"records that differ from what was sent: {wrong[:3]}"
    assert [(r["partition"], r["kiln_offset"]) for r in output if r["key"] == CLOSING_KEY] == [
        (0, closing_offset)]
    assert_in_kiln_order([(r["partition"], r["kafka_offset"], r["kiln_offset"]) for r in output])
    # ... though each partition's Kafka offsets skip the restarted Kiln's fence marker(s)
    read = Counter(r["partition"] for r in output)
    markers = [end - read[p] for p, end in
               enumerate(end_offsets(kafka_bootstrap, unique_topic, PARTITIONS))]
    assert all(m >= 1 for m in markers), f"no fence marker in some partition: {markers}"
    # ... the counts output counts each record once per key and one-second window
    counts = {(r["window_start"], r["key"]): r["records"] for r in
              spark.read.parquet(str(tmp_path / "output" / "counts")).select(
                  F.unix_millis("window_start").alias("window_start"), "key", "records")
              .collect()}
    expected = Counter((timestamp_of(s) // WINDOW_MS * WINDOW_MS, key_of(s)) for s in seqs)
    assert counts == dict(expected)
    # ... and the audit of the hardened topic finds no gap and no duplicate
    audits = run_audit(spark, audit_options(kafka_bootstrap, unique_topic))
    per_partition = Counter(partition for partition, _ in told.values())
    per_partition[0] += 1  # the closing record
    # (and counts the records without a kiln.offset header as the job saw them)
    without_header = Counter(r["partition"] for r in output if not r["kiln_header"])
    assert [(a.partition, a.records, a.min_offset, a.max_offset, a.gap_count,
             a.duplicate_records, a.without_kiln_header) for a in audits] == [
        (p, per_partition[p], 0, per_partition[p] - 1, 0, 0, without_header[p])
        for p in range(PARTITIONS)]
