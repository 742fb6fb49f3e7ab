"""`kiln serve --workers N`'s supervisor (cli/workers.py): each worker's own flags, the flags
passed on, and the supervision itself, with small stand-in workers (real `kiln serve`
workers are tested in tests/cluster/test_workers.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cli.local_services import free_port
from cli.main import serve
from cli.settings import load_settings
from cli.workers import command_flags, supervise, worker_flags
from tests.kiln_harness import eventually

# A stand-in worker: listens on argv[1], appends its pid to argv[2], and exits 0 on SIGTERM.
_WORKER = """
import os, signal, socket, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
with open(sys.argv[2], "a") as pids:
    pids.write(f"{os.getpid()}\\n")
while True:
    time.sleep(0.05)
"""


def stand_in(port: int, pids: Path) -> tuple[list[str], tuple[str, int]]:
    return [sys.executable, "-c", _WORKER, str(port), str(pids)], ("127.0.0.1", port)


def started(pids: Path) -> list[int]:
    return [int(line) for line in pids.read_text().split()] if pids.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_each_worker_is_a_node_of_its_own_on_the_next_ports() -> None:
    settings = load_settings(overrides={
        "listen": "0.0.0.0:9092", "advertise": "kiln.example:19092",
        "http_listen": "0.0.0.0:8000", "node_id": 5}, environ={})

    assert worker_flags(settings, 2) == [
        "--workers", "1", "--listen", "0.0.0.0:9094", "--advertise", "kiln.example:19094",
        "--http-listen", "0.0.0.0:8002", "--node-id", "7"]
    # Defaults: the listen port moves, the rest follows by itself (auto HTTP, any free id)
    assert worker_flags(load_settings(environ={}), 1) == [
        "--workers", "1", "--listen", "127.0.0.1:9093"]
    # Port 0 (tests): each worker takes any free port
    assert worker_flags(load_settings(overrides={"listen": "127.0.0.1:0"}, environ={}), 3) \
        == ["--workers", "1", "--listen", "127.0.0.1:0"]


def test_a_worker_of_an_ssl_listener_gets_the_listener_on_its_port() -> None:
    settings = load_settings(overrides={
        "listeners": "SSL://0.0.0.0:9093", "ssl_certificate_file": "server.pem",
        "ssl_key_file": "server.key"}, environ={})
    several = load_settings(overrides={
        "listeners": "PLAINTEXT://0.0.0.0:9092,SSL://0.0.0.0:9093",
        "advertised_listeners": "SSL://kiln.example:19093", "ssl_certificate_file": "server.pem",
        "ssl_key_file": "server.key"}, environ={})

    assert worker_flags(settings, 2) == ["--workers", "1", "--listeners", "SSL://0.0.0.0:9095"]
    # Every listener moves to the worker's block of ports, and every advertised address
    # with it: worker 1 after worker 0's 9092 and 9093
    assert worker_flags(several, 1) == [
        "--workers", "1", "--listeners", "PLAINTEXT://0.0.0.0:9094,SSL://0.0.0.0:9095",
        "--advertised-listeners", "PLAINTEXT://127.0.0.1:9094,SSL://kiln.example:19095"]


def test_the_flags_given_are_passed_on_and_unset_ones_left_to_the_worker() -> None:
    flags = command_flags(serve, {"listen": "127.0.0.1:9092", "log_json": True,
                                  "redis_url": None, "config_file": Path("kiln.toml"),
                                  "node_heartbeat_ms": 500})

    # (in the order `kiln serve` declares them)
    assert flags == ["--listen", "127.0.0.1:9092", "--node-heartbeat-ms", "500",
                     "--config", "kiln.toml", "--log-json"]


def test_a_worker_failing_as_it_starts_stops_the_others(tmp_path: Path) -> None:
    # Given two workers, one of which exits with 3 before it listens
    pids = tmp_path / "pids"
    failing = ([sys.executable, "-c", "import sys; sys.exit(3)"], ("127.0.0.1", free_port()))

    # When they are supervised
    begun = time.monotonic()
    code = supervise([failing, stand_in(free_port(), pids)])

    # Then the supervisor stops the other and exits with the failing worker's code
    assert code == 3
    assert time.monotonic() - begun < 10
    assert started(pids) and not any(alive(pid) for pid in started(pids))


def test_a_worker_that_dies_is_started_again_and_sigterm_stops_all(tmp_path: Path) -> None:
    # Given a supervisor of two stand-in workers, both listening
    files = [tmp_path / "pids-0", tmp_path / "pids-1"]
    commands = [stand_in(free_port(), f) for f in files]
    supervisor = subprocess.Popen(
        [sys.executable, "-c", "import sys; from cli.workers import supervise; "
         f"sys.exit(supervise({commands!r}))"])
    try:
        assert eventually(lambda: all(len(started(f)) == 1 for f in files), timeout_s=20)
        [first] = started(files[0])
        time.sleep(1)  # the supervisor sees them listening at its next look (every 0.2 s)

        # When one is killed (it had started)
        os.kill(first, signal.SIGKILL)

        # Then it is started again (after a second), the other left alone
        assert eventually(lambda: len(started(files[0])) == 2, timeout_s=20)
        assert len(started(files[1])) == 1
        # and SIGTERM to the supervisor stops both workers, then the supervisor, cleanly
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=20) == 0
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    assert not any(alive(pid) for f in files for pid in started(f))
