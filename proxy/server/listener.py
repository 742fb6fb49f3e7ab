"""The TCP listener: accepts Kafka clients and hands each to a Connection."""

from __future__ import annotations

import asyncio
import logging

from proxy.server.connection import Connection
from proxy.server.context import KilnContext

log = logging.getLogger(__name__)


class Listener:
    def __init__(self, ctx: KilnContext, host: str, port: int) -> None:
        self._ctx = ctx
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        """The bound port (useful when listening on port 0)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self._host, self._port,
                                                  limit=2**20)
        log.info("Kiln listening on %s:%d", self._host, self.port)

    async def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        await self.stop_accepting()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await Connection(self._ctx, reader, writer).serve()
        except asyncio.CancelledError:
            pass  # Kiln is closing; this task ends here (asyncio would log the cancel)
        finally:
            self._connections.discard(task)
