"""Operator commands work on a running deployment through its Redis (and Kafka), so they run
from any machine that reaches them; this module connects to them and builds the parts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from cli.settings import Settings, SettingsError, load_settings
from storage.acks import SettledWaiters
from storage.delivery import Delivery
from storage.errors import StorageError
from storage.log_queue import LogQueue
from storage.subscriptions import SubscriptionRegistry
from storage.topics import TopicRegistry


def settings_from(config_file: Path | None, **flags: Any) -> Settings:
    """Settings for a command; a bad flag, variable or file is a usage error naming it."""
    try:
        return load_settings(config_file, overrides=flags)
    except SettingsError as exc:
        raise click.UsageError(str(exc)) from exc


@dataclass(frozen=True, slots=True)
class Stores:
    queue: LogQueue
    topics: TopicRegistry
    delivery: Delivery


@asynccontextmanager
async def connect(settings: Settings) -> AsyncIterator[Stores]:
    queue = LogQueue.from_url(settings.redis_url)
    try:
        try:
            await queue.ping()
        except StorageError as exc:
            raise click.ClickException(f"cannot reach Redis at {settings.shown_redis_url}: "
                                       f"{exc.__cause__ or exc}") from exc
        topics = TopicRegistry(queue.redis)
        yield Stores(queue, topics, Delivery(queue, topics, SubscriptionRegistry(queue.redis),
                                             SettledWaiters(queue)))
    finally:
        await queue.close()
