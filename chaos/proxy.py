"""A TCP proxy in front of Redis that can slow every request down, or cut its clients off.

Each client connection gets its own upstream connection and two pump threads. While
`delay` is above zero, every chunk from a client waits that long before it is forwarded,
so every command's round trip grows by it (the slow-Redis fault). While the proxy is `cut`,
nothing is forwarded either way and nothing is closed: what was sent waits, as it waits in
the kernels' buffers and retransmissions when a network partition drops every packet, and
is delivered late when the proxy is mended (the partition fault). An upstream that is down
closes the client's connection, as a dead Redis would.
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
        self._flowing = threading.Event()  # clear while cut: the pumps hold what they read
        self._flowing.set()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> DelayProxy:
        """Accept connections on a daemon thread."""
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()
        return self

    def cut(self) -> None:
        """Stop forwarding both ways, closing nothing: the clients stall as in a partition."""
        self._flowing.clear()

    def mend(self) -> None:
        """Forward again, what was held first: late, as a healed partition delivers it."""
        self._flowing.set()

    @property
    def is_cut(self) -> bool:
        """Whether the proxy forwards nothing now."""
        return not self._flowing.is_set()

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self._closed.set()
        self._flowing.set()  # a pump held by a cut ends with its sockets
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
                self._flowing.wait()
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
