"""`kiln nodes`: the Kiln nodes of the deployment, as they registered in Redis
(storage/nodes.py): live ones, with the partitions they lead and the groups they coordinate
(storage/leadership.py), and dead ones whose ids are still kept for them."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import click

from cli import output
from cli.admin import connect, settings_from
from cli.settings import Settings
from cli.subscriptions import store_options
from storage.clock import wall_clock_ms
from storage.delay_control import ingress_by_node
from storage.groups.store import GroupStore
from storage.leadership import group_placement_key, partition_placement_key, place
from storage.model import TopicPartition
from storage.nodes import KilnNode, read_nodes

_COLUMNS = ("node_id", "state", "address", "http", "pid", "up_s", "heard_s_ago", "partitions",
            "groups", "in_rec_s", "in_mb_s")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@store_options
def nodes(as_json: bool, config_file: Path | None, redis_url: str | None) -> None:
    """The Kiln nodes sharing this Redis: id, live or dead, Kafka address clients reach it
    at, HTTP endpoints, process id, time since it started and since its last heartbeat, and
    how many partitions it leads and groups it coordinates, and the records/s and MB/s
    producers sent through it lately (from its delay reports)."""
    settings = settings_from(config_file, redis_url=redis_url)
    output.emit(asyncio.run(_rows(settings)), _COLUMNS, as_json=as_json,
                empty="no nodes registered")


async def _rows(settings: Settings) -> list[dict[str, Any]]:
    async with connect(settings) as stores:
        registered = await read_nodes(stores.queue.redis)
        topics = await stores.topics.all()
        groups = await GroupStore(stores.queue.redis).group_ids()
        ingress = await ingress_by_node(stores.queue.redis,
                                        [n.incarnation for n in registered])
    now = wall_clock_ms()
    live = tuple(sorted(n.node_id for n in registered if n.live(now)))
    partitions = Counter(place(partition_placement_key(TopicPartition(name, p)), live)
                         for name, config in topics.items() for p in range(config.partitions))
    coordinated = Counter(place(group_placement_key(group), live) for group in groups)
    return [node_row(node, now, partitions[node.node_id], coordinated[node.node_id],
                     ingress.get(node.incarnation))
            for node in registered]


def node_row(node: KilnNode, now_ms: int, partitions: int, groups: int,
             ingress: tuple[float, float] | None) -> dict[str, Any]:
    live = node.live(now_ms)
    records_per_s, bytes_per_s = ingress if live and ingress is not None else (None, None)
    return {"node_id": node.node_id, "state": "live" if live else "dead",
            "address": node.address or None, "http": node.http or None, "pid": node.pid,
            "up_s": round((now_ms - node.started_ms) / 1000),
            "heard_s_ago": round((now_ms - node.renewed_ms) / 1000, 1),
            "partitions": partitions if live else None, "groups": groups if live else None,
            "in_rec_s": None if records_per_s is None else round(records_per_s),
            "in_mb_s": None if bytes_per_s is None else round(bytes_per_s / 1e6, 2)}
