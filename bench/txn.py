"""Transactional produce through Kiln versus straight to the broker, side by side, in one run.

One broker per run (`--broker`, Apache Kafka by default: tansu's transactions are not
usable, shared/notes/hardening.md); for every measurement a fresh topic (`--partitions`) and,
for Kiln, a fresh Redis and a `python -m cli serve` process with `transactions_enabled`. The
producer is confluent-kafka's transactional producer (librdkafka), with identical settings
for Kiln and for the broker: `--producers` producers (1 by default), each committing
`--transactions` transactions of `--per-transaction` records of `--size` bytes spread over
the partitions, each begun, produced, flushed and committed in turn. Kiln and direct runs
alternate, `--repeats` each; medians (and min..max) of records/s and of commit latency
(commit_transaction() call to return), Kiln/direct.

What Kiln does with the records depends on `--level`, the level the transactions get
(docs/reliability.md, transactions): `assured_persistent` (what acks=all asks for, the
default) answers each commit once Kiln's hardening lane has written the transaction to Kafka
in a Kafka transaction of its own; `reliable_persistent` (the topic's kiln.max.reliability)
answers it once the decision and markers are in Redis, and hardens it after the delay, which
is long here, so nothing is hardened during the run. So the first compares Kiln plus a
second Kafka transaction per commit against Kafka, the second Redis plus Kiln's coordinator
against Kafka's log plus its coordinator.

    python -m bench.txn                          # about 1-2 minutes
    python -m bench.txn --level reliable_persistent
    python -m bench.txn --per-transaction 1000   # larger transactions
    python -m bench.txn --producers 4            # several producers share the lane's passes
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from bench.brokers import Broker, add_broker_option, start_broker
from bench.produce import (
    kiln_source,
    percentile,
    progress_log,
    publish,
    stack_with_topic,
    stop_on_signals,
    tool_versions,
)

# Kiln never hardens during a run: what is measured is the transactional path itself.
KILN_DELAY_MS = 600_000
PRODUCER = {"linger.ms": 5, "batch.size": 1_000_000, "compression.type": "none",
            "log_level": 3}


def run_transactions(bootstrap: str, topic: str, args: argparse.Namespace) -> dict[str, Any]:
    """`--producers` producers at once, each with a transactional id of its own."""
    commits: list[float] = []
    errors: list[BaseException] = []

    def one_producer() -> None:
        try:
            commits.extend(produce_transactions(bootstrap, topic, args))
        except BaseException as exc:  # reported by the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=one_producer) for _ in range(args.producers)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    if errors:
        raise errors[0]
    transactions = args.transactions * args.producers
    records = transactions * args.per_transaction
    commits.sort()
    return {"seconds": round(seconds, 3), "records_per_s": round(records / seconds),
            "transactions_per_s": round(transactions / seconds, 1),
            "commit_ms_p50": round(percentile(commits, 0.5), 2),
            "commit_ms_p99": round(percentile(commits, 0.99), 2)}


def produce_transactions(bootstrap: str, topic: str, args: argparse.Namespace) -> list[float]:
    """One producer's transactions, in turn; their commit latencies (ms)."""
    producer = Producer({"bootstrap.servers": bootstrap,
                         "transactional.id": f"bench-{uuid.uuid4().hex[:8]}", **PRODUCER})
    producer.init_transactions(30)
    value = bytes(args.size)
    commits: list[float] = []
    for _ in range(args.transactions):
        producer.begin_transaction()
        for i in range(args.per_transaction):
            while True:
                try:
                    producer.produce(topic, value, partition=i % args.partitions)
                    break
                except BufferError:
                    producer.poll(0.01)
        committing = time.perf_counter()
        producer.commit_transaction(30)  # flushes, then EndTxn
        commits.append((time.perf_counter() - committing) * 1000)
    return commits


def measure(target: str, args: argparse.Namespace, workdir: Path, broker: Broker
            ) -> dict[str, Any]:
    config = workdir / "txn.toml"
    config.write_text("transactions_enabled = true\n")
    delay = KILN_DELAY_MS if target == "kiln" else None
    with stack_with_topic(workdir, broker, f"txn-{target}", kiln_delay_ms=delay,
                          partitions=args.partitions,
                          kiln_args=("--config", str(config))) as (stack, topic):
        if target == "kiln" and args.level != "assured_persistent":
            cap_level(stack.endpoint, topic, args.level)
        return {"target": target, **run_transactions(stack.endpoint, topic, args)}


def cap_level(bootstrap: str, topic: str, level: str) -> None:
    """The topic's kiln.max.reliability, set through Kiln."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("kiln.max.reliability", level,
                    incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(30)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": runs}
    for key in ("records_per_s", "commit_ms_p50", "commit_ms_p99"):
        values = [r[key] for r in runs]
        out[key] = {"median": statistics.median(values), "min": min(values),
                    "max": max(values)}
    return out


def bench(args: argparse.Namespace, workdir: Path, broker: Broker,
          log: Any) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"kiln": [], "direct": []}
    for repeat in range(args.repeats):
        for target in ("kiln", "direct"):
            run = measure(target, args, workdir, broker)
            runs[target].append(run)
            log(f"{target:6} #{repeat + 1}: {run['records_per_s']:>9,} rec/s, "
                f"{run['transactions_per_s']:>7} txn/s, commit p50 {run['commit_ms_p50']} ms")
    sides = {target: summarize(target_runs) for target, target_runs in runs.items()}
    kiln, direct = (sides[t]["records_per_s"]["median"] for t in ("kiln", "direct"))
    return {**sides, "ratio_kiln_to_direct": round(kiln / direct, 2)}


def table(doc: dict[str, Any]) -> str:
    result = doc["result"]
    settings = doc["settings"]
    lines = [f"{settings.get('producers', 1)} x {settings['transactions']} transactions x "
             f"{settings['per_transaction']} records "
             f"of {settings['size']} B over {settings['partitions']} partitions "
             f"({doc['broker']['kind']}; Kiln at {settings['level']})",
             f"{'':8} {'rec/s':>10} {'min..max':>21} {'commit p50 ms':>14} "
             f"{'commit p99 ms':>14}"]
    for target in ("kiln", "direct"):
        side = result[target]
        rate = side["records_per_s"]
        lines.append(f"{target:8} {rate['median']:>10,} {rate['min']:>10,}..{rate['max']:<10,} "
                     f"{side['commit_ms_p50']['median']:>14} "
                     f"{side['commit_ms_p99']['median']:>14}")
    lines.append(f"Kiln/direct: {result['ratio_kiln_to_direct']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.txn", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_broker_option(parser)
    parser.add_argument("--transactions", type=int, default=300, help="per producer")
    parser.add_argument("--producers", type=int, default=1,
                        help="transactional producers at once (threads)")
    parser.add_argument("--per-transaction", type=int, default=100)
    parser.add_argument("--size", type=int, default=100, help="bytes per record value")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--level", choices=("assured_persistent", "reliable_persistent"),
                        default="assured_persistent",
                        help="the level Kiln gives the transactions (see above)")
    parser.add_argument("--output", type=Path, help="also write the JSON document here")
    parser.add_argument("--json", action="store_true", help="only the JSON document")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = progress_log(args.json)
    stop_on_signals()
    workdir = Path(tempfile.mkdtemp(prefix="kiln-bench-txn-"))
    started = time.time()
    try:
        log(f"starting the broker ({args.broker})")
        with start_broker(args.broker) as broker:
            doc = {
                "benchmark": "bench.txn",
                "command": " ".join(["python -m bench.txn", *args.argv]),
                "kiln_source": kiln_source(), "broker": broker.describe(),
                "versions": tool_versions(),
                "settings": {"producers": args.producers, "transactions": args.transactions,
                             "per_transaction": args.per_transaction, "size": args.size,
                             "partitions": args.partitions, "repeats": args.repeats,
                             "level": args.level,
                             "producer": {k: v for k, v in PRODUCER.items()
                                          if k != "log_level"},
                             "kiln_harden_delay_ms": KILN_DELAY_MS},
                "result": bench(args, workdir, broker, log),
            }
    except KeyboardInterrupt:
        print("interrupted; every started process was stopped", file=sys.stderr)
        return 130
    doc["wall_seconds"] = round(time.time() - started, 1)
    publish(doc, args.output, args.json, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
