from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from cli.local_kafka import java_binary, kafka_jars
from cli.local_services import ServiceError
from tests.conftest import _unavailable
from tests.kiln_harness import RunningKiln, start_kiln

# Short, so acks=all producers (answered once hardened) are not slowed down; the tests call
# kiln.flush() before they read the hardened topic, so they never wait for the delay.
HARDEN_DELAY_MS = 100
# Groups that form in a fraction of a second: the tests start and stop members.
GROUP_SETTINGS = {"group_initial_rebalance_delay_ms": 100, "group_min_session_timeout_ms": 1000}


@pytest.fixture
def kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    """A fresh Kiln (empty Redis) in front of the session's broker."""
    redis.Redis.from_url(redis_url).flushdb()
    running = start_kiln(redis_url, kafka_bootstrap, harden_delay_ms=HARDEN_DELAY_MS)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def module_kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    """One Kiln (empty Redis at its start) for every test of a module whose tests each use
    topics and groups of their own: the Java tests pay for JVM launches, not Kiln starts.
    Only one Kiln may run on the session's Redis at a time (any of them hardens any
    partition), so a module using this one starts no other."""
    redis.Redis.from_url(redis_url).flushdb()
    running = start_kiln(redis_url, kafka_bootstrap, harden_delay_ms=HARDEN_DELAY_MS,
                         **GROUP_SETTINGS)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def kafka_tools() -> None:
    """Kafka's Java client and tools (the jars scripts/setup.sh resolves, and a JDK)."""
    try:
        kafka_jars()
        java_binary()
    except ServiceError as exc:
        _unavailable("Kafka's Java tools", str(exc))
