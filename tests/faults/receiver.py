"""The webhook receiver of the network fault test: a process of its own in the servers' namespace.

It answers every POST with 200 after ``--delay-ms`` and appends one line per request to ``--log``:
``<CLOCK_MONOTONIC seconds> <Idempotency-Key>``. The monotonic clock is the machine's, shared by all
namespaces, so the test compares these times with its own. The test counts requests per key from the log.

``ip netns exec NS python -m tests.faults.receiver --host 10.0.0.2 --port 8080 --log requests.log``
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO


class QuietServer(ThreadingHTTPServer):
    """Many concurrent connections; a client that goes away mid-request (a partition) is no error."""

    request_queue_size = 256
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


def serve(host: str, port: int, log_path: Path, delay: float) -> None:
    log: BinaryIO = log_path.open("ab", buffering=0)
    log_lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # A half-open connection left by a partition must not keep a thread forever.
        timeout = 120

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            key = self.headers.get("Idempotency-Key", "-")
            with log_lock:
                log.write(f"{time.monotonic():.6f} {key}\n".encode())
            time.sleep(delay)
            body = b'{"id": "accepted"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = QuietServer((host, port), Handler)
    signal.signal(signal.SIGTERM, lambda signum, frame: threading.Thread(target=server.shutdown).start())
    print("listening", flush=True)
    server.serve_forever()
    server.server_close()
    log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--delay-ms", type=float, default=5.0)
    options = parser.parse_args()
    serve(options.host, options.port, options.log, options.delay_ms / 1000.0)


if __name__ == "__main__":
    main()
