"""One client connection: frames in, responses out in request order.

Requests are processed one at a time in arrival order (as Kafka does: appends keep the
producer's order), but a response that must wait (an assured produce waiting for hardening)
is deferred so the next request goes ahead; responses are still written strictly in request
order, which is how Kafka clients match them.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time

from proxy.protocol import apis
from proxy.protocol.apis import ApiKey, UnsupportedRequest
from proxy.protocol.errors import MalformedRequest
from proxy.server.context import KilnContext
from proxy.server.dispatch import dispatch
from proxy.server.handlers import api_versions
from proxy.server.peer import CLIENT_HOST, client_host_of
from proxy.server.request_metrics import observe_request

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")


class Connection:
    def __init__(self, ctx: KilnContext, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self._ctx = ctx
        self._reader = reader
        self._writer = writer
        self._peer = writer.get_extra_info("peername")
        self._pending: asyncio.Queue[asyncio.Future[bytes | None]] = asyncio.Queue(
            ctx.settings.max_in_flight_per_connection
        )

    async def serve(self) -> None:
        self._ctx.counters.connections += 1
        self._ctx.metrics.connection_accepted()
        CLIENT_HOST.set(client_host_of(self._peer))
        sender = asyncio.create_task(self._send_in_order())
        try:
            await self._read_loop()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            # The peer is gone or the connection is being closed: answers still waiting
            # (assured produces) have nobody to go to; their records stay appended.
            sender.cancel()
            while not self._pending.empty():
                self._pending.get_nowait().cancel()
            await asyncio.gather(sender, return_exceptions=True)
            self._ctx.counters.connections -= 1
            self._writer.close()

    async def _read_loop(self) -> None:
        max_frame = self._ctx.settings.max_frame_bytes
        while True:
            (size,) = _SIZE.unpack(await self._reader.readexactly(4))
            if size < 4 or size > max_frame:
                self._ctx.counters.malformed_frames += 1
                log.warning("closing %s: frame size %d outside 4..%d", self._peer, size, max_frame)
                return
            frame = await self._reader.readexactly(size)
            try:
                request = apis.decode_request(frame)
            except UnsupportedRequest as exc:
                if not await self._answer_unsupported(exc):
                    return
                continue
            except MalformedRequest as exc:
                self._ctx.counters.malformed_frames += 1
                log.warning("closing %s: malformed request (correlation_id=%s): %s",
                            self._peer, exc.correlation_id, exc)
                return
            started = time.perf_counter()
            answer = await dispatch(self._ctx, request)
            observe_request(self._ctx.metrics, request, answer, started)
            await self._pending.put(answer)

    async def _answer_unsupported(self, exc: UnsupportedRequest) -> bool:
        """ApiVersions at an unknown version is answered (v0, error 35, our ranges) so the
        client can retry lower; anything else unsupported closes the connection, as Kafka."""
        header = exc.header
        if header.request_api_key == ApiKey.API_VERSIONS:
            fut: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
            fut.set_result(api_versions.unsupported_version_frame(header.correlation_id))
            await self._pending.put(fut)
            return True
        self._ctx.counters.malformed_frames += 1
        log.warning("closing %s: unsupported api %d v%d (client %s)", self._peer,
                    header.request_api_key, header.request_api_version, header.client_id)
        return False

    async def _send_in_order(self) -> None:
        while True:
            frame = await (await self._pending.get())
            if frame is None:
                continue
            self._writer.write(frame)
            if self._pending.empty():
                try:
                    await self._writer.drain()
                except ConnectionError:
                    return

