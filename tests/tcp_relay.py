"""A TCP relay on 127.0.0.1 that a test can cut and restore, to take a service away from Kiln
without losing its data (tansu's memory storage loses everything when it stops).

`stop()` closes the listening socket and every relayed connection, so new connections are
refused at once; `start()` listens again on the same port. `hold()` keeps the connections
open but forwards nothing towards the service until `release()`: requests a client sent are
held in hand, as a paused process holds them, and land late."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Self

from cli.local_services import LocalTansu


class TcpRelay:
    def __init__(self, target_port: int, port: int, target_host: str = "127.0.0.1") -> None:
        self.port = port
        self._target = (target_host, target_port)
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self._bytes_per_s: float | None = None

    def start(self) -> Self:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def stop(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, set()
        for sock in [s for s in (listener,) if s is not None] + list(sockets):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def throttle(self, bytes_per_s: float | None) -> None:
        """Forward at most this many bytes a second towards the service (None: no limit)."""
        self._bytes_per_s = bytes_per_s

    def hold(self) -> None:
        """Forward nothing more towards the service (answers still come back)."""
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._sockets.update((client, upstream))
            for source, sink, gated in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(source, sink, gated),
                                 daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, gated: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if gated:
                    self._flowing.wait()
                    if self._bytes_per_s:
                        time.sleep(len(chunk) / self._bytes_per_s)
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._sockets.discard(source)
            source.close()  # each socket is the source of exactly one pump


class RelayedTansu(LocalTansu):
    """A tansu broker that tells clients to reach it through a relay."""

    def __init__(self, port: int, advertised_port: int) -> None:
        super().__init__(port)
        self._advertised_port = advertised_port

    def _command(self, port: int, workdir: Path) -> list[str]:
        command = super()._command(port, workdir)
        at = command.index("--advertised-listener-url") + 1
        command[at] = f"tcp://127.0.0.1:{self._advertised_port}"
        return command

    def _probe(self, port: int) -> None:
        super()._probe(self._advertised_port)  # through the relay, which must be running
