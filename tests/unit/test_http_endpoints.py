"""The HTTP endpoints' I/O-free exchange (h11 and Kiln's rules on top) fed the bytes a client
sends, as the server reads them, and the http_listen setting."""

from __future__ import annotations

import asyncio

import pytest

from cli.settings import SettingsError, load_settings
from proxy.http_endpoints import (
    MAX_HEAD_BYTES,
    BadRequest,
    Exchange,
    HttpRequest,
    HttpResponse,
    read_request,
)


@pytest.mark.parametrize(("head", "expected"), [
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", HttpRequest("GET", "/metrics")),
    (b"GET /readyz?verbose=1 HTTP/1.0\r\n\r\n", HttpRequest("GET", "/readyz")),
    (b"\r\nHEAD /healthz HTTP/1.1\nHost: x\n\n", HttpRequest("HEAD", "/healthz")),
    (b"DELETE /metrics HTTP/1.1\r\nHost: x\r\n\r\n", HttpRequest("DELETE", "/metrics")),
])
def test_request_lines_give_method_and_path(head: bytes, expected: HttpRequest) -> None:
    assert read(head) == expected


@pytest.mark.parametrize("head", [
    b"GET /metrics\r\n\r\n",
    b"GET  /metrics HTTP/1.1\r\n\r\n",
    b"G(T /metrics HTTP/1.1\r\n\r\n",
    b"GET /metrics HTTP/2.0\r\n\r\n",
    b"GET /metrics http/1.1\r\n\r\n",
    b"GET http://kiln/metrics HTTP/1.1\r\n\r\n",
    b"GET http://kiln/metrics HTTP/1.1\r\nHost: kiln\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
    # RFC 9112 3.2: an HTTP/1.1 request without Host must be answered 400. h11 does; the
    # hand-written parser served these three (given a Host, they are served above and below).
    b"\r\nHEAD /healthz HTTP/1.1\n\n",
    b"DELETE /metrics HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.1\r\nA: b\r\n\r\nbody",
])
def test_anything_else_is_a_bad_request(head: bytes) -> None:
    with pytest.raises(BadRequest) as raised:
        read(head)
    assert raised.value.status == 400


def test_a_response_carries_length_and_close_and_head_has_no_body() -> None:
    response = HttpResponse(405, b'{"error": "x"}', allow="GET, HEAD")

    full = answer(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", response)
    bare = answer(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n", response)

    assert full.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n")
    assert b"\r\nContent-Length: 14\r\n" in full
    assert b"\r\nConnection: close\r\n" in full
    assert b"\r\nAllow: GET, HEAD\r\n" in full
    assert full.endswith(b"\r\n\r\n" + b'{"error": "x"}')
    assert bare == full[:-14]


def test_the_head_is_read_up_to_the_blank_line() -> None:
    assert read(b"GET / HTTP/1.1\r\nHost: x\r\nA: b\r\n\r\nbody") == HttpRequest("GET", "/")


# Blank lines before a request are skipped (RFC 9112 2.2): alone, they are no request yet.
@pytest.mark.parametrize("data", [b"GET / HTTP/1.1\r\nA: b", b"\r\n"])
def test_a_client_that_stops_mid_head_is_a_closed_connection(data: bytes) -> None:
    with pytest.raises(ConnectionError):
        read(data)


@pytest.mark.parametrize("data", [
    b"GET / HTTP/1.1\r\nA: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + b"A: b\r\n" * (MAX_HEAD_BYTES // 6 + 10) + b"\r\n",
])
def test_a_head_over_16_kib_is_refused_with_431(data: bytes) -> None:
    with pytest.raises(BadRequest) as raised:
        read(data)
    assert raised.value.status == 431


def read(data: bytes) -> HttpRequest:
    """What the server reads from a client that sends `data` and then closes."""
    async def go() -> HttpRequest:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await read_request(reader, Exchange(), timeout_s=5)
    return asyncio.run(go())


def answer(head: bytes, response: HttpResponse) -> bytes:
    exchange = Exchange()
    assert exchange.receive(head) is not None
    return exchange.respond(response)


def test_http_listen_defaults_to_port_9644_and_the_environment_overrides_it() -> None:
    default = load_settings(environ={})
    from_env = load_settings(environ={"KILN_HTTP_LISTEN": "0.0.0.0:9100"})

    assert default.http_address == ("127.0.0.1", 9644)
    assert from_env.http_address == ("0.0.0.0", 9100)


def test_an_empty_http_listen_turns_the_endpoints_off() -> None:
    assert load_settings(overrides={"http_listen": ""}, environ={}).http_address is None


def test_a_bad_http_listen_is_named() -> None:
    with pytest.raises(SettingsError, match="http_listen"):
        load_settings(environ={"KILN_HTTP_LISTEN": "metrics"})
