"""Producing through Kiln versus producing straight to the broker, side by side, in one run.

One broker per run (`--broker kafka|tansu`, see bench/brokers.py), warmed up before the
first measurement; every measurement gets a fresh topic with one partition on it, created
beforehand through the endpoint under test, and, for Kiln, a fresh Redis and a separate
`python -m cli serve` process. The producer is confluent-kafka (librdkafka), with identical
settings for Kiln and for the broker.

1. ingest     N records of 100 B and of 1 KB, acks=1, as fast as one producer goes. Kiln
              and direct runs alternate (Kiln, direct, Kiln, direct, ...), `--repeats` runs
              each; median, min and max of records/s and MB/s (of values); Kiln/direct.
              Kiln runs with a long fixed harden delay, so nothing becomes due during the
              run (the adaptive default would harden this unread topic at once).
              Afterwards Kiln's (and Redis') CPU is measured for `--idle-seconds` with the
              buffer full and nothing due, then Kiln is SIGKILLed (its Redis is thrown away;
              `--drain` sends SIGTERM instead and measures how long hardening everything takes).
2. latency    produce latency of every message (librdkafka's `msg.latency()`: produce() to
              delivery report) at a fixed paced rate, for Kiln acks=1, direct acks=1,
              direct acks=all, and (with Apache Kafka, unless `--no-cluster`) acks=all
              straight to a 3-node Kafka cluster that replicates the topic three ways
              (min.insync.replicas 2); p50/p99/p99.9/max over the pooled runs. Two scenarios:
              "batched" at half the median Kiln 100 B ingest rate with linger.ms=5, and
              "single" at 200 msg/s with linger.ms=0 (every message its own request).
3. end_to_end M records of 100 B through Kiln, as fast as the producer goes; time from the
              first produce() until the broker's high watermark (read from a Fetch
              response) reaches M. Twice: with a fixed 500 ms harden delay
              (`end_to_end`), and with the product's default adaptive delay
              (`end_to_end_adaptive`: a topic nobody reads through Kiln hardens at once).
4. memory     peak RSS (VmHWM) of the Kiln process and Redis used_memory_peak per Kiln run.

Prints one JSON document on stdout and a human-readable table on stderr (`--json`: the JSON
document only). The producer, Kiln, Redis and the broker all share this machine's cores.

    python -m bench.produce                  # full run, Apache Kafka, about 3-4 minutes
    python -m bench.produce --broker tansu   # the same against tansu, about 2 minutes
    python -m bench.produce --quick          # smaller counts, one run each, about 1.5 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
import redis
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CkTopicPartition

from bench.brokers import (
    Broker,
    add_broker_option,
    create_topic,
    start_broker,
    start_kafka_cluster,
)
from cli.local_kafka import KAFKA_VERSION, java_binary
from cli.local_redis_cluster import LocalRedisCluster
from cli.local_services import LocalRedis, free_port, tansu_binary
from storage.errors import StorageError
from storage.kafka.client import KafkaClient

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Identical for Kiln and the broker. delivery.report.only.error keeps the Python side out of
# the per-message path (errors are still counted); the bounded queue gives back-pressure.
INGEST_PRODUCER = {
    "linger.ms": 10,
    "batch.size": 1_000_000,
    "batch.num.messages": 100_000,
    "compression.type": "none",
    "queue.buffering.max.messages": 200_000,
    "queue.buffering.max.kbytes": 262_144,
    "enable.idempotence": False,
    "delivery.report.only.error": True,
    "log_level": 3,
}
# Latency: a delivery report for every message; linger.ms is set per scenario.
LATENCY_PRODUCER = {
    "batch.size": 1_000_000,
    "batch.num.messages": 100_000,
    "compression.type": "none",
    "queue.buffering.max.messages": 1_000_000,
    "enable.idempotence": False,
    "log_level": 3,
}


class BenchError(RuntimeError):
    pass


# --- processes ------------------------------------------------------------------------------

def proc_cpu_s(pid: int | Sequence[int | None] | None) -> float:
    """user + system CPU seconds of a process, or of several together (0 when gone)."""
    if pid is None:
        return 0.0
    if not isinstance(pid, int):
        return sum(proc_cpu_s(one) for one in pid)
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_status_kb(pid: int | None, key: str) -> int:
    if pid is None:
        return 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine_cpu_s() -> tuple[float, float]:
    """CPU seconds since boot over all cores, from /proc/stat: (user + nice + system, which
    processes are charged with; irq + softirq + steal, which no process is charged with)."""
    ticks = [int(f) for f in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    return (ticks[0] + ticks[1] + ticks[2]) / CLK_TCK, (ticks[5] + ticks[6] + ticks[7]) / CLK_TCK


class CpuWindow:
    """CPU used during a window by named processes (or groups of them: a cluster's nodes), by
    this process (the producer, with librdkafka's threads), and by everything else on the
    machine (other work competing)."""

    def __init__(self, **pids: int | Sequence[int | None] | None) -> None:
        self._pids = pids
        self._start = self._snapshot()

    def _snapshot(self) -> dict[str, float]:
        snap = {name: proc_cpu_s(pid) for name, pid in self._pids.items()}
        snap["producer"] = self_cpu_s()
        snap["machine"], snap["irq"] = machine_cpu_s()
        return snap

    def stop(self) -> dict[str, float]:
        end = self._snapshot()
        used = {k: end[k] - self._start[k] for k in end}
        machine, irq = used.pop("machine"), used.pop("irq")
        out = {f"{k}_cpu_s": round(v, 2) for k, v in used.items()}
        out["other_cpu_s"] = round(max(0.0, machine - sum(used.values())), 2)
        out["irq_cpu_s"] = round(irq, 2)
        return out


class KilnProcess:
    """`kiln serve` as a child process in its own session, logging to a file."""

    def __init__(self, redis_url: str, kafka_bootstrap: str, delay_ms: int, *,
                 workdir: Path, delay_policy: str = "fixed", workers: int = 1,
                 extra_args: Sequence[str] = (), listeners: Sequence[str] = ()) -> None:
        # `listeners`: the names of that many listeners (each PROTOCOL by its name) on
        # consecutive ports from `port`, instead of one plaintext `--listen`.
        self.port = free_ports(max(workers, len(listeners)))
        self.workers = workers
        self.log_path = workdir / f"kiln-{self.port}.log"
        where = (["--listeners", ",".join(f"{name}://127.0.0.1:{self.port + i}"
                                          for i, name in enumerate(listeners))]
                 if listeners else ["--listen", f"127.0.0.1:{self.port}"])
        cmd = [sys.executable, "-m", "cli", "serve", "--workers", str(workers),
               *where, "--redis-url", redis_url,
               "--kafka-bootstrap", kafka_bootstrap, "--harden-delay-ms", str(delay_ms),
               "--delay-policy", delay_policy, *extra_args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
        self._log = self.log_path.open("wb")
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            cwd=REPO, env=env, start_new_session=True)
        self.peak_rss_kb = 0
        try:
            self._wait_ready(30.0)
        except BaseException:
            self.stop(kill=True)
            raise

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def worker_pids(self) -> list[int | None]:
        """The node processes: this one, or the workers its supervisor started."""
        if self.workers == 1:
            return [self.pid]
        return [int(m) for m in re.findall(r"worker \d+ started \(pid (\d+)\)",
                                           self.log_text())[-self.workers:]]

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.log_text()
            if text.count("Kiln ready") >= self.workers:
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise BenchError(f"kiln exited with {self.proc.returncode} before it was ready:"
                                 f"\n{text[-3000:]}")
            time.sleep(0.02)
        raise BenchError(f"kiln not ready within {timeout_s}s:\n{self.log_text()[-3000:]}")

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def problems(self) -> list[str]:
        """Log lines at WARNING or above, and first lines of tracebacks/errors."""
        out = []
        for line in self.log_text().splitlines():
            if (" WARNING " in line or " ERROR " in line or " CRITICAL " in line
                    or line.startswith(("Error:", "Traceback"))):
                out.append(line.strip()[:300])
        return out

    def sample_rss(self) -> int:
        self.peak_rss_kb = max(self.peak_rss_kb, proc_status_kb(self.pid, "VmHWM"))
        return self.peak_rss_kb

    def stop(self, *, kill: bool = False, timeout_s: float = 10.0) -> tuple[int | None, float]:
        """SIGKILL, or SIGTERM (Kiln then hardens what is buffered and exits) with SIGKILL
        after `timeout_s`. Returns (exit code, seconds it took); samples peak RSS meanwhile."""
        proc = self.proc
        if proc is None:
            return None, 0.0
        started = time.perf_counter()
        if proc.poll() is None:
            self.sample_rss()
            proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None and time.monotonic() < deadline:
                self.sample_rss()
                time.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
        code = proc.wait()
        self.proc = None
        self._log.close()
        return code, time.perf_counter() - started


@dataclass
class Stack:
    """One measurement's endpoint: a broker, with a fresh Redis and Kiln in front of it when
    `kiln_delay_ms` is given. `close()` stops by PID what the stack started: Kiln and Redis,
    and the broker only when none was passed in (a bench's broker outlives its stacks)."""

    workdir: Path
    broker: Broker
    owns_broker: bool = False
    redis: LocalRedis | LocalRedisCluster | None = None
    kiln: KilnProcess | None = None
    kiln_exit: tuple[int | None, float] | None = None
    kiln_problems: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, workdir: Path, broker: Broker | None = None, *, kiln_delay_ms: int | None,
              kiln_delay_policy: str = "fixed", kiln_workers: int = 1,
              redis_cluster: bool = False, kiln_args: Sequence[str] = ()) -> Stack:
        stack = cls(workdir, broker or start_broker(), owns_broker=broker is None)
        try:
            if kiln_delay_ms is not None:
                stack.redis = (LocalRedisCluster() if redis_cluster else LocalRedis()).start()
                stack.kiln = KilnProcess(stack.redis.url, stack.broker.bootstrap, kiln_delay_ms,
                                         workdir=workdir, delay_policy=kiln_delay_policy,
                                         workers=kiln_workers, extra_args=kiln_args)
        except BaseException:
            stack.close()
            raise
        return stack

    @property
    def endpoint(self) -> str:
        return self.kiln.bootstrap if self.kiln is not None else self.broker.bootstrap

    @property
    def redis_pids(self) -> list[int | None]:
        """The Redis server process (every server of a Redis Cluster)."""
        if isinstance(self.redis, LocalRedisCluster):
            return [server.pid for server in self.redis.servers]
        return [] if self.redis is None else [self.redis.pid]

    def stop_kiln(self, *, kill: bool = False, timeout_s: float = 10.0
                  ) -> tuple[int | None, float]:
        if self.kiln is not None and self.kiln_exit is None:
            self.kiln_exit = self.kiln.stop(kill=kill, timeout_s=timeout_s)
            self.kiln_problems = self.kiln.problems()
        return self.kiln_exit or (None, 0.0)

    def close(self) -> None:
        try:
            self.stop_kiln(timeout_s=5.0)
        finally:
            if self.redis is not None:
                self.redis.stop()
            if self.owns_broker:
                self.broker.stop()


@contextlib.contextmanager
def stack_with_topic(workdir: Path, broker: Broker, kind: str, *, kiln_delay_ms: int | None,
                     kiln_delay_policy: str = "fixed", kiln_workers: int = 1,
                     partitions: int = 1, redis_cluster: bool = False,
                     kiln_args: Sequence[str] = ()) -> Iterator[tuple[Stack, str]]:
    """A started Stack and a fresh topic `bench-{kind}-…` created through its endpoint,
    replicated as `broker` replicates; the stack is closed on the way out."""
    stack = Stack.start(workdir, broker, kiln_delay_ms=kiln_delay_ms,
                        kiln_delay_policy=kiln_delay_policy, kiln_workers=kiln_workers,
                        redis_cluster=redis_cluster, kiln_args=kiln_args)
    try:
        topic = new_topic_name(kind)
        create_topic(stack.endpoint, topic, broker.replication_factor, partitions)
        yield stack, topic
    finally:
        stack.close()


# --- Kafka helpers --------------------------------------------------------------------------

def fetch_high_watermark(bootstrap: str, topic: str, partition: int = 0, offset: int = 0) -> int:
    """The partition's high watermark as a Fetch response reports it (tansu 0.6 answers
    ListOffsets LATEST wrongly). Fetching at `offset` ≤ the watermark keeps the answer small
    when `offset` is close to it."""
    async def fetch() -> int:
        client = KafkaClient(bootstrap, client_id="kiln-bench", connect_timeout=10,
                             request_timeout=10)
        try:
            return (await client.fetch(topic, partition, offset, max_bytes=1)).high_watermark
        finally:
            await client.close()

    return asyncio.run(fetch())


def wait_hardened(bootstrap: str, topic: str, count: int, partitions: int = 1,
                  timeout_s: float = 300) -> None:
    """Until the topic's partitions on the broker at `bootstrap` hold `count` records."""
    deadline = time.monotonic() + timeout_s
    while sum(fetch_high_watermark(bootstrap, topic, p) for p in range(partitions)) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topic}: not all {count} records hardened in {timeout_s}s")
        time.sleep(0.2)


def confluent_watermark(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                         "log_level": 3})
    try:
        return int(consumer.get_watermark_offsets(CkTopicPartition(topic, 0), timeout=10,
                                                  cached=False)[1])
    finally:
        consumer.close()


def produce_n(bootstrap: str, topic: str, count: int, value: bytes, acks: str,
              client: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Produce `count` copies of `value` as fast as possible; the clock runs from the first
    produce() to the end of flush() (connection and metadata are set up before). `client`:
    more producer settings (TLS)."""
    errors: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, **INGEST_PRODUCER,
                         **(client or {}),
                         "on_delivery": lambda err, _msg: errors.append(err)})
    producer.list_topics(topic, timeout=10)
    produce, poll = producer.produce, producer.poll
    cpu0 = self_cpu_s()
    started = time.perf_counter()
    sent = 0
    while sent < count:
        try:
            for _ in range(count - sent):
                produce(topic, value)
                sent += 1
        except BufferError:  # queue full: wait 1 ms (librdkafka's shortest non-spinning wait)
            poll(0.001)
    left = producer.flush(120)
    seconds = time.perf_counter() - started
    cpu = self_cpu_s() - cpu0
    if left:
        errors.append(f"{left} messages not delivered within 120 s")
    return {"seconds": seconds, "errors": len(errors),
            "first_error": str(errors[0]) if errors else None, "client_cpu_s": cpu}


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def latency_stats(lat: list[float]) -> dict[str, Any]:
    """Percentiles of latencies in ms (sorted in place)."""
    lat.sort()
    return {
        "samples": len(lat),
        "p50_ms": round(percentile(lat, 0.50), 3), "p99_ms": round(percentile(lat, 0.99), 3),
        "p999_ms": round(percentile(lat, 0.999), 3), "max_ms": round(lat[-1], 3) if lat else None,
        "mean_ms": round(statistics.fmean(lat), 3) if lat else None,
    }


def paced_latency(bootstrap: str, topic: str, acks: str, rate: float, seconds: float,
                  value: bytes, linger_ms: int) -> tuple[dict[str, Any], list[float]]:
    """Send at `rate` messages/s for `seconds` (what is due every millisecond or so, at most
    4 ms worth at once), recording each message's produce()-to-delivery-report latency."""
    samples: list[float] = []
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            samples.append(msg.latency())
        else:
            errors.append(err)

    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, **LATENCY_PRODUCER,
                         "linger.ms": linger_ms, "on_delivery": on_delivery})
    producer.list_topics(topic, timeout=10)
    for _ in range(100):  # warm up: connection, first batches
        producer.produce(topic, value)
    producer.flush(10)
    samples.clear()
    produce, poll = producer.produce, producer.poll
    started = time.perf_counter()
    end = started + seconds
    sent = 0
    max_burst = max(1, int(rate / 1000))
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        due = min(int((now - started) * rate) - sent, 4 * max_burst)
        for _ in range(due):
            produce(topic, value)
        sent += max(due, 0)
        # librdkafka counts the timeout in whole milliseconds: 1 ms is the shortest wait
        # that does not spin; poll() returns early when a delivery report arrives.
        poll(0.001 if due < max_burst else 0)
    elapsed = time.perf_counter() - started
    producer.flush(30)
    lat = [s * 1000 for s in samples]
    return {
        "achieved_rate": round(sent / elapsed), "seconds": round(elapsed, 2),
        "errors": len(errors), "first_error": str(errors[0]) if errors else None,
        **latency_stats(list(lat)),
    }, lat


# --- the measurements -----------------------------------------------------------------------

def free_ports(count: int) -> int:
    """A free port followed by `count - 1` free ones (a Kiln with that many workers)."""
    for _ in range(100):
        port = free_port()
        try:
            for extra in range(1, count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port + extra))
        except OSError:
            continue
        return port
    raise BenchError(f"no {count} consecutive free ports")


def new_topic_name(kind: str) -> str:
    return f"bench-{kind}-{uuid.uuid4().hex[:10]}"


def redis_memory(url: str) -> dict[str, int]:
    client = redis.Redis.from_url(url)
    try:
        info = client.info("memory")
        return {"used_memory": int(info["used_memory"]),
                "used_memory_peak": int(info["used_memory_peak"])}
    finally:
        client.close()


def ingest_once(target: str, count: int, size: int, args: argparse.Namespace, workdir: Path,
                broker: Broker, check_watermarks: bool = False) -> dict[str, Any]:
    value = bytes(size)
    via_kiln = target == "kiln"
    delay = args.ingest_delay_ms if via_kiln else None
    with stack_with_topic(workdir, broker, target, kiln_delay_ms=delay) as (stack, topic):
        redis_pid = stack.redis_pids[0] if stack.redis_pids else None
        window = (CpuWindow(kiln=stack.kiln.pid, broker=broker.pids, redis=redis_pid)
                  if stack.kiln else CpuWindow(broker=broker.pids))
        result = produce_n(stack.endpoint, topic, count, value, "1")
        cpu = window.stop()
        seconds = result["seconds"]
        run: dict[str, Any] = {
            "target": target, "value_bytes": size, "records": count,
            "seconds": round(seconds, 3),
            "records_per_s": round(count / seconds),
            "mb_per_s": round(count * size / seconds / 1e6, 2),
            "delivery_errors": result["errors"], "first_error": result["first_error"],
            **cpu,
        }
        if via_kiln:
            assert stack.kiln is not None and stack.redis is not None
            run["kiln_cpu_us_per_record"] = round(cpu["kiln_cpu_s"] / count * 1e6, 2)
            run["kiln_peak_rss_mb_ingest"] = round(stack.kiln.sample_rss() / 1024, 1)
            memory = redis_memory(stack.redis.url)
            run["redis_used_memory_mb"] = round(memory["used_memory"] / 2**20, 1)
            run["redis_used_memory_peak_mb"] = round(memory["used_memory_peak"] / 2**20, 1)
            # What the idle Kiln costs while the buffer is full and nothing is due yet.
            k0, r0 = proc_cpu_s(stack.kiln.pid), proc_cpu_s(redis_pid)
            time.sleep(args.idle_seconds)
            run["kiln_idle_cpu_pct"] = round(
                (proc_cpu_s(stack.kiln.pid) - k0) / args.idle_seconds * 100)
            run["redis_idle_cpu_pct"] = round(
                (proc_cpu_s(redis_pid) - r0) / args.idle_seconds * 100)
            if args.drain:
                # SIGTERM: Kiln hardens everything buffered (ignoring the delay), then exits.
                code, drain_s = stack.stop_kiln(timeout_s=args.drain_timeout)
                hardened = fetch_high_watermark(broker.bootstrap, topic)
                run["drain"] = {"exit_code": code, "seconds": round(drain_s, 2),
                                "hardened": hardened, "complete": hardened == count}
            else:
                # The buffered records go with this throwaway Redis; hardening is measured
                # in end_to_end.
                stack.stop_kiln(kill=True)
            run["kiln_peak_rss_mb"] = round(stack.kiln.peak_rss_kb / 1024, 1)
            run["kiln_log_problems"] = stack.kiln_problems[:10]
            run["ok"] = result["errors"] == 0 and (not args.drain or run["drain"]["complete"])
        else:
            high = fetch_high_watermark(broker.bootstrap, topic)
            run["broker_high_watermark"] = high
            run["ok"] = result["errors"] == 0 and high == count
            if check_watermarks:
                run["watermark_check"] = {
                    "expected": count, "fetch_high_watermark": high,
                    "confluent_get_watermark_offsets_uncached": confluent_watermark(
                        broker.bootstrap, topic),
                }
        return run


def summarize(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [r[key] for r in runs]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def bench_ingest(args: argparse.Namespace, workdir: Path, broker: Broker,
                 log: Callable[[str], None]) -> list[dict[str, Any]]:
    out = []
    first = True
    for size, count in ((100, args.records), (1024, args.records_1k)):
        runs: dict[str, list[dict[str, Any]]] = {"kiln": [], "direct": []}
        for repeat in range(args.repeats):
            for target in ("kiln", "direct"):
                run = ingest_once(target, count, size, args, workdir, broker,
                                  check_watermarks=first and target == "direct")
                if target == "direct":
                    first = False
                runs[target].append(run)
                log(f"ingest {size:>5} B {target:6} #{repeat + 1}: {run['records_per_s']:>10,} "
                    f"rec/s {run['mb_per_s']:>7.1f} MB/s{'' if run['ok'] else '  NOT OK'}")
        sides: dict[str, dict[str, Any]] = {
            target: {"records_per_s": summarize(target_runs, "records_per_s"),
                     "mb_per_s": summarize(target_runs, "mb_per_s"), "runs": target_runs}
            for target, target_runs in runs.items()}
        kiln_rate, direct_rate = (sides[t]["records_per_s"]["median"] for t in ("kiln", "direct"))
        out.append({
            "value_bytes": size, "records": count, "repeats": args.repeats, **sides,
            "ratio_kiln_to_direct": round(kiln_rate / direct_rate, 2),
            "all_ok": all(r["ok"] for r in runs["kiln"] + runs["direct"]),
        })
    return out


@dataclass(frozen=True, slots=True)
class LatencyConfig:
    name: str
    via_kiln: bool
    broker: Broker
    acks: str


def latency_once(args: argparse.Namespace, workdir: Path, config: LatencyConfig,
                 running: dict[str, Broker], rate: float, linger_ms: int, seconds: float
                 ) -> tuple[dict[str, Any], list[float]]:
    """One paced run; `running`: every broker the bench has running (named as in the CPU
    figures), idle ones too, whose CPU is counted."""
    delay = args.ingest_delay_ms if config.via_kiln else None
    with stack_with_topic(workdir, config.broker, config.name.replace("_", "-"),
                          kiln_delay_ms=delay) as (stack, topic):
        window = CpuWindow(kiln=stack.kiln.pid if stack.kiln else None,
                           redis=stack.redis.pid if stack.redis else None,
                           **{role: b.pids for role, b in running.items()})
        result, samples = paced_latency(stack.endpoint, topic, config.acks, rate, seconds,
                                        bytes(100), linger_ms)
        result.update(window.stop())
        if stack.kiln is not None:
            stack.stop_kiln(kill=True)
            result["kiln_log_problems"] = stack.kiln_problems[:10]
        return result, samples


def bench_latency(args: argparse.Namespace, workdir: Path, configs: list[LatencyConfig],
                  running: dict[str, Broker], rate: float, linger_ms: int, seconds: float,
                  log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Each configuration `--latency-repeats` times, alternating; percentiles over the pooled
    samples of its runs, and each run's own figures."""
    pooled: dict[str, list[float]] = {config.name: [] for config in configs}
    runs: dict[str, list[dict[str, Any]]] = {config.name: [] for config in configs}
    for repeat in range(args.latency_repeats):
        for config in configs:
            result, samples = latency_once(args, workdir, config, running, rate, linger_ms,
                                           seconds)
            pooled[config.name] += samples
            runs[config.name].append(result)
            log(f"latency {config.name:15} #{repeat + 1} @{result['achieved_rate']:>8,}/s "
                f"linger {linger_ms}: p50 {result['p50_ms']} p99 {result['p99_ms']} "
                f"p99.9 {result['p999_ms']} ms")
    return [{"name": config.name, "acks": config.acks, "broker": config.broker.description,
             "achieved_rate": round(statistics.fmean(r["achieved_rate"]
                                                     for r in runs[config.name])),
             "errors": sum(r["errors"] for r in runs[config.name]),
             **latency_stats(pooled[config.name]), "runs": runs[config.name]}
            for config in configs]


def bench_end_to_end(args: argparse.Namespace, workdir: Path, broker: Broker,
                     log: Callable[[str], None], delay_policy: str) -> dict[str, Any]:
    """Produce `count` records through Kiln (short delay) as fast as possible; a second
    thread reads the broker's high watermark every 100 ms until all of them are there."""
    count = args.e2e_records
    with stack_with_topic(workdir, broker, "e2e", kiln_delay_ms=args.e2e_delay_ms,
                          kiln_delay_policy=delay_policy) as (stack, topic):
        assert stack.kiln is not None and stack.redis is not None
        kiln, broker_bootstrap = stack.kiln, broker.bootstrap
        window = CpuWindow(kiln=kiln.pid, redis=stack.redis.pid, broker=broker.pids)
        timeline: list[tuple[float, int]] = []
        finished = threading.Event()
        started = time.perf_counter()

        def watch() -> None:
            high = 0
            deadline = started + args.e2e_timeout
            while high < count and time.perf_counter() < deadline and not finished.is_set():
                with contextlib.suppress(StorageError):
                    high = fetch_high_watermark(broker_bootstrap, topic, offset=high)
                timeline.append((time.perf_counter() - started, high))
                kiln.sample_rss()
                if high < count:
                    time.sleep(0.1)
            finished.set()

        watcher = threading.Thread(target=watch, name="bench-watermark", daemon=True)
        watcher.start()
        result = produce_n(stack.endpoint, topic, count, bytes(100), "1")
        produced_s = time.perf_counter() - started
        hardened_at_produce_end = timeline[-1][1] if timeline else 0
        finished.wait(args.e2e_timeout + 5)
        finished.set()
        watcher.join(5)
        done_s, high = timeline[-1] if timeline else (produced_s, 0)
        cpu = window.stop()
        memory = redis_memory(stack.redis.url)
        code, stop_s = stack.stop_kiln(timeout_s=30)
        every = max(1, len(timeline) // 40)
        out = {
            "records": count, "value_bytes": 100, "delay_policy": delay_policy,
            "harden_delay_ms": args.e2e_delay_ms if delay_policy == "fixed" else None,
            "produce_seconds": round(produced_s, 3),
            "produce_records_per_s": round(count / produced_s),
            "hardened_at_produce_end": hardened_at_produce_end,
            "hardened": high,
            "seconds_to_all_hardened": round(done_s, 3),
            "end_to_end_records_per_s": round(count / done_s) if high >= count else None,
            "delivery_errors": result["errors"],
            **cpu,
            "kiln_peak_rss_mb": round(kiln.peak_rss_kb / 1024, 1),
            "redis_used_memory_peak_mb": round(memory["used_memory_peak"] / 2**20, 1),
            "kiln_sigterm_exit_code": code, "kiln_sigterm_seconds": round(stop_s, 2),
            "hardened_timeline": [[round(t, 2), h] for t, h in timeline[::every]
                                  + ([timeline[-1]] if timeline else [])],
            "kiln_log_problems": stack.kiln_problems[:10],
            "ok": high == count and result["errors"] == 0,
        }
        log(f"end-to-end ({delay_policy}): {high:,} of {count:,} records hardened after "
            f"{done_s:.2f} s "
            f"({out['end_to_end_records_per_s'] or 0:,}/s; produce alone {produced_s:.2f} s)")
        return out


# --- output ---------------------------------------------------------------------------------

def tool_versions() -> dict[str, str]:
    ck_version: Any = confluent_kafka.version()  # a str here; documented as (str, int)
    versions = {"python": platform.python_version(),
                "confluent_kafka": str(ck_version[0] if isinstance(ck_version, tuple)
                                       else ck_version),
                "librdkafka": confluent_kafka.libversion()[0],
                "redis_py": redis.__version__}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        line = subprocess.run(["redis-server", "--version"], capture_output=True, text=True,
                              timeout=10).stdout
        versions["redis_server"] = line.split("v=")[1].split()[0] if "v=" in line else line
    with contextlib.suppress(OSError, subprocess.SubprocessError, RuntimeError):
        line = subprocess.run([str(tansu_binary()), "--version"], capture_output=True,
                              text=True, timeout=10).stdout
        versions["tansu"] = line.split()[-1] if line.strip() else "?"
    versions["kafka"] = KAFKA_VERSION
    with contextlib.suppress(OSError, subprocess.SubprocessError, RuntimeError):
        line = subprocess.run([java_binary(), "-version"], capture_output=True, text=True,
                              timeout=10).stderr
        versions["java"] = line.split('"')[1] if '"' in line else line.strip()
    return versions


def kiln_source() -> dict[str, Any]:
    """The commit measured, and whether the working tree differed from it."""
    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    try:
        return {"commit": git("rev-parse", "--short", "HEAD"),
                "uncommitted_changes": bool(git("status", "--porcelain", "--", "proxy", "storage",
                                                "cli"))}
    except (OSError, subprocess.SubprocessError):
        return {}


def fmt(values: list[Any]) -> str:
    return "/".join(str(v) for v in values)


def table(doc: dict[str, Any]) -> str:
    lines = [f"{doc['machine']['note']}", ""]
    lines.append(f"{'ingest (acks=1)':18} {'Kiln rec/s':>11} {'MB/s':>7} {'direct rec/s':>13} "
                 f"{'MB/s':>7} {'Kiln/direct':>12}   Kiln min..max / direct min..max")
    for row in doc["ingest"]:
        k, d = row["kiln"], row["direct"]
        lines.append(
            f"{row['records']:>9,} x {row['value_bytes']:>4} B"
            f" {k['records_per_s']['median']:>11,.0f}"
            f" {k['mb_per_s']['median']:>7.1f} {d['records_per_s']['median']:>13,.0f}"
            f" {d['mb_per_s']['median']:>7.1f} {row['ratio_kiln_to_direct']:>12.2f}   "
            f"{k['records_per_s']['min']:,}..{k['records_per_s']['max']:,} / "
            f"{d['records_per_s']['min']:,}..{d['records_per_s']['max']:,}"
            f"{'' if row['all_ok'] else '   SOME RUNS NOT OK'}")
    lines.append("")
    for block in doc["latency"]:
        lines.append(f"latency, {block['scenario']}: {block['target_rate']:,} msg/s target, "
                     f"100 B, linger.ms={block['linger_ms']}, {block['repeats']} x "
                     f"{block['seconds_per_run']:g} s per config, pooled")
        lines.append(f"  {'':16} {'achieved/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9}"
                     f" {'max ms':>8}")
        for r in block["runs"]:
            lines.append(f"  {r['name']:16} {r['achieved_rate']:>10,} {r['p50_ms']:>8.3f}"
                         f" {r['p99_ms']:>8.3f} {r['p999_ms']:>9.3f} {r['max_ms'] or 0:>8.3f}")
        t = block["target"]
        lines.append(f"  Kiln acks=1 p99 {t['kiln_acks1_p99_ms']} ms vs direct acks=all p99 "
                     f"{t['direct_acksall_p99_ms']} ms (ratio {t['ratio']})")
        if t.get("cluster_acksall_p99_ms") is not None:
            lines.append(f"  Kiln acks=1 p99 vs 3-node cluster acks=all p99 "
                         f"{t['cluster_acksall_p99_ms']} ms (ratio {t['ratio_to_cluster']})")
    lines.append("")
    for e in (doc["end_to_end"], doc["end_to_end_adaptive"]):
        delay = (f"fixed delay {e['harden_delay_ms']} ms" if e["delay_policy"] == "fixed"
                 else "adaptive delay")
        lines.append(f"end-to-end: {e['records']:,} x 100 B, {delay}: "
                     f"{e['hardened']:,} hardened after {e['seconds_to_all_hardened']} s = "
                     f"{e['end_to_end_records_per_s'] or 0:,} rec/s "
                     f"({e['ratio_to_direct_ingest']} of direct ingest); produce alone "
                     f"{e['produce_records_per_s']:,} rec/s")
    m = doc["memory"]
    lines.append(f"memory: Kiln peak RSS {m['kiln_peak_rss_mb_max']} MB, Redis used_memory_peak "
                 f"{m['redis_used_memory_peak_mb_max']} MB (max over Kiln ingest runs)")
    for row in doc["ingest"]:
        runs = row["kiln"]["runs"]
        lines.append(f"  {row['value_bytes']:>4} B: Kiln CPU {fmt([r['kiln_cpu_s'] for r in runs])}"
                     f" s, Redis CPU {fmt([r['redis_cpu_s'] for r in runs])} s per run; idle "
                     f"after the run: Kiln {fmt([r['kiln_idle_cpu_pct'] for r in runs])} %, "
                     f"Redis {fmt([r['redis_idle_cpu_pct'] for r in runs])} % CPU")
    o = doc["other_load"]
    lines.append(f"other processes used {o['total_cpu_s']} CPU-s during the "
                 f"{o['measured_seconds']} s measured (max {o['max_in_one_window_cpu_s']} in one "
                 f"run)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts, one repeat")
    parser.add_argument("--json", action="store_true", help="print only the JSON document")
    parser.add_argument("--output", type=Path, help="also write the JSON document here")
    add_broker_option(parser)
    parser.add_argument("--no-cluster", action="store_true",
                        help="leave out the latency runs against a 3-node Apache Kafka cluster "
                             "(always left out with --broker tansu)")
    parser.add_argument("--records", type=int, help="100-byte records per ingest run")
    parser.add_argument("--records-1k", type=int, help="1 KB records per ingest run")
    parser.add_argument("--repeats", type=int, help="runs per ingest measurement")
    parser.add_argument("--ingest-delay-ms", type=int, default=60_000,
                        help="Kiln harden delay during ingest and latency runs")
    parser.add_argument("--idle-seconds", type=float, default=1.0,
                        help="after each Kiln ingest run, CPU is measured this long")
    parser.add_argument("--latency-seconds", type=float, help="per batched latency run")
    parser.add_argument("--latency-repeats", type=int, help="runs per latency configuration")
    parser.add_argument("--latency-rate", type=float,
                        help="batched latency rate (msg/s); default: half the median Kiln "
                             "100 B ingest rate")
    parser.add_argument("--latency-linger-ms", type=int, default=5,
                        help="linger.ms of the batched latency runs (librdkafka's default)")
    parser.add_argument("--single-rate", type=float, default=200,
                        help="rate of the single-message latency runs, linger.ms=0 "
                             "(0: skip them)")
    parser.add_argument("--single-seconds", type=float, help="per single-message run")
    parser.add_argument("--e2e-records", type=int, help="records of the end-to-end run")
    parser.add_argument("--e2e-delay-ms", type=int, default=500)
    parser.add_argument("--e2e-timeout", type=float, default=120.0)
    parser.add_argument("--drain", action="store_true",
                        help="end each Kiln ingest run with SIGTERM and measure the drain "
                             "(Kiln hardens everything buffered) instead of SIGKILL")
    parser.add_argument("--drain-timeout", type=float, default=90.0)
    parser.add_argument("--keep-logs", action="store_true", help="keep Kiln's log files")
    args = parser.parse_args(argv)
    shown = list(sys.argv[1:] if argv is None else argv)
    for i, arg in enumerate(shown):  # keep file names out of the recorded command
        if arg == "--output" and i + 1 < len(shown):
            shown[i + 1] = "FILE"
        elif arg.startswith("--output="):
            shown[i] = "--output=FILE"
    args.argv = shown
    quick = {"records": 200_000, "records_1k": 40_000, "repeats": 1, "latency_seconds": 2.0,
             "single_seconds": 3.0, "latency_repeats": 1, "e2e_records": 200_000}
    defaults = (quick if args.quick else
                {"records": 1_000_000, "records_1k": 200_000, "repeats": 3,
                 "latency_seconds": 3.0, "single_seconds": 5.0, "latency_repeats": 2,
                 "e2e_records": 1_000_000})
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def run(args: argparse.Namespace, workdir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    started = time.time()
    log(f"starting the broker ({args.broker}) and warming it up")
    with start_broker(args.broker) as broker:
        doc = measure_all(args, workdir, broker, log)
    doc["wall_seconds"] = round(time.time() - started, 1)
    return doc


def measure_all(args: argparse.Namespace, workdir: Path, broker: Broker,
                log: Callable[[str], None]) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "benchmark": "bench.produce",
        "date": datetime.date.today().isoformat(),
        "command": " ".join(["python -m bench.produce", *args.argv]),
        "kiln_source": kiln_source(),
        "machine": {
            "cpus": os.cpu_count(),
            "note": f"{os.cpu_count()} cores shared by the producer, Kiln, Redis and the broker "
                    f"({broker.description}); all on loopback",
        },
        "broker": broker.describe(),
        "versions": tool_versions(),
        "settings": {
            "ingest_producer": {k: v for k, v in INGEST_PRODUCER.items() if k != "log_level"},
            "latency_producer": {k: v for k, v in LATENCY_PRODUCER.items() if k != "log_level"},
            "partitions": 1,
            "ingest_harden_delay_ms": args.ingest_delay_ms,
            "mb": "10^6 bytes of record values",
        },
    }
    doc["ingest"] = bench_ingest(args, workdir, broker, log)
    kiln_peak = doc["ingest"][0]["kiln"]["records_per_s"]["median"]
    doc["latency"] = latency_scenarios(args, workdir, broker, kiln_peak, log)
    direct_100 = doc["ingest"][0]["direct"]["records_per_s"]["median"]
    e2e_runs = []
    for key, policy in (("end_to_end", "fixed"), ("end_to_end_adaptive", "adaptive")):
        e2e = bench_end_to_end(args, workdir, broker, log, policy)
        e2e["ratio_to_direct_ingest"] = (round(e2e["end_to_end_records_per_s"] / direct_100, 2)
                                         if e2e["end_to_end_records_per_s"] else None)
        doc[key] = e2e
        e2e_runs.append(e2e)
    kiln_runs = [r for row in doc["ingest"] for r in row["kiln"]["runs"]]
    doc["memory"] = {
        "kiln_peak_rss_mb_max": max(r["kiln_peak_rss_mb"] for r in kiln_runs),
        "redis_used_memory_peak_mb_max": max(r["redis_used_memory_peak_mb"] for r in kiln_runs),
        "per_size": [{"value_bytes": row["value_bytes"], "records": row["records"],
                      "kiln_peak_rss_mb": [r["kiln_peak_rss_mb"] for r in row["kiln"]["runs"]],
                      "redis_used_memory_peak_mb": [r["redis_used_memory_peak_mb"]
                                                    for r in row["kiln"]["runs"]]}
                     for row in doc["ingest"]],
    }
    windows = ([r for row in doc["ingest"] for t in ("kiln", "direct") for r in row[t]["runs"]]
               + [r for block in doc["latency"] for c in block["runs"] for r in c["runs"]]
               + e2e_runs)
    doc["other_load"] = {
        "note": "CPU seconds used by processes outside this benchmark during the measured "
                "windows (other work on the machine competing for the cores; ideally ~0), "
                "and irq + softirq + steal time, charged to no process (loopback networking; "
                "steal: the hypervisor running something else on these cores)",
        "irq_cpu_s": round(sum(w["irq_cpu_s"] for w in windows), 2),
        "total_cpu_s": round(sum(w["other_cpu_s"] for w in windows), 2),
        "max_in_one_window_cpu_s": max(w["other_cpu_s"] for w in windows),
        "measured_seconds": round(sum(w["seconds"] if "seconds" in w else
                                      w["seconds_to_all_hardened"] for w in windows), 1),
    }
    return doc


def latency_scenarios(args: argparse.Namespace, workdir: Path, broker: Broker,
                      kiln_peak: float, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The batched and single scenarios: Kiln acks=1, direct acks=1 and acks=all on the
    bench's broker, alternating; then, with Apache Kafka unless --no-cluster, acks=all to a
    3-node cluster, which runs only for those runs (idle, its JVMs would take CPU from the
    others)."""
    scenarios = [("batched", args.latency_rate or kiln_peak / 2, args.latency_linger_ms,
                  args.latency_seconds)]
    if args.single_rate:
        scenarios.append(("single", args.single_rate, 0, args.single_seconds))
    configs = [LatencyConfig("kiln_acks1", True, broker, "1"),
               LatencyConfig("direct_acks1", False, broker, "1"),
               LatencyConfig("direct_acksall", False, broker, "all")]
    runs = [bench_latency(args, workdir, configs, {"broker": broker}, rate, linger_ms, seconds,
                          log)
            for _, rate, linger_ms, seconds in scenarios]
    if broker.kind == "kafka" and not args.no_cluster:
        log("starting a 3-node Apache Kafka cluster and warming it up")
        with start_kafka_cluster(3) as cluster:
            cluster_config = [LatencyConfig("cluster_acksall", False, cluster, "all")]
            for (_, rate, linger_ms, seconds), scenario_runs in zip(scenarios, runs,
                                                                    strict=True):
                scenario_runs += bench_latency(args, workdir, cluster_config,
                                               {"broker": broker, "cluster": cluster}, rate,
                                               linger_ms, seconds, log)
    out = []
    for (scenario, rate, linger_ms, seconds), scenario_runs in zip(scenarios, runs, strict=True):
        by_name = {r["name"]: r for r in scenario_runs}
        kiln_p99 = by_name["kiln_acks1"]["p99_ms"]
        all_p99 = by_name["direct_acksall"]["p99_ms"]
        target: dict[str, Any] = {
            "kiln_acks1_p99_ms": kiln_p99, "direct_acksall_p99_ms": all_p99,
            "ratio": round(kiln_p99 / all_p99, 2) if all_p99 else None,
            "kiln_at_or_below_direct_acksall": kiln_p99 <= all_p99}
        if "cluster_acksall" in by_name:
            cluster_p99 = by_name["cluster_acksall"]["p99_ms"]
            target |= {"cluster_acksall_p99_ms": cluster_p99,
                       "ratio_to_cluster": (round(kiln_p99 / cluster_p99, 2)
                                            if cluster_p99 else None),
                       "kiln_at_or_below_cluster_acksall": kiln_p99 <= cluster_p99}
        out.append({
            "scenario": scenario, "target_rate": round(rate), "linger_ms": linger_ms,
            "seconds_per_run": seconds, "repeats": args.latency_repeats,
            "value_bytes": 100, "runs": scenario_runs, "target": target,
        })
    return out


def stop_on_signals() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt, so every started service is stopped on the
    way out; SIGINT too when the bench was started in the background, where it is ignored."""
    def on_term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def progress_log(quiet: bool) -> Callable[[str], None]:
    """Progress lines on stderr, unless only the JSON document was asked for."""
    def log(text: str) -> None:
        if not quiet:
            print(text, file=sys.stderr, flush=True)
    return log


def publish(doc: dict[str, Any], output: Path | None, json_only: bool,
            table: Callable[[dict[str, Any]], str]) -> None:
    """The JSON document on stdout (and in `output`), then the table on stderr."""
    text = json.dumps(doc, indent=2)
    print(text, flush=True)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text + "\n")
    if not json_only:
        print("\n" + table(doc), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = progress_log(args.json)

    stop_on_signals()
    workdir = Path(tempfile.mkdtemp(prefix="kiln-bench-"))
    try:
        doc = run(args, workdir, log)
    except KeyboardInterrupt:
        print("interrupted; every started process was stopped", file=sys.stderr)
        return 130
    finally:
        if not args.keep_logs:
            for path in workdir.glob("*"):
                path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                workdir.rmdir()
        elif not args.json:
            print(f"Kiln logs kept in {workdir}", file=sys.stderr)
    publish(doc, args.output, args.json, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
