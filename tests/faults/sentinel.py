"""A throwaway Redis Sentinel (`redis-server --sentinel`) watching one master, quick to
fail over: the master is judged down after 1 s and a failover may retry after 3 s."""

from __future__ import annotations

from pathlib import Path

import redis

from cli.local_services import _ChildService, _NotReady, redis_server_binary


class LocalSentinel(_ChildService):
    name = "sentinel"

    def __init__(self, service: str, master_port: int) -> None:
        super().__init__(port=None, start_timeout=10.0, stop_timeout=10.0, env=None)
        self.service = service
        self._master_port = master_port

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.port}/{self.service}"

    def _command(self, port: int, workdir: Path) -> list[str]:
        config = workdir / "sentinel.conf"  # Sentinel rewrites it as the cluster changes
        config.write_text("\n".join([
            f"port {port}", "bind 127.0.0.1", "daemonize no", f"dir {workdir}",
            f"sentinel monitor {self.service} 127.0.0.1 {self._master_port} 1",
            f"sentinel down-after-milliseconds {self.service} 1000",
            f"sentinel failover-timeout {self.service} 3000",
        ]) + "\n")
        return [redis_server_binary(), str(config), "--sentinel"]

    def _probe(self, port: int) -> None:
        if self._master_port_at(port) is None:
            raise _NotReady("the sentinel names no master yet")

    def master_port(self) -> int | None:
        """The port of the server this Sentinel names master now."""
        return self._master_port_at(self.port)

    def _master_port_at(self, port: int) -> int | None:
        client = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)
        try:
            address = client.execute_command("SENTINEL", "get-master-addr-by-name",
                                             self.service)
        except (redis.exceptions.RedisError, OSError) as exc:
            raise _NotReady(f"sentinel does not answer: {exc}") from exc
        finally:
            client.close()
        return int(address[1]) if address else None
