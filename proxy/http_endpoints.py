"""Operators' HTTP endpoints, in Kiln's event loop: /metrics (Prometheus), /healthz (the
process runs and its loop answers), /readyz (Redis and Kafka answer).

One request per connection (`Connection: close`), GET and HEAD only, no request bodies.
h11 parses the request head and frames the answer; Kiln's asyncio edge adds what h11 leaves
to its user, so that whatever a client sends or fails to send (garbage, an endless head,
nothing at all) costs it its connection, never Kiln anything else: the head must arrive
within `read_timeout_s` (408) and fit in 16 KiB (431), answers that cannot be written within
`write_timeout_s` are dropped, and at most `max_connections` are served at once. Kiln also
skips blank lines before the request line (RFC 9112 2.2) and refuses what h11 lets through:
versions other than 1.0 and 1.1, targets that are not paths.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from dataclasses import dataclass
from http import HTTPStatus

import h11
from prometheus_client import CONTENT_TYPE_LATEST

from storage.observability.metrics import KilnMetrics
from storage.observability.readiness import Readiness

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024
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
    content_type: str = "application/json"
    allow: str | None = None

    @classmethod
    def json(cls, status: int, document: object) -> HttpResponse:
        return cls(status, json.dumps(document).encode() + b"\n")


class Exchange:
    """One connection's request and answer, I/O-free: bytes in, request out; answer in,
    bytes out."""

    def __init__(self) -> None:
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.received = 0
        self._method = b"GET"

    def receive(self, data: bytes) -> HttpRequest | None:
        """The request once its head is complete, None until then; b"" (the client closed)
        raises ConnectionError, a head h11 or Kiln refuses BadRequest."""
        if not data:
            raise ConnectionError("client closed before the end of the request head")
        if not self.received and not (data := data.lstrip(b"\r\n")):
            return None
        self.received += len(data)
        self._h11.receive_data(data)
        try:
            event = self._h11.next_event()
        except h11.RemoteProtocolError as exc:
            # h11 quotes the offending input in its message: only the start of it is told.
            raise BadRequest(exc.error_status_hint, str(exc)[:200]) from None
        if not isinstance(event, h11.Request):
            return None  # NEED_DATA (h11 never saw an end of input: nothing else can come)
        self._method = event.method  # h11 frames the answer by it: no body for HEAD
        if event.http_version not in (b"1.0", b"1.1") or not event.target.startswith(b"/"):
            raise BadRequest(400, "not an HTTP/1.0 or HTTP/1.1 request for a path")
        return HttpRequest(event.method.decode(), event.target.decode().split("?", 1)[0])

    def respond(self, response: HttpResponse) -> bytes:
        headers = [("Content-Type", response.content_type),
                   ("Content-Length", str(len(response.body))),
                   ("Cache-Control", "no-store"), ("Connection", "close"),
                   *([("Allow", response.allow)] if response.allow is not None else [])]
        head = self._h11.send(h11.Response(status_code=response.status, headers=headers,
                                           reason=HTTPStatus(response.status).phrase))
        body = self._h11.send(h11.Data(data=response.body)) if self._method != b"HEAD" else b""
        return head + body + self._h11.send(h11.EndOfMessage())


async def read_request(reader: asyncio.StreamReader, exchange: Exchange,
                       timeout_s: float) -> HttpRequest:
    """The request whose head arrives within timeout_s, else BadRequest(408)."""
    try:
        async with asyncio.timeout(timeout_s):
            # h11 refuses a head over its limit only while the head is incomplete: never
            # give it more than one byte over.
            while (request := exchange.receive(
                    await reader.read(MAX_HEAD_BYTES + 1 - exchange.received))) is None:
                pass
            return request
    except TimeoutError:
        raise BadRequest(408, "request head not received in time") from None


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
        self._server = await asyncio.start_server(self._accept, self._host, self._port)
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
        exchange = Exchange()
        try:
            response = await self._route(
                await read_request(reader, exchange, self._read_timeout_s))
        except BadRequest as exc:
            response = HttpResponse.json(exc.status, {"error": str(exc)})
        except ConnectionError:
            return
        except Exception:
            # The one place an unexpected failure of an endpoint becomes an answer (500),
            # logged once with its traceback: a broken collector must not take Kiln down.
            log.exception("HTTP endpoint failed")
            response = HttpResponse.json(500, {"error": "internal error, see Kiln's log"})
        writer.write(exchange.respond(response))
        try:
            async with asyncio.timeout(self._write_timeout_s):
                await writer.drain()
        except TimeoutError:
            writer.transport.abort()  # a client that does not read: drop what is buffered
        except ConnectionError:
            pass

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
