"""Planned shutdown (SIGTERM) while producers keep writing: every record a producer was told
is stored at a persistent level must be in Kafka when Kiln has exited, because nothing is
appended after the final flush has fixed what it hardens."""

from __future__ import annotations

import time
from pathlib import Path

from tests.faults.kiln_process import fresh_kiln_process
from tests.faults.records import NumberedLoop, read_partition

SECOND_PRODUCER = 10_000_000  # the acks=all producer's records are value_of(10_000_000 + n)
_COMMON = {"linger.ms": 5, "message.timeout.ms": 30_000, "retries": 0,
           "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500}


def test_records_acknowledged_before_or_during_sigterm_are_all_hardened(
        redis_url: str, kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    # Given Kiln with a delay longer than the test, so that only the final flush hardens,
    # and two producers on one partition: acks=1 (answered on append) and acks=all
    with fresh_kiln_process(redis_url, kafka_bootstrap, tmp_path / "kiln.log",
                            harden_delay_ms=600_000) as kiln:
        kiln.start()
        loops = [
            NumberedLoop({**_COMMON, "bootstrap.servers": kiln.bootstrap, "acks": "1"},
                         unique_topic, 0, rate=3000),
            NumberedLoop({**_COMMON, "bootstrap.servers": kiln.bootstrap, "acks": "all"},
                         unique_topic, SECOND_PRODUCER, rate=1000),
        ]
        try:
            for loop in loops:
                loop.start()
            assert loops[0].wait_for_acks(3000, timeout_s=30), kiln.log_tail()

            # When Kiln is told to stop while both keep sending
            sigterm_at = time.monotonic()
            exit_code = kiln.terminate(timeout_s=90)
            shutdown_s = time.monotonic() - sigterm_at
            for loop in loops:
                loop.stop_sending()
            for loop in loops:
                loop.stop(flush_timeout_s=35)
            log = kiln.current_log()
        finally:
            for loop in loops:
                loop.stop(flush_timeout_s=1)
        hardened = read_partition(kafka_bootstrap, unique_topic, 0, timeout_s=60)

    # Then Kiln exited cleanly, and every acknowledged record is in Kafka exactly once
    acknowledged = loops[0].acknowledged() | loops[1].acknowledged()
    seqs = [record.seq for record in hardened]
    missing = sorted(acknowledged - set(seqs))
    print(f"shutdown took {shutdown_s:.1f}s; {len(acknowledged)} acknowledged, "
          f"{len(seqs)} hardened")
    assert exit_code == 0, log[-3000:]
    assert len(loops[1].acknowledged()) > 0
    assert missing == [], f"{len(missing)} acknowledged records not hardened: {missing[:5]}"
    assert len(seqs) == len(set(seqs))
