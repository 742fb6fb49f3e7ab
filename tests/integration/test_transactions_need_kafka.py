"""Kiln hardens transactions into Kafka transactions of its own, so it offers them only in
front of an Apache Kafka broker: in front of tansu (whose aborted records show to
read_committed readers after a crash) transactions are off, whatever the setting says."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from cli.local_services import LocalTansu
from tests.kiln_harness import RunningKiln, fresh_kiln
from tests.raw_client import RawClient
from wire.errors import ErrorCode

pytestmark = pytest.mark.integration


@pytest.fixture
def tansu() -> Iterator[LocalTansu]:
    broker = LocalTansu()
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def find_transaction_coordinator(kiln: RunningKiln) -> int:
    with RawClient(kiln.bootstrap) as client:
        answer = client.request(FindCoordinatorRequest[4](
            key_type=1, coordinator_keys=["tx"]), 4, FindCoordinatorResponse)
    return int(answer.coordinators[0].error_code)


def test_in_front_of_tansu_transactions_are_off_with_a_warning(
        redis_url: str, tansu: LocalTansu, caplog: pytest.LogCaptureFixture) -> None:
    # Given transactions left on (the default), when Kiln starts in front of tansu
    with caplog.at_level(logging.WARNING, logger="cli.app"), \
            fresh_kiln(redis_url, tansu.bootstrap) as kiln:
        # Then transactional producers find no coordinator, and no lane runs
        assert find_transaction_coordinator(kiln) == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert kiln.app.lane is None and kiln.app.transactions is None
    # ... and the operator is told why
    assert any("transactions are off" in r.getMessage() and tansu.bootstrap in r.getMessage()
               for r in caplog.records)


def test_in_front_of_apache_kafka_transactions_stay_on(
        redis_url: str, kafka_bootstrap: str) -> None:
    with fresh_kiln(redis_url, kafka_bootstrap) as kiln:
        assert find_transaction_coordinator(kiln) == ErrorCode.NONE
        assert kiln.app.lane is not None
