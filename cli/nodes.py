"""`kiln nodes`: the Kiln nodes of the deployment, as they registered in Redis
(storage/nodes.py): live ones, and dead ones whose ids are still kept for them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click

from cli import output
from cli.admin import connect, settings_from
from cli.settings import Settings
from cli.subscriptions import store_options
from storage.clock import wall_clock_ms
from storage.nodes import KilnNode, read_nodes

_COLUMNS = ("node_id", "state", "address", "http", "pid", "up_s", "heard_s_ago")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@store_options
def nodes(as_json: bool, config_file: Path | None, redis_url: str | None) -> None:
    """The Kiln nodes sharing this Redis: id, live or dead, Kafka address clients reach it
    at, HTTP endpoints, process id, time since it started and since its last heartbeat."""
    settings = settings_from(config_file, redis_url=redis_url)
    output.emit(asyncio.run(_rows(settings)), _COLUMNS, as_json=as_json,
                empty="no nodes registered")


async def _rows(settings: Settings) -> list[dict[str, Any]]:
    async with connect(settings) as stores:
        registered = await read_nodes(stores.queue.redis)
    now = wall_clock_ms()
    return [node_row(node, now) for node in registered]


def node_row(node: KilnNode, now_ms: int) -> dict[str, Any]:
    return {"node_id": node.node_id, "state": "live" if node.live(now_ms) else "dead",
            "address": node.address or None, "http": node.http or None, "pid": node.pid,
            "up_s": round((now_ms - node.started_ms) / 1000),
            "heard_s_ago": round((now_ms - node.renewed_ms) / 1000, 1)}
