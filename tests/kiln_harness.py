"""Run a real Kiln in-process for tests: its own event loop in a thread, listening on port 0,
so test bodies can drive it with ordinary (blocking) Kafka clients."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, Self, TypeVar

import redis

from cli.app import KilnApp
from cli.settings import Settings, load_settings
from storage.redis_pool import CLUSTER_SCHEME, parse_cluster_url

T = TypeVar("T")


class RunningKiln:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kiln-test",
                                        daemon=True)
        self._thread.start()
        try:
            self.app = self.call(self._build())
        except BaseException:
            self._stop_loop()
            raise
        self.settings = self.app.settings  # with the node id it registered under

    async def _build(self) -> KilnApp:
        """Start Kiln; one that fails to start is closed again, so that nothing of it
        (hardener tasks, delay reports in Redis) outlives this test into the next."""
        app = KilnApp(self.settings)
        try:
            await app.start()
        except BaseException:
            await app.close()
            raise
        return app

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.app.port}"

    @property
    def http_url(self) -> str:
        """Base URL of /metrics, /healthz and /readyz."""
        return f"http://127.0.0.1:{self.app.http_port}"

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def flush(self, timeout_s: float = 30) -> bool:
        return self.call(self.app.hardener.flush(timeout_s=timeout_s), timeout_s + 5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        try:
            self.call(self.app.close(), timeout=30)
        except TimeoutError:
            self.call(_print_stuck_tasks(), timeout=5)
            raise
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


async def _print_stuck_tasks() -> None:
    for task in asyncio.all_tasks():
        if task is not asyncio.current_task():
            print("stuck:", task.get_name(), task.get_stack(limit=4))


def start_kiln(redis_url: str, kafka_bootstrap: str, **overrides: Any) -> RunningKiln:
    """Kiln in this process; a fixed 200 ms delay unless the test chooses otherwise."""
    values = {"redis_url": redis_url,
              "kafka_bootstrap": kafka_bootstrap, "harden_delay_ms": 200,
              "delay_policy": "fixed",
              # Port 0: several test Kilns (and test sessions) must not share one HTTP port.
              "http_listen": "127.0.0.1:0", **overrides}
    if "listeners" not in values:
        values.setdefault("listen", "127.0.0.1:0")
    return RunningKiln(load_settings(overrides=values, environ={}))


def sync_redis(redis_url: str) -> redis.Redis | redis.RedisCluster:
    """A blocking client on a Kiln redis_url: one server, or a Redis Cluster."""
    if redis_url.startswith(CLUSTER_SCHEME):
        nodes, password = parse_cluster_url(redis_url)
        startup = [redis.cluster.ClusterNode(host, port)  # type: ignore[no-untyped-call]
                   for host, port in nodes]
        return redis.RedisCluster(startup_nodes=startup, password=password)
    return redis.Redis.from_url(redis_url)


def empty_redis(redis_url: str) -> None:
    """Empty a Kiln redis_url's database (every master's, on a cluster)."""
    client = sync_redis(redis_url)
    try:
        client.flushdb()
    finally:
        client.close()


def fresh_kiln(redis_url: str, kafka_bootstrap: str, **overrides: Any) -> RunningKiln:
    """start_kiln on an emptied Redis database: nothing of an earlier test's Kiln is left."""
    empty_redis(redis_url)
    return start_kiln(redis_url, kafka_bootstrap, **overrides)


def eventually(check: Callable[[], bool], timeout_s: float = 10) -> bool:
    """Poll `check` every 50 ms until it holds (True) or `timeout_s` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
