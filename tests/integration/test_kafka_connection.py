"""The broker connection: pipelining against the real broker, and every way a broker can let
Kiln down (refusal, silence, a closed socket, a wrong answer) becoming HardenedStoreUnavailable.

The failure cases use a scripted fake broker on loopback, since a real one cannot be made to
misbehave on cue.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest
from kafka.protocol.metadata import ApiVersionsResponse, MetadataRequest

from storage.errors import HardenedStoreUnavailable
from storage.kafka.client import parse_bootstrap
from storage.kafka.connection import BrokerConnection
from wire.apis import ApiKey
from wire.header import response_frame

pytestmark = pytest.mark.integration

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def metadata_request() -> MetadataRequest:
    return MetadataRequest(topics=[], allow_auto_topic_creation=False)


async def read_request(reader: asyncio.StreamReader) -> tuple[int, int]:
    """(api_key, correlation_id) of the next request frame."""
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    frame = await reader.readexactly(size)
    api_key, _, correlation_id = struct.unpack_from(">hhi", frame, 0)
    return api_key, correlation_id


async def answer_api_versions(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    api_key, correlation_id = await read_request(reader)
    assert api_key == ApiKey.API_VERSIONS
    body = ApiVersionsResponse(
        error_code=0,
        api_keys=[ApiVersionsResponse.ApiVersion(api_key=k, min_version=0, max_version=12)
                  for k in (ApiKey.API_VERSIONS, ApiKey.METADATA)],
        throttle_time_ms=0,
    )
    writer.write(response_frame(correlation_id, False, body.encode(version=3)))
    await writer.drain()


async def against_fake_broker(script: Script, test: Callable[[int], Awaitable[None]]) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await answer_api_versions(reader, writer)
            await script(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        await test(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


def test_many_requests_in_flight_are_all_answered(kafka_bootstrap: str) -> None:
    # Given a connection to the real broker
    host, port = parse_bootstrap(kafka_bootstrap)[0]

    async def body() -> tuple[list[int], dict[ApiKey, int]]:
        conn = await BrokerConnection.open(host, port)
        try:
            # When 50 requests are sent before any answer is awaited
            answers = [conn.send(ApiKey.METADATA, metadata_request()) for _ in range(50)]
            await conn.drain()
            responses = await asyncio.gather(*answers)
            versions = {k: conn.version(k) for k in (ApiKey.PRODUCE, ApiKey.FETCH,
                                                     ApiKey.INIT_PRODUCER_ID)}
            return [len(r.brokers) for r in responses], versions
        finally:
            await conn.close()

    brokers, versions = asyncio.run(body())

    # Then each gets its own answer, and the versions are ones Kiln speaks
    assert len(brokers) == 50 and all(n >= 1 for n in brokers)
    assert 3 <= versions[ApiKey.PRODUCE] <= 11
    assert 4 <= versions[ApiKey.FETCH] <= 12
    assert 3 <= versions[ApiKey.INIT_PRODUCER_ID] <= 5


def test_a_refused_connection_is_unavailable() -> None:
    # Given a port nobody listens on
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    # When a connection is opened, Then it is HardenedStoreUnavailable
    with pytest.raises(HardenedStoreUnavailable, match="cannot connect"):
        asyncio.run(BrokerConnection.open("127.0.0.1", port, connect_timeout=2))


def test_a_silent_broker_times_out_and_fails_the_connection() -> None:
    # Given a broker that reads requests and never answers
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)

    failures: list[BaseException] = []

    async def test(port: int) -> None:
        conn = await BrokerConnection.open("127.0.0.1", port, request_timeout=0.3)
        # When two requests are in flight past the timeout
        answers = [conn.send(ApiKey.METADATA, metadata_request()) for _ in range(2)]
        failures.extend(await asyncio.gather(*answers, return_exceptions=True))
        try:
            conn.send(ApiKey.METADATA, metadata_request())
        except HardenedStoreUnavailable as exc:
            failures.append(exc)
        await conn.close()

    asyncio.run(against_fake_broker(silent, test))

    # Then both fail, and so does anything sent afterwards
    assert len(failures) == 3
    assert all(isinstance(f, HardenedStoreUnavailable) for f in failures)
    assert "no answer" in str(failures[0])


def test_a_broker_closing_the_socket_fails_what_is_in_flight() -> None:
    # Given a broker that hangs up after reading one request
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    outcome: list[BaseException] = []

    async def test(port: int) -> None:
        conn = await BrokerConnection.open("127.0.0.1", port)
        # When a request is waiting for its answer
        outcome.extend(await asyncio.gather(conn.request(ApiKey.METADATA, metadata_request()),
                                            return_exceptions=True))
        await conn.close()

    asyncio.run(against_fake_broker(hang_up, test))

    # Then it fails as unavailable
    assert len(outcome) == 1 and isinstance(outcome[0], HardenedStoreUnavailable)
    assert "closed by the broker" in str(outcome[0])


def test_an_answer_with_the_wrong_correlation_id_fails_the_connection() -> None:
    # Given a broker that answers with a correlation id nobody asked for
    async def confused(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, correlation_id = await read_request(reader)
        writer.write(response_frame(correlation_id + 1000, True, b"\x00" * 16))
        await writer.drain()
        await reader.read()

    outcome: list[BaseException] = []

    async def test(port: int) -> None:
        conn = await BrokerConnection.open("127.0.0.1", port)
        # When a request is answered
        outcome.extend(await asyncio.gather(conn.request(ApiKey.METADATA, metadata_request()),
                                            return_exceptions=True))
        outcome.append(HardenedStoreUnavailable("closed") if conn.closed else Exception("open"))
        await conn.close()

    asyncio.run(against_fake_broker(confused, test))

    # Then the request fails and the connection is not used again
    assert isinstance(outcome[0], HardenedStoreUnavailable)
    assert "correlation id" in str(outcome[0])
    assert isinstance(outcome[1], HardenedStoreUnavailable)
