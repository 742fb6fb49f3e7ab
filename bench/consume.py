"""Consuming through Kiln versus consuming straight from the broker, and how much of the
stream Kiln keeps out of Kafka because it was delivered first.

One broker per run (`--broker kafka|tansu`, see bench/brokers.py), warmed up first; every
measurement gets a fresh one-partition topic on it and, for Kiln, a fresh Redis and a
separate `python -m cli serve` process. Producers and consumers are confluent-kafka
(librdkafka) with the same settings for Kiln and the broker.

1. latency      end to end, produce() to the consumer receiving the record, at a paced
                rate; p50/p99 through Kiln against the broker directly (a consumer in
                assign mode, long-polling with the client's defaults).
2. throughput   N records of 100 B read from offset 0 by one consumer: from Kiln's log
                queue (hot), from the broker directly, and through Kiln after they were all
                hardened (read-through from Kafka, cold).
3. avoidance    records produced at a paced rate for some seconds through Kiln with a 2 s
                delay while a consumer group (auto-commit every 200 ms) keeps up, lags by
                half the delay, or is stopped (it committed once, so it is a durable
                subscription, then left). Afterwards: the share of records written to
                Kafka, the share dropped as delivered, and what the consumer received.

Prints one JSON document on stdout and a table on stderr (`--json`: the JSON only). The
clients, Kiln, Redis and the broker all share this machine's cores.

    python -m bench.consume                  # full run, Apache Kafka, a few minutes
    python -m bench.consume --broker tansu   # the same against tansu
    python -m bench.consume --quick          # smaller counts, about 1.5 minutes
"""

from __future__ import annotations

import argparse
import contextlib
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as CkTopicPartition

from bench.brokers import Broker, add_broker_option, start_broker
from bench.produce import (
    fetch_high_watermark,
    kiln_source,
    latency_stats,
    produce_n,
    progress_log,
    publish,
    stack_with_topic,
    tool_versions,
    wait_hardened,
)

VALUE_BYTES = 100
LONG_DELAY_MS = 600_000
AVOIDANCE_DELAY_MS = 2_000
_STAMP = struct.Struct(">d")  # perf_counter() at produce(), at the front of each value


def stamped_value() -> bytes:
    return _STAMP.pack(time.perf_counter()).ljust(VALUE_BYTES, b".")


def produce_paced(producer: Producer, topic: str, rate: float, seconds: float) -> int:
    """Stamped records at `rate` per second for `seconds`, then flush; how many were sent."""
    started = time.perf_counter()
    sent = 0
    while (now := time.perf_counter()) < started + seconds:
        for _ in range(int((now - started) * rate) - sent):
            producer.produce(topic, stamped_value())
            sent += 1
        producer.poll(0.001)
    producer.flush(30)
    return sent


def consumer_config(bootstrap: str, group: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3,
            "enable.auto.commit": False, "auto.offset.reset": "earliest", **extra}


# --- 1. end-to-end latency ------------------------------------------------------------------

def paced_end_to_end(bootstrap: str, topic: str, rate: float, seconds: float,
                     fetch_wait_ms: int) -> dict[str, Any]:
    """A paced producer and an assign-mode consumer on one partition; each record's time
    from produce() to poll() returning it."""
    consumer = Consumer(consumer_config(bootstrap, f"bench-{topic}",
                                        **{"fetch.wait.max.ms": fetch_wait_ms}))
    consumer.assign([CkTopicPartition(topic, 0, OFFSET_BEGINNING)])
    latencies: list[float] = []
    stop = threading.Event()

    def consume() -> None:
        # poll(), not consume(n, timeout): a batch call waits out its timeout unless n
        # messages arrive, which would be measured as latency.
        while not stop.is_set():
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                sent = _STAMP.unpack_from(message.value())[0]
                latencies.append((time.perf_counter() - sent) * 1000)

    reader = threading.Thread(target=consume, name="bench-consumer")
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 0,
                         "log_level": 3})
    producer.list_topics(topic, timeout=10)
    reader.start()
    try:
        time.sleep(1.0)  # the consumer has fetched once and is long-polling
        sent = produce_paced(producer, topic, rate, seconds)
        deadline = time.monotonic() + 10
        while len(latencies) < sent and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        reader.join(10)
        consumer.close()
    return {"sent": sent, "received": len(latencies), **latency_stats(latencies)}


def bench_latency(args: argparse.Namespace, workdir: Path, broker: Broker,
                  log: Callable[[str], None]) -> dict[str, Any]:
    """Two consumer settings: librdkafka's default long-poll (fetch.wait.max.ms=500) and a
    short one (10 ms), for brokers that answer a long-poll only when it expires."""
    out: dict[str, Any] = {"rate": args.latency_rate, "seconds": args.latency_seconds}
    for wait_ms in (500, 10):
        row: dict[str, Any] = {}
        for name, delay in (("kiln", LONG_DELAY_MS), ("direct", None)):
            with stack_with_topic(workdir, broker, "latency",
                                  kiln_delay_ms=delay) as (stack, topic):
                row[name] = paced_end_to_end(stack.endpoint, topic, args.latency_rate,
                                             args.latency_seconds, wait_ms)
            log(f"latency {name} fetch.wait.max.ms={wait_ms}: p50 {row[name]['p50_ms']} ms, "
                f"p99 {row[name]['p99_ms']} ms")
        row["p99_ratio_kiln_to_direct"] = round(row["kiln"]["p99_ms"] / row["direct"]["p99_ms"],
                                                2)
        out[f"fetch_wait_{wait_ms}ms"] = row
    return out


# --- 2. consume throughput ------------------------------------------------------------------

def read_all(bootstrap: str, topic: str, count: int) -> dict[str, Any]:
    """Read `count` records from offset 0; records/s from the first poll to the last."""
    consumer = Consumer(consumer_config(bootstrap, f"bench-{topic}-{time.monotonic_ns()}",
                                        **{"fetch.max.bytes": 52_428_800}))
    consumer.assign([CkTopicPartition(topic, 0, OFFSET_BEGINNING)])
    received, last_offset, out_of_order = 0, -1, 0
    started = time.perf_counter()
    deadline = time.monotonic() + 300
    while received < count and time.monotonic() < deadline:
        for message in consumer.consume(10_000, 0.5):
            if message.error() is None:
                received += 1
                out_of_order += message.offset() <= last_offset
                last_offset = message.offset()
    seconds = time.perf_counter() - started
    consumer.close()
    return {"records": received, "seconds": round(seconds, 3),
            "records_per_s": round(received / seconds), "out_of_order": out_of_order}


def bench_throughput(args: argparse.Namespace, workdir: Path, broker: Broker,
                     log: Callable[[str], None]) -> dict[str, Any]:
    count = args.records
    value = b"x" * VALUE_BYTES
    out: dict[str, Any] = {"records": count, "value_bytes": VALUE_BYTES}
    for name, delay in (("kiln_hot", LONG_DELAY_MS), ("direct", None), ("kiln_cold", 200)):
        with stack_with_topic(workdir, broker, "consume", kiln_delay_ms=delay) as (stack, topic):
            produced = produce_n(stack.endpoint, topic, count, value, "1")
            if produced["errors"]:
                raise RuntimeError(f"producing failed: {produced['first_error']}")
            if name == "kiln_cold":
                wait_hardened(broker.bootstrap, topic, count)
            out[name] = read_all(stack.endpoint, topic, count)
        log(f"consume {name}: {out[name]['records_per_s']:,} records/s")
    direct = out["direct"]["records_per_s"]
    out["ratio_hot_to_direct"] = round(out["kiln_hot"]["records_per_s"] / direct, 2)
    out["ratio_cold_to_direct"] = round(out["kiln_cold"]["records_per_s"] / direct, 2)
    return out


# --- 3. write avoidance ---------------------------------------------------------------------

class GroupReader:
    """A consumer group member that auto-commits every 200 ms; with `lag_s` it holds each
    record until it is that old before taking the next (its commits trail by as much)."""

    def __init__(self, bootstrap: str, topic: str, group: str, lag_s: float) -> None:
        self._consumer = Consumer(consumer_config(
            bootstrap, group, **{"enable.auto.commit": True, "auto.commit.interval.ms": 200}))
        self._consumer.subscribe([topic])
        self._lag_s = lag_s
        self.offsets: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-group-reader")

    def start(self) -> GroupReader:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in self._consumer.consume(500, 0.1):
                if message.error() is not None:
                    continue
                if self._lag_s:
                    sent = _STAMP.unpack_from(message.value())[0]
                    hold = sent + self._lag_s - time.perf_counter()
                    if hold > 0 and self._stop.wait(hold):
                        return
                self.offsets.append(message.offset())

    def caught_up(self, count: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while len(set(self.offsets)) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(set(self.offsets)) >= count

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)
        with contextlib.suppress(Exception):
            self._consumer.commit(asynchronous=False)
        self._consumer.close()


def partition_meta(redis_url: str, topic: str) -> dict[str, int]:
    """The partition's counters in the log queue (`inc`, a token, is left out)."""
    raw = redis.Redis.from_url(redis_url).hgetall(f"kiln:{{{topic}/0}}:meta")
    return {k.decode(): int(v) for k, v in raw.items() if v.isdigit()}


def avoidance_once(workdir: Path, broker: Broker, scenario: str, rate: float, seconds: float
                   ) -> dict[str, Any]:
    with stack_with_topic(workdir, broker, "avoid",
                          kiln_delay_ms=AVOIDANCE_DELAY_MS) as (stack, topic):
        assert stack.redis is not None
        lag_s = AVOIDANCE_DELAY_MS / 2000 if scenario == "lags_half_delay" else 0.0
        reader = GroupReader(stack.endpoint, topic, f"bench-{scenario}", lag_s).start()
        producer = Producer({"bootstrap.servers": stack.endpoint, "acks": "1",
                             "linger.ms": 5, "log_level": 3})
        if scenario == "stopped":
            # One record read and committed makes the group a durable subscription.
            producer.produce(topic, stamped_value())
            producer.flush(10)
            reader.caught_up(1, 30)
            reader.stop()
        sent = produce_paced(producer, topic, rate, seconds)
        total = sent + (1 if scenario == "stopped" else 0)
        if scenario != "stopped":
            reader.caught_up(total, 60)
            reader.stop()
        time.sleep(AVOIDANCE_DELAY_MS / 1000 + 1.5)  # every survivor is due and hardened
        wait_hardened_or_dropped(stack.redis.url, topic, total)
        meta = partition_meta(stack.redis.url, topic)
        in_kafka = fetch_high_watermark(broker.bootstrap, topic)
    received = reader.offsets
    return {
        "produced": total, "written_to_kafka": in_kafka,
        "share_written": round(in_kafka / total, 4),
        "dropped_as_delivered": meta.get("delivered_records", 0),
        "share_never_written": round(1 - in_kafka / total, 4),
        "consumer_received": len(set(received)),
        "consumer_duplicates": len(received) - len(set(received)),
    }


def wait_hardened_or_dropped(redis_url: str, topic: str, total: int,
                             timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        meta = partition_meta(redis_url, topic)
        if meta.get("records", 0) == 0 and meta.get("next", 0) >= total:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{topic}: log queue not empty {timeout_s}s after the delay")


def bench_avoidance(args: argparse.Namespace, workdir: Path, broker: Broker,
                    log: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {"delay_ms": AVOIDANCE_DELAY_MS, "rate": args.avoidance_rate,
                           "seconds": args.avoidance_seconds}
    for scenario in ("keeps_up", "lags_half_delay", "stopped"):
        out[scenario] = avoidance_once(workdir, broker, scenario, args.avoidance_rate,
                                       args.avoidance_seconds)
        row = out[scenario]
        log(f"avoidance {scenario}: {row['share_never_written']:.2%} never written, "
            f"consumer received {row['consumer_received']}/{row['produced']}")
    return out


# --- report ---------------------------------------------------------------------------------

def table(doc: dict[str, Any]) -> str:
    lines = [f"broker: {doc['broker']['description']}"]
    if "latency" in doc:
        lat = doc["latency"]
        lines.append(f"end-to-end latency at {lat['rate']} msg/s   p50 ms   p99 ms  received")
        for wait_ms in (500, 10):
            row = lat[f"fetch_wait_{wait_ms}ms"]
            for name in ("kiln", "direct"):
                cell = row[name]
                label = f"{name}, fetch.wait.max.ms={wait_ms}"
                lines.append(f"  {label:32} {cell['p50_ms']:>7} {cell['p99_ms']:>8} "
                             f"{cell['received']:>6}/{cell['sent']}")
            lines.append(f"  p99 Kiln/direct {row['p99_ratio_kiln_to_direct']}")
    if "throughput" in doc:
        thr = doc["throughput"]
        lines.append(f"\nconsume {thr['records']:,} x {thr['value_bytes']} B      records/s")
        for name in ("kiln_hot", "direct", "kiln_cold"):
            lines.append(f"  {name:32} {thr[name]['records_per_s']:>9,}")
        lines.append(f"  hot/direct {thr['ratio_hot_to_direct']}, "
                     f"cold/direct {thr['ratio_cold_to_direct']}")
    if "avoidance" in doc:
        av = doc["avoidance"]
        lines.append(f"\nwrite avoidance, {av['rate']} msg/s for {av['seconds']} s, "
                     f"delay {av['delay_ms']} ms")
        lines.append(f"  {'consumer':18} {'produced':>9} {'to Kafka':>9} {'never written':>14} "
                     f"{'received':>9}")
        for scenario in ("keeps_up", "lags_half_delay", "stopped"):
            row = av[scenario]
            lines.append(f"  {scenario:18} {row['produced']:>9} {row['written_to_kafka']:>9} "
                         f"{row['share_never_written']:>14.2%} {row['consumer_received']:>9}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.consume", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller counts")
    parser.add_argument("--json", action="store_true", help="print only the JSON document")
    parser.add_argument("--only", choices=("latency", "throughput", "avoidance"),
                        action="append", help="run only these parts (repeatable)")
    parser.add_argument("--output", type=Path, help="also write the JSON document here")
    add_broker_option(parser)
    parser.add_argument("--records", type=int,
                        help="records of the throughput part (default 1,000,000; --quick "
                             "200,000)")
    args = parser.parse_args(argv)
    if args.records is None:
        args.records = 200_000 if args.quick else 1_000_000
    args.latency_rate, args.latency_seconds = 500.0, (5.0 if args.quick else 15.0)
    args.avoidance_rate, args.avoidance_seconds = 2000.0, (6.0 if args.quick else 20.0)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = progress_log(args.json)

    parts = args.only or ["latency", "throughput", "avoidance"]
    runners = {"latency": bench_latency, "throughput": bench_throughput,
               "avoidance": bench_avoidance}
    log(f"starting the broker ({args.broker}) and warming it up")
    with (tempfile.TemporaryDirectory(prefix="kiln-bench-") as workdir,
          start_broker(args.broker) as broker):
        doc: dict[str, Any] = {"kiln": kiln_source(), "tools": tool_versions(),
                               "broker": broker.describe()}
        for part in parts:
            doc[part] = runners[part](args, Path(workdir), broker, log)
    publish(doc, args.output, args.json, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
