"""A webhook receiver for the benchmark: answers every POST after ``--delay`` seconds, over real HTTP.

Runs in its own process (asyncio, keep-alive HTTP/1.1), so the receiver's CPU does not share the
worker's GIL. ``GET /stats`` returns the arrival time (``time.time()``) of every POST since the last
``GET /reset``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time


class _Sink:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.arrivals: list[float] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                arrived = time.time()
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = 0
                for line in lines[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                if length:
                    await reader.readexactly(length)
                if method == "POST":
                    self.arrivals.append(arrived)
                    if self.delay:
                        await asyncio.sleep(self.delay)
                    body = b'{"id":"sink-1"}'
                elif path == "/stats":
                    body = json.dumps(self.arrivals).encode()
                else:  # /reset
                    self.arrivals = []
                    body = b"{}"
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError):
            pass
        finally:
            writer.close()


async def _main(port: int, delay: float) -> None:
    sink = _Sink(delay)
    server = await asyncio.start_server(sink.handle, "127.0.0.1", port, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    """Serve until killed; prints the bound port on the first line of stdout."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.02)
    args = parser.parse_args(argv)
    try:
        asyncio.run(_main(args.port, args.delay))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
