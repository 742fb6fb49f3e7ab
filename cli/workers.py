"""`kiln serve --workers N`: N node processes on one machine, so that all its cores serve.

A Kiln node is one event loop on one core; a machine's other cores are used by running more
nodes (storage/nodes.py), which clients are routed across as across Kafka brokers
(storage/leadership.py). Worker i is `kiln serve --workers 1` on the `listen` port + i,
advertised at the advertised port + i (with n `listeners`, each listener's port and
advertised port + i·n), with its HTTP endpoints at its own port + 552 (`auto`)
or at the configured HTTP port + i, and node id `node_id` + i when one is configured. Clients
need only one worker's address: Metadata names the others.

The supervisor passes SIGTERM and SIGINT on to every worker, and each drains (hardens what it
buffered, answers what it owes); it exits when all have, with the first failing worker's exit
code. A worker that fails as it first starts (before its Kafka port answers: a port taken, a
store unreachable, as `kiln serve` alone fails) stops them all. One that exits later is started
again, after 1 s, doubling up to 30 s while it keeps failing within a minute of its start.
Workers are told to stop should the supervisor be killed (Linux: the parent-death signal),
so none is left running unsupervised.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click

from cli.settings import Settings, parse_host_port
from storage.nodes import AUTO_NODE_ID

log = logging.getLogger(__name__)

_RESTART_FIRST_S = 1.0
_RESTART_MAX_S = 30.0
_STABLE_AFTER_S = 60.0  # a worker up this long starts its next restart from the first delay
_STARTUP_S = 10.0  # a worker on port 0 (its port unknown here) counts as started after this
_POLL_S = 0.2


def default_workers() -> int:
    """One per core this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def worker_flags(settings: Settings, index: int) -> list[str]:
    """The flags that make worker `index` a node of its own beside the others."""
    # With several listeners, each worker takes the next block of as many ports.
    step = index * len(settings.kafka_listeners)
    flags = ["--workers", "1"]
    if settings.listeners:
        flags += ["--listeners", ",".join(
            str(dataclasses.replace(listener, port=_shifted(listener.port, step)))
            for listener in settings.kafka_listeners)]
        if settings.advertised_listeners:
            flags += ["--advertised-listeners", ",".join(
                f"{name}://{host}:{_shifted(port, step)}"
                for name, (host, port) in settings.advertised_listener_addresses.items())]
    else:
        host, port = settings.listen_address
        flags += ["--listen", f"{host}:{_shifted(port, step)}"]
    if settings.advertise:
        advertised_host, advertised_port = settings.advertised_address
        flags += ["--advertise", f"{advertised_host}:{_shifted(advertised_port, index)}"]
    if settings.http_listen not in ("", "auto"):
        http_host, http_port = parse_host_port(settings.http_listen, "http_listen")
        flags += ["--http-listen", f"{http_host}:{_shifted(http_port, index)}"]
    if settings.node_id != AUTO_NODE_ID:
        flags += ["--node-id", str(settings.node_id + index)]
    return flags


def _shifted(port: int, index: int) -> int:
    return port + index if port else 0  # port 0: any free port, for each worker


def command_flags(command: click.Command, values: Mapping[str, Any]) -> list[str]:
    """`values` (a command's parameters as click parsed them) as flags again; unset ones
    (None) are left out, so that a worker reads them where the supervisor did."""
    flags: list[str] = []
    for param in command.params:
        value = values.get(param.name or "")
        if not isinstance(param, click.Option) or value is None:
            continue
        name = max(param.opts, key=len)
        if param.is_flag:
            if value:
                flags.append(name)
        else:
            flags += [name, str(value)]
    return flags


@dataclass
class _Worker:
    index: int
    command: list[str]
    address: tuple[str, int]  # where it listens (port 0: any)
    process: subprocess.Popen[bytes] | None = None
    started: bool = False  # its first start got as far as listening
    started_at: float = 0.0
    restart_after_s: float = _RESTART_FIRST_S
    due_at: float | None = None  # when it is to be started again


def supervise(commands: Sequence[tuple[list[str], tuple[str, int]]]) -> int:
    """Run one worker per (command, address it listens at) until SIGTERM or SIGINT, then
    until all have stopped; the exit code."""
    workers = [_Worker(i, list(command), address)
               for i, (command, address) in enumerate(commands)]
    stopping: list[int] = []
    failed_to_start: list[int] = []

    def stop_all(signum: int) -> None:
        stopping.append(signum)
        for worker in workers:
            _signal(worker, signum)

    def on_signal(signum: int, _frame: object) -> None:
        if not stopping:
            log.info("%s: stopping %d workers (each hardens what it buffered)",
                     signal.Signals(signum).name, len(workers))
        stop_all(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for worker in workers:
            _start(worker)
        while not stopping or any(_running(w) for w in workers):
            time.sleep(_POLL_S)
            if not stopping:
                code = _keep_running(workers)
                if code is not None:
                    failed_to_start.append(code)
                    stop_all(signal.SIGTERM)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for worker in workers:
            if _running(worker):
                _signal(worker, signal.SIGKILL)
    last = [w.process.returncode for w in workers if w.process is not None]
    failed = failed_to_start + [code for code in last if code]
    code = failed[0] if failed else 0
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell says


def _keep_running(workers: Sequence[_Worker]) -> int | None:
    """Start again the workers that exited; the exit code of one that failed as it first
    started (None while all run or are to be started again)."""
    now = time.monotonic()
    for worker in workers:
        process = worker.process
        if process is not None and process.poll() is not None:
            worker.process = None
            if not worker.started:
                log.error("worker %d failed to start (exit code %d): stopping the others",
                          worker.index, process.returncode)
                return process.returncode or 1
            if now - worker.started_at >= _STABLE_AFTER_S:
                worker.restart_after_s = _RESTART_FIRST_S
            worker.due_at = now + worker.restart_after_s
            log.error("worker %d (pid %d) exited with %d; starting it again in %.0f s",
                      worker.index, process.pid, process.returncode, worker.restart_after_s)
            worker.restart_after_s = min(_RESTART_MAX_S, worker.restart_after_s * 2)
        elif worker.process is None and worker.due_at is not None and now >= worker.due_at:
            _start(worker)
        elif not worker.started:
            worker.started = _listening(worker.address) if worker.address[1] else \
                now - worker.started_at >= _STARTUP_S
    return None


def _listening(address: tuple[str, int]) -> bool:
    host = "127.0.0.1" if address[0] in ("", "0.0.0.0", "::") else address[0]
    try:
        socket.create_connection((host, address[1]), timeout=0.2).close()
    except OSError:
        return False
    return True


def _start(worker: _Worker) -> None:
    worker.process = subprocess.Popen(worker.command, stdin=subprocess.DEVNULL,
                                      start_new_session=True,  # signals come from here
                                      preexec_fn=_die_with_parent)
    worker.started_at = time.monotonic()
    worker.due_at = None
    log.info("worker %d started (pid %d)", worker.index, worker.process.pid)


def _running(worker: _Worker) -> bool:
    return worker.process is not None and worker.process.poll() is None


def _signal(worker: _Worker, signum: int) -> None:
    if _running(worker):
        assert worker.process is not None
        worker.process.send_signal(signum)


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the worker, before it runs: SIGTERM it (a planned shutdown) when the supervisor
    dies. Linux only; elsewhere a killed supervisor leaves its workers running."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def worker_commands(settings: Settings, flags: list[str], workers: int
                    ) -> list[tuple[list[str], tuple[str, int]]]:
    """The command of each worker (this interpreter running `kiln serve` with the flags the
    supervisor was given and those of the worker's own) and the address it listens at."""
    host, port = settings.listen_address
    return [([sys.executable, "-m", "cli", "serve", *flags, *worker_flags(settings, i)],
             (host, _shifted(port, i * len(settings.kafka_listeners))))
            for i in range(workers)]
