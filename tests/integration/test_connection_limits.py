"""What a client can make Kiln hold: answers it never reads, frames it never finishes,
connections it never closes or never uses. Each is bounded, and given back when it leaves."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from tests.kiln_harness import RunningKiln, eventually, fresh_kiln
from tests.raw_client import RawClient, record_batch

MiB = 1024 * 1024
BIG_VALUE = b"x" * (200 * 1024)


def fetch_everything(topic: str, max_bytes: int) -> FetchRequest:
    return FetchRequest[11](
        replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=max_bytes, isolation_level=0,
        session_id=0, session_epoch=-1, rack_id="", forgotten_topics_data=[],
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchTopic.FetchPartition(
                partition=0, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
                partition_max_bytes=max_bytes)])])



def closed_by_kiln(sock: socket.socket, timeout_s: float) -> bool:
    """True when Kiln closes the connection within `timeout_s` (reads to the end)."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def api_versions(client: RawClient) -> int:
    answer = client.request(ApiVersionsRequest[0](), 0, ApiVersionsResponse)
    return int(answer.error_code)


@pytest.fixture
def limited_kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=600_000,
                    max_answer_bytes_per_connection=MiB, max_fetch_bytes=20 * MiB,
                    frame_read_timeout_ms=500, connections_max_idle_ms=1500,
                    max_connections_per_host=3) as running:
        yield running


def test_a_client_that_never_reads_its_fetch_answers_stops_being_read(
        limited_kiln: RunningKiln, unique_topic: str) -> None:
    kiln = limited_kiln
    # Given 8 MB of records, and a client with a small receive buffer
    producer = RawClient(kiln.bootstrap)
    for _ in range(4):
        assert producer.produce(unique_topic, 0, record_batch([BIG_VALUE] * 10)).error_code == 0
    producer.close()
    greedy = socket.socket()
    greedy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    greedy.connect(("127.0.0.1", kiln.app.port))
    memory = kiln.app.context.memory
    fetches_before = kiln.app.metrics.value("kiln_requests_total", api="Fetch")

    # When it sends 64 fetches for all of it and reads none of the answers
    for correlation_id in range(64):
        request = fetch_everything(unique_topic, 10 * MiB)
        request.with_header(correlation_id=correlation_id, client_id="greedy")
        payload = bytes(request.encode(version=11, header=True))
        greedy.sendall(struct.pack(">i", len(payload)) + payload)
    time.sleep(2)
    handled = kiln.app.metrics.value("kiln_requests_total", api="Fetch") - fetches_before
    held = memory.answers.used

    # Then Kiln handled one or two of them and holds no more than their answers
    assert 1 <= handled <= 2
    assert held <= 2 * 9 * MiB

    # and when the client goes away, everything it held is given back
    greedy.close()
    assert eventually(lambda: memory.answers.used == 0 and memory.requests.used == 0)
    assert eventually(lambda: kiln.app.metrics.value("kiln_connections_open") == 0)


def test_a_fetch_answers_no_more_than_max_fetch_bytes(
        redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    kiln = fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=600_000,
                      max_fetch_bytes=MiB)
    client = RawClient(kiln.bootstrap)
    try:
        # Given 4 MB of records in batches of 400 KB
        for _ in range(10):
            assert client.produce(unique_topic, 0, record_batch([BIG_VALUE] * 2)).error_code == 0

        # When a fetch asks for 10 MB
        answer = client.request(fetch_everything(unique_topic, 10 * MiB), 11, FetchResponse)
    finally:
        client.close()
        kiln.stop()

    # Then it gets the batches that fit in 1 MB
    records = answer.responses[0].partitions[0].records
    assert 400 * 1024 < len(records) <= MiB


def test_a_frame_that_never_completes_closes_its_connection(limited_kiln: RunningKiln) -> None:
    memory = limited_kiln.app.context.memory
    with socket.create_connection(("127.0.0.1", limited_kiln.app.port)) as sock:
        # When a client announces a 50 MB frame and sends 10 bytes of it
        sock.sendall(struct.pack(">i", 50 * MiB) + b"0123456789")
        announced = eventually(lambda: memory.requests.used == 50 * MiB, 2)

        # Then Kiln closes the connection after frame_read_timeout_ms, and lets go of it
        assert announced
        assert closed_by_kiln(sock, timeout_s=5)
    assert eventually(lambda: memory.requests.used == 0)


def test_an_idle_connection_is_closed(limited_kiln: RunningKiln) -> None:
    with RawClient(limited_kiln.bootstrap) as client:
        assert api_versions(client) == 0
        started = time.monotonic()

        assert closed_by_kiln(client.sock, timeout_s=10)
        idle_s = time.monotonic() - started
    assert idle_s >= 1.4


def test_connections_beyond_the_per_host_limit_are_refused(limited_kiln: RunningKiln) -> None:
    # Given three connections from one host in use (the limit)
    clients = [RawClient(limited_kiln.bootstrap) for _ in range(3)]
    try:
        assert [api_versions(c) for c in clients] == [0, 0, 0]

        # When a fourth connects, it is closed at once; once one of the three leaves, a new
        # connection is served
        fourth = socket.create_connection(("127.0.0.1", limited_kiln.app.port))
        refused = closed_by_kiln(fourth, timeout_s=5)
        fourth.close()
        clients.pop().close()
        time.sleep(0.2)
        clients.append(RawClient(limited_kiln.bootstrap))
        served = api_versions(clients[-1])
    finally:
        for client in clients:
            client.close()

    assert refused
    assert served == 0
