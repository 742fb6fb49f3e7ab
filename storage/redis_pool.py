"""Redis clients for Kiln's stores, each with a pool of its own.

redis-py's default asyncio pool refuses a command at once when all its connections are in
use; these pools make a command wait for a free connection instead (for `wait_s`, after
which it fails as Redis being unavailable).

A command whose connection turns out closed is tried once more on a new connection: after a
Redis restart every pooled connection is dead, and without the retry the first command on
each would fail although Redis is back. (If the connection died after a script was sent
and before its answer, the retry may run it twice; that is what a client's own retry of the
failed request would do, and idempotent producers are deduplicated either way.)"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError


def connect(url: str, *, max_connections: int, wait_s: float = 10.0) -> aioredis.Redis:
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=wait_s, decode_responses=False,
        retry=Retry(NoBackoff(), 1), retry_on_error=[RedisConnectionError])
    return aioredis.Redis(connection_pool=pool)


async def close(client: aioredis.Redis) -> None:
    await client.aclose(close_connection_pool=True)
