"""`kiln delay explain [TOPIC]`: each topic's current hardening delay, every input the policy
used, every constraint it weighed and the one that binds, as each running Kiln process last
published it to Redis (about once a second)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from cli import output
from cli.admin import connect, settings_from
from cli.settings import Settings
from cli.subscriptions import store_options
from storage.clock import wall_clock_ms
from storage.delay_control import read_reports

_STALE_MS = 10_000


@click.group()
def delay() -> None:
    """The hardening delay (see docs/delay.md)."""


@delay.command()
@click.argument("topic", required=False)
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@store_options
def explain(topic: str | None, as_json: bool, config_file: Path | None,
            redis_url: str | None) -> None:
    """Per topic: the current delay and why: the binding constraint, every candidate the
    policy weighed, and the inputs it observed."""
    settings = settings_from(config_file, redis_url=redis_url)
    reports = asyncio.run(_reports(settings))
    if topic is not None:
        reports = [r for r in reports if r["topic"] == topic]
    if not reports:
        where = f" for topic {topic!r}" if topic is not None else ""
        raise click.ClickException(
            f"no delay decisions published{where}: no Kiln process is running against "
            f"{settings.shown_redis_url}, or it has not seen the topic yet")
    now = wall_clock_ms()
    for report in reports:
        report["age_ms"] = now - report["at_ms"]
        report["stale"] = report["age_ms"] > _STALE_MS
    if as_json:
        click.echo(json.dumps(reports, indent=2, sort_keys=True))
        return
    for index, report in enumerate(reports):
        if index:
            click.echo()
        _print_report(report)


async def _reports(settings: Settings) -> list[dict[str, Any]]:
    async with connect(settings) as stores:
        return await read_reports(stores.queue.redis)


def _print_report(report: Mapping[str, Any]) -> None:
    age = report["age_ms"] / 1000
    stale = click.style("  STALE", fg="red", bold=True) if report["stale"] else ""
    click.echo(click.style(f"{report['topic']}", bold=True)
               + f"  delay {report['delay_ms']} ms, bound by "
               + click.style(report["binding"], fg="yellow", bold=True)
               + f"  ({report['policy']} policy; {report['node']}, {age:.1f} s ago){stale}")
    if report["candidates"]:
        rows = [{"constraint": c["constraint"],
                 "delay_ms": "unbounded" if c["delay_ms"] is None else c["delay_ms"],
                 "": "<- binding" if c["constraint"] == report["binding"] else ""}
                for c in report["candidates"]]
        output.emit(rows, ("constraint", "delay_ms", ""), as_json=False)
    inputs = report["inputs"]
    limits = report["limits"]
    latency = inputs["delivery_latency_ms"]
    lines = [
        ("durable subscriptions", "yes" if inputs["has_subscriptions"] else "none"),
        ("delivery latency (high quantile)",
         "not timed yet" if latency is None else f"{latency:.0f} ms"),
        ("oldest undelivered waits", f"{inputs['undelivered_wait_ms']} ms"),
        ("sending clients (last 10 s)", str(inputs["senders"])),
        ("ingress, all topics", f"{_size(inputs['bytes_per_s'])}/s, "
                                f"{inputs['records_per_s']:.0f} records/s"),
        ("at risk (not hardened)", f"{_size(inputs['at_risk_bytes'])} of "
                                   f"{_size(limits['risk_budget_bytes'])}, "
                                   f"{inputs['at_risk_records']} of "
                                   f"{limits['risk_budget_records']} records"),
        ("buffered, all levels", f"{_size(inputs['buffered_bytes'])} of "
                                 f"{_size(limits['memory_budget_bytes'])}"),
        ("guarantee acks waiting", str(inputs["pending_acks"])),
        ("kafka", ("healthy" if inputs["kafka_healthy"] else "FAILING")
                  + f", write {inputs['kafka_write_ms']:.0f} ms"),
        ("bounds", f"{limits['min_delay_ms']}..{limits['max_delay_ms']} ms"),
    ]
    width = max(len(name) for name, _ in lines)
    for name, value in lines:
        click.echo(f"  {name.ljust(width)}  {value}")


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(nbytes) < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")
