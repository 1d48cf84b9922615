"""Webhook signatures: Standard Webhooks for ``whsec_`` secrets, the legacy ``X-Signature`` otherwise.

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
from collections.abc import Mapping
from typing import Any

__all__ = [
    "LEGACY_HEADER",
    "PREFIX",
    "STANDARD_HEADERS",
    "Signer",
    "fingerprint",
    "masked",
    "secret_problems",
    "stored_secrets",
]

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
