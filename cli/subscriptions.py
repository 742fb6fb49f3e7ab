"""`kiln subscriptions list|add|remove`: the durable subscriptions whose commits decide which
records are delivered (and so never written to Kafka)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from cli import output
from cli.admin import Stores, connect, settings_from
from cli.settings import Settings
from storage.model import TopicPartition

_COLUMNS = ("topic", "group", "source", "since", "committed", "lag")


def store_options(func: Any) -> Any:
    func = click.option("--config", "config_file", type=click.Path(path_type=Path,
                        dir_okay=False), help="TOML configuration file")(func)
    return click.option("--redis-url", help="Redis of the Kiln deployment [KILN_REDIS_URL]")(func)


@click.group()
def subscriptions() -> None:
    """Durable subscriptions: consumer groups whose commits make records delivered."""


@subscriptions.command("list")
@click.argument("topic", required=False)
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@store_options
def list_(topic: str | None, as_json: bool, config_file: Path | None,
          redis_url: str | None) -> None:
    """Every durable subscription (of TOPIC), with its committed offsets and lag."""
    rows = asyncio.run(_rows(settings_from(config_file, redis_url=redis_url), topic))
    output.emit(rows, _COLUMNS, as_json=as_json, empty="no durable subscriptions")


@subscriptions.command()
@click.argument("topic")
@click.argument("group")
@store_options
def add(topic: str, group: str, config_file: Path | None, redis_url: str | None) -> None:
    """Make GROUP a durable subscription of TOPIC."""
    settings = settings_from(config_file, redis_url=redis_url)
    added = asyncio.run(_change(settings, topic, group, add=True))
    click.echo(f"{group} {'is now' if added else 'already was'} a durable subscription of "
               f"{topic}")


@subscriptions.command()
@click.argument("topic")
@click.argument("group")
@store_options
def remove(topic: str, group: str, config_file: Path | None, redis_url: str | None) -> None:
    """Stop counting GROUP's commits for TOPIC."""
    settings = settings_from(config_file, redis_url=redis_url)
    if not asyncio.run(_change(settings, topic, group, add=False)):
        raise click.ClickException(f"{group} is not a durable subscription of {topic}")
    click.echo(f"{group} is no longer a durable subscription of {topic}")


async def _change(settings: Settings, topic: str, group: str, *, add: bool) -> bool:
    async with connect(settings) as stores:
        if await stores.topics.get(topic) is None:
            raise click.ClickException(f"unknown topic {topic!r}")
        if add:
            return await stores.delivery.subscribe(topic, group)
        return await stores.delivery.unsubscribe(topic, group)


async def _rows(settings: Settings, only_topic: str | None) -> list[dict[str, Any]]:
    async with connect(settings) as stores:
        return await _subscription_rows(stores, only_topic)


async def _subscription_rows(stores: Stores, only_topic: str | None) -> list[dict[str, Any]]:
    rows = []
    for topic, groups in sorted((await stores.delivery.subscriptions()).items()):
        if only_topic is not None and topic != only_topic:
            continue
        config = await stores.topics.get(topic)
        tps = [TopicPartition(topic, p) for p in range(config.partitions if config else 0)]
        commits = await stores.queue.commits(tps)
        states = await stores.queue.states(tps)
        for group, sub in sorted(groups.items()):
            committed = [c.get(group) for c in commits]
            lag = [s.next_offset - c for s, c in zip(states, committed, strict=True)
                   if c is not None]
            rows.append({
                "topic": topic, "group": group, "source": sub.source,
                "since": datetime.fromtimestamp(sub.since_ms / 1000, UTC).strftime(
                    "%Y-%m-%d %H:%M:%SZ"),
                "committed": f"{sum(c is not None for c in committed)}/{len(tps)} partitions",
                "lag": sum(lag) if lag else None,
            })
    return rows
