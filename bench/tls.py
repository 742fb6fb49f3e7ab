"""Producing to Kiln over TLS versus in plain text, side by side, in one run.

One Apache Kafka broker for the run (`--broker`), warmed up. Every measurement gets a fresh
Redis and a fresh `python -m cli serve` with two listeners, `PLAINTEXT` and `SSL` (a
throwaway CA and server certificate, ECDSA P-256, made for the run), a long fixed harden
delay (nothing is hardened during the run), and a fresh topic with one partition. The
producer is confluent-kafka (librdkafka) with bench.produce's ingest settings, acks=1,
`security.protocol=SSL` and the CA for the SSL side. Plaintext and SSL runs alternate,
`--repeats` each; medians (min..max) of records/s and MB/s of values, SSL/plaintext, and the
CPU seconds Kiln spent per run.

    python -m bench.tls                 # about 2 minutes
    python -m bench.tls --records 500000 --records-1k 200000
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.brokers import Broker, add_broker_option, create_topic, start_broker
from bench.produce import (
    CpuWindow,
    KilnProcess,
    kiln_source,
    new_topic_name,
    produce_n,
    progress_log,
    publish,
    stop_on_signals,
    tool_versions,
)
from cli.local_services import LocalRedis
from tests.certs import TlsMaterial, make_tls_material

# Nothing becomes due while a run produces.
KILN_DELAY_MS = 600_000
PROTOCOLS = ("PLAINTEXT", "SSL")


def measure(protocol: str, size: int, count: int, workdir: Path, broker: Broker,
            tls: TlsMaterial) -> dict[str, Any]:
    redis = LocalRedis().start()
    kiln = None
    try:
        kiln = KilnProcess(redis.url, broker.bootstrap, KILN_DELAY_MS, workdir=workdir,
                           listeners=PROTOCOLS, extra_args=[
                               "--ssl-certificate-file", str(tls.server_certificate_file),
                               "--ssl-key-file", str(tls.server_key_file)])
        plaintext = f"127.0.0.1:{kiln.port}"
        topic = new_topic_name(protocol.lower())
        create_topic(plaintext, topic)
        secure = protocol == "SSL"
        bootstrap = f"127.0.0.1:{kiln.port + 1}" if secure else plaintext
        client = ({"security.protocol": "SSL", "ssl.ca.location": str(tls.ca_file)}
                  if secure else {})
        window = CpuWindow(kiln=kiln.pid, redis=redis.pid)
        result = produce_n(bootstrap, topic, count, bytes(size), "1", client)
        cpu = window.stop()
        seconds = result["seconds"]
        return {"protocol": protocol, "value_bytes": size, "records": count,
                "seconds": round(seconds, 3), "records_per_s": round(count / seconds),
                "mb_per_s": round(count * size / seconds / 1e6, 2),
                "delivery_errors": result["errors"], "first_error": result["first_error"],
                "kiln_cpu_us_per_record": round(cpu["kiln_cpu_s"] / count * 1e6, 2), **cpu,
                "ok": result["errors"] == 0}
    finally:
        if kiln is not None:
            kiln.stop(kill=True)
        redis.stop()


def summarize(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [run[key] for run in runs]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run(args: argparse.Namespace, workdir: Path, log: Any) -> dict[str, Any]:
    tls = make_tls_material(workdir)
    broker = start_broker(args.broker)
    try:
        sizes = []
        for size, count in ((100, args.records), (1024, args.records_1k)):
            runs: dict[str, list[dict[str, Any]]] = {p: [] for p in PROTOCOLS}
            for repeat in range(args.repeats):
                for protocol in PROTOCOLS:
                    one = measure(protocol, size, count, workdir, broker, tls)
                    runs[protocol].append(one)
                    log(f"{size:>5} B {protocol:9} #{repeat + 1}: {one['records_per_s']:>10,} "
                        f"rec/s {one['mb_per_s']:>7.1f} MB/s{'' if one['ok'] else '  NOT OK'}")
            sides = {p: {"records_per_s": summarize(r, "records_per_s"),
                         "mb_per_s": summarize(r, "mb_per_s"),
                         "kiln_cpu_us_per_record": summarize(r, "kiln_cpu_us_per_record"),
                         "runs": r} for p, r in runs.items()}
            plain, secure = (sides[p]["records_per_s"]["median"] for p in PROTOCOLS)
            sizes.append({"value_bytes": size, "records": count, "repeats": args.repeats,
                          **sides, "ratio_ssl_to_plaintext": round(secure / plain, 2),
                          "all_ok": all(r["ok"] for rs in runs.values() for r in rs)})
    finally:
        broker.stop()
    return {"bench": "tls", "broker": args.broker, "kiln": kiln_source(),
            "tools": tool_versions(), "ingest": sizes}


def table(doc: dict[str, Any]) -> str:
    lines = [f"{'':17}{'rec/s':>10}{'min..max':>22}{'MB/s':>9}{'Kiln µs/rec':>13}"]
    for size in doc["ingest"]:
        for protocol in PROTOCOLS:
            side = size[protocol]
            rate = side["records_per_s"]
            lines.append(f"{size['value_bytes']:>5} B {protocol:<10}{rate['median']:>10,.0f}"
                         f"{rate['min']:>11,.0f}..{rate['max']:<9,.0f}"
                         f"{side['mb_per_s']['median']:>9.1f}"
                         f"{side['kiln_cpu_us_per_record']['median']:>13.2f}")
        lines.append(f"      SSL/plaintext: {size['ratio_ssl_to_plaintext']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_broker_option(parser)
    parser.add_argument("--records", type=int, default=300_000, help="100 B records per run")
    parser.add_argument("--records-1k", type=int, default=100_000, help="1 KB records per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print only the JSON document")
    parser.add_argument("--output", type=Path, help="also write the JSON document here")
    args = parser.parse_args(argv)
    stop_on_signals()
    workdir = Path(tempfile.mkdtemp(prefix="kiln-bench-tls-"))
    try:
        doc = run(args, workdir, progress_log(args.json))
    except KeyboardInterrupt:
        print("interrupted; every started process was stopped", file=sys.stderr)
        return 130
    finally:
        for path in workdir.glob("*"):
            with contextlib.suppress(OSError):
                path.unlink()
        with contextlib.suppress(OSError):
            workdir.rmdir()
    publish(doc, args.output, args.json, table)
    all_ok = all(size["all_ok"] for size in doc["ingest"])
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
