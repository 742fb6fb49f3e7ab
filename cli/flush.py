"""`kiln flush [TOPIC]` (harden what is buffered now) and `kiln drain` (planned shutdown of
every running Kiln process), asked of the running processes through Redis, with progress."""

from __future__ import annotations

import asyncio
import io
import sys
import time
from pathlib import Path
from typing import Any

import click

from cli import output
from cli.admin import Stores, connect, settings_from
from cli.settings import Settings
from cli.subscriptions import store_options
from storage.clock import wall_clock_ms
from storage.delay_control import read_reports
from storage.log_queue import PartitionState
from storage.model import TopicPartition
from storage.operator_requests import clear_flush, request_drain, request_flush

_POLL_S = 0.2
# How long `kiln flush` waits for a running Kiln process to publish its first report.
_FIRST_REPORT_S = 5.0
_COLUMNS = ("topic", "partition", "goal", "start", "written", "dropped", "done")


@click.command()
@click.argument("topic", required=False)
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), default=120.0,
              show_default=True,
              help="give up after this many seconds")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@store_options
def flush(topic: str | None, timeout_s: float, as_json: bool, config_file: Path | None,
          redis_url: str | None) -> None:
    """Harden every record buffered now (of TOPIC, or all topics), ignoring the delay.

    Delivered records are dropped as usual; non-persistent ones are let go. Needs a running
    Kiln process: the one holding each partition's lease does the work."""
    settings = settings_from(config_file, redis_url=redis_url)
    rows, finished = asyncio.run(_flush(settings, topic, timeout_s, show_progress=not as_json))
    output.emit(rows, _COLUMNS, as_json=as_json, empty="nothing buffered")
    if not finished:
        raise click.ClickException(f"not everything was hardened within {timeout_s:.0f} s; "
                                   "is Kafka reachable? (`kiln status`, Kiln's log)")


@click.command()
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), default=300.0,
              show_default=True,
              help="give up waiting after this many seconds")
@store_options
def drain(timeout_s: float, config_file: Path | None, redis_url: str | None) -> None:
    """Planned shutdown of every running Kiln process: each stops accepting, hardens every
    buffered persistent record, and exits. Waits until they are gone."""
    settings = settings_from(config_file, redis_url=redis_url)
    gone, left = asyncio.run(_drain(settings, timeout_s))
    if not gone:
        raise click.ClickException(f"still running after {timeout_s:.0f} s: {', '.join(left)}")
    click.echo("drained: no Kiln process is running; "
               "what is still buffered is in `kiln status`")


async def _flush(settings: Settings, only_topic: str | None, timeout_s: float,
                 show_progress: bool) -> tuple[list[dict[str, Any]], bool]:
    async with connect(settings) as stores:
        tps = await _partitions(stores, only_topic)
        before = await stores.queue.states(tps) if tps else []
        goals = {tp: s.next_offset for tp, s in zip(tps, before, strict=True)
                 if s.flushed_offset < s.next_offset}
        if goals and not await _a_kiln_reports(stores):
            raise click.ClickException("no Kiln process is running against "
                                       f"{settings.shown_redis_url}: nothing can harden")
        await request_flush(stores.queue.redis, goals)
        first = {tp: s for tp, s in zip(tps, before, strict=True) if tp in goals}
        try:
            latest, finished = await _follow(stores, first, goals, timeout_s, show_progress)
        finally:
            await clear_flush(stores.queue.redis, list(goals))
    return [_row(tp, goals[tp], first[tp], latest[tp]) for tp in goals], finished


async def _a_kiln_reports(stores: Stores) -> bool:
    """Whether a Kiln process is running: it publishes a report per topic it knows every
    second, so a process that has just started (or just seen its first topic) gets a few
    seconds to show up before the answer is no."""
    deadline = time.monotonic() + _FIRST_REPORT_S
    while not await read_reports(stores.queue.redis):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_POLL_S)
    return True


async def _follow(stores: Stores, first: dict[TopicPartition, PartitionState],
                  goals: dict[TopicPartition, int], timeout_s: float, show_progress: bool
                  ) -> tuple[dict[TopicPartition, PartitionState], bool]:
    """Poll the partitions until each one is flushed to its goal, with a bar."""
    total = sum(goals[tp] - state.flushed_offset for tp, state in first.items())
    latest = dict(first)
    deadline = time.monotonic() + timeout_s
    with click.progressbar(length=total, label="hardening", show_pos=True,
                           file=sys.stderr if show_progress else io.StringIO()) as bar:
        done = 0
        while True:
            states = await stores.queue.states(list(goals)) if goals else []
            latest = dict(zip(goals, states, strict=True))
            now_done = sum(min(latest[tp].flushed_offset, goal) - first[tp].flushed_offset
                           for tp, goal in goals.items())
            bar.update(now_done - done)
            done = now_done
            if all(latest[tp].flushed_offset >= goal for tp, goal in goals.items()):
                return latest, True
            if time.monotonic() >= deadline:
                return latest, False
            await asyncio.sleep(_POLL_S)


async def _drain(settings: Settings, timeout_s: float) -> tuple[bool, list[str]]:
    async with connect(settings) as stores:
        nodes = sorted({r["node"] for r in await read_reports(stores.queue.redis)})
        if not nodes:
            raise click.ClickException("no Kiln process is running against "
                                       f"{settings.shown_redis_url}")
        click.echo(f"asking {len(nodes)} Kiln process(es) to drain: {', '.join(nodes)}")
        await request_drain(stores.queue.redis, wall_clock_ms())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            left = sorted({r["node"] for r in await read_reports(stores.queue.redis)})
            if not left:
                return True, []
            await asyncio.sleep(_POLL_S * 5)
        return False, left


async def _partitions(stores: Stores, only_topic: str | None) -> list[TopicPartition]:
    topics = await stores.topics.all()
    if only_topic is not None and only_topic not in topics:
        raise click.ClickException(f"unknown topic {only_topic!r}")
    return [TopicPartition(name, p) for name, config in sorted(topics.items())
            if only_topic in (None, name) for p in range(config.partitions)]


def _row(tp: TopicPartition, goal: int, first: PartitionState, last: PartitionState
         ) -> dict[str, Any]:
    return {"topic": tp.topic, "partition": tp.partition, "goal": goal,
            "start": last.start_offset,
            "written": last.hardened_records - first.hardened_records,
            "dropped": last.delivered_records - first.delivered_records,
            "done": last.flushed_offset >= goal}
