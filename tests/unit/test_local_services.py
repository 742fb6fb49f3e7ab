"""cli/local_services.py without real services: fake binaries and error paths."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from cli.local_services import (
    LocalRedis,
    LocalTansu,
    ServiceError,
    ensure_executable,
    free_port,
    kafka_broker_answers,
    redis_server_binary,
)


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fake-service"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_free_port_can_be_bound() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_redis_server_binary_missing_gives_install_hint(tmp_path: Path) -> None:
    with pytest.raises(ServiceError, match="apt-get"):
        redis_server_binary(search_path=str(tmp_path))


def test_ensure_executable_adds_exec_bits(tmp_path: Path) -> None:
    path = tmp_path / "bin"
    path.write_text("#!/bin/sh\n")
    path.chmod(0o644)
    assert ensure_executable(path) == path
    assert path.stat().st_mode & stat.S_IXUSR


def test_addresses_need_a_port_before_start() -> None:
    with pytest.raises(ServiceError, match="start"):
        _ = LocalRedis().url
    with pytest.raises(ServiceError, match="start"):
        _ = LocalTansu().bootstrap
    assert LocalRedis(6390).url == "redis://127.0.0.1:6390/0"
    assert LocalTansu(9099).bootstrap == "127.0.0.1:9099"


def test_early_exit_raises_with_log_tail_and_cleans_up(tmp_path: Path) -> None:
    fake = _script(tmp_path, "echo 'boom: cannot bind'\nexit 3")
    service = LocalRedis(binary=fake, start_timeout=5)
    with pytest.raises(ServiceError) as info:
        service.start()
    message = str(info.value)
    assert "code 3" in message
    assert "boom: cannot bind" in message
    assert not service.running
    with pytest.raises(ServiceError):
        _ = service.workdir  # temporary directory removed


def test_unresponsive_process_times_out_and_is_stopped(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    fake = _script(tmp_path, f"echo $$ > {pid_file}\nexec sleep 30")
    service = LocalTansu(port=free_port(), binary=fake, start_timeout=0.5, stop_timeout=5)
    with pytest.raises(ServiceError, match="did not answer"):
        service.start()
    assert not service.running
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_missing_binary_raises_service_error(tmp_path: Path) -> None:
    service = LocalTansu(binary=tmp_path / "does-not-exist")
    with pytest.raises(ServiceError, match="does not exist"):
        service.start()
    assert not service.running


def test_kafka_probe_false_on_closed_port() -> None:
    assert kafka_broker_answers("127.0.0.1", free_port(), timeout=0.5) is False

