"""One pipelined asyncio connection to one Kafka broker.

Requests are written in call order and many may be in flight; Kafka answers in request
order on a connection, and each answer is checked against the oldest outstanding
correlation id. Versions are negotiated once, by ApiVersions, at connect.

Every socket failure, timeout or early EOF becomes HardenedStoreUnavailable and fails the
whole connection: after a lost or late answer nothing later on the socket can be trusted
(the Java client does the same on a request timeout).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import struct
from dataclasses import dataclass

from kafka.protocol.metadata import ApiVersionsRequest

from storage.errors import HardenedStoreRejected, HardenedStoreUnavailable, error_for
from wire.apis import (
    UPSTREAM_APIS,
    ApiKey,
    ApiSpec,
    Message,
    decode_client_response,
    encode_client_request,
)
from wire.errors import ErrorCode

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
_MAX_RESPONSE_BYTES = 512 * 1024 * 1024
_API_VERSIONS_FIRST_TRY = 3  # flexible; every broker since Kafka 2.4 understands it
_CLOSED = "connection closed"
# What kafka-python raises on bytes it cannot decode.
_DECODE_ERRORS = (ValueError, IndexError, struct.error, UnicodeDecodeError, KeyError, TypeError)


@dataclass(frozen=True, slots=True)
class _Pending:
    correlation_id: int
    spec: ApiSpec
    version: int
    future: asyncio.Future[Message]
    deadline: asyncio.TimerHandle


class BrokerConnection:
    """Use `await BrokerConnection.open(host, port)`; then `request()` or `send()`."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        host: str,
        port: int,
        client_id: str,
        request_timeout: float,
    ) -> None:
        self.host = host
        self.port = port
        self._reader = reader
        self._writer = writer
        self._client_id = client_id
        self._request_timeout = request_timeout
        self._next_correlation_id = 0
        self._pending: collections.deque[_Pending] = collections.deque()
        self._failure: str | None = None
        self._versions: dict[int, int] = {}
        # The cluster-wide finalized features ApiVersions reported (v3+), by name: their max
        # version level. Empty from a broker that finalizes none (tansu).
        self.finalized_features: dict[str, int] = {}
        self._read_task = asyncio.get_running_loop().create_task(
            self._read_loop(), name=f"kiln-kafka-read-{host}:{port}"
        )

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        client_id: str = "kiln",
        connect_timeout: float = 10.0,
        request_timeout: float = 45.0,
    ) -> BrokerConnection:
        """Connect and negotiate versions; raises HardenedStoreUnavailable."""
        try:
            async with asyncio.timeout(connect_timeout):
                reader, writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError) as exc:
            raise HardenedStoreUnavailable(f"cannot connect to {host}:{port}: {exc!r}") from exc
        conn = cls(reader, writer, host, port, client_id, request_timeout)
        try:
            await conn._negotiate_versions()
        except BaseException:
            await conn.close()
            raise
        log.debug("connected to %s:%d, versions %s", host, port, conn._versions)
        return conn

    @property
    def closed(self) -> bool:
        return self._failure is not None

    def version(self, api_key: int) -> int:
        """The version negotiated for an API; HardenedStoreRejected if there is none."""
        try:
            return self._versions[api_key]
        except KeyError:
            raise HardenedStoreRejected(
                ErrorCode.UNSUPPORTED_VERSION,
                f"{self.host}:{self.port} shares no version of api {api_key} with Kiln",
            ) from None

    def send(self, api_key: int, body: Message, version: int | None = None
             ) -> asyncio.Future[Message]:
        """Write a request now (so requests leave in call order); the future gets the answer.

        A request that expects no answer (Produce with acks=0) gets a future already done
        with None. Call `drain()` before sending much more.
        """
        self._check_open()
        spec = UPSTREAM_APIS[api_key]
        if version is None:
            version = self.version(api_key)
        correlation_id = self._next_correlation_id
        self._next_correlation_id = (correlation_id + 1) & 0x7FFFFFFF
        frame = encode_client_request(spec, version, correlation_id, self._client_id, body)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Message] = loop.create_future()
        if not body.expect_response():
            future.set_result(None)
        else:
            deadline = loop.call_later(self._request_timeout, self._timed_out, correlation_id)
            self._pending.append(_Pending(correlation_id, spec, version, future, deadline))
        try:
            self._writer.write(frame)
        except (OSError, RuntimeError) as exc:
            raise self._fail(f"write failed: {exc!r}") from exc
        log.debug("sent api %d v%d correlation id %d to %s:%d (%d bytes)",
                  api_key, version, correlation_id, self.host, self.port, len(frame))
        return future

    async def drain(self) -> None:
        """Wait while the socket's write buffer is full."""
        self._check_open()
        try:
            await self._writer.drain()
        except (OSError, RuntimeError) as exc:
            raise self._fail(f"write failed: {exc!r}") from exc

    async def request(self, api_key: int, body: Message, version: int | None = None) -> Message:
        """Send a request and wait for its answer (other requests may be in flight)."""
        future = self.send(api_key, body, version)
        await self.drain()
        return await future

    async def close(self) -> None:
        self._fail(_CLOSED)
        self._read_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError, RuntimeError):
            await self._read_task
        with contextlib.suppress(OSError, RuntimeError):
            self._writer.close()
            await self._writer.wait_closed()

    async def _negotiate_versions(self) -> None:
        spec = UPSTREAM_APIS[ApiKey.API_VERSIONS]
        body = ApiVersionsRequest(client_software_name="kiln", client_software_version="0.1")
        try:
            response = await self.request(ApiKey.API_VERSIONS, body,
                                          min(_API_VERSIONS_FIRST_TRY, spec.max_version))
        except HardenedStoreRejected:
            response = None  # undecodable: an older broker answered in v0
        if response is None or response.error_code == ErrorCode.UNSUPPORTED_VERSION:
            response = await self.request(ApiKey.API_VERSIONS, ApiVersionsRequest(), 0)
        if response.error_code != 0:
            raise error_for(response.error_code, f"ApiVersions to {self.host}:{self.port}")
        self.finalized_features = {
            str(feature.name): int(feature.max_version_level)
            for feature in getattr(response, "finalized_features", None) or ()}
        for api in response.api_keys:
            ours = UPSTREAM_APIS.get(api.api_key)
            if ours is None:
                continue
            top = min(ours.max_version, api.max_version)
            if top >= max(ours.min_version, api.min_version):
                self._versions[api.api_key] = top

    async def _read_loop(self) -> None:
        try:
            while True:
                size_bytes = await self._reader.readexactly(4)
                size = _SIZE.unpack(size_bytes)[0]
                if not 4 <= size <= _MAX_RESPONSE_BYTES:
                    self._fail(f"response frame of {size} bytes")
                    return
                frame = await self._reader.readexactly(size)
                self._deliver(frame)
        except asyncio.IncompleteReadError:
            self._fail("connection closed by the broker")
        except OSError as exc:
            self._fail(f"read failed: {exc!r}")

    def _deliver(self, frame: bytes) -> None:
        if not self._pending:
            self._fail("answer to no request")
            return
        pending = self._pending[0]
        correlation_id = _SIZE.unpack_from(frame, 0)[0]
        if correlation_id != pending.correlation_id:
            self._fail(f"correlation id {correlation_id}, expected {pending.correlation_id}")
            return
        self._pending.popleft()
        pending.deadline.cancel()
        if pending.future.done():  # the caller gave up waiting (cancelled)
            return
        try:
            _, body = decode_client_response(pending.spec, pending.version, frame)
        except _DECODE_ERRORS as exc:
            pending.future.set_exception(HardenedStoreRejected(
                ErrorCode.CORRUPT_MESSAGE,
                f"cannot decode {pending.spec.api_key.name} v{pending.version} answer: {exc!r}",
            ))
            return
        pending.future.set_result(body)

    def _timed_out(self, correlation_id: int) -> None:
        self._fail(f"no answer to correlation id {correlation_id} in {self._request_timeout}s")

    def _check_open(self) -> None:
        if self._failure is not None:
            raise HardenedStoreUnavailable(f"{self.host}:{self.port}: {self._failure}")

    def _fail(self, reason: str) -> HardenedStoreUnavailable:
        """Fail the connection and everything in flight on it; returns an error to raise."""
        if self._failure is None:
            self._failure = reason
            if reason != _CLOSED:
                log.warning("connection to %s:%d failed: %s", self.host, self.port, reason)
            while self._pending:
                pending = self._pending.popleft()
                pending.deadline.cancel()
                if not pending.future.done():
                    pending.future.set_exception(
                        HardenedStoreUnavailable(f"{self.host}:{self.port}: {reason}")
                    )
            self._writer.close()
        return HardenedStoreUnavailable(f"{self.host}:{self.port}: {self._failure}")
