"""A running `kiln dev` is found by every other command without flags; a stale record, or a
setting the command was given, wins over it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from cli import dev_instance
from cli.settings import dev_state_file, load_settings

SHARED = {"redis_url": "redis://127.0.0.1:41234/0", "kafka_bootstrap": "127.0.0.1:41235"}


def test_commands_use_the_running_dev_instance_unless_told_otherwise(tmp_path: Path) -> None:
    # Given a dev instance (this process) that recorded its services
    environ = {"HOME": str(tmp_path)}
    state = dev_state_file(environ)
    assert state == tmp_path / ".local" / "state" / "kiln" / "dev.json"
    dev_instance.announce(state, SHARED)

    # When a command loads its settings with no flags, and another with its own Redis
    found = load_settings(environ=environ)
    told = load_settings(environ={**environ, "KILN_REDIS_URL": "redis://elsewhere:6379/0"})

    # Then the first uses the dev instance's Redis and broker, the second its own Redis
    assert (found.redis_url, found.kafka_bootstrap) == (SHARED["redis_url"],
                                                        SHARED["kafka_bootstrap"])
    assert (told.redis_url, told.kafka_bootstrap) == ("redis://elsewhere:6379/0",
                                                      SHARED["kafka_bootstrap"])


def test_a_record_left_by_a_dead_dev_instance_is_ignored(tmp_path: Path) -> None:
    # Given a record whose process has exited
    state = dev_instance.state_file(tmp_path)
    gone = subprocess.Popen(["true"])
    gone.wait()
    state.parent.mkdir(parents=True)
    state.write_text(f'{{"pid": {gone.pid}, "redis_url": "redis://127.0.0.1:1/0"}}')

    # When a command loads its settings
    settings = load_settings(environ={"XDG_STATE_HOME": str(tmp_path)})

    # Then the defaults hold
    assert settings.redis_url == "redis://127.0.0.1:6379/0"


def test_withdraw_removes_only_this_process_record(tmp_path: Path) -> None:
    state = dev_instance.state_file(tmp_path)
    dev_instance.announce(state, SHARED)
    dev_instance.withdraw(state)
    state.write_text(f'{{"pid": {os.getppid()}, "redis_url": "redis://x:1/0"}}')
    dev_instance.withdraw(state)

    assert state.exists()  # the parent's record stays
    assert dev_instance.running(state) == {"redis_url": "redis://x:1/0"}


def test_no_home_no_record() -> None:
    assert dev_state_file({}) is None
    assert load_settings(environ={}).redis_url == "redis://127.0.0.1:6379/0"
