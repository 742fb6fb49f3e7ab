"""How long a killed Kiln node's partitions stay unanswered: three `kiln serve` nodes with the
default node settings (heartbeat 1 s, session 3 s), an idempotent acks=all producer spreading
records over six partitions, and the node leading the most partitions killed -9 in
mid-stream, `--runs` times (fresh Redis and nodes each run, one broker for all).

The takeover time is from the kill to the first acknowledgement of a record, sent after the
kill, in a partition the killed node led: the survivors see the node dead (its session), the
producer's requests to it fail and it refreshes its metadata, the new leader takes the
partition's lease and the dead node's hardening lease, and the record is hardened (acks=all
is answered once hardened; the nodes' delay is a fixed 200 ms). Every run also checks that
Kafka holds every acknowledged record once, in order.

    python -m bench.takeover                # 20 runs, about 8 minutes
    python -m bench.takeover --runs 3       # a quick look
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.brokers import add_broker_option, start_broker
from bench.produce import kiln_source, progress_log, stop_on_signals
from cli.local_services import LocalRedis
from tests.cluster.takeover_support import (
    Cluster,
    SpreadLoop,
    assert_every_record_once_in_order,
    read_topic,
)
from tests.kiln_harness import eventually

WARM_UP_ACKS = 600
AFTER_KILL_S = 12.0  # the producer goes on this long after the kill
TAKEOVER_LIMIT_S = 60.0


def one_run(redis_url: str, kafka_bootstrap: str, workdir: Path, node_args: list[str]
            ) -> dict[str, Any]:
    topic = f"bench-takeover-{uuid.uuid4().hex[:10]}"
    cluster = Cluster(redis_url, kafka_bootstrap, workdir, node_args=node_args)
    try:
        cluster.start()
        cluster.create_topic(topic)
        victim, victim_id, led = cluster.busiest(topic)
        producer = SpreadLoop(cluster.bootstrap, topic)
        producer.start()
        try:
            if not producer.wait_for_acks(WARM_UP_ACKS, 30, fail_fast=True):
                raise RuntimeError(f"nothing delivered: {producer.error}")
            killed_at = time.monotonic()
            victim.kill()
            sent_at_kill = producer.sent
            eventually(lambda: producer.first_ack_after(killed_at, sent_at_kill, led)
                       is not None, TAKEOVER_LIMIT_S)
            first_ack = producer.first_ack_after(killed_at, sent_at_kill, led)
            time.sleep(max(0.0, AFTER_KILL_S - (time.monotonic() - killed_at)))
        finally:
            undelivered = producer.stop(flush_timeout_s=60)
        hardened_in_time = eventually(lambda: cluster.hardened_everything(topic), 60)
    finally:
        cluster.stop()
    counted = "ok"
    try:
        assert undelivered == 0 and hardened_in_time and producer.error is None
        assert_every_record_once_in_order(read_topic(kafka_bootstrap, topic), producer)
    except AssertionError as exc:
        counted = f"FAILED: {exc}"[:300]
    return {"takeover_s": None if first_ack is None else round(first_ack - killed_at, 3),
            "killed_node": victim_id, "partitions_moved": len(led), "sent": producer.sent,
            "records_check": counted}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--heartbeat-ms", type=int, default=1_000)
    parser.add_argument("--session-ms", type=int, default=3_000)
    parser.add_argument("--json", action="store_true", help="print only the JSON document")
    parser.add_argument("--output", type=Path, help="also write the JSON document here")
    add_broker_option(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    stop_on_signals()
    log = progress_log(args.json)
    node_args = ["--node-heartbeat-ms", str(args.heartbeat_ms),
                 "--node-session-timeout-ms", str(args.session_ms)]
    runs = []
    with tempfile.TemporaryDirectory(prefix="kiln-bench-takeover-") as tmp:
        log(f"starting the broker ({args.broker}) and warming it up")
        with start_broker(args.broker) as broker:
            for i in range(args.runs):
                redis = LocalRedis().start()
                try:
                    workdir = Path(tmp) / f"run-{i}"
                    workdir.mkdir()
                    run = one_run(redis.url, broker.bootstrap, workdir, node_args)
                finally:
                    redis.stop()
                runs.append(run)
                log(f"run {i + 1:>2}: takeover {run['takeover_s']} s, node "
                    f"{run['killed_node']} led {run['partitions_moved']} partitions; "
                    f"records {run['records_check']}")
            broker_description = broker.description
    times = sorted(r["takeover_s"] for r in runs if r["takeover_s"] is not None)
    doc = {
        "benchmark": "bench.takeover", "date": datetime.date.today().isoformat(),
        "command": " ".join(["python -m bench.takeover", *(argv or sys.argv[1:])]),
        "kiln_source": kiln_source(), "broker": broker_description,
        "settings": {"nodes": 3, "partitions": 6, "heartbeat_ms": args.heartbeat_ms,
                     "session_timeout_ms": args.session_ms, "harden_delay_ms": 200,
                     "producer": "idempotent, acks=all, librdkafka defaults"},
        "takeover_s": {"runs": len(runs), "taken_over": len(times),
                       "median": round(statistics.median(times), 3) if times else None,
                       "p99": times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
                       if times else None,
                       "max": times[-1] if times else None},
        "records_checks_ok": sum(r["records_check"] == "ok" for r in runs),
        "runs": runs,
    }
    text = json.dumps(doc, indent=2)
    if args.output:
        args.output.write_text(text + "\n")
    print(text)
    if not args.json:
        t = doc["takeover_s"]
        print(f"takeover after kill -9 over {t['runs']} runs: median {t['median']} s, "
              f"p99 {t['p99']} s, max {t['max']} s; records exactly once in "
              f"{doc['records_checks_ok']}/{len(runs)} runs", file=sys.stderr)


if __name__ == "__main__":
    main()
