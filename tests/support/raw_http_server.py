"""A TCP server on 127.0.0.1 that answers HTTP requests with scripted bytes, on threads.

For the answers a well-behaved server never gives (malformed, dripped, endless headers, closed early),
and to count connections. ``handler(conn, server)`` runs once per connection, on its own thread;
``server.read_request(conn)`` reads one request (``None`` when the client closed).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

OK = b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{"id":"a1"}'

Handler = Callable[[socket.socket, "RawServer"], None]


class RawServer:
    """Accept connections on 127.0.0.1 and run ``handler`` on each; counts connections and requests."""

    def __init__(self, handler: Handler, host: str = "127.0.0.1") -> None:
        self.handler = handler
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(128)
        self.host = host
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.connections = 0
        self.open_now = 0
        self.most_open = 0
        self.requests: list[bytes] = []
        self.stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/hook"

    def __enter__(self) -> RawServer:
        self._accepter.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.stopped.set()
        with contextlib.suppress(OSError):
            self.sock.close()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                self.open_now += 1
                self.most_open = max(self.most_open, self.open_now)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                self.handler(conn, self)
        except OSError:
            pass  # the client went away: expected of a client that gives up
        finally:
            with self.lock:
                self.open_now -= 1

    def read_request(self, conn: socket.socket) -> bytes | None:
        """One request (head and Content-Length body); None if the client closed first."""
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(rest) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            rest += chunk
        request = head + b"\r\n\r\n" + rest
        with self.lock:
            self.requests.append(request)
        return request


def keep_alive(answer: bytes = OK, delay: float = 0.0) -> Handler:
    """Answer every request on the connection with ``answer`` (after ``delay`` seconds)."""

    def handler(conn: socket.socket, server: RawServer) -> None:
        while server.read_request(conn) is not None:
            if delay:
                server.stopped.wait(delay)
            conn.sendall(answer)

    return handler


def one_answer_then_close(answer: bytes = OK) -> Handler:
    def handler(conn: socket.socket, server: RawServer) -> None:
        if server.read_request(conn) is not None:
            conn.sendall(answer)

    return handler


def endless(head: bytes, chunk: bytes, total: int) -> Handler:
    """Answer with ``head`` then ``chunk`` repeated up to ``total`` bytes (a flood of headers)."""

    def handler(conn: socket.socket, server: RawServer) -> None:
        if server.read_request(conn) is None:
            return
        conn.sendall(head)
        sent = 0
        while sent < total and not server.stopped.is_set():
            conn.sendall(chunk)
            sent += len(chunk)
        conn.sendall(b"\r\n\r\n")

    return handler


def chunks(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def drip(answer: bytes, per_second: float) -> Handler:
    """Answer one byte at a time, ``per_second`` bytes a second."""

    def handler(conn: socket.socket, server: RawServer) -> None:
        if server.read_request(conn) is None:
            return
        for piece in chunks(answer, 1):
            if server.stopped.wait(1.0 / per_second):
                return
            conn.sendall(piece)

    return handler


def never_answer(conn: socket.socket, server: RawServer) -> None:
    server.read_request(conn)
    server.stopped.wait(60)


def never_read(conn: socket.socket, server: RawServer) -> Any:
    server.stopped.wait(60)
