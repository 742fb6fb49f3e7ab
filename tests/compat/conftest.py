from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from cli.local_kafka import java_binary, kafka_jars
from cli.local_services import ServiceError
from tests.conftest import _unavailable
from tests.kiln_harness import RunningKiln, fresh_kiln

# Short, so acks=all producers (answered once hardened) are not slowed down; the tests call
# kiln.flush() before they read the hardened topic, so they never wait for the delay.
HARDEN_DELAY_MS = 100
# Groups that form in a fraction of a second: the tests start and stop members.
GROUP_SETTINGS = {"group_initial_rebalance_delay_ms": 100, "group_min_session_timeout_ms": 1000,
                  # KIP-848 members learn of a rebalance from their next heartbeat.
                  "group_consumer_heartbeat_interval_ms": 300,
                  "group_consumer_session_timeout_ms": 6000}


@pytest.fixture
def kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    """A fresh Kiln (empty Redis) in front of the session's broker."""
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=HARDEN_DELAY_MS) as running:
        yield running


@pytest.fixture(scope="module")
def module_kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    """One Kiln (empty Redis at its start) for every test of a module whose tests each use
    topics and groups of their own: the Java tests pay for JVM launches, not Kiln starts.
    Only one Kiln may run on the session's Redis at a time (any of them hardens any
    partition), so a module using this one starts no other."""
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=HARDEN_DELAY_MS,
                    **GROUP_SETTINGS) as running:
        yield running


@pytest.fixture(scope="session")
def kafka_tools() -> None:
    """Kafka's Java client and tools (the jars scripts/setup.sh resolves, and a JDK)."""
    try:
        kafka_jars()
        java_binary()
    except ServiceError as exc:
        _unavailable("Kafka's Java tools", str(exc))


@contextmanager
def answering_all(kiln: RunningKiln, caplog: pytest.LogCaptureFixture, *,
                  warnings_fail: bool = False) -> Iterator[None]:
    """Checked when the block is over (a fixture's teardown): Kiln answered every request
    the test's clients sent. It closed no connection for a request it could not take (its
    kiln_malformed_frames counter: malformed, unsupported, oversized or unfinished frames,
    each also logged "closing ..." at WARNING) and answered none with UNKNOWN_SERVER_ERROR
    for an unexpected failure (which dispatch logs at ERROR); with `warnings_fail`, it
    logged no WARNING either. The client matrix's target is 0 of each."""
    closed_before = kiln.app.metrics.value("kiln_malformed_frames_total")
    yield
    closed = kiln.app.metrics.value("kiln_malformed_frames_total") - closed_before
    logged = [r for r in caplog.get_records("call")
              if r.name.startswith("proxy.") and r.levelno >= logging.WARNING]
    lines = [f"{r.levelname} {r.name}: {r.getMessage()}" for r in logged]
    worst_allowed = logging.INFO if warnings_fail else logging.WARNING
    failed = [line for r, line in zip(logged, lines, strict=True) if r.levelno > worst_allowed]
    assert closed == 0, (f"Kiln closed {closed} client connection(s) on a request it could not "
                         "take:\n" + "\n".join(lines))
    assert failed == [], "Kiln failed (or complained about) requests:\n" + "\n".join(failed)


@pytest.fixture
def kiln_answering_all(module_kiln: RunningKiln,
                       caplog: pytest.LogCaptureFixture) -> Iterator[RunningKiln]:
    """`module_kiln`, checked when the test is over (`answering_all`)."""
    with answering_all(module_kiln, caplog):
        yield module_kiln
