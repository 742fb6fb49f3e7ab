"""Redis clients for Kiln's stores, each with a pool of its own.

redis-py's default asyncio pool refuses a command at once when all its connections are in
use; these pools make a command wait for a free connection instead (for `wait_s`, after
which it fails as Redis being unavailable)."""

from __future__ import annotations

import redis.asyncio as aioredis


def connect(url: str, *, max_connections: int, wait_s: float = 10.0) -> aioredis.Redis:
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=wait_s, decode_responses=False)
    return aioredis.Redis(connection_pool=pool)


async def close(client: aioredis.Redis) -> None:
    await client.aclose(close_connection_pool=True)
