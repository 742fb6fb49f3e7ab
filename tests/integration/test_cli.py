"""The `kiln` command as an operator runs it: bad input, unreachable stores, planned
shutdown, and `kiln dev`."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaProducer

from cli.local_services import free_port
from tests.integration.test_produce_harden import read_hardened
from tests.kiln_harness import sync_redis

KILN = str(Path(sys.executable).with_name("kiln"))


def run_kiln(*args: str, env: dict[str, str] | None = None,
             timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KILN, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def wait_listening(port: int, process: subprocess.Popen[str], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"kiln did not listen on {port}")


@contextlib.contextmanager
def kiln_process(*args: str, port: int, env: dict[str, str] | None = None
                 ) -> Iterator[subprocess.Popen[str]]:
    """`kiln ARGS` listening on `port`; killed by PID if the test leaves it running."""
    # No metrics endpoint: its default port may be taken by another Kiln on this machine.
    process = subprocess.Popen([KILN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True,
                               env={**os.environ, "KILN_HTTP_LISTEN": "", **(env or {})})
    try:
        wait_listening(port, process)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_bad_flag_value_is_named() -> None:
    result = run_kiln("serve", "--listen", "nowhere")

    assert result.returncode == 2
    assert "listen: expected HOST:PORT, got 'nowhere'" in result.stderr


def test_bad_environment_value_is_named() -> None:
    result = run_kiln("serve", env={"KILN_HARDEN_DELAY_MS": "soon"})

    assert result.returncode == 2
    assert "KILN_HARDEN_DELAY_MS" in result.stderr


def test_unknown_config_key_is_named(tmp_path: Path) -> None:
    config = tmp_path / "kiln.toml"
    config.write_text('redis = "redis://x"\n')

    result = run_kiln("serve", "--config", str(config))

    assert result.returncode == 2
    assert "unknown key 'redis'" in result.stderr


def test_unreachable_redis_is_reported(kafka_bootstrap: str) -> None:
    # (with two workers: one that fails as it starts stops the other, and the code is its)
    result = run_kiln("serve", "--workers", "2", "--listen", "127.0.0.1:0", "--redis-url",
                      f"redis://127.0.0.1:{free_port()}/0", "--kafka-bootstrap", kafka_bootstrap)

    assert result.returncode == 1
    assert "cannot reach Redis at redis://127.0.0.1:" in result.stderr


def test_unreachable_kafka_is_reported(redis_url: str) -> None:
    result = run_kiln("serve", "--workers", "1", "--listen", "127.0.0.1:0",
                      "--redis-url", redis_url, "--kafka-bootstrap", f"127.0.0.1:{free_port()}")

    assert result.returncode == 1
    assert "cannot reach Kafka at 127.0.0.1:" in result.stderr


def test_sigterm_hardens_everything_buffered_before_exit(
        redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    sync_redis(redis_url).flushdb()
    port = free_port()
    with kiln_process("serve", "--workers", "1", "--listen", f"127.0.0.1:{port}",
                      "--redis-url", redis_url, "--kafka-bootstrap", kafka_bootstrap,
                      "--delay-policy", "fixed",
                      "--harden-delay-ms", "600000", port=port) as process:
        producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", acks=1)
        for i in range(50):
            producer.send(unique_topic, value=b"r%d" % i, partition=0)
        producer.flush()
        producer.close()

        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
    records = read_hardened(kafka_bootstrap, unique_topic, 0, 50)

    assert code == 0
    assert [r.value for r in records] == [b"r%d" % i for i in range(50)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("broker", ["kafka", "tansu"])
def test_kiln_dev_runs_all_three_other_commands_find_it_and_ctrl_c_stops_them(
        unique_topic: str, tmp_path: Path, broker: str) -> None:
    port = free_port()
    home = {"HOME": str(tmp_path), "XDG_STATE_HOME": ""}
    state = tmp_path / ".local" / "state" / "kiln" / "dev.json"
    with kiln_process("dev", "--broker", broker, "--listen", f"127.0.0.1:{port}", port=port,
                      env=home) as process:
        assert process.stdout is not None
        banner = [process.stdout.readline() for _ in range(3)]
        redis_port = int(banner[0].rsplit(":", 1)[1].split("/")[0])
        kafka_port = int(banner[1].split()[1].rsplit(":", 1)[1])
        producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", acks=1)
        try:
            metadata = producer.send(unique_topic, value=b"hello", partition=0).get(timeout=10)
        finally:
            producer.close()
        # A second terminal: no flags
        status = run_kiln("status", unique_topic, "--json", env=home)
        recorded = state.exists()

        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=60)

    assert f"({broker})" in banner[1]
    assert metadata.offset == 0
    assert status.returncode == 0, status.stderr
    assert unique_topic in status.stdout
    assert recorded and not state.exists()
    assert code == 0
    for service_port in (port, redis_port, kafka_port):
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", service_port), timeout=0.5).close()
