"""`kiln status`: per topic-partition, what the log queue holds and where each tier stands,
read from the deployment's Redis (so it works from any machine that reaches it)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click

from cli import output
from cli.admin import Stores, connect, settings_from
from cli.settings import Settings
from cli.subscriptions import store_options
from storage.clock import wall_clock_ms
from storage.delay_control import read_reports
from storage.model import TopicPartition

_COLUMNS = ("topic", "partition", "next", "hardened", "delivered", "buffered", "bytes",
            "oldest_s", "delay_ms", "why", "subscriptions", "dropped", "written", "avoided")


@click.command()
@click.argument("topic", required=False)
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@store_options
def status(topic: str | None, as_json: bool, config_file: Path | None,
           redis_url: str | None) -> None:
    """Per partition: next offset, hardened and delivered marks, records and bytes
    buffered, age of the oldest buffered record, the current delay and why (see `kiln delay
    explain`), durable subscriptions, records dropped as delivered versus written to Kafka,
    and the share of records kept out of Kafka."""
    settings = settings_from(config_file, redis_url=redis_url)
    rows = asyncio.run(_rows(settings, topic))
    if topic is not None and not rows:
        raise click.ClickException(f"unknown topic {topic!r}")
    output.emit(rows, _COLUMNS, as_json=as_json, empty="no topics")


async def _rows(settings: Settings, only_topic: str | None) -> list[dict[str, Any]]:
    async with connect(settings) as stores:
        return await status_rows(stores, only_topic)


async def status_rows(stores: Stores, only_topic: str | None) -> list[dict[str, Any]]:
    topics = await stores.topics.all()
    subscriptions = await stores.delivery.subscriptions()
    # The delay each topic has now, as the Kiln process hardening it last published.
    delays = {r["topic"]: r for r in await read_reports(stores.queue.redis)}
    now = wall_clock_ms()
    rows = []
    for name, config in sorted(topics.items()):
        if only_topic is not None and name != only_topic:
            continue
        tps = [TopicPartition(name, p) for p in range(config.partitions)]
        states = await stores.queue.states(tps)
        oldest = await asyncio.gather(*(stores.queue.peek_oldest(tp) for tp in tps))
        for tp, state, first in zip(tps, states, oldest, strict=True):
            settled = state.delivered_records + state.hardened_records
            rows.append({
                "topic": name, "partition": tp.partition, "next": state.next_offset,
                "hardened": state.hardened_offset, "delivered": state.delivered_offset,
                "buffered": state.buffered_records, "bytes": state.buffered_bytes,
                "oldest_s": (round((now - first.append_time_ms) / 1000, 1)
                             if first is not None else None),
                "delay_ms": delays[name]["delay_ms"] if name in delays else None,
                "why": delays[name]["binding"] if name in delays else None,
                "subscriptions": len(subscriptions.get(name, {})),
                "dropped": state.delivered_records, "written": state.hardened_records,
                "avoided": (f"{state.delivered_records / settled:.1%}" if settled else None),
                "harden": config.harden.value,
            })
    return rows
