"""One client connection: frames in, responses out in request order.

Requests are processed one at a time in arrival order (as Kafka does: appends keep the
producer's order), but a response that must wait (an assured produce waiting for hardening)
is deferred so the next request goes ahead; responses are still written strictly in request
order, which is how Kafka clients match them.

Memory (`proxy/limits.py`): the next request is read only when fewer than
`max_in_flight_per_connection` answers are owed and the bytes of answers computed but not
yet taken by the client are under the connection's bound (and, if it owes any, under the
listener's); a client that does not read its answers stops being read. A request's bytes
count against the listener's request budget from its size prefix until it is handled.

Planned shutdown (`stop_reading`) ends the reading side only: the request being handled
finishes, no further one is read, and the answers already owed are still written (an
assured produce's after the final flush has hardened its records) before the connection
closes. Nothing is appended after the final flush has fixed what it hardens.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time

from proxy.authentication import SaslGate, SaslSettings, Verdict
from proxy.context import KilnContext
from proxy.dispatch import dispatch
from proxy.handlers import api_versions
from proxy.peer import CLIENT_HOST, LISTENER_NAME, client_host_of
from proxy.request_metrics import observe_request
from wire import apis
from wire.apis import ApiKey, UnsupportedRequest
from wire.errors import MalformedRequest
from wire.header import peek_api

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")


class Connection:
    def __init__(self, ctx: KilnContext, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, listener_name: str = "",
                 sasl: SaslSettings | None = None) -> None:
        self._ctx = ctx
        self._listener_name = listener_name
        # A SASL listener's connection serves nothing but its authentication until it is
        # authenticated (proxy/authentication.py).
        self._gate = SaslGate(sasl) if sasl is not None else None
        self._reader = reader
        self._writer = writer
        self._memory = ctx.memory
        self._peer = writer.get_extra_info("peername")
        self._pending: asyncio.Queue[asyncio.Future[bytes | None]] = asyncio.Queue()
        self._room = asyncio.Semaphore(ctx.settings.max_in_flight_per_connection)
        self._owed_bytes = 0  # answers computed, not yet written out (in `memory.answers`)
        self._reading: asyncio.Task[None] | None = None
        self._handling = False  # a request is being handled (decoded, dispatched, queued)
        self._stopping = False
        self._closed = False

    async def serve(self) -> None:
        self._ctx.metrics.connection_opened()
        CLIENT_HOST.set(client_host_of(self._peer))
        LISTENER_NAME.set(self._listener_name)
        sender = asyncio.create_task(self._send_in_order())
        reading = self._reading = asyncio.create_task(self._read_loop())
        deadline = (asyncio.create_task(self._authenticated_in_time())
                    if self._gate is not None else None)
        try:
            # Whichever ends first: the reading (the peer closed, a limit, shutdown) or the
            # sending (the peer stopped taking answers for `idle_timeout_s`).
            await asyncio.wait({reading, sender}, return_when=asyncio.FIRST_COMPLETED)
            if reading.done() and not reading.cancelled():
                reading.result()  # what ended the read loop (the peer closing) goes on up
            if self._stopping and not sender.done():
                await self._owed_answers_sent(sender)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            # The peer is gone or the connection is being closed: answers still waiting
            # (assured produces) have nobody to go to; their records stay appended.
            reading.cancel()
            sender.cancel()
            if deadline is not None:
                deadline.cancel()
            while not self._pending.empty():
                self._pending.get_nowait().cancel()
            await asyncio.gather(reading, sender, return_exceptions=True)
            self._closed = True
            self._memory.answers.release(self._owed_bytes)
            self._owed_bytes = 0
            self._ctx.metrics.connection_closed()
            self._writer.close()

    def stop_reading(self) -> None:
        """Read no further request; the one being handled finishes (`reading_stopped`)."""
        self._stopping = True
        if not self._handling and self._reading is not None:
            self._reading.cancel()

    def cancel_reading(self) -> None:
        """Stop handling the current request too (it is not answered)."""
        self._stopping = True
        if self._reading is not None:
            self._reading.cancel()

    @property
    def reading_stopped(self) -> bool:
        return self._reading is not None and self._reading.done()

    async def _owed_answers_sent(self, sender: asyncio.Task[None]) -> None:
        all_written = asyncio.create_task(self._pending.join())
        try:
            await asyncio.wait({all_written, sender}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            all_written.cancel()
        if not sender.done():
            await self._writer.drain()

    async def _authenticated_in_time(self) -> None:
        assert self._gate is not None
        await asyncio.sleep(self._gate.settings.authentication_timeout_s)
        if not self._gate.authenticated:
            log.warning("closing %s: not authenticated within %.0fs", self._peer,
                        self._gate.settings.authentication_timeout_s)
            self.cancel_reading()

    def _max_frame(self) -> int:
        if self._gate is not None and not self._gate.authenticated:
            return self._gate.settings.max_preauth_frame_bytes
        return self._ctx.settings.max_frame_bytes

    async def _read_loop(self) -> None:
        requests = self._memory.requests
        while not self._stopping:
            await self._room.acquire()
            await self._answers_taken()
            size = await self._next_frame_size()
            if size is None:
                return
            max_frame = self._max_frame()
            if size < 4 or size > max_frame:
                self._ctx.metrics.malformed_frame()
                log.warning("closing %s: frame size %d outside 4..%d", self._peer, size, max_frame)
                return
            await requests.acquire(size)
            try:
                frame = await self._frame_body(size)
                if frame is None:
                    return
                self._handling = True
                if not await self._handle(frame):
                    return
            finally:
                self._handling = False
                requests.release(size)

    async def _answers_taken(self) -> None:
        """Wait while this connection owes too many answer bytes, or owes some while all
        connections together do."""
        answers = self._memory.answers
        per_connection = self._memory.limits.max_answer_bytes_per_connection
        while self._owed_bytes >= per_connection or (self._owed_bytes and answers.over_limit):
            await answers.released()

    async def _next_frame_size(self) -> int | None:
        """The next frame's size prefix; None when the client sent none for the idle timeout
        while owing it no answer."""
        idle_s = self._memory.limits.idle_timeout_s
        while True:
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow the
                # cancellation that closes the connection, and the read loop then waits on.
                async with asyncio.timeout(idle_s):
                    (size,) = _SIZE.unpack(await self._reader.readexactly(4))
                return int(size)
            except TimeoutError:
                if self._pending.empty():
                    log.info("closing %s: no request for %.0fs", self._peer, idle_s)
                    return None

    async def _frame_body(self, size: int) -> bytes | None:
        timeout_s = self._memory.limits.frame_read_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                return await self._reader.readexactly(size)
        except TimeoutError:
            self._ctx.metrics.malformed_frame()
            log.warning("closing %s: a %d-byte frame did not arrive within %.0fs",
                        self._peer, size, timeout_s)
            return None

    async def _handle(self, frame: bytes) -> bool:
        """Answer one request frame (the answer is queued); False to close the connection."""
        gate = self._gate
        if gate is not None and not gate.authenticated:
            return await self._authenticate(gate, frame)
        return await self._serve(frame)

    async def _serve(self, frame: bytes) -> bool:
        try:
            request = apis.decode_request(frame)
        except UnsupportedRequest as exc:
            return self._answer_unsupported(exc)
        except MalformedRequest as exc:
            self._ctx.metrics.malformed_frame()
            log.warning("closing %s: malformed request (correlation_id=%s): %s",
                        self._peer, exc.correlation_id, exc)
            return False
        started = time.perf_counter()
        answer = await dispatch(self._ctx, request)
        observe_request(self._ctx.metrics, request, answer, started)
        self._owe(answer)
        return True

    async def _authenticate(self, gate: SaslGate, frame: bytes) -> bool:
        """A request before authentication: ApiVersions as ever, the SASL exchange by the
        gate; anything else closes the connection unanswered, its body never decoded."""
        try:
            api_key, _ = peek_api(frame)
        except MalformedRequest:
            api_key = -1
        if not gate.admits(api_key):
            self._ctx.metrics.malformed_frame()
            log.warning("closing %s: api %d before authentication", self._peer, api_key)
            return False
        if api_key == ApiKey.API_VERSIONS:
            return await self._serve(frame)
        try:
            request = apis.decode_request(frame)
        except (UnsupportedRequest, MalformedRequest) as exc:
            self._ctx.metrics.malformed_frame()
            log.warning("closing %s: SASL request not read: %s", self._peer, exc)
            return False
        body, verdict = await gate.handle(request, self._peer)
        answer: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        self._owe(answer)
        answer.set_result(apis.encode_response(request, body))
        if verdict is Verdict.FAILED:
            # As Kafka: the answer goes, then the connection closes after a delay, which
            # also slows a client guessing passwords down.
            await asyncio.sleep(gate.settings.failed_delay_s)
            self._stopping = True
            return False
        return True

    def _owe(self, answer: asyncio.Future[bytes | None]) -> None:
        """Queue an answer; its bytes count as owed from when it is computed."""
        answer.add_done_callback(self._answer_computed)
        self._pending.put_nowait(answer)

    def _answer_computed(self, answer: asyncio.Future[bytes | None]) -> None:
        if self._closed or answer.cancelled() or answer.exception() is not None:
            return
        frame = answer.result()
        if frame:
            self._owed_bytes += len(frame)
            self._memory.answers.charge(len(frame))

    def _answer_unsupported(self, exc: UnsupportedRequest) -> bool:
        """ApiVersions at an unknown version is answered (v0, error 35, our ranges) so the
        client can retry lower; anything else unsupported closes the connection, as Kafka."""
        header = exc.header
        if header.request_api_key == ApiKey.API_VERSIONS:
            fut: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
            self._owe(fut)
            fut.set_result(api_versions.unsupported_version_frame(header.correlation_id))
            return True
        self._ctx.metrics.malformed_frame()
        log.warning("closing %s: unsupported api %d v%d (client %s)", self._peer,
                    header.request_api_key, header.request_api_version, header.client_id)
        return False

    async def _send_in_order(self) -> None:
        """Write answers in request order; return when the client takes none for the idle
        timeout (the connection then closes) or is gone."""
        idle_s = self._memory.limits.idle_timeout_s
        while True:
            answer = await self._pending.get()
            try:
                frame = await answer
            finally:
                self._pending.task_done()  # written below with no await between
            if frame:
                self._writer.write(frame)
                try:
                    # At once below the transport's high-water mark; a client that does not
                    # read holds the sender here, and with it the room for more requests.
                    async with asyncio.timeout(idle_s):
                        await self._writer.drain()
                except TimeoutError:
                    log.warning("closing %s: the client took no answer for %.0fs",
                                self._peer, idle_s)
                    return
                except ConnectionError:
                    return
                self._owed_bytes -= len(frame)
                self._memory.answers.release(len(frame))
            self._room.release()
