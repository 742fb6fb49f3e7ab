"""`kiln flush` and `kiln drain` against running Kiln processes, through Redis only."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from kafka import KafkaProducer

from cli.local_services import free_port
from cli.main import main
from storage.operator_requests import drain_requested
from tests.integration.test_cli import kiln_process
from tests.integration.test_produce_harden import read_hardened
from tests.kiln_harness import RunningKiln, fresh_kiln, start_kiln, sync_redis
from tests.raw_client import RawClient, record_batch


@pytest.fixture
def slow_kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=600_000,
                    default_partitions=2) as running:
        yield running


def wait_for_reports(redis_url: str, present: bool = True, timeout_s: float = 10) -> None:
    client = sync_redis(redis_url)

    def reported() -> bool:  # (SCAN: a cluster client asks every master)
        return any(True for _ in client.scan_iter("kiln:delay:*"))

    deadline = time.monotonic() + timeout_s
    while reported() != present and time.monotonic() < deadline:
        time.sleep(0.1)
    assert reported() == present


def produce(bootstrap: str, topic: str, partition: int, values: list[bytes]) -> None:
    with RawClient(bootstrap) as client:
        assert client.produce(topic, partition, record_batch(values)).error_code == 0


def test_flush_hardens_every_buffered_record_now_and_reports_it(
        slow_kiln: RunningKiln, kafka_bootstrap: str, redis_url: str, unique_topic: str) -> None:
    produce(slow_kiln.bootstrap, unique_topic, 0, [b"a%d" % i for i in range(30)])
    produce(slow_kiln.bootstrap, unique_topic, 1, [b"b%d" % i for i in range(20)])
    wait_for_reports(redis_url)

    result = CliRunner().invoke(main, ["flush", unique_topic, "--json", "--timeout", "30",
                                       "--redis-url", redis_url])

    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["partition"], r["goal"], r["written"], r["dropped"], r["done"]) for r in rows] == [
        (0, 30, 30, 0, True), (1, 20, 20, 0, True)]
    assert [r.value for r in read_hardened(kafka_bootstrap, unique_topic, 0, 30)] == [
        b"a%d" % i for i in range(30)]
    assert len(read_hardened(kafka_bootstrap, unique_topic, 1, 20)) == 20
    assert sync_redis(redis_url).hlen("kiln:flush") == 0


def test_flush_table_and_nothing_to_do(slow_kiln: RunningKiln, redis_url: str,
                                       unique_topic: str) -> None:
    produce(slow_kiln.bootstrap, unique_topic, 0, [b"x"])
    wait_for_reports(redis_url)
    runner = CliRunner()

    first = runner.invoke(main, ["flush", "--redis-url", redis_url])
    second = runner.invoke(main, ["flush", "--redis-url", redis_url])

    assert first.exit_code == 0, first.output
    assert "TOPIC" in first.stdout and unique_topic in first.stdout
    assert second.exit_code == 0, second.output
    assert "nothing buffered" in second.stdout


def test_flush_bad_input_is_a_clear_message(slow_kiln: RunningKiln, redis_url: str) -> None:
    result = CliRunner().invoke(main, ["flush", "no-such-topic", "--redis-url", redis_url])

    assert result.exit_code == 1
    assert "unknown topic 'no-such-topic'" in result.output


def test_flush_without_a_running_kiln_says_so(redis_url: str, kafka_bootstrap: str,
                                             unique_topic: str) -> None:
    running = start_kiln(redis_url, kafka_bootstrap, harden_delay_ms=600_000)
    produce(running.bootstrap, unique_topic, 0, [b"x"])
    running.stop()
    wait_for_reports(redis_url, present=False)

    result = CliRunner().invoke(main, ["flush", unique_topic, "--redis-url", redis_url])

    assert result.exit_code == 1
    assert "no Kiln process is running" in result.output


def test_garbage_under_kiln_keys_is_ignored_not_fatal(
        slow_kiln: RunningKiln, kafka_bootstrap: str, redis_url: str, unique_topic: str) -> None:
    # Given hand-written junk where Kiln keeps operator requests and delay reports
    client = sync_redis(redis_url)
    client.hset("kiln:flush", mapping={"x/oops": "1", "0/some-topic": "not-a-number"})
    client.set("kiln:drain", "yesterday")
    client.hset("kiln:delay:intruder", mapping={"t": "{not json", "u": "[1, 2]"})
    client.set("kiln:delay:string-key", "junk")
    produce(slow_kiln.bootstrap, unique_topic, 0, [b"g%d" % i for i in range(5)])
    wait_for_reports(redis_url)
    time.sleep(1.5)  # a hardener topic scan and a drain check have read the junk

    # When an operator asks for the delay and a flush
    runner = CliRunner()
    explained = runner.invoke(main, ["delay", "explain", unique_topic, "--json",
                                     "--redis-url", redis_url])
    flushed = runner.invoke(main, ["flush", unique_topic, "--json", "--timeout", "30",
                                   "--redis-url", redis_url])

    # Then both work, the hardener still hardens, and the junk is no drain request
    assert explained.exit_code == 0, explained.output
    assert [r["topic"] for r in json.loads(explained.stdout)] == [unique_topic]
    assert flushed.exit_code == 0, flushed.output
    assert [r.value for r in read_hardened(kafka_bootstrap, unique_topic, 0, 5)] == [
        b"g%d" % i for i in range(5)]
    assert slow_kiln.call(drain_requested(slow_kiln.app.queue.redis, started_ms=0)) is False


def test_flush_refuses_a_negative_timeout(redis_url: str) -> None:
    result = CliRunner().invoke(main, ["flush", "--timeout", "-1", "--redis-url", redis_url])

    assert result.exit_code == 2
    assert "--timeout" in result.output


@pytest.mark.timeout(120)
def test_drain_stops_every_kiln_after_hardening_what_it_buffered(
        redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    sync_redis(redis_url).flushdb()
    port = free_port()
    with kiln_process("serve", "--workers", "1", "--listen", f"127.0.0.1:{port}",
                      "--redis-url", redis_url, "--kafka-bootstrap", kafka_bootstrap,
                      "--delay-policy", "fixed",
                      "--harden-delay-ms", "600000", "--http-listen", "",
                      port=port) as process:
        producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", acks=1)
        for i in range(40):
            producer.send(unique_topic, value=b"d%d" % i, partition=0)
        producer.flush()
        producer.close()
        wait_for_reports(redis_url)

        result = CliRunner().invoke(main, ["drain", "--timeout", "60",
                                           "--redis-url", redis_url])
        code = process.wait(timeout=30)

    assert result.exit_code == 0, result.output
    assert "asking 1 Kiln process(es) to drain" in result.output
    assert code == 0
    records = read_hardened(kafka_bootstrap, unique_topic, 0, 40)
    assert [r.value for r in records] == [b"d%d" % i for i in range(40)]
