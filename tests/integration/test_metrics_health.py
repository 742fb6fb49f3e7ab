"""The operator's HTTP endpoints of a real Kiln: /metrics scraped and parsed after real
producers, /healthz, /readyz with Redis or Kafka taken away, and clients that misbehave."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator

import pytest
import redis
from kafka import KafkaProducer
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from cli.local_services import LocalRedis
from tests.conftest import KafkaRelay
from tests.kiln_harness import RunningKiln, fresh_kiln, start_kiln, sync_redis

ROUNDS, PER_ROUND = 10, 30


@pytest.fixture
def held_kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    """A fresh Kiln whose records wait a minute before hardening (so a test sees them
    buffered until it flushes), its HTTP endpoints on a free port."""
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=60_000) as running:
        yield running


def test_metrics_count_the_records_bytes_and_requests_of_a_producer(
        held_kiln: RunningKiln, redis_client: redis.Redis, unique_topic: str) -> None:
    # Given a kafka-python producer that sends 10 requests of 30 records (acks=1)
    # When it has sent them all
    produce_rounds(held_kiln, unique_topic)

    # Then the scrape counts exactly those records, bytes and Produce requests, and the
    # records wait in the buffer, at risk, with the delay that holds them
    appended = int(redis_client.hget(f"kiln:{{{unique_topic}/0}}:meta", "appended") or 0)
    metrics = scrape_when(held_kiln, "kiln_harden_delay_seconds", topic=unique_topic)
    level = {"topic": unique_topic, "reliability": "reliable_persistent"}
    topic = {"topic": unique_topic}
    assert value(metrics, "kiln_records_in_total", **level) == ROUNDS * PER_ROUND
    assert value(metrics, "kiln_bytes_in_total", **level) == appended > ROUNDS * PER_ROUND
    assert value(metrics, "kiln_requests_total", api="Produce") == ROUNDS
    assert value(metrics, "kiln_produce_latency_seconds_count", acks="1") == ROUNDS
    assert value(metrics, "kiln_request_latency_seconds_count", api="Produce") == ROUNDS
    assert value(metrics, "kiln_requests_total", api="Metadata") >= 1
    assert value(metrics, "kiln_requests_total", api="ApiVersions") >= 1
    assert value(metrics, "kiln_connections_accepted_total") >= 1
    assert value(metrics, "kiln_buffered_records", **topic) == ROUNDS * PER_ROUND
    assert value(metrics, "kiln_buffered_bytes", **topic) == appended
    assert value(metrics, "kiln_at_risk_records", **topic) == ROUNDS * PER_ROUND
    assert value(metrics, "kiln_at_risk_bytes", **topic) == appended
    assert 0 < value(metrics, "kiln_buffered_oldest_age_seconds", **topic) < 60
    assert value(metrics, "kiln_harden_delay_seconds", **topic) == 60.0
    assert value(metrics, "kiln_harden_delay_binding", constraint="fixed", **topic) == 1
    assert value(metrics, "kiln_hardened_records_total", **topic) is None


def test_after_a_flush_metrics_count_the_records_hardened_and_the_buffer_empty(
        held_kiln: RunningKiln, redis_client: redis.Redis, unique_topic: str) -> None:
    # Given 300 records buffered
    produce_rounds(held_kiln, unique_topic)
    appended = int(redis_client.hget(f"kiln:{{{unique_topic}/0}}:meta", "appended") or 0)

    # When they are flushed to Kafka
    assert held_kiln.flush()

    # Then they are counted as hardened, one latency observation per client batch, and
    # nothing is buffered or at risk any more
    metrics = scrape(held_kiln)
    topic = {"topic": unique_topic}
    assert value(metrics, "kiln_hardened_records_total", **topic) == ROUNDS * PER_ROUND
    assert value(metrics, "kiln_hardened_bytes_total") > appended / 2
    assert value(metrics, "kiln_harden_latency_seconds_count", **topic) == ROUNDS
    assert value(metrics, "kiln_buffered_records", **topic) == 0
    assert value(metrics, "kiln_buffered_bytes", **topic) == 0
    assert value(metrics, "kiln_buffered_oldest_age_seconds", **topic) == 0
    assert value(metrics, "kiln_at_risk_records", **topic) == 0
    assert value(metrics, "kiln_delivered_dropped_records_total", **topic) == 0
    assert value(metrics, "kiln_harden_errors_total") == 0


def test_healthz_and_readyz_answer_ok_while_redis_and_kafka_answer(
        held_kiln: RunningKiln) -> None:
    # When both probes are asked
    health = get(held_kiln, "/healthz")
    ready = get(held_kiln, "/readyz")

    # Then both are 200, readiness naming each dependency
    assert (health.status, json.loads(health.body)) == (200, {"status": "ok"})
    assert (ready.status, json.loads(ready.body)) == (
        200, {"status": "ready", "checks": {"redis": "ok", "kafka": "ok", "node": "ok"}})


def test_readyz_answers_503_naming_kafka_while_kafka_is_unreachable(
        redis_url: str, kafka_relay: KafkaRelay) -> None:
    # Given a Kiln reaching its broker through a relay that can be cut, ready
    sync_redis(redis_url).flushdb()
    relay = kafka_relay.relay
    with start_kiln(redis_url, kafka_relay.bootstrap) as kiln:
        before = get(kiln, "/readyz")

        # When Kafka becomes unreachable, and later reachable again
        relay.stop()
        time.sleep(1.1)  # readiness answers are reused for 1 s
        during = get(kiln, "/readyz")
        health_during = get(kiln, "/healthz")
        metrics_during = get(kiln, "/metrics")
        relay.start()
        time.sleep(1.1)
        after = get(kiln, "/readyz")

    # Then readiness is 503 with Kafka named only while it is away; health and metrics
    # answer throughout
    assert before.status == 200
    report = json.loads(during.body)
    assert (during.status, report["status"], report["failed"]) == (503, "not ready", ["kafka"])
    assert report["checks"]["redis"] == "ok"
    assert "unavailable" in report["checks"]["kafka"]
    assert (health_during.status, metrics_during.status) == (200, 200)
    assert after.status == 200


def test_readyz_answers_503_naming_redis_while_redis_is_unreachable(
        kafka_bootstrap: str) -> None:
    # Given a Kiln with a Redis of its own, ready
    store = LocalRedis()
    store.start()
    kiln = start_kiln(store.url, kafka_bootstrap)
    try:
        before = get(kiln, "/readyz")

        # When Redis stops
        store.stop()
        time.sleep(1.1)
        during = get(kiln, "/readyz")
        metrics_during = get(kiln, "/metrics")
    finally:
        kiln.stop()
        store.stop()

    # Then readiness is 503 naming Redis; metrics still answer, without the buffer (which
    # cannot be read) and counting the failed read
    assert before.status == 200
    report = json.loads(during.body)
    assert (during.status, report["failed"], report["checks"]["kafka"]) == (503, ["redis"], "ok")
    assert metrics_during.status == 200
    families = parse(metrics_during.body)
    assert "kiln_buffered_records" not in families
    assert value(families, "kiln_redis_errors_total", source="metrics") >= 1


def test_unknown_paths_are_404_and_other_methods_405(held_kiln: RunningKiln) -> None:
    # When an unknown path is asked, a known one with POST, and one with HEAD
    missing = get(held_kiln, "/nowhere")
    posted = get(held_kiln, "/metrics", method="POST")
    head = get(held_kiln, "/healthz", method="HEAD")

    # Then 404, 405 with the allowed methods, and a bodiless 200
    assert missing.status == 404
    assert (posted.status, posted.headers.get("Allow")) == (405, "GET, HEAD")
    assert (head.status, head.body) == (200, b"")


def test_garbage_and_stalled_clients_cost_only_their_own_connection(
        held_kiln: RunningKiln, unique_topic: str) -> None:
    # Given a client that connects and sends nothing, held open throughout
    port = held_kiln.app.http_port
    with socket.create_connection(("127.0.0.1", port)) as stalled:
        # When clients send garbage: binary, a request line that is not HTTP, an endless
        # header, a half request then hang up
        binary = exchange(port, bytes(range(256)) * 4 + b"\r\n\r\n")
        not_http = exchange(port, b"HELLO\r\n\r\n")
        endless = exchange(port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 40_000 + b"\r\n\r\n")
        exchange(port, b"GET /metr", read=False)
        health = get(held_kiln, "/healthz")
        stalled.settimeout(15)
        timed_out = stalled.recv(65536)  # the request head is due within 5 s

    # Then each gets a 4xx (the silent one when its time is up), the endpoints still
    # answer, and so does Kiln's Kafka side
    assert timed_out.startswith(b"HTTP/1.1 408 ")
    assert binary.startswith(b"HTTP/1.1 400 ")
    assert not_http.startswith(b"HTTP/1.1 400 ")
    assert endless.startswith(b"HTTP/1.1 431 ")
    assert health.status == 200
    producer = KafkaProducer(bootstrap_servers=held_kiln.bootstrap, acks=1)
    assert producer.send(unique_topic, b"still here", partition=0).get(timeout=10).offset == 0
    producer.close()


def test_a_failing_metrics_source_answers_500_and_the_endpoints_carry_on(
        held_kiln: RunningKiln) -> None:
    # Given a delay source that fails
    def broken() -> dict[str, tuple[int, str]]:
        raise RuntimeError("delay source broken")
    held_kiln.app.metrics.set_delay_source(broken)

    # When metrics are scraped
    scraped = get(held_kiln, "/metrics")

    # Then the scrape fails with 500 and nothing else does
    assert scraped.status == 500
    assert get(held_kiln, "/healthz").status == 200
    assert get(held_kiln, "/readyz").status == 200


# --- helpers ---------------------------------------------------------------------------------


def produce_rounds(kiln: RunningKiln, topic: str) -> None:
    """ROUNDS Produce requests of PER_ROUND records each, all to partition 0."""
    producer = KafkaProducer(bootstrap_servers=kiln.bootstrap, acks=1, linger_ms=1000)
    for r in range(ROUNDS):
        futures = [producer.send(topic, value=b"value-%d-%d" % (r, i), partition=0)
                   for i in range(PER_ROUND)]
        producer.flush()
        assert [f.get(timeout=10).offset for f in futures] == list(
            range(r * PER_ROUND, (r + 1) * PER_ROUND))
    producer.close()


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


def get(kiln: RunningKiln, path: str, method: str = "GET") -> Answer:
    connection = http.client.HTTPConnection("127.0.0.1", kiln.app.http_port, timeout=10)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return Answer(response.status, dict(response.getheaders()), response.read())
    finally:
        connection.close()


def exchange(port: int, data: bytes, read: bool = True) -> bytes:
    """Send raw bytes; everything the server answers before it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        if not read:
            return b""
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def parse(text: bytes) -> dict[str, list[Sample]]:
    """Samples by metric family name."""
    return {family.name: family.samples
            for family in text_string_to_metric_families(text.decode())}


def scrape(kiln: RunningKiln) -> dict[str, list[Sample]]:
    answer = get(kiln, "/metrics")
    assert answer.status == 200
    assert answer.headers["Content-Type"].startswith("text/plain")
    return parse(answer.body)


def scrape_when(kiln: RunningKiln, sample: str, timeout_s: float = 10,
                **labels: str) -> dict[str, list[Sample]]:
    """A scrape that has `sample`: the hardener decides a new topic's delay when it first
    looks at the topic (within a second of the topic's creation)."""
    deadline = time.monotonic() + timeout_s
    while value(metrics := scrape(kiln), sample, **labels) is None:
        assert time.monotonic() < deadline, f"no {sample} {labels} within {timeout_s}s"
        time.sleep(0.1)
    return metrics


def value(families: dict[str, list[Sample]], sample: str, **labels: str) -> float | None:
    """The value of the sample named `sample` whose labels include `labels`; None if none."""
    for samples in families.values():
        for s in samples:
            if s.name == sample and labels.items() <= s.labels.items():
                return s.value
    return None
