"""A Kiln with `transactions_enabled = false` answers transactional producers as a broker
without a transaction coordinator: they never get to send anything."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.compat.java import PRODUCER_PERF, run_tool
from tests.compat.test_kafka_tools import kiln_partition_count
from tests.kiln_harness import RunningKiln, fresh_kiln

pytestmark = pytest.mark.usefixtures("kafka_tools")


@pytest.fixture
def kiln_without_transactions(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    with fresh_kiln(redis_url, kafka_bootstrap, transactions_enabled=False) as running:
        yield running


def test_a_transactional_producer_times_out_finding_a_transaction_coordinator(
        kiln_without_transactions: RunningKiln, unique_topic: str) -> None:
    kiln = kiln_without_transactions
    # When kafka-producer-perf-test runs transactionally (Kiln answers FindCoordinator for
    # transactions with COORDINATOR_NOT_AVAILABLE, which the Java producer retries until
    # max.block.ms: 60 s by default, 3 s here)
    run = run_tool(PRODUCER_PERF, "--bootstrap-server", kiln.bootstrap,
                   "--topic", unique_topic, "--num-records", "10", "--record-size", "10",
                   "--throughput", "-1", "--transactional-id", f"tx-{unique_topic}",
                   "--command-property", "max.block.ms=3000", timeout_s=30)
    # Then it fails at initTransactions, before sending anything
    assert run.returncode == 1, run
    assert "InitTransactions timed out - did not complete coordinator discovery" in run.output
    assert kiln_partition_count(kiln.bootstrap, unique_topic) is None
