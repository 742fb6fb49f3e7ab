"""Redis clients for Kiln's stores, each with a pool of its own.

redis-py's default asyncio pool refuses a command at once when all its connections are in
use; these pools make a command wait for a free connection instead (for `wait_s`, after
which it fails as Redis being unavailable).

A command whose connection turns out closed is tried once more on a new connection: after a
Redis restart every pooled connection is dead, and without the retry the first command on
each would fail although Redis is back. (If the connection died after a script was sent
and before its answer, the retry may run it twice; that is what a client's own retry of the
failed request would do, and idempotent producers are deduplicated either way.)

`redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]` reaches whichever server
the Sentinels name master of SERVICE, asking them again when a connection fails (after a
failover). Kiln notices that the new master is another Redis process and starts its
partitions again from what Kafka holds (storage/appender.py): a promoted replica may lack
the last writes.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

SENTINEL_SCHEME = "redis+sentinel://"


class _BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """Connections to the master the Sentinels name, waiting for a free one when all are
    in use (SentinelConnectionPool's own refuses at once)."""


def _retrying() -> dict[str, Any]:
    return {"retry": Retry(NoBackoff(), 1), "retry_on_error": [RedisConnectionError]}


def connect(url: str, *, max_connections: int, wait_s: float = 10.0) -> aioredis.Redis:
    if url.startswith(SENTINEL_SCHEME):
        return _connect_through_sentinels(url, max_connections, wait_s)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=wait_s, decode_responses=False,
        **_retrying())
    return aioredis.Redis(connection_pool=pool)


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, int, str | None]:
    """(Sentinel addresses, service name, database, password) of a redis+sentinel:// URL;
    raises ValueError naming what is wrong."""
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    sentinels = []
    for item in filter(None, hosts.split(",")):
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"sentinel address {item!r} is not HOST:PORT")
        sentinels.append((host.strip("[]"), int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not sentinels or not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError("expected redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]")
    password = unquote(parts.password) if parts.password else None
    return sentinels, path[0], int(path[1]) if len(path) == 2 else 0, password


def _connect_through_sentinels(url: str, max_connections: int, wait_s: float
                               ) -> aioredis.Redis:
    sentinels, service, db, password = parse_sentinel_url(url)
    manager = Sentinel(sentinels, socket_timeout=wait_s)  # type: ignore[no-untyped-call]
    pool = _BlockingSentinelPool(  # type: ignore[no-untyped-call]
        service, manager, max_connections=max_connections, timeout=wait_s, db=db,
        password=password, decode_responses=False, **_retrying())
    return aioredis.Redis(connection_pool=pool)


async def close(client: aioredis.Redis) -> None:
    pool = client.connection_pool
    await client.aclose(close_connection_pool=True)
    if isinstance(pool, SentinelConnectionPool):
        for sentinel in pool.sentinel_manager.sentinels:
            await sentinel.aclose()
