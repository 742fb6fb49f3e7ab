"""The Kafka listener: accepts Kafka clients (over TLS for an SSL listener) and hands each to
a Connection.

An SSL listener finishes the TLS handshake before a connection is counted against the
connection limits; a handshake not done within its timeout is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import ssl

from proxy.authentication import SaslSettings
from proxy.connection import Connection
from proxy.context import KilnContext
from proxy.limits import ConnectionSlots

log = logging.getLogger(__name__)


class Listener:
    def __init__(self, ctx: KilnContext, host: str, port: int, *, name: str = "",
                 tls: ssl.SSLContext | None = None, tls_handshake_timeout_s: float = 10.0,
                 slots: ConnectionSlots | None = None, sasl: SaslSettings | None = None
                 ) -> None:
        self._ctx = ctx
        self._host = host
        self._port = port
        self.name = name  # as in `listeners`: clients are given brokers on this listener
        self._tls = tls
        self._sasl = sasl  # SASL_PLAINTEXT and SASL_SSL: every connection authenticates
        self._tls_handshake_timeout_s = tls_handshake_timeout_s
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], Connection] = {}
        # Shared by every listener of the process: the limits are the process's.
        self._slots = slots if slots is not None else ConnectionSlots(ctx.memory.limits)
        self.refused_connections = 0
        # False from stop_accepting on: a connection the server accepted but whose task had
        # not started yet is closed at once, rather than served after shutdown began (it
        # would append after the final flush, or keep close() waiting for it).
        self._accepting = True

    @property
    def port(self) -> int:
        """The bound port (useful when listening on port 0)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, self._host, self._port, limit=2**20, ssl=self._tls,
            ssl_handshake_timeout=None if self._tls is None else self._tls_handshake_timeout_s)
        protocol = ("SASL_" if self._sasl is not None else "") + (
            "PLAINTEXT" if self._tls is None else "SSL")
        log.info("Kiln listening on %s://%s:%d (%s)", self.name or "PLAINTEXT", self._host,
                 self.port, protocol)

    async def stop_accepting(self) -> None:
        self._accepting = False
        if self._server is not None:
            self._server.close()

    async def stop_reading(self, timeout_s: float) -> int:
        """Planned shutdown, before the final flush: every open connection reads no further
        request, and the requests being handled finish (up to `timeout_s`; those still
        running then are cancelled, unanswered). Returns how many connections there were."""
        connections = list(self._connections.values())
        for connection in connections:
            connection.stop_reading()
        deadline = asyncio.get_running_loop().time() + timeout_s
        while any(not c.reading_stopped for c in connections):
            if asyncio.get_running_loop().time() >= deadline:
                late = [c for c in connections if not c.reading_stopped]
                log.warning("%d requests still running after %.0fs of shutdown: cancelled",
                            len(late), timeout_s)
                for connection in late:
                    connection.cancel_reading()
                break
            await asyncio.sleep(0.01)
        return len(connections)

    async def answers_sent(self, timeout_s: float) -> bool:
        """Planned shutdown, after the final flush: wait for the connections to write the
        answers they owe and close. True when all did within `timeout_s`."""
        if not self._connections:
            return True
        _, late = await asyncio.wait(list(self._connections), timeout=timeout_s)
        return not late

    async def close(self) -> None:
        await self.stop_accepting()
        while self._connections:
            # Cancelled again until they end: a cancellation that arrives as a read
            # completes can be lost on the way down.
            for task in list(self._connections):
                task.cancel()
            await asyncio.wait(list(self._connections), timeout=1.0)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not self._accepting:
            writer.close()
            return
        refused = self._slots.take(host)
        if refused is not None:
            # As Kafka past max.connections(.per.ip): closed before a byte is read.
            self.refused_connections += 1
            if self.refused_connections & (self.refused_connections - 1) == 0:
                log.warning("refusing a connection from %s: %s (%d refused so far)", host,
                            refused, self.refused_connections)
            writer.close()
            return
        connection = self._connections[task] = Connection(self._ctx, reader, writer,
                                                          self.name, self._sasl)
        try:
            await connection.serve()
        except asyncio.CancelledError:
            pass  # Kiln is closing; this task ends here (asyncio would log the cancel)
        finally:
            self._connections.pop(task, None)
            self._slots.give_back(host)
