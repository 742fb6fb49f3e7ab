"""`kiln transactions`: the transactional ids of the deployment, as their coordinators keep
them in Redis (storage/transactions): each id's producer, epoch and state, how long its
transaction has been open, its timeout and participants, and the node that coordinates it;
and the hardening lane that hardens their partitions (storage/lane.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import click

from cli import output
from cli.admin import connect, settings_from
from cli.settings import Settings
from cli.subscriptions import store_options
from storage import redis_pool
from storage.clock import wall_clock_ms
from storage.errors import StorageError
from storage.lane_store import LANE, LaneStore
from storage.leadership import place, transaction_placement_key
from storage.model import TopicPartition
from storage.nodes import read_nodes
from storage.transactions.state import TxnState, TxnStatus, fence
from storage.transactions.store import TxnConflict, TxnStore

_COLUMNS = ("transactional_id", "producer_id", "epoch", "state", "open_s", "timeout_ms",
            "partitions", "groups", "coordinator")
_LANE_COLUMNS = ("lane", "node", "partitions", "awaiting", "assured_awaiting", "lagging")
_OPEN = frozenset({TxnStatus.ONGOING, TxnStatus.PREPARE_COMMIT, TxnStatus.PREPARE_ABORT})


@click.group()
def transactions() -> None:
    """Kafka transactions through Kiln (with transactions_enabled)."""


@transactions.command("list")
@click.option("--state", "states", multiple=True,
              type=click.Choice([s.value for s in TxnStatus], case_sensitive=False),
              help="only ids in this state (repeatable)")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@store_options
def list_(states: tuple[str, ...], as_json: bool, config_file: Path | None,
          redis_url: str | None) -> None:
    """Every transactional id: producer id and epoch, state, seconds its transaction has been
    open, timeout, how many partitions and groups it holds, and its coordinator node."""
    settings = settings_from(config_file, redis_url=redis_url)
    wanted = {s.lower() for s in states}
    rows = [row for row in _run(_rows(settings))
            if not wanted or str(row["state"]).lower() in wanted]
    output.emit(rows, _COLUMNS, as_json=as_json, empty="no transactional ids")


@transactions.command("describe")
@click.argument("transactional_id")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@store_options
def describe(transactional_id: str, as_json: bool, config_file: Path | None,
             redis_url: str | None) -> None:
    """One transactional id, with the partitions and groups of its open transaction."""
    settings = settings_from(config_file, redis_url=redis_url)
    rows = [dict(row, partitions=row["participants"]) for row in
            _run(_rows(settings, [transactional_id], participants=True))]
    if not rows:
        raise click.ClickException(f"no transactional id {transactional_id!r}")
    output.emit(rows, _COLUMNS, as_json=as_json)


@transactions.command("abort")
@click.argument("transactional_id")
@click.option("--timeout", "timeout_s", type=float, default=10.0, show_default=True,
              help="seconds to wait for its coordinator to end it")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@store_options
def abort(transactional_id: str, timeout_s: float, as_json: bool, config_file: Path | None,
          redis_url: str | None) -> None:
    """Abort TRANSACTIONAL_ID's open transaction, fencing its producer (its epoch is bumped:
    the producer must initialise again), as a transaction timeout does. The decision is
    written to Redis; the id's coordinator node writes the markers within about a second."""
    settings = settings_from(config_file, redis_url=redis_url)
    rows = _run(_abort(settings, transactional_id, timeout_s))
    output.emit(rows, _COLUMNS, as_json=as_json)


@transactions.command("lane")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@store_options
def lane(as_json: bool, config_file: Path | None, redis_url: str | None) -> None:
    """The hardening lane, which hardens every partition a transaction registered in: the
    node running it, how many partitions it hardens, the committed transactions it has not
    decided yet (awaiting; assured_awaiting: those whose producers' commits wait for it) and
    how many partitions hold them (lagging)."""
    settings = settings_from(config_file, redis_url=redis_url)
    output.emit(_run(_lane_rows(settings)), _LANE_COLUMNS, as_json=as_json)


async def _lane_rows(settings: Settings) -> list[dict[str, Any]]:
    async with connect(settings) as stores:
        topics = await stores.topics.all()
        tps = [TopicPartition(name, p) for name, config in sorted(topics.items())
               for p in range(config.partitions)]
        in_lane = await stores.queue.in_lane(tps)
        committed = await stores.queue.committed_transactions(tps)
        view = await LaneStore(stores.queue.redis).view()
        registered = await read_nodes(stores.queue.redis)
    node = next((n.node_id for n in registered if n.incarnation == view.holder_incarnation),
                None)
    return [{"lane": LANE, "node": node, "partitions": sum(in_lane),
             "awaiting": view.awaiting, "assured_awaiting": view.assured_awaiting,
             "lagging": sum(1 for txns in committed if txns)}]


async def _abort(settings: Settings, transactional_id: str, timeout_s: float
                 ) -> list[dict[str, Any]]:
    redis = redis_pool.connect(settings.redis_url, max_connections=4)
    try:
        store = TxnStore(redis)
        stored = await store.load(transactional_id)
        if stored.state is None:
            raise click.ClickException(f"no transactional id {transactional_id!r}")
        now = wall_clock_ms()
        step = fence(stored.state, now=now)
        if step.state is None:
            raise click.ClickException(f"{transactional_id!r} has no open transaction "
                                       f"({stored.state.status.value})")
        try:
            await store.save(step.state, stored.revision, now)
        except TxnConflict:
            raise click.ClickException(f"{transactional_id!r} changed meanwhile; try again"
                                       ) from None
        deadline = time.monotonic() + timeout_s
        while (state := (await store.load(transactional_id)).state) is not None \
                and state.status is TxnStatus.PREPARE_ABORT:
            if time.monotonic() > deadline:
                raise click.ClickException(
                    f"the abort of {transactional_id!r} is decided; no Kiln node finished it "
                    f"within {timeout_s:g}s (its coordinator does once it runs)")
            await asyncio.sleep(0.1)
    finally:
        await redis_pool.close(redis)
    return await _rows(settings, [transactional_id], participants=True)


def _run(rows: Any) -> list[dict[str, Any]]:
    try:
        return list(asyncio.run(rows))
    except StorageError as exc:
        raise click.ClickException(exc.message) from exc


async def _rows(settings: Settings, ids: list[str] | None = None, *,
                participants: bool = False) -> list[dict[str, Any]]:
    redis = redis_pool.connect(settings.redis_url, max_connections=4)
    try:
        store = TxnStore(redis)
        states = await store.load_many(ids if ids is not None
                                       else await store.transactional_ids())
        registered = await read_nodes(redis)
    finally:
        await redis_pool.close(redis)
    now = wall_clock_ms()
    live = tuple(sorted(n.node_id for n in registered if n.live(now)))
    return [_row(state, now, place(transaction_placement_key(state.transactional_id), live),
                 participants) for state in states if state.status is not TxnStatus.DEAD]


def _row(state: TxnState, now_ms: int, coordinator: int | None,
         participants: bool) -> dict[str, Any]:
    row: dict[str, Any] = {
        "transactional_id": state.transactional_id, "producer_id": state.producer_id,
        "epoch": state.producer_epoch, "state": state.status.value,
        "open_s": (round((now_ms - state.start_ms) / 1000, 1)
                   if state.status in _OPEN and state.start_ms >= 0 else None),
        "timeout_ms": state.timeout_ms, "partitions": len(state.partitions),
        "groups": len(state.groups), "coordinator": coordinator}
    if participants:
        row["participants"] = " ".join(
            [f"{t}/{p}" for t, p in sorted(state.partitions)]
            + [f"group:{g}" for g in sorted(state.groups)]) or None
    return row
