"""A real HTTP server on 127.0.0.1 whose answers tests script, recording every request."""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclasses.dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    received_at: float

    def json(self) -> Any:
        return json.loads(self.body)


@dataclasses.dataclass
class Reply:
    """A scripted answer: status, headers, body; ``delay`` before answering; ``drip`` bytes/second."""

    status: int = 200
    body: bytes | str | dict[str, Any] | None = None
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    delay: float = 0.0
    drip: float | None = None
    hang: bool = False


Responder = Callable[[RecordedRequest], Reply]


class _QuietServer(ThreadingHTTPServer):
    """A client that goes away (a killed worker, an abandoned call) is expected, not an error to print."""

    # socketserver's default backlog is 5: a worker opening max_concurrency connections at once would
    # see the rest of its SYNs dropped and retried a second later, longer than the tests' timeouts.
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class ScriptedServer:
    """Serve ``responder(request)`` for every request; keeps the requests in ``requests``."""

    def __init__(self, responder: Responder | None = None, port: int = 0) -> None:
        self.responder: Responder = responder or (lambda request: Reply(200, {"id": "msg-1"}))
        self.requests: list[RecordedRequest] = []
        self.lock = threading.Lock()
        self._stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                request = RecordedRequest(
                    "POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.monotonic()
                )
                with server.lock:
                    server.requests.append(request)
                reply = server.responder(request)
                if reply.hang:
                    server._stop.wait(600)
                    return
                if reply.delay:
                    time.sleep(reply.delay)
                payload = reply.body
                if isinstance(payload, dict):
                    payload = json.dumps(payload)
                data = payload.encode() if isinstance(payload, str) else (payload or b"")
                head = f"HTTP/1.1 {reply.status} X\r\nContent-Length: {len(data)}\r\n"
                head += "".join(f"{k}: {v}\r\n" for k, v in reply.headers.items()) + "\r\n"
                raw = head.encode() + data
                try:
                    if reply.drip:
                        for i in range(len(raw)):
                            if server._stop.is_set():
                                return
                            self.wfile.write(raw[i : i + 1])
                            self.wfile.flush()
                            time.sleep(1.0 / reply.drip)
                    else:
                        self.wfile.write(raw)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = _QuietServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/hook"

    def start(self) -> ScriptedServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def keys(self) -> list[str]:
        with self.lock:
            return [r.headers.get("idempotency-key", "") for r in self.requests]
