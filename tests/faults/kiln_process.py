"""Kiln as a real child process (`kiln serve`), so it can be killed with SIGKILL and started
again on the same port, as an operator's supervisor would."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

from cli.local_services import free_port, kafka_broker_answers
from tests.kiln_harness import sync_redis

if TYPE_CHECKING:
    from tests.conftest import KafkaRelay


def kiln_executable() -> str:
    """The `kiln` console script of the running interpreter's environment."""
    beside = Path(sys.executable).with_name("kiln")
    if beside.is_file():
        return str(beside)
    found = shutil.which("kiln")
    if found is None:
        raise RuntimeError("the `kiln` console script is not installed (pip install -e .)")
    return found


class KilnProcess:
    """One `kiln serve` child at a time on a fixed port; every start appends to one log."""

    def __init__(self, port: int, redis_url: str, kafka_bootstrap: str, harden_delay_ms: int,
                 log_path: Path, extra_args: Sequence[str] = (),
                 advertised_port: int | None = None) -> None:
        self.port = port
        # Where clients are told to connect (--advertise), which is where readiness is probed.
        self._advertised_port = port if advertised_port is None else advertised_port
        self.bootstrap = f"127.0.0.1:{port}"
        self._command = [
            kiln_executable(), "serve",
            "--workers", "1",
            "--listen", self.bootstrap,
            "--redis-url", redis_url,
            "--kafka-bootstrap", kafka_bootstrap,
            "--delay-policy", "fixed",
            "--http-listen", "",
            "--harden-delay-ms", str(harden_delay_ms),
            *extra_args,
        ]  # fmt: skip
        # No inherited KILN_* setting may change what the flags say.
        self._env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
        self.log_path = log_path
        self._log: IO[bytes] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_start = 0
        self.starts = 0

    @property
    def pid(self) -> int | None:
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    def start(self, timeout_s: float = 20, *, crash_at: str = "") -> None:
        """With `crash_at`, the process ends itself at that crash point (storage/faults.py)."""
        assert self.pid is None, "already running"
        if self._log is None:
            self._log = self.log_path.open("ab")
        self._log.flush()
        self._log_start = self.log_path.stat().st_size
        env = {**self._env, "KILN_CRASH_AT": crash_at} if crash_at else self._env
        self._proc = subprocess.Popen(self._command, stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True)
        self.starts += 1
        deadline = time.monotonic() + timeout_s
        while not kafka_broker_answers("127.0.0.1", self._advertised_port, 0.5):
            if self._proc.poll() is not None:
                raise RuntimeError(f"kiln exited with {self._proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"kiln did not answer on {self.bootstrap}:\n{self.log_tail()}")
            time.sleep(0.05)

    def exit_code(self, timeout_s: float) -> int | None:
        """The process's exit code once it ended by itself, None if it still runs."""
        assert self._proc is not None
        try:
            return self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def pause(self) -> None:
        """SIGSTOP: the process hangs (a GC pause, a stalled VM) and holds its sockets."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.pid is not None:
            os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: a crash, nothing is flushed or released."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def terminate(self, timeout_s: float = 90) -> int:
        """SIGTERM (a planned shutdown, which hardens what is buffered); the exit code."""
        proc = self._proc
        assert proc is not None
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        return proc.wait(timeout_s)

    def stop(self) -> None:
        """For finally blocks: whatever state it is in, no child is left running."""
        try:
            self.kill()
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None

    def current_log(self) -> str:
        """What the running (or last) process has logged so far."""
        with self.log_path.open("rb") as fh:
            fh.seek(self._log_start)
            return fh.read().decode("utf-8", errors="replace")

    def wait_for_log(self, text: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in self.current_log():
                return True
            if self.pid is None:
                return False
            time.sleep(0.02)
        return False

    def log_tail(self, limit: int = 4000) -> str:
        return self.current_log()[-limit:]


@contextlib.contextmanager
def fresh_kiln_process(redis_url: str, kafka_bootstrap: str, log_path: Path,
                       harden_delay_ms: int, extra_args: Sequence[str] = ()
                       ) -> Iterator[KilnProcess]:
    """`kiln serve` as a child process on a free port (not started yet), with an empty
    Redis; killed in the end whatever happened."""
    sync_redis(redis_url).flushdb()
    process = KilnProcess(free_port(), redis_url, kafka_bootstrap, harden_delay_ms, log_path,
                          extra_args)
    try:
        yield process
    finally:
        process.stop()


class Takeover:
    """Two `kiln serve` children on one Redis, for the zombie tests: `first` reaches Kafka
    through a relay and its delay never expires (it hardens when asked to flush); `second`,
    its successor, reaches Kafka directly. Neither is started yet."""

    def __init__(self, redis_url: str, kafka_bootstrap: str, kafka_relay: KafkaRelay,
                 log_dir: Path, successor_delay_ms: int) -> None:
        self._redis_url = redis_url
        self._relay = kafka_relay.relay
        self.first = KilnProcess(free_port(), redis_url, kafka_relay.bootstrap, 600_000,
                                 log_dir / "first.log")
        self.second = KilnProcess(free_port(), redis_url, kafka_bootstrap, successor_delay_ms,
                                  log_dir / "second.log")
        self._flush: subprocess.Popen[bytes] | None = None

    def start_flush(self, topic: str, timeout_s: int) -> subprocess.Popen[bytes]:
        """`kiln flush TOPIC` in the background (an operator's flush): every partition of
        the topic hardened at once, by whichever Kiln process owns it."""
        self._flush = subprocess.Popen([kiln_executable(), "flush", topic, "--timeout",
                                        str(timeout_s), "--redis-url", self._redis_url],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self._flush

    def pause_first(self) -> None:
        """The relay holds what the first process sends, then the process is paused
        (SIGSTOP): it hangs with requests in hand, however its writes are going."""
        self._relay.hold()
        self.first.pause()

    def resume_first(self) -> None:
        """The held requests go on to Kafka and the first process resumes (SIGCONT)."""
        self._relay.release()
        self.first.resume()

    def close(self) -> None:
        """For finally blocks: nothing left held, paused or running."""
        try:
            self.resume_first()
        finally:
            self.first.stop()
            self.second.stop()
            if self._flush is not None and self._flush.poll() is None:
                self._flush.kill()


@contextlib.contextmanager
def takeover(redis_url: str, kafka_bootstrap: str, kafka_relay: KafkaRelay, log_dir: Path,
             successor_delay_ms: int) -> Iterator[Takeover]:
    """A `Takeover` on an emptied Redis, closed in the end whatever happened."""
    sync_redis(redis_url).flushdb()
    scene = Takeover(redis_url, kafka_bootstrap, kafka_relay, log_dir, successor_delay_ms)
    try:
        yield scene
    finally:
        scene.close()


def kiln_cli(redis_url: str, *args: str, timeout_s: float = 60) -> str:
    """Run `kiln ARGS --redis-url REDIS_URL`; its output, AssertionError with it if it
    fails."""
    done = subprocess.run([kiln_executable(), *args, "--redis-url", redis_url],
                          timeout=timeout_s, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"kiln {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout
