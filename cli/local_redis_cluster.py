"""A throwaway Redis Cluster on 127.0.0.1 for the test suite and benchmarks.

Six ``redis-server --cluster-enabled yes`` processes (three masters, each with one replica)
joined by ``redis-cli --cluster create``, quick to fail over: a master that does not answer
for ``node_timeout_ms`` is replaced by its replica. Each server is a LocalRedis, so it is
started, killed and stopped by its own PID like every other local service.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import redis
import redis.exceptions

from cli.local_services import PROBE_TIMEOUT_S, LocalRedis, ServiceError

_CREATE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ClusterNodeState:
    """One server as the cluster sees it (a line of CLUSTER NODES)."""

    port: int
    master: bool
    failed: bool
    slots: int


class LocalRedisCluster:
    """`masters` masters with `replicas` replicas each, every server a LocalRedis."""

    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000) -> None:
        if masters < 3:
            raise ValueError("a Redis Cluster needs at least three masters")
        self._masters = masters
        self._replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.servers: list[LocalRedis] = []

    @property
    def url(self) -> str:
        """Kiln's redis_url for this cluster (every server listed, any one would do)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers)

    def start(self) -> Self:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise ServiceError("redis-cli not found on PATH; install redis-server (or "
                               "run scripts/setup.sh)")
        try:
            for _ in range(self._masters * (1 + self._replicas)):
                self.servers.append(LocalRedis(extra_args=[
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(self.node_timeout_ms),
                    # A replica that lost touch with its master for a while still takes
                    # over: the test kills masters on purpose.
                    "--cluster-replica-validity-factor", "0",
                    "--repl-diskless-sync-delay", "0",
                ]).start())
            addresses = [f"127.0.0.1:{s.port}" for s in self.servers]
            done = subprocess.run(
                [cli, "--cluster", "create", *addresses, "--cluster-replicas",
                 str(self._replicas), "--cluster-yes"],
                capture_output=True, text=True, timeout=_CREATE_TIMEOUT_S, check=False)
            if done.returncode != 0:
                raise ServiceError(f"redis-cli --cluster create failed: "
                                   f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
            self.wait_healthy(_CREATE_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers = []

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def nodes(self) -> list[ClusterNodeState]:
        """The cluster's servers as a live server sees them."""
        for server in self.servers:
            if not server.running:
                continue
            try:
                return _parse_cluster_nodes(_command(server.port, "CLUSTER", "NODES"))
            except (redis.exceptions.RedisError, OSError):
                continue
        raise ServiceError("no server of the Redis Cluster answers")

    def server_at(self, port: int) -> LocalRedis:
        return next(s for s in self.servers if s.port == port)

    def master_of(self, key: str) -> LocalRedis:
        """The server that is master of `key`'s hash slot now."""
        for server in self.servers:
            if not server.running:
                continue
            try:
                slot = int(_command(server.port, "CLUSTER", "KEYSLOT", key))
                for start, end, master, *_ in _command(server.port, "CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        return self.server_at(int(master[1]))
            except (redis.exceptions.RedisError, OSError):
                continue
        raise ServiceError(f"no live server names the master of {key!r}")

    def wait_healthy(self, timeout_s: float) -> None:
        """Until every running server says cluster_state:ok, every slot has a running
        master and every running replica is in sync with its master."""
        deadline = time.monotonic() + timeout_s
        problem = "not asked yet"
        while time.monotonic() < deadline:
            problem = self._health_problem()
            if problem == "":
                return
            time.sleep(0.1)
        raise ServiceError(f"the Redis Cluster is not healthy after {timeout_s:.0f} s: "
                           f"{problem}")

    def _health_problem(self) -> str:
        for server in self.servers:
            if not server.running:
                continue
            try:
                info = _command(server.port, "CLUSTER", "INFO")
            except (redis.exceptions.RedisError, OSError) as exc:
                return f"server {server.port}: {exc}"
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text:
                return f"server {server.port} is not ok yet"
        running = {s.port for s in self.servers if s.running}
        masters = [n for n in self.nodes() if n.master and not n.failed and n.port in running]
        if sum(n.slots for n in masters) != 16384:
            return "not every slot has a live master"
        for server in self.servers:
            if server.running and server.port not in {n.port for n in masters}:
                link = _command(server.port, "INFO", "replication").get("master_link_status")
                if link != "up":
                    return f"replica {server.port} is not in sync with its master"
        return ""


def _command(port: int, *args: str) -> Any:
    client = redis.Redis(port=port, socket_timeout=PROBE_TIMEOUT_S,
                         socket_connect_timeout=PROBE_TIMEOUT_S)
    try:
        return client.execute_command(*args)  # type: ignore[no-untyped-call]
    finally:
        client.close()


def _parse_cluster_nodes(raw: object) -> list[ClusterNodeState]:
    """CLUSTER NODES lines: id, host:port@bus, flags, master, ping, pong, epoch, link, slots."""
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    nodes = []
    for line in filter(None, text.splitlines()):
        fields = line.split()
        flags = fields[2].split(",")
        nodes.append(ClusterNodeState(
            port=int(fields[1].split("@")[0].rpartition(":")[2]), master="master" in flags,
            failed="fail" in flags, slots=sum(_slot_count(r) for r in fields[8:])))
    return nodes


def _slot_count(item: str) -> int:
    if item.startswith("["):  # a slot being migrated or imported
        return 0
    start, _, end = item.partition("-")
    return int(end or start) - int(start) + 1
