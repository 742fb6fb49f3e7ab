"""Kiln on 1, 2, 4 workers (`kiln serve --workers N`) versus producing straight to the
broker, side by side, in one run: how ingest and end-to-end scale with the node processes of
one machine.

One broker per run (`--broker kafka|tansu`, bench/brokers.py), warmed up; every measurement
gets a fresh topic of `--partitions` partitions created through the endpoint under test, and,
for Kiln, a fresh Redis and a fresh `python -m cli serve --workers N`. Several producer
processes (`--producers`, confluent-kafka, librdkafka's sticky partitioner spreading batches
over the partitions) start together and each produces its share of 100 B records with
acks=1, as fast as it goes; the clock runs from the common start to the last delivery.

1. ingest      records/s and MB/s; Kiln with a long fixed harden delay (nothing is hardened
               during the run). Direct and each worker count alternate, `--repeats` runs
               each; medians with min and max; each Kiln figure over direct, and over Kiln
               on one worker.
2. end_to_end  records/s from the common start until Kafka holds every record, Kiln with a
               fixed 500 ms delay (`--e2e-delay-ms`).

CPU seconds of Kiln's node processes, Redis, the broker and the producers are recorded per
run. Everything shares this machine's cores: on a 2-core machine, two workers compete with
the producers, Redis and the broker, and the figures say how much that leaves.

    python -m bench.scale                  # 1, 2, 4 workers, 3 repeats, about 6 minutes
    python -m bench.scale --quick          # 1 and 2 workers, one repeat, about 2 minutes
    python -m bench.scale --redis cluster  # the same on a Redis Cluster (3 masters, 3 replicas)
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from bench.brokers import Broker, add_broker_option, start_broker
from bench.produce import (
    INGEST_PRODUCER,
    CpuWindow,
    kiln_source,
    progress_log,
    stack_with_topic,
    stop_on_signals,
    tool_versions,
    wait_hardened,
)

VALUE_BYTES = 100


def produce_share(bootstrap: str, topic: str, count: int, ready: Any, go: Event,
                  done: Any, leave: Event) -> None:
    """In a producer process: connect and learn the topic, say so, wait for the common
    start, produce `count` records, report (start, end, errors), and stay until told to
    leave (its CPU time is read meanwhile)."""
    errors: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", **INGEST_PRODUCER,
                         "on_delivery": lambda err, _msg: errors.append(err)})
    producer.list_topics(topic, timeout=10)
    ready.put(os.getpid())
    go.wait()
    started = time.monotonic()
    value = bytes(VALUE_BYTES)
    sent = 0
    while sent < count:
        try:
            for _ in range(count - sent):
                producer.produce(topic, value)
                sent += 1
        except BufferError:
            producer.poll(0.001)
    left = producer.flush(120)
    done.put((started, time.monotonic(), len(errors) + left))
    leave.wait(60)


def produce_together(bootstrap: str, topic: str, count: int, producers: int,
                     window: Callable[[list[int]], CpuWindow], until: Callable[[], None]
                     ) -> dict[str, Any]:
    """`producers` processes producing `count` records between them: seconds from the
    common start to the last delivery (to the end of `until()` when given), failed
    deliveries, and the CPU used meanwhile (`window`, given the producers' pids, is opened
    once they are connected, just before the start)."""
    context = multiprocessing.get_context("spawn")  # no librdkafka state crosses a fork
    ready, done = context.Queue(), context.Queue()
    go, leave = context.Event(), context.Event()
    shares = [count // producers + (i < count % producers) for i in range(producers)]
    processes = [context.Process(target=produce_share, args=(bootstrap, topic, share, ready,
                                                             go, done, leave))
                 for share in shares]
    for process in processes:
        process.start()
    try:
        pids = [ready.get(timeout=60) for _ in processes]
        cpu = window(pids)
        go.set()
        reports = [done.get(timeout=300) for _ in processes]
        until()
        used = cpu.stop()
        ended = time.monotonic()
        leave.set()
    finally:
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
    start = min(r[0] for r in reports)
    last_delivery = max(r[1] for r in reports)
    return {"seconds": last_delivery - start, "seconds_until": ended - start,
            "delivery_errors": sum(r[2] for r in reports), "cpu": used}


def measure(target: str, workers: int, args: argparse.Namespace, workdir: Path,
            broker: Broker, *, end_to_end: bool = False) -> dict[str, Any]:
    via_kiln = workers > 0
    delay = (args.e2e_delay_ms if end_to_end else args.ingest_delay_ms) if via_kiln else None
    count = args.records
    with stack_with_topic(workdir, broker, target, kiln_delay_ms=delay,
                          kiln_workers=max(1, workers), partitions=args.partitions,
                          redis_cluster=args.redis == "cluster") as (stack, topic):
        pids: dict[str, Any] = {"broker": broker.pids}
        if stack.kiln is not None:
            pids |= {"kiln": stack.kiln.worker_pids(), "redis": stack.redis_pids}

        def hardened() -> None:
            if end_to_end:
                wait_hardened(broker.bootstrap, topic, count, args.partitions,
                              timeout_s=args.e2e_timeout)

        result = produce_together(stack.endpoint, topic, count, args.producers,
                                  lambda producers: CpuWindow(**pids, producers=producers),
                                  hardened)
        seconds = result["seconds_until" if end_to_end else "seconds"]
        cpu = result["cpu"]
        cpu["bench_cpu_s"] = cpu.pop("producer_cpu_s")  # this process: waits, polls Kafka
        run = {"target": target, "workers": workers, "records": count,
               "seconds": round(seconds, 3), "records_per_s": round(count / seconds),
               "mb_per_s": round(count * VALUE_BYTES / seconds / 1e6, 2),
               "delivery_errors": result["delivery_errors"], **cpu}
        if stack.kiln is not None:
            stack.stop_kiln(kill=True)
            run["kiln_log_problems"] = stack.kiln_problems[:10]
        run["ok"] = result["delivery_errors"] == 0
        return run


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    values = [r["records_per_s"] for r in runs]
    return {"records_per_s": {"median": statistics.median(values), "min": min(values),
                              "max": max(values)},
            "runs": runs}


def bench(args: argparse.Namespace, workdir: Path, broker: Broker,
          log: Callable[[str], None], *, end_to_end: bool) -> dict[str, Any]:
    kind = "end_to_end" if end_to_end else "ingest"
    targets = ([] if end_to_end else [("direct", 0)]) + [
        (f"kiln_{w}_workers", w) for w in args.workers]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in targets}
    for repeat in range(args.repeats):
        for name, workers in targets:
            run = measure(name, workers, args, workdir, broker, end_to_end=end_to_end)
            runs[name].append(run)
            log(f"{kind:10} {name:15} #{repeat + 1}: {run['records_per_s']:>10,} rec/s"
                f"{'' if run['ok'] else '  NOT OK'}")
    out: dict[str, Any] = {name: summarize(name_runs) for name, name_runs in runs.items()}
    one = out[f"kiln_{args.workers[0]}_workers"]["records_per_s"]["median"]
    for name, workers in targets:
        rate = out[name]["records_per_s"]["median"]
        if workers:
            out[name]["ratio_to_first_worker_count"] = round(rate / one, 2)
            if "direct" in out:
                out[name]["ratio_to_direct"] = round(
                    rate / out["direct"]["records_per_s"]["median"], 2)
    return out


def table(doc: dict[str, Any]) -> str:
    lines = [f"bench.scale {doc['date']}  {doc['machine']['note']}", "",
             "| measurement | target | records/s (median) | min-max | vs direct | vs first |",
             "|---|---|---|---|---|---|"]
    for kind in ("ingest", "end_to_end"):
        for name, row in doc[kind].items():
            rate = row["records_per_s"]
            vs_direct = row.get("ratio_to_direct", row.get("ratio_to_direct_ingest", ""))
            lines.append(f"| {kind} | {name} | {rate['median']:,.0f} | "
                         f"{rate['min']:,}-{rate['max']:,} | {vs_direct} | "
                         f"{row.get('ratio_to_first_worker_count', '')} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 and 2 workers, one repeat")
    parser.add_argument("--json", action="store_true", help="print only the JSON document")
    parser.add_argument("--output", type=Path, help="also write the JSON document here")
    add_broker_option(parser)
    parser.add_argument("--workers", type=lambda text: [int(w) for w in text.split(",")],
                        help="worker counts, comma-separated (default 1,2,4)")
    parser.add_argument("--producers", type=int, default=4, help="producer processes")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--records", type=int, help="100-byte records per run")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--ingest-delay-ms", type=int, default=600_000)
    parser.add_argument("--e2e-delay-ms", type=int, default=500)
    parser.add_argument("--e2e-timeout", type=float, default=300.0)
    parser.add_argument("--redis", choices=["single", "cluster"], default="single",
                        help="Kiln's log queue: one redis-server, or a Redis Cluster of three "
                             "masters with a replica each")
    args = parser.parse_args(argv)
    given = list(sys.argv[1:] if argv is None else argv)
    # File names stay out of the recorded command.
    args.argv = ["FILE" if i and given[i - 1] == "--output" else arg
                 for i, arg in enumerate(given)]
    defaults = ({"workers": [1, 2], "records": 400_000, "repeats": 1} if args.quick else
                {"workers": [1, 2, 4], "records": 1_000_000, "repeats": 3})
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


_REDIS_NOTE = {"single": "Redis",
               "cluster": "a Redis Cluster (3 masters, 3 replicas)"}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    stop_on_signals()
    log = progress_log(args.json)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="kiln-bench-scale-") as tmp:
        log(f"starting the broker ({args.broker}) and warming it up")
        with start_broker(args.broker) as broker:
            doc: dict[str, Any] = {
                "benchmark": "bench.scale",
                "date": datetime.date.today().isoformat(),
                "command": " ".join(["python -m bench.scale", *args.argv]),
                "kiln_source": kiln_source(),
                "machine": {"cpus": os.cpu_count(),
                            "note": f"{os.cpu_count()} cores shared by {args.producers} "
                                    f"producer processes, Kiln's workers, "
                                    f"{_REDIS_NOTE[args.redis]} and the broker "
                                    f"({broker.description}); all on loopback"},
                "broker": broker.describe(),
                "versions": tool_versions(),
                "settings": {"redis": args.redis,
                             "partitions": args.partitions, "producers": args.producers,
                             "value_bytes": VALUE_BYTES, "records": args.records,
                             "repeats": args.repeats, "workers": args.workers,
                             "ingest_producer": {k: v for k, v in INGEST_PRODUCER.items()
                                                 if k != "log_level"}},
            }
            doc["ingest"] = bench(args, Path(tmp), broker, log, end_to_end=False)
            doc["end_to_end"] = bench(args, Path(tmp), broker, log, end_to_end=True)
            direct = doc["ingest"]["direct"]["records_per_s"]["median"]
            for row in doc["end_to_end"].values():
                row["ratio_to_direct_ingest"] = round(
                    row["records_per_s"]["median"] / direct, 2)
    doc["wall_seconds"] = round(time.time() - started, 1)
    text = json.dumps(doc, indent=2)
    if args.output:
        args.output.write_text(text + "\n")
    print(text)
    if not args.json:
        print(table(doc), file=sys.stderr)


if __name__ == "__main__":
    main()
