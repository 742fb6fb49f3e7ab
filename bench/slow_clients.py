"""What clients that never read their answers cost: Kiln's memory against the broker's.

Fresh local services (Redis, the broker of `--broker kafka|tansu`, see bench/brokers.py,
and Kiln as a separate `python -m cli serve` with a long delay, so the records stay in
Redis). A topic gets 8 MB of records (200 KB each). Then
N connections each send 64 Fetch requests for the whole topic (max_bytes 10 MB) and never
read a byte of the answers, for some seconds; then they close. The resident memory (VmRSS)
of the endpoint's process is sampled all along: before, the peak while the clients hold
their connections, and a few seconds after they left; three rounds, one after another, so
that what stays after a round shows whether it is kept once or piles up. The same clients
then do the same to the broker directly.

Prints one JSON document on stdout and a table on stderr (`--json`: the JSON only).

    python -m bench.slow_clients                 # 4 clients, Apache Kafka, about 1.5 minutes
    python -m bench.slow_clients --broker tansu
    python -m bench.slow_clients --clients 8
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kafka.protocol.consumer import FetchRequest

from bench.brokers import add_broker_option, create_topic, start_broker
from bench.produce import (
    kiln_source,
    new_topic_name,
    proc_status_kb,
    produce_n,
    stack_with_topic,
)

MiB = 1024 * 1024
RECORD = b"x" * (200 * 1024)
FETCHES_PER_CLIENT = 64


def fill(bootstrap: str, topic: str, records: int) -> None:
    outcome = produce_n(bootstrap, topic, records, RECORD, "1")
    if outcome["errors"]:
        raise RuntimeError(f"producing to {bootstrap}: {outcome['first_error']}")


def greedy_client(bootstrap: str, topic: str) -> socket.socket:
    """A connection that asks for everything 64 times and reads nothing."""
    host, _, port = bootstrap.rpartition(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.connect((host, int(port)))
    sock.setblocking(False)
    for correlation_id in range(FETCHES_PER_CLIENT):
        request = FetchRequest[11](
            replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=10 * MiB,
            isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
            forgotten_topics_data=[],
            topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
                FetchRequest.FetchTopic.FetchPartition(
                    partition=0, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
                    partition_max_bytes=10 * MiB)])])
        request.with_header(correlation_id=correlation_id, client_id="greedy")
        payload = bytes(request.encode(version=11, header=True))
        try:
            sock.send(struct.pack(">i", len(payload)) + payload)
        except BlockingIOError:
            break  # the endpoint stopped reading: so much the better
    return sock


def rss_mb(pid: int | None) -> float:
    return round(proc_status_kb(pid, "VmRSS") / 1024, 1)


def measure(bootstrap: str, pid: int | None, topic: str, clients: int, hold_s: float,
            after_s: float) -> dict[str, Any]:
    before = rss_mb(pid)
    socks = [greedy_client(bootstrap, topic) for _ in range(clients)]
    peak = before
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        peak = max(peak, rss_mb(pid))
        time.sleep(0.1)
    for sock in socks:
        sock.close()
    time.sleep(after_s)
    return {"rss_before_mb": before, "rss_peak_mb": peak, "rss_after_mb": rss_mb(pid),
            "peak_growth_mb": round(peak - before, 1)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    with (tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp,
          start_broker(args.broker) as broker,
          stack_with_topic(Path(tmp), broker, "slow",
                           kiln_delay_ms=600_000) as (stack, kiln_topic)):
        assert stack.kiln is not None
        direct_topic = new_topic_name("slow")
        create_topic(broker.bootstrap, direct_topic)
        fill(stack.kiln.bootstrap, kiln_topic, args.records)
        fill(broker.bootstrap, direct_topic, args.records)
        kiln_rounds = [measure(stack.kiln.bootstrap, stack.kiln.pid, kiln_topic,
                               args.clients, args.hold_s, args.after_s)
                       for _ in range(args.rounds)]
        direct_rounds = [measure(broker.bootstrap, broker.pid, direct_topic,
                                 args.clients, args.hold_s, args.after_s)
                         for _ in range(args.rounds)]
    kiln, direct = kiln_rounds[0], direct_rounds[0]
    growth_ratio = (round(kiln["peak_growth_mb"] / direct["peak_growth_mb"], 2)
                    if direct["peak_growth_mb"] > 0 else None)
    return {"broker": broker.describe(),
            "clients": args.clients, "fetches_per_client": FETCHES_PER_CLIENT,
            "topic_mb": round(args.records * len(RECORD) / MiB, 1),
            "hold_s": args.hold_s, "kiln": kiln_rounds, "direct": direct_rounds,
            "peak_growth_ratio_kiln_to_direct": growth_ratio, "source": kiln_source()}


def table(doc: dict[str, Any]) -> str:
    lines = [f"{doc['clients']} clients x {doc['fetches_per_client']} fetches of a "
             f"{doc['topic_mb']} MB topic, answers never read, held {doc['hold_s']} s; "
             f"broker: {doc['broker']['description']}",
             f"{'':8} {'RSS before MB':>14} {'peak MB':>9} {'growth MB':>10} {'after MB':>9}"]
    for name in ("kiln", "direct"):
        for i, row in enumerate(doc[name], 1):
            lines.append(f"{name + ' ' + str(i):8} {row['rss_before_mb']:>14} "
                         f"{row['rss_peak_mb']:>9} {row['peak_growth_mb']:>10} "
                         f"{row['rss_after_mb']:>9}")
    lines.append(f"peak growth Kiln/direct (first round): "
                 f"{doc['peak_growth_ratio_kiln_to_direct']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--records", type=int, default=40, help="records of 200 KB")
    parser.add_argument("--hold-s", type=float, default=8.0)
    parser.add_argument("--after-s", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of clients, one after "
                        "another, against the same process")
    parser.add_argument("--json", action="store_true", help="JSON only")
    add_broker_option(parser)
    args = parser.parse_args()
    doc = run(args)
    print(json.dumps(doc, indent=2))
    if not args.json:
        print(table(doc), file=sys.stderr)


if __name__ == "__main__":
    main()
