"""A TCP proxy on 127.0.0.1 that a test controls: cut every connection, or swallow the server's answers.

Put between a client and a real broker, it plays the broker's side of a failure: ``drop()`` closes
every proxied connection at once (what ``rabbitmqctl close_all_connections`` does, for this test's
connections only), and ``swallow(True)`` keeps forwarding the client's bytes to the server but
throws the server's away (a broker that took a message and never confirmed it, as seen by the
client). New connections are accepted throughout, so a client that reconnects gets through.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1", server_delay: float = 0.0) -> None:
        """``server_delay``: seconds each chunk of the server's answer is held (a slow broker)."""
        self.target = (target_host, target_port)
        self.server_delay = server_delay
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)  # closing a socket does not wake accept(): poll a stop flag
        self.port: int = self.listener.getsockname()[1]
        self.connections = 0
        self._swallow = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> TcpProxy:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self.connections += 1
                self._sockets += [client, server]
            for source, sink, from_server in ((client, server, False), (server, client, True)):
                thread = threading.Thread(target=self._pump, args=(source, sink, from_server), daemon=True)
                thread.start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_server: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if from_server and self.server_delay:
                    time.sleep(self.server_delay)
                if from_server and self._swallow.is_set():
                    continue
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def swallow(self, on: bool) -> None:
        """Drop (``True``) or forward again the server's bytes on every connection."""
        if on:
            self._swallow.set()
        else:
            self._swallow.clear()

    def drop(self) -> None:
        """Close every proxied connection now, both sides."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self.listener.close()
        self.drop()
