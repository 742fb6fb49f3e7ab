"""Operators' HTTP endpoints, in Kiln's event loop: /metrics (Prometheus), /healthz (the
process runs and its loop answers), /readyz (Redis and Kafka answer).

A deliberately small HTTP/1.x server: one request per connection (`Connection: close`),
GET and HEAD only, no request bodies. Whatever a client sends or fails to send (garbage,
an endless head, nothing at all) costs it its connection, never Kiln anything else: the
head must arrive within `read_timeout_s` and fit in 16 KiB, answers that cannot be written
within `write_timeout_s` are dropped, and at most `max_connections` are served at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST

from storage.observability.metrics import KilnMetrics
from storage.observability.readiness import Readiness

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(r"HTTP/1\.[01]")
_JSON = "application/json"
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}
_PATHS = ("/metrics", "/healthz", "/readyz")


class BadRequest(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    path: str  # without the query string


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    body: bytes
    content_type: str = _JSON
    allow: str | None = None

    @classmethod
    def json(cls, status: int, document: object) -> HttpResponse:
        return cls(status, json.dumps(document).encode() + b"\n")


def parse_request_head(head: bytes) -> HttpRequest:
    """The method and path of a request head (request line, headers, blank line); raises
    BadRequest(400) for anything that is not an HTTP/1.0 or 1.1 origin-form request line."""
    # RFC 9112 2.2: a server should ignore blank lines received before the request line.
    request_line = head.decode("latin-1").lstrip("\r\n").split("\n", 1)[0].removesuffix("\r")
    parts = request_line.split(" ")
    if len(parts) != 3:
        raise BadRequest(400, "malformed request line")
    method, target, version = parts
    if not _TOKEN.fullmatch(method):
        raise BadRequest(400, "malformed method")
    if not _VERSION.fullmatch(version):
        raise BadRequest(400, "not HTTP/1.0 or HTTP/1.1")
    if not target.startswith("/"):
        raise BadRequest(400, "request target must be a path")
    return HttpRequest(method, target.split("?", 1)[0])


def encode_response(response: HttpResponse, *, with_body: bool = True) -> bytes:
    lines = [f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Unknown')}",
             f"Content-Type: {response.content_type}",
             f"Content-Length: {len(response.body)}",
             "Cache-Control: no-store",
             "Connection: close"]
    if response.allow is not None:
        lines.append(f"Allow: {response.allow}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + response.body if with_body else head


async def read_head(reader: asyncio.StreamReader) -> bytes:
    """Lines up to and including the blank one; ConnectionError when the client stops
    sending first, BadRequest(431) past MAX_HEAD_BYTES."""
    head = bytearray()
    while len(head) <= MAX_HEAD_BYTES:
        try:
            line = await reader.readline()
        except ValueError:  # one line longer than the reader's limit
            raise BadRequest(431, "request head too large") from None
        if not line.endswith(b"\n"):
            raise ConnectionError("client closed before the end of the request head")
        head += line
        if line in (b"\r\n", b"\n") and head.strip():
            return bytes(head)
    raise BadRequest(431, "request head too large")


class HttpEndpoints:
    def __init__(self, metrics: KilnMetrics, readiness: Readiness, host: str, port: int, *,
                 read_timeout_s: float = 5.0, write_timeout_s: float = 10.0,
                 max_connections: int = 64, lag_interval_s: float = 1.0) -> None:
        self._metrics = metrics
        self._readiness = readiness
        self._host = host
        self._port = port
        self._read_timeout_s = read_timeout_s
        self._write_timeout_s = write_timeout_s
        self._max_connections = max_connections
        self._lag_interval_s = lag_interval_s
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._lag_task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        """The bound port (useful when listening on port 0)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self._host, self._port,
                                                  limit=MAX_HEAD_BYTES)
        self._lag_task = asyncio.create_task(self._watch_loop(), name="kiln-loop-lag")
        log.info("metrics and health on http://%s:%d (/metrics, /healthz, /readyz)",
                 self._host, self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [*self._connections, *([self._lag_task] if self._lag_task else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _watch_loop(self) -> None:
        """How late the loop runs a timer: a blocked loop shows here (and /healthz, answered
        from the same loop, stops answering)."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self._lag_interval_s
            await asyncio.sleep(self._lag_interval_s)
            self._metrics.event_loop_lag.set(max(0.0, loop.time() - due))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= self._max_connections:
            writer.transport.abort()
            return
        self._connections.add(task)
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            pass  # Kiln is closing
        finally:
            self._connections.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        method = "GET"
        try:
            request = parse_request_head(await self._read_head(reader))
            method = request.method
            response = await self._route(request)
        except BadRequest as exc:
            response = HttpResponse.json(exc.status, {"error": str(exc)})
        except ConnectionError:
            return
        except Exception:
            # The one place an unexpected failure of an endpoint becomes an answer (500),
            # logged once with its traceback: a broken collector must not take Kiln down.
            log.exception("HTTP endpoint failed")
            response = HttpResponse.json(500, {"error": "internal error, see Kiln's log"})
        writer.write(encode_response(response, with_body=method != "HEAD"))
        try:
            async with asyncio.timeout(self._write_timeout_s):
                await writer.drain()
        except TimeoutError:
            writer.transport.abort()  # a client that does not read: drop what is buffered
        except ConnectionError:
            pass

    async def _read_head(self, reader: asyncio.StreamReader) -> bytes:
        try:
            async with asyncio.timeout(self._read_timeout_s):
                return await read_head(reader)
        except TimeoutError:
            raise BadRequest(408, "request head not received in time") from None

    async def _route(self, request: HttpRequest) -> HttpResponse:
        if request.path not in _PATHS:
            return HttpResponse.json(404, {"error": f"no such path: {request.path}",
                                           "paths": list(_PATHS)})
        if request.method not in ("GET", "HEAD"):
            return dataclasses.replace(HttpResponse.json(405, {"error": "only GET and HEAD"}),
                                       allow="GET, HEAD")
        if request.path == "/metrics":
            return HttpResponse(200, await self._metrics.render(), CONTENT_TYPE_LATEST)
        if request.path == "/healthz":
            return HttpResponse.json(200, {"status": "ok"})
        report = await self._readiness.report()
        checks = {name: report.failures.get(name, "ok") for name in self._readiness.names}
        if report.ready:
            return HttpResponse.json(200, {"status": "ready", "checks": checks})
        return HttpResponse.json(503, {"status": "not ready", "failed": sorted(report.failures),
                                       "checks": checks})
