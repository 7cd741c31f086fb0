"""A TCP proxy in front of Redis that can slow every request down (the slow-Redis fault).

Each client connection gets its own upstream connection and two pump threads. While
`delay` is above zero, every chunk from a client waits that long before it is forwarded,
so every command's round trip grows by it. An upstream that is down closes the client's
connection, as a dead Redis would.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

CHUNK = 65_536


class DelayProxy:
    """Listens on 127.0.0.1:`port` (free when 0) and forwards to `upstream_port`."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.delay = 0.0  # seconds added to every client → Redis chunk
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> DelayProxy:
        """Accept connections on a daemon thread."""
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()
        return self

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=2)
                upstream.settimeout(None)
            except OSError:
                client.close()  # Redis is down: the client sees its connection refused
                continue
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, slowed: bool) -> None:
        try:
            while data := source.recv(CHUNK):
                if slowed and self.delay > 0:
                    time.sleep(self.delay)
                target.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
            with self._lock:
                self._sockets = [s for s in self._sockets if s not in (source, target)]
