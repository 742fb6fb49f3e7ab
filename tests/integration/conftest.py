from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kiln_harness import RunningKiln, fresh_kiln


@pytest.fixture
def kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    """A fresh Kiln (empty Redis) in front of the session's broker, 200 ms harden delay."""
    with fresh_kiln(redis_url, kafka_bootstrap) as running:
        yield running


@pytest.fixture
def slow_kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    """A fresh Kiln whose delay (10 minutes) never expires during a test: only delivery or
    an explicit flush moves records."""
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=600_000) as running:
        yield running
