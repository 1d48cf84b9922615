"""Webhook provider: POST the notification as JSON, idempotent by ``Idempotency-Key`` (docs/contract.md).

It holds the provider (:class:`WebhookProvider`) and its signatures (:class:`Signer`): Standard Webhooks
for ``whsec_`` secrets, the legacy ``X-Signature`` otherwise.

A ``whsec_<base64>`` secret signs per the Standard Webhooks spec (what Svix and Hook0 send, and what the
``standardwebhooks`` reference library verifies): ``webhook-id`` is the notification id (the same on
every attempt, so the receiver can drop duplicates), ``webhook-timestamp`` the Unix seconds of the
attempt (so a captured request goes stale), and ``webhook-signature`` ``v1,<base64 HMAC-SHA256 of
id.timestamp.body>``, one per secret, space-separated: during a rotation the old secret and the new
one both sign, and a receiver holding either verifies.

A secret without the prefix keeps the legacy ``X-Signature: sha256=<hex HMAC of the body>``: no id, no
timestamp, no rotation. It stays for receivers written against it, and it may sit beside ``whsec_``
secrets while a receiver moves from one to the other (both headers go out).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import json
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar
from urllib.parse import urlsplit

import orjson
from django.conf import settings as django_settings

from notifications_retry.inputs import url_policy
from notifications_retry.rules.outcomes import Evidence, answer_text
from notifications_retry.runtime.asyncio_bridge import run_sync

from ..conf import SETTINGS_NAME, get_settings
from ..exceptions import PermanentProviderError, ProviderError, RetryableProviderError
from ..version import __version__
from . import http_client
from .base import ChannelSettings, OutgoingMessage, Provider, SendResult
from .http_client import HttpClient, NeverConnected, Response, TransportError, check_header
from .http_status import status_error

#: A success answer larger than this is not parsed for an id: a webhook answers briefly.
MAX_RESPONSE_BYTES = 64 * 1024
USER_AGENT = f"notifications-retry/{__version__}"
#: Headers the request framing owns: options cannot override them.
RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


#: The body's JSON: keys sorted, no spaces (one encoder, not one built per ``json.dumps`` call).
_BODY_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))

#: (the NOTIFICATIONS_RETRY object read, its webhook allowlist) — see _allowed_hosts.
_policy_cache: list[tuple[object, tuple[str, ...]]] = []


def _allowed_hosts() -> tuple[str, ...]:
    """The ``WEBHOOK_ALLOWED_HOSTS`` setting, read again whenever ``NOTIFICATIONS_RETRY`` is replaced.

    Every send needs it; building the whole settings object per send cost a tenth of the client's
    CPU. ``override_settings`` (and a settings reload) replace the dict, which is what is compared.
    """
    raw = getattr(django_settings, SETTINGS_NAME, None)
    if _policy_cache and _policy_cache[0][0] is raw:
        return _policy_cache[0][1]
    value = tuple(get_settings().WEBHOOK_ALLOWED_HOSTS)
    _policy_cache[:] = [(raw, value)]
    return value


def classify_response(status: int, headers: Mapping[str, str], body: bytes) -> SendResult:
    """Map an HTTP answer to a result or a classified error."""
    if 200 <= status < 300:
        return SendResult(provider_message_id=_message_id(body))
    raise status_error(status, headers.get("retry-after"), f"webhook answered HTTP {status}")


def _message_id(body: bytes) -> str | None:
    if not body:
        return None
    try:
        # orjson reads a short answer several times faster; what it reads otherwise than the standard
        # library (an integer past 64 bits becomes a float; NaN or a byte order mark is refused) is
        # read again by the standard library, so the id's text stays what the receiver sent.
        data = orjson.loads(body)
        if isinstance(data, dict) and isinstance(data.get("id"), float):
            data = json.loads(body)
    except orjson.JSONDecodeError:
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
    if isinstance(data, dict) and data.get("id") is not None:
        return str(data["id"])[:255]
    return None


def _crash(exc: Exception) -> RetryableProviderError:
    return RetryableProviderError(
        f"webhook client failed: {type(exc).__name__}: {exc}", kind="provider_crash"
    )


PREFIX = "whsec_"
#: The Standard Webhooks spec asks for keys of 24 to 64 bytes (192 to 512 bits).
MIN_KEY_BYTES = 24
MAX_KEY_BYTES = 64
LEGACY_HEADER = "X-Signature"
STANDARD_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")


def is_standard(secret: str) -> bool:
    """Whether ``secret`` is a Standard Webhooks secret (``whsec_`` prefix)."""
    return secret.startswith(PREFIX)


def _key(secret: str) -> bytes:
    """The HMAC key a ``whsec_`` secret stands for; ValueError when it is not base64 of 24-64 bytes."""
    encoded = secret[len(PREFIX) :]
    try:
        # validate=True: a typo (a space, a stray character) is an error, never a different key.
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("the part after whsec_ is not base64") from exc
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"the key is {len(key)} bytes; the Standard Webhooks spec asks for 24 to 64")
    return key


def stored_secrets(options: Mapping[str, Any]) -> list[str]:
    """Every secret a channel's options hold: ``secret`` first, then ``secrets`` in order."""
    found: list[str] = []
    single = options.get("secret")
    if isinstance(single, str) and single:
        found.append(single)
    many = options.get("secrets")
    if isinstance(many, list):
        found.extend(s for s in many if isinstance(s, str) and s and s not in found)
    return found


def secret_problems(options: Mapping[str, Any]) -> list[str]:
    """What is wrong with a channel's ``secret`` / ``secrets``; never quotes a secret."""
    problems: list[str] = []
    single = options.get("secret")
    if single is not None and not isinstance(single, str):
        problems.append("webhook option 'secret' must be a string")
    elif isinstance(single, str) and is_standard(single):
        try:
            _key(single)
        except ValueError as exc:
            problems.append(f"webhook option 'secret' is not a valid whsec_ secret: {exc}")
    if "secrets" in options:
        many = options["secrets"]
        if not isinstance(many, list) or not all(isinstance(s, str) for s in many):
            problems.append("webhook option 'secrets' must be a list of whsec_ strings")
        else:
            for number, secret in enumerate(many, start=1):
                if not is_standard(secret):
                    # The legacy signature has room for one secret: 'secret' holds it.
                    problems.append(
                        f"webhook option 'secrets' entry {number} must start with whsec_ "
                        "(a legacy secret goes in 'secret')"
                    )
                    continue
                try:
                    _key(secret)
                except ValueError as exc:
                    problems.append(f"webhook option 'secrets' entry {number} is not valid: {exc}")
    return problems


def fingerprint(secret: str) -> str:
    """Eight hex digits that tell two secrets apart (a SHA-256 prefix) without revealing either."""
    return hashlib.sha256(secret.encode()).hexdigest()[:8]


def masked(secret: str) -> str:
    """How the admin and any listing show a secret: its kind and fingerprint, never a character of it."""
    kind = "whsec_… (Standard Webhooks)" if is_standard(secret) else "legacy (X-Signature)"
    return f"{kind}, fingerprint {fingerprint(secret)}"


@dataclasses.dataclass(frozen=True)
class Signer:
    """Signs request bodies with a channel's secrets; keys decoded once, when the channel is loaded."""

    # No field is ever shown (repr=False): a logged provider must not print its keys.
    keys: tuple[bytes, ...] = dataclasses.field(default=(), repr=False)
    legacy: bytes | None = dataclasses.field(default=None, repr=False)
    #: The secrets as configured: an answer's excerpt has them cut out should a receiver echo one.
    secrets: tuple[str, ...] = dataclasses.field(default=(), repr=False)

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> Signer:
        """The signer for a channel's options (already validated by :func:`secret_problems`)."""
        keys: list[bytes] = []
        legacy: bytes | None = None
        for secret in stored_secrets(options):
            if is_standard(secret):
                keys.append(_key(secret))
            elif legacy is None:
                legacy = secret.encode()
        return cls(tuple(keys), legacy, tuple(stored_secrets(options)))

    @property
    def signs(self) -> bool:
        return bool(self.keys) or self.legacy is not None

    @property
    def header_names(self) -> frozenset[str]:
        """Lower-cased names of the headers this signer sets (configured headers cannot override them)."""
        names = set(STANDARD_HEADERS) if self.keys else set()
        if self.legacy is not None:
            names.add(LEGACY_HEADER.lower())
        return frozenset(names)

    def headers(self, msg_id: str, timestamp: int, body: bytes) -> list[tuple[str, str]]:
        """The signature headers of one request sent at ``timestamp`` (Unix seconds)."""
        headers: list[tuple[str, str]] = []
        if self.keys:
            signed = f"{msg_id}.{timestamp}.".encode() + body
            signatures = " ".join(
                "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
                for key in self.keys
            )
            headers += [
                ("webhook-id", msg_id),
                ("webhook-timestamp", str(timestamp)),
                ("webhook-signature", signatures),
            ]
        if self.legacy is not None:
            digest = hmac.new(self.legacy, body, hashlib.sha256).hexdigest()
            headers.append((LEGACY_HEADER, f"sha256={digest}"))
        return headers


class WebhookProvider(Provider):
    """``POST options["url"]``; options: ``url`` (required), ``headers``, ``secret`` / ``secrets``.

    A ``whsec_`` secret signs per Standard Webhooks, any other the legacy ``X-Signature``
    (:class:`Signer`); ``wall_clock`` gives the Unix time of each attempt, the signature's timestamp.

    Every send checks the URL policy (:mod:`notifications_retry.inputs.url_policy`) and every connection
    the address it goes to: a refused URL is a permanent ``url_refused`` failure, never a request.
    """

    key: ClassVar[str] = "webhook"
    enforces_timeout = True  # one deadline over each whole request (http_client)

    def __init__(self, channel: ChannelSettings, *, wall_clock: Callable[[], float] = time.time) -> None:
        super().__init__(channel)
        options = channel.options
        self.url: str = options["url"]
        self.extra_headers: dict[str, str] = dict(options.get("headers") or {})
        self.signer = Signer.of(options)
        self.wall_clock = wall_clock
        self.timeout = float(channel.timeout_seconds)
        self.max_connections = max(1, int(channel.max_concurrency))
        # The allowlist this URL last passed the policy with (None: not checked yet): the same object
        # again needs no check, and the connect-time guard uses the same one.
        self._allowed: tuple[str, ...] | None = None
        # Created on the first asynchronous send, on the loop that sends (the worker's); its libraries
        # are imported now, when the worker loads the channel, not inside that first send.
        self._client: HttpClient | None = None
        http_client.load()

    @classmethod
    def options_problems(cls, options: Mapping[str, Any]) -> list[str]:
        problems = super().options_problems(options)
        if problems:
            return problems
        url = options.get("url")
        if not url or not isinstance(url, str):
            return ["webhook channel needs options['url']"]
        try:
            parts = urlsplit(url)
            hostname = parts.hostname
        except ValueError as exc:  # an unclosed IPv6 bracket, a bad port
            return [f"webhook url cannot be parsed ({exc}), got {url!r}"]
        if parts.scheme not in ("http", "https") or not hostname:
            problems.append(f"webhook url must be an http(s) URL with a host, got {url!r}")
        elif any(ord(c) <= 32 or ord(c) == 127 for c in url):
            problems.append(f"webhook url must not contain spaces or control characters, got {url!r}")
        else:
            problems.extend(url_policy.webhook_url_problems(url))
        headers = options.get("headers", {})
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            problems.append("webhook option 'headers' must map header names to strings")
        else:
            for name, value in headers.items():
                try:
                    check_header(name, value)
                except ValueError:
                    problems.append(f"webhook header {name!r} has a character HTTP does not allow")
                    continue
                if name.lower() in RESERVED_HEADERS:
                    problems.append(f"webhook header {name!r} is set by the provider itself")
        problems.extend(secret_problems(options))
        return problems

    def body(self, message: OutgoingMessage) -> bytes:
        """The request body; byte-identical for every attempt of one notification."""
        return self._body(message, str(message.notification_id))

    def _body(self, message: OutgoingMessage, id_text: str) -> bytes:
        document = {
            "notification_id": id_text,
            "tenant_id": str(message.tenant_id) if message.tenant_id else None,
            "channel": message.channel,
            "recipient": message.recipient,
            "notification_type": message.notification_type,
            "payload": message.payload,
        }
        try:
            return _BODY_ENCODER.encode(document).encode()
        except (TypeError, ValueError, RecursionError) as exc:
            raise PermanentProviderError(
                f"payload cannot be serialized: {exc}", kind="serialization"
            ) from exc

    def _request(self, message: OutgoingMessage) -> tuple[list[tuple[str, str]], bytes]:
        """The body and the headers that change per message (the rest are the client's)."""
        msg_id = str(message.notification_id)
        body = self._body(message, msg_id)
        headers = [("Idempotency-Key", msg_id)]
        if self.signer.signs:
            headers += self.signer.headers(msg_id, int(self.wall_clock()), body)
        return headers, body

    def _evidence(self, response: Response, message: OutgoingMessage) -> Evidence:
        """A refused answer's evidence: its status, where it came from, and its text (the caller masks it)."""
        hidden = [*self.signer.secrets, *self.extra_headers.values()]
        return Evidence(response.status, answer_text(response.body, secrets=hidden), response.remote_addr)

    def _check_url(self) -> None:
        """The URL policy, on every send: a channel made in code is held to it as the admin's are."""
        allowed = _allowed_hosts()
        if allowed is self._allowed:
            return
        problems = url_policy.webhook_url_problems(self.url, allowed_hosts=allowed)
        if problems:
            raise PermanentProviderError(f"webhook URL refused: {'; '.join(problems)}", kind="url_refused")
        self._allowed = allowed

    def _guard(self, address: str) -> str | None:
        """The connect-time half of the policy, on the address a new connection goes to."""
        host = urlsplit(self.url).hostname or ""
        return url_policy.address_problem(address, host, self._allowed or ())

    def _new_client(self, max_connections: int) -> HttpClient:
        # The options' headers, minus those the provider sets per message, go on every request.
        fixed = {**self.extra_headers, "Content-Type": "application/json", "User-Agent": USER_AGENT}
        fixed.pop("Idempotency-Key", None)
        signed = self.signer.header_names
        fixed = {name: value for name, value in fixed.items() if name.lower() not in signed}
        try:
            return HttpClient(
                self.url,
                max_connections=max_connections,
                max_body=MAX_RESPONSE_BYTES,
                headers=list(fixed.items()),
                guard=self._guard,
            )
        except ValueError as exc:  # a header the options should not have let through
            raise PermanentProviderError(
                f"webhook request is invalid: {exc}", kind="invalid_request"
            ) from exc

    async def _post(self, message: OutgoingMessage, *, own_client: bool) -> SendResult:
        """Check, POST and classify; every failure leaves as a ProviderError with its cause kept."""
        client: HttpClient | None = None
        try:
            self._check_url()
            headers, body = self._request(message)
            if own_client:
                client = self._new_client(1)
            else:
                if self._client is None:
                    self._client = self._new_client(self.max_connections)
                client = self._client
            try:
                response = await client.request("POST", headers, body, timeout=self.timeout)
            except TransportError as exc:
                error = RetryableProviderError if exc.retriable else PermanentProviderError
                # No connection (refused, unresolvable name): the request never left. Anything later
                # may have reached the receiver, so it stays ambiguous.
                unsent = isinstance(exc, NeverConnected)
                raise error(
                    f"webhook {exc.kind} failure: {exc}", kind=exc.kind, ambiguous=not unsent
                ) from exc
            try:
                result = classify_response(response.status, response.headers, response.body)
            except ProviderError as exc:
                exc.evidence = self._evidence(response, message)
                raise
            # A 2xx answer's body is not kept (its id is the provider message id): the hot path
            # writes a few bytes of evidence and masks nothing.
            return SendResult(result.provider_message_id, Evidence(response.status, "", response.remote_addr))
        except ProviderError:
            raise
        except Exception as exc:
            # Whatever else breaks inside the client is this record's retriable failure, with its cause.
            raise _crash(exc) from exc
        finally:
            if own_client and client is not None:
                await client.aclose()

    async def send_async(self, message: OutgoingMessage) -> SendResult:
        """POST on the running loop over kept-alive connections (at most ``max_concurrency``)."""
        return await self._post(message, own_client=False)

    def send(self, message: OutgoingMessage) -> SendResult:
        """POST from synchronous code, on a connection of its own (the worker sends asynchronously)."""
        try:
            return run_sync(self._post(message, own_client=True))
        except ProviderError:
            raise
        except Exception as exc:
            raise _crash(exc) from exc

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
