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

`redis+cluster://[:PASSWORD@]HOST:PORT[,HOST:PORT...]` reaches a Redis Cluster: any of its
nodes will do to discover the rest. Every key Kiln writes carries a hash tag (one per
partition, per group, per registry), every script and transaction touches one hash slot,
and each command goes to the master of its slot; after a failover the client learns the new
map and Kiln starts the moved partitions again, as after a Sentinel failover. A cluster has
only database 0.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, TypeAlias
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError

SENTINEL_SCHEME = "redis+sentinel://"
CLUSTER_SCHEME = "redis+cluster://"

# What Kiln's stores are given: one Redis server (or the master Sentinels name), or a Redis
# Cluster. Both answer the same commands; a cluster only takes scripts, transactions and
# multi-key commands whose keys share a hash slot.
RedisClient: TypeAlias = "aioredis.Redis | RedisCluster"

# What a Redis command can fail with: Redis's answer, the connection, or (on a cluster) no
# master known for the key's slot, as during a failover.
REDIS_FAILURES = (RedisError, RedisClusterException, OSError)

# A cluster client opens connections per node as commands need them and refuses a command
# when a node has this many in use (it cannot wait for a free one as the single-server pool
# does), so the bound is generous.
_CLUSTER_CONNECTIONS_PER_NODE = 512


class _BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """Connections to the master the Sentinels name, waiting for a free one when all are
    in use (SentinelConnectionPool's own refuses at once)."""


def _retrying() -> dict[str, Any]:
    return {"retry": Retry(NoBackoff(), 1), "retry_on_error": [RedisConnectionError]}


def connect(url: str, *, max_connections: int, wait_s: float = 10.0) -> RedisClient:
    if url.startswith(SENTINEL_SCHEME):
        return _connect_through_sentinels(url, max_connections, wait_s)
    if url.startswith(CLUSTER_SCHEME):
        return _connect_to_cluster(url, max_connections, wait_s)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=wait_s, decode_responses=False,
        **_retrying())
    return aioredis.Redis(connection_pool=pool)


def _addresses(netloc: str, what: str) -> list[tuple[str, int]]:
    addresses = []
    for item in filter(None, netloc.rpartition("@")[2].split(",")):
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"{what} address {item!r} is not HOST:PORT")
        addresses.append((host.strip("[]"), int(port)))
    return addresses


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, int, str | None]:
    """(Sentinel addresses, service name, database, password) of a redis+sentinel:// URL;
    raises ValueError naming what is wrong."""
    parts = urlsplit(url)
    sentinels = _addresses(parts.netloc, "sentinel")
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


def redact_url(url: str) -> str:
    """`url` as it may be shown (logs, errors, status): its password, in the userinfo or as a
    `password` query parameter, replaced by `***`."""
    netloc = urlsplit(url).netloc
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        url = url.replace(netloc, f"{user}{colon and ':***'}@{hosts}", 1)
    head, question, query = url.partition("?")
    return head + question + re.sub(r"(^|&)(password=)[^&]*", r"\1\2***", query,
                                    flags=re.IGNORECASE)


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], str | None]:
    """(addresses of some of the cluster's nodes, password) of a redis+cluster:// URL;
    raises ValueError naming what is wrong."""
    parts = urlsplit(url)
    nodes = _addresses(parts.netloc, "cluster node")
    if not nodes or parts.path.strip("/") not in ("", "0"):
        raise ValueError("expected redis+cluster://HOST:PORT[,HOST:PORT...] (a cluster has "
                         "only database 0)")
    return nodes, unquote(parts.password) if parts.password else None


def _connect_to_cluster(url: str, max_connections: int, wait_s: float) -> RedisCluster:
    nodes, password = parse_cluster_url(url)
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in nodes], password=password,
        max_connections=max(max_connections, _CLUSTER_CONNECTIONS_PER_NODE),
        socket_timeout=wait_s, socket_connect_timeout=wait_s, decode_responses=False)


async def close(client: RedisClient) -> None:
    if isinstance(client, RedisCluster):
        await client.aclose()
        return
    pool = client.connection_pool
    await client.aclose(close_connection_pool=True)
    if isinstance(pool, SentinelConnectionPool):
        for sentinel in pool.sentinel_manager.sentinels:
            await sentinel.aclose()


ScriptCall: TypeAlias = tuple[list[str], Sequence[bytes | int | str]]


def pipe_script(pipe: Any, sha: str, keys: Sequence[str], *args: bytes | int | str) -> None:
    """Queue EVALSHA on a pipeline. (redis-py refuses `pipe.evalsha` on a cluster client;
    the command itself goes to the master of its keys' slot like any other.)"""
    pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)


async def run_scripts(redis: RedisClient, script: AsyncScript, calls: Sequence[ScriptCall]
                      ) -> list[Any]:
    """Run one script per call (keys, args) in a single round trip, on one connection
    however many calls there are.

    redis-py's pipelines ask SCRIPT EXISTS before every execute (an extra round trip on the
    produce path), so scripts go out as plain EVALSHA and are loaded only when Redis answers
    NOSCRIPT (after a restart or SCRIPT FLUSH). Raises what Redis raised."""
    if not calls:
        return []
    if len(calls) == 1:
        keys, args = calls[0]
        return [await script(keys=keys, args=args)]
    async with redis.pipeline(transaction=False) as pipe:
        for keys, args in calls:
            pipe_script(pipe, script.sha, keys, *args)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
    for i, reply in enumerate(replies):
        if isinstance(reply, NoScriptError):
            keys, args = calls[i]
            replies[i] = await script(keys=keys, args=args)  # loads it, then runs it
        elif isinstance(reply, Exception):
            raise reply
    return replies
