"""`kiln transactions`: the transactional ids of the deployment, as their coordinators keep
them in Redis (storage/transactions): each id's producer, epoch and state, how long its
transaction has been open, its timeout and participants, and the node that coordinates it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click

from cli import output
from cli.admin import settings_from
from cli.settings import Settings
from cli.subscriptions import store_options
from storage import redis_pool
from storage.clock import wall_clock_ms
from storage.errors import StorageError
from storage.leadership import place, transaction_placement_key
from storage.nodes import read_nodes
from storage.transactions.state import TxnState, TxnStatus
from storage.transactions.store import TxnStore

_COLUMNS = ("transactional_id", "producer_id", "epoch", "state", "open_s", "timeout_ms",
            "partitions", "groups", "coordinator")
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
