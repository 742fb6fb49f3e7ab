from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.kiln_harness import RunningKiln, start_kiln

# Short, so acks=all producers (answered once hardened) are not slowed down; the tests call
# kiln.flush() before they read the hardened topic, so they never wait for the delay.
HARDEN_DELAY_MS = 100


@pytest.fixture
def kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    """A fresh Kiln (empty Redis) in front of the session's broker."""
    redis.Redis.from_url(redis_url).flushdb()
    running = start_kiln(redis_url, kafka_bootstrap, harden_delay_ms=HARDEN_DELAY_MS)
    yield running
    running.stop()
