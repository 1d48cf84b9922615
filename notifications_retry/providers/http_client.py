"""The HTTP client providers post with: aiohttp, kept connections, one deadline, capped answers.

What this module adds to aiohttp is the product's policy, not HTTP: one deadline over a whole request
(connect, write, status line, headers and body: a server dripping a byte a second is cut off at the
timeout), an answer capped in size (the body at ``max_body``; the status line, each header and the
number of headers by aiohttp's parser limits), no redirects followed, no proxy taken from the
environment, and a connect-time guard that sees the address every connection actually goes to
(``socket_factory``: after DNS, for names and IP literals alike) and refuses it when the URL policy
says so. aiohttp's own errors are mapped here, in one place, to :class:`TransportError` kinds.

Why aiohttp (measured by ``python -m bench.http_clients``; docs/providers.md has the figures):
driven directly it costs the least CPU per request of the kept clients, and it exposes the three
hooks this needs (parser limits, a socket factory, ``trust_env=False``) without private API.

aiohttp and httpx are imported by :func:`load`, when a provider that posts is built, never by importing
this module: the admin imports the providers in every web process, and the two cost about a quarter of a
second to import, which a process that never posts (a web worker, a cron tick of e-mail channels) should
not pay.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import socket
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from notifications_retry.exceptions import causes
from notifications_retry.runtime.asyncio_bridge import deadline

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "MAX_HEADERS",
    "MAX_HEADER_FIELD_BYTES",
    "MAX_STATUS_LINE_BYTES",
    "AddressRefused",
    "ConnectFailed",
    "HttpClient",
    "InvalidRequest",
    "ProtocolFailure",
    "RequestTimeout",
    "Response",
    "TransportError",
    "UrlRefused",
    "check_header",
    "load",
]

#: Longest status line accepted (bytes): aiohttp refuses a longer one before buffering it.
MAX_STATUS_LINE_BYTES = 8190
#: Longest single header (name + value, bytes) accepted.
MAX_HEADER_FIELD_BYTES = 8190
#: Most headers accepted in one answer: with the field limit, an answer's headers stay under ~1 MiB
#: however much the other side sends.
MAX_HEADERS = 128
#: Seconds an idle kept-alive connection stays in the pool.
KEEPALIVE_SECONDS = 15.0

_T = TypeVar("_T")

#: Checks an address the client is about to connect to: a reason to refuse it, or None.
AddressGuard = Callable[[str], "str | None"]


class TransportError(Exception):
    """A request that got no usable answer; ``kind`` names why, one of the contract's error kinds."""

    kind = "transport"
    retriable = True


class ConnectFailed(TransportError):
    kind = "connection"


class NeverConnected(ConnectFailed):
    """No connection could be opened (refused, unresolvable): the request certainly never left."""


class RequestTimeout(TransportError):
    kind = "timeout"


class ProtocolFailure(TransportError):
    """A malformed, oversized or cut-short answer."""

    kind = "transport"


class UrlRefused(TransportError):
    """The URL policy refused where the request would go: never retried."""

    kind = "url_refused"
    retriable = False


class InvalidRequest(TransportError):
    """A request HTTP cannot carry as configured (a bad header, an unusable URL): never retried."""

    kind = "invalid_request"
    retriable = False


class AddressRefused(OSError):
    """Raised by the connect-time guard; an OSError so that aiohttp treats it as a failed connect."""

    def __init__(self, address: str, reason: str) -> None:
        # One message for every refused address: aiohappyeyeballs raises the first of several
        # failures as it is when they all read the same, which keeps this type visible.
        super().__init__("address refused by the webhook URL policy")
        self.address = address
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Response:
    """A complete answer; ``headers`` are case-insensitive; ``body`` is cut at ``max_body`` bytes."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    truncated: bool = False
    #: The IP address the answer came from (the connection's peer), when the transport tells it.
    remote_addr: str | None = None


def check_header(name: str, value: str) -> None:
    """Raise ValueError for a header HTTP/1.1 cannot carry as given."""
    # A CR or LF would let a configured header value start a header (or a request) of its own.
    if not name or any(c in name for c in "\r\n\0: \t") or any(c in value for c in "\r\n\0"):
        raise ValueError(f"invalid HTTP header {name!r}")


def load() -> None:
    """Import the HTTP libraries now (once a process), so that the first request does not stall its loop."""
    import aiohttp  # noqa: F401
    import httpx  # noqa: F401


@functools.cache
def default_ssl_context() -> ssl.SSLContext:
    """One verifying TLS context (certifi's CA bundle) for every client: building one costs tens of ms."""
    import httpx

    return httpx.create_ssl_context()


@dataclasses.dataclass
class _Session:
    session: aiohttp.ClientSession
    #: The URL parsed once: aiohttp would parse a string on every request.
    url: Any
    loop: asyncio.AbstractEventLoop
    inflight: int = 0
    closing: bool = False


class HttpClient:
    """Requests to one URL over at most ``max_connections`` kept-alive connections, on one event loop.

    ``guard`` is asked about the address of every new connection before it is opened (after DNS);
    a reason refuses it with :class:`UrlRefused`. ``headers`` go on every request.
    """

    def __init__(
        self,
        url: str,
        *,
        max_connections: int,
        max_body: int,
        headers: Sequence[tuple[str, str]] = (),
        guard: AddressGuard | None = None,
        ssl_context: Callable[[], ssl.SSLContext] = default_ssl_context,
    ) -> None:
        for name, value in headers:
            check_header(name, value)
        self.url = url
        self.max_connections = max(1, int(max_connections))
        self.max_body = max_body
        self.headers = dict(headers)
        self.guard = guard
        self._ssl_context = ssl_context
        self._current: _Session | None = None

    # -- the connect-time guard ------------------------------------------------------------------

    def _socket(self, addr_info: Any) -> socket.socket:
        """aiohttp's socket factory: called with the resolved address of every connection it opens."""
        family, type_, proto, _, sockaddr = addr_info
        address = str(sockaddr[0])
        if self.guard is not None:
            reason = self.guard(address)
            if reason is not None:
                raise AddressRefused(address, reason)
        return socket.socket(family=family, type=type_, proto=proto)

    # -- sessions --------------------------------------------------------------------------------

    def _session(self) -> _Session:
        loop = asyncio.get_running_loop()
        current = self._current
        if current is not None and current.loop is loop and not current.session.closed:
            return current
        import aiohttp  # only to open a session, not on every request
        import yarl

        if current is not None:
            self._retire(current)  # used from another loop now (a new asyncio.run): start afresh
        connector = aiohttp.TCPConnector(
            limit=self.max_connections,
            limit_per_host=0,
            keepalive_timeout=KEEPALIVE_SECONDS,
            ssl=self._ssl_context() if self.url.lower().startswith("https:") else False,
            socket_factory=self._socket,
        )
        session = aiohttp.ClientSession(
            connector=connector,
            trust_env=False,  # no proxy (nor .netrc credentials) from the environment
            timeout=aiohttp.ClientTimeout(total=None),  # the deadline is ours, over the whole request
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding",),
            cookie_jar=aiohttp.DummyCookieJar(),
            max_line_size=MAX_STATUS_LINE_BYTES,
            max_field_size=MAX_HEADER_FIELD_BYTES,
            max_headers=MAX_HEADERS,
            headers=self.headers,
        )
        self._current = _Session(session, yarl.URL(self.url), loop)
        return self._current

    @staticmethod
    async def _close_when_idle(state: _Session) -> None:
        state.closing = True
        if state.inflight == 0 and not state.session.closed:
            await state.session.close()

    def _retire(self, state: _Session) -> None:
        """Close ``state``'s session once its requests in flight are done, from whichever thread."""
        if self._current is state:
            self._current = None
        loop = state.loop
        if loop.is_closed() or state.session.closed:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            task = loop.create_task(self._close_when_idle(state))
            _pending.add(task)
            task.add_done_callback(_pending.discard)
        elif loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._close_when_idle(state), loop)
            try:
                future.result(timeout=2.0)
            except Exception:  # a stuck or closing loop keeps its sockets: nothing more to do here
                future.cancel()
        else:
            # A loop its owner runs in steps (the worker's send loop), between two of them: the close
            # runs at its next step, or when the owner closes the loop.
            task = loop.create_task(self._close_when_idle(state))
            _pending.add(task)
            task.add_done_callback(_pending.discard)

    def close(self) -> None:
        """Close the connections; a request in flight keeps its own until it ends. Any thread."""
        if self._current is not None:
            self._retire(self._current)

    async def aclose(self) -> None:
        """Close the connections from the client's own loop, waiting until they are closed."""
        state, self._current = self._current, None
        if state is not None and state.loop is asyncio.get_running_loop():
            await self._close_when_idle(state)
        elif state is not None:
            self._retire(state)

    # -- requests --------------------------------------------------------------------------------

    async def request(
        self, method: str, headers: Sequence[tuple[str, str]], body: bytes, *, timeout: float
    ) -> Response:
        """Send one request and read its answer, all within ``timeout`` seconds."""
        import aiohttp  # a dictionary lookup once loaded (see load): for the errors' names below

        try:
            for name, value in headers:
                check_header(name, value)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from exc
        state = self._session()
        state.inflight += 1
        try:
            # Not asyncio.timeout: an answer that arrived while the process was paused is read, not
            # called a timeout (notifications_retry.runtime.asyncio_bridge).
            async with deadline(timeout):
                return await self._exchange(state, method, headers, body)
        except TimeoutError as exc:
            raise RequestTimeout(f"no complete answer within {timeout:g}s") from exc
        except aiohttp.ClientConnectorError as exc:
            refused = _refusal(exc)
            if refused is not None:
                raise UrlRefused(f"connection to {refused.address} refused: {refused.reason}") from exc
            raise NeverConnected(f"cannot connect: {exc}") from exc
        except (aiohttp.InvalidURL, ValueError) as exc:
            raise InvalidRequest(f"request cannot be sent: {exc}") from exc
        except aiohttp.ClientResponseError as exc:
            # The parser's refusals: a malformed answer, a status line, header or header count over
            # the limits above. The other side misbehaves; it may heal.
            raise ProtocolFailure(f"malformed or oversized answer: {_short(exc.message)}") from exc
        except aiohttp.ClientOSError as exc:
            raise ConnectFailed(f"connection failed: {exc}") from exc
        except aiohttp.ServerDisconnectedError as exc:
            raise ProtocolFailure("connection closed before the answer was complete") from exc
        except aiohttp.ClientError as exc:
            raise ProtocolFailure(f"{type(exc).__name__}: {_short(str(exc))}") from exc
        finally:
            state.inflight -= 1
            if state.closing and state.inflight == 0 and not state.session.closed:
                await state.session.close()

    async def _exchange(
        self, state: _Session, method: str, headers: Sequence[tuple[str, str]], body: bytes
    ) -> Response:
        async with state.session.request(
            method, state.url, data=body, headers=dict(headers), allow_redirects=False
        ) as response:
            remote_addr = _peer(response)
            data = bytearray()
            room = self.max_body + 1  # one byte more than kept tells a cut answer from a full one
            while len(data) < room:
                chunk = await response.content.read(room - len(data))
                if not chunk:
                    break
                data += chunk
            truncated = len(data) > self.max_body
            if truncated:
                # Enough of an answer that should be short: drop the connection rather than read on.
                response.close()
            return Response(
                response.status, response.headers, bytes(data[: self.max_body]), truncated, remote_addr
            )


def _peer(response: aiohttp.ClientResponse) -> str | None:
    """The address of the connection an answer came on.

    A short answer arrives whole with its headers, and aiohttp hands the connection back to the pool
    before the caller sees the response (``response.connection`` is then None); the protocol the
    response was read from still holds the transport. aiohttp has no public name for it, hence the
    guarded attribute (tests/integration/test_attempt_evidence.py fails should it go away).
    """
    connection = response.connection
    protocol = connection.protocol if connection is not None else getattr(response, "_protocol", None)
    transport = getattr(protocol, "transport", None)
    peer = transport.get_extra_info("peername") if transport is not None else None
    return str(peer[0]) if peer else None


def _short(text: str, limit: int = 200) -> str:
    """Error text quotes what the other side sent: keep the record's error short."""
    return text if len(text) <= limit else text[:limit] + "…"


def _refusal(exc: BaseException) -> AddressRefused | None:
    """The guard's refusal behind an aiohttp connect error, if that is what it was."""
    for current in causes(exc):
        if isinstance(current, AddressRefused):
            return current
    return None


#: Close tasks started on a loop from inside it (the loop keeps only weak references to tasks).
_pending: set[asyncio.Task[None]] = set()
