from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.kiln_harness import RunningKiln, start_kiln


@pytest.fixture
def kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    """A fresh Kiln (empty Redis) in front of the session's broker, 200 ms harden delay."""
    redis.Redis.from_url(redis_url).flushdb()
    running = start_kiln(redis_url, kafka_bootstrap)
    yield running
    running.stop()


@pytest.fixture
def slow_kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    """A fresh Kiln whose delay (10 minutes) never expires during a test: only delivery or
    an explicit flush moves records."""
    redis.Redis.from_url(redis_url).flushdb()
    running = start_kiln(redis_url, kafka_bootstrap, harden_delay_ms=600_000)
    yield running
    running.stop()
