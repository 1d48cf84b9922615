"""structlog processors that keep recipients, secrets and message bodies out of log output.

The library only *emits* events (``structlog.get_logger("notifications_retry...")``); the project
decides how they are rendered. Put :func:`processors` into the project's structlog chain (and into
``ProcessorFormatter``'s ``foreign_pre_chain`` for stdlib records), before the renderer::

    import notifications_retry.observability.logging as nr_logging
    structlog.configure(processors=[..., *nr_logging.processors(), renderer])

See docs/observability.md for a complete configuration (JSON lines in production, console in development).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import unquote
from uuid import UUID

from structlog.processors import format_exc_info
from structlog.typing import EventDict, WrappedLogger

from notifications_retry.observability.masking import mask_recipient

__all__ = ["MASK", "mask_event_dict", "mask_text", "mask_value", "processors", "redact"]

MASK = "***"

# Keys are compared lower-cased with "-" read as "_" (HTTP header names arrive either way).
RECIPIENT_KEYS = frozenset(
    {
        "recipient",
        "recipients",
        "to",
        "cc",
        "bcc",
        "email",
        "email_address",
        "emails",
        "phone",
        "phone_number",
        "msisdn",
        "address",
        "addresses",
        "device_token",
        "push_token",
        "registration_id",
        "destination",
        "user_email",
    }
)
SECRET_KEYS = frozenset(
    {
        "token",
        "tokens",
        "access_token",
        "refresh_token",
        "id_token",
        "api_key",
        "apikey",
        "x_api_key",
        "authorization",
        "proxy_authorization",
        "password",
        "passwd",
        "secret",
        "secrets",
        "client_secret",
        "webhook_secret",
        "signature",
        "x_signature",
        "cookie",
        "set_cookie",
        "credentials",
        "session",
    }
)
BODY_KEYS = frozenset(
    {
        "body",
        "payload",
        "content",
        "html",
        "text",
        "subject",
        "data",
        "template_context",
        "request_body",
        "response_body",
        "params",
        "form",
        "json",
        "attachments",
        "headers",
    }
)
RECIPIENT_SUFFIXES = ("_recipient", "_email", "_phone", "_address", "_device_token")
SECRET_SUFFIXES = ("_token", "_secret", "_password", "_api_key", "_signature")
BODY_SUFFIXES = ("_body", "_payload", "_content", "_html")

# Meta keys of structlog's ProcessorFormatter (the LogRecord itself) and the event's own scaffolding.
_UNTOUCHED_KEYS = frozenset({"_record", "_from_structlog", "timestamp", "level", "logger", "logger_name"})

_EMAIL = re.compile(r"[A-Za-z0-9._%+'-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
# Candidate phone numbers; _phone_sub rejects dates, versions and anything with too few digits.
_PHONE = re.compile(r"(?<![\w/.:+-])\+?\(?\d[\d ().-]{6,}\d(?![\w/.:-])")
_DATE_LIKE = re.compile(r"^\d{4}[-./]\d{1,2}[-./]\d{1,2}")
_IPV4 = re.compile(r"^\d{1,3}(?:\.\d{1,3}){3}$")
_BEARER = re.compile(r"(?i)\b(bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{6,}")
_QUERY_SECRET = re.compile(
    r"(?i)([?&;\s]|^)((?:access_|refresh_|id_)?token|api_?key|key|secret|signature|sig|password|auth)"
    r"=([^&\s\"'<>]+)"
)
_QUERY_RECIPIENT = re.compile(
    r"(?i)([?&;]|^)(to|cc|bcc|email|e_?mail|phone|msisdn|recipient|device_?token)=([^&\s\"'<>]+)"
)
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s:]+(?::[^/@\s]*)?@")
# Opaque tokens (push device tokens, API keys) in free text: long words mixing letters and digits.
_OPAQUE = re.compile(r"(?<![\w:-])[A-Za-z0-9_:-]{20,}(?![\w:-])")
_NOT_SECRET = re.compile(
    r"^(?:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"  # a UUID
    r"|[0-9a-f]{32}"  # uuid4().hex: job run ids
    r"|\d{4}-\d{2}-\d{2}T.*"  # a timestamp
    r"|[A-Za-z_:-]+|[\d_:-]+)$"  # words or numbers alone
)
_SAFE_SCALARS = (bool, int, float, Decimal, UUID, datetime, date, time, timedelta)
# Exact types for the fast path of mask_value (a UUID is rendered as text there, so it is not one).
_SAFE_TYPES = frozenset(_SAFE_SCALARS) - {UUID}


def _phone_sub(match: re.Match[str]) -> str:
    text = match.group(0)
    digits = sum(c.isdigit() for c in text)
    if digits < 7 or digits > 15 or _DATE_LIKE.match(text.lstrip("(+")) or _IPV4.match(text):
        return text
    return mask_recipient(text)


#: Texts no pattern below can change: a UUID, a run id (32 hex digits), an ISO timestamp, a word of
#: letters (no digit, ``@``, ``=`` or space for a pattern to start from). A per-record event carries
#: several of them, each new (ids are unique), so they skip the patterns instead of filling the cache.
#: tests/unit/test_masking.py checks these texts come out of the patterns unchanged.
_PLAIN = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"|[0-9a-f]{32}"
    r"|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?(?:[+-]\d{2}:\d{2}|Z)?"
    r"|[A-Za-z_.-]*"
)


def mask_text(text: str, opaque: bool = True) -> str:
    """Free text with every email address, phone number, bearer token and URL secret masked, and
    (``opaque``) long words mixing letters and digits, which is how device tokens and API keys look."""
    # A text no pattern can start in (a correlation or message id, unique each time) is returned before
    # the cache, which it would only churn.
    if not text or _PLAIN.fullmatch(text) or not _may_change(text, opaque):
        return text
    if len(text) <= _CACHED_TEXT_LENGTH:
        return _mask_short_text(text, opaque)
    return _apply_patterns(text, opaque)


#: Short field values repeat from event to event (event names, channels, lanes, a tick's run id):
#: their masking is remembered instead of running every pattern again for each log line.
_CACHED_TEXT_LENGTH = 128


@functools.lru_cache(maxsize=4096)
def _mask_short_text(text: str, opaque: bool) -> str:
    return _apply_patterns(text, opaque)


#: What every pattern below needs somewhere in a text to match at all: an ``@`` (an address, a URL's
#: userinfo), an ``=`` (a query's secret or recipient), a space (after "Bearer"), a digit run a phone
#: number could be, and (opaque) a word long enough to be a token. A text with none of them, such as a
#: correlation or message id, skips the seven patterns: each is unique, so the cache does not help it.
#: tests/unit/test_masking.py checks on generated texts that the gate never lets a change through.
_MAY_CHANGE = re.compile(r"[@=\s]|\d[\d ().-]{6,}\d")
_MAY_CHANGE_OPAQUE = re.compile(r"[@=\s]|\d[\d ().-]{6,}\d|[A-Za-z0-9_:-]{20}")


def _may_change(text: str, opaque: bool) -> bool:
    return (_MAY_CHANGE_OPAQUE if opaque else _MAY_CHANGE).search(text) is not None


def _apply_patterns(text: str, opaque: bool) -> str:
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    text = _EMAIL.sub(lambda m: mask_recipient(m.group(0)), text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", text)
    text = _QUERY_SECRET.sub(lambda m: f"{m.group(1)}{m.group(2)}={MASK}", text)
    text = _QUERY_RECIPIENT.sub(
        lambda m: f"{m.group(1)}{m.group(2)}={mask_recipient(unquote(m.group(3)))}", text
    )
    text = _PHONE.sub(_phone_sub, text)
    return _OPAQUE.sub(_opaque_sub, text) if opaque else text


def _opaque_sub(match: re.Match[str]) -> str:
    word = match.group(0)
    return word if _NOT_SECRET.match(word) else mask_recipient(word)


def _leaves(value: Any, minimum: int, _depth: int = 0) -> list[str]:
    if isinstance(value, str):
        return [value] if len(value.strip()) >= minimum else []
    if _depth > 8:
        return []
    if isinstance(value, Mapping):
        return [leaf for v in value.values() for leaf in _leaves(v, minimum, _depth + 1)]
    if isinstance(value, list | tuple | set | frozenset):
        return [leaf for v in value for leaf in _leaves(v, minimum, _depth + 1)]
    return []


def redact(text: str, recipient: Any = None, payload: Any = None) -> str:
    """``text`` (a provider's error message, say) without this message's recipient and payload texts.

    Patterns cannot recognise a push token or a sentence of the body inside free text; the caller
    knows them, so they are cut out by value before the pattern masking of :func:`mask_text`.
    """
    if not text:
        return text
    if isinstance(recipient, str) and len(recipient.strip()) >= 3:
        text = text.replace(recipient.strip(), mask_recipient(recipient))
    # Longest first, so a leaf containing another is removed whole; short leaves ("Hi") stay readable.
    for leaf in sorted(set(_leaves(payload, 6)), key=len, reverse=True):
        text = text.replace(leaf, MASK)
    return mask_text(text)


def _is_identifier(key: Any) -> bool:
    return _is_identifier_name(key) if isinstance(key, str) else _is_identifier_name(_normal(key))


@functools.lru_cache(maxsize=1024)
def _is_identifier_name(key: str) -> bool:
    name = _normal(key)
    return name == "id" or name.endswith("_id")


def _normal(key: Any) -> str:
    return str(key).lower().replace("-", "_")


def _kind(key: Any) -> str | None:
    return _kind_of_name(key) if isinstance(key, str) else _kind_of_name(_normal(key))


@functools.lru_cache(maxsize=1024)
def _kind_of_name(key: str) -> str | None:
    name = _normal(key)
    if name in SECRET_KEYS or name.endswith(SECRET_SUFFIXES):
        return "secret"
    if name in RECIPIENT_KEYS or name.endswith(RECIPIENT_SUFFIXES):
        return "recipient"
    if name in BODY_KEYS or name.endswith(BODY_SUFFIXES):
        return "body"
    return None


def _mask_recipient_value(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, list | tuple | set | frozenset):
        return [_mask_recipient_value(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _mask_recipient_value(v) for k, v in value.items()}
    return mask_recipient(str(value))


def _mask_body_value(value: Any) -> Any:
    # Keep the shape (an operator can tell "empty" from "something") but nothing of the content.
    if value is None or value == "" or value == {} or value == []:
        return value
    if isinstance(value, Mapping):
        return f"<masked {len(value)} keys>"
    if isinstance(value, list | tuple):
        return f"<masked {len(value)} items>"
    return MASK


def mask_value(value: Any, key: Any = None, _depth: int = 0) -> Any:
    """``value`` as it may be logged under ``key``: masked by the key's meaning, else scrubbed deeply."""
    kind = _kind(key) if key is not None else None
    if kind is None:
        # The common cases first: a per-record event is text and numbers under plain keys.
        cls = type(value)
        if cls is str:
            return mask_text(value, opaque=key is None or not _is_identifier(key))
        if value is None or cls in _SAFE_TYPES:
            return value
    if kind == "secret":
        return MASK if value not in (None, "") else value
    if kind == "recipient":
        return _mask_recipient_value(value)
    if kind == "body":
        return _mask_body_value(value)
    if isinstance(value, UUID):
        return str(value)  # renderers would otherwise show "UUID('…')"
    if value is None or isinstance(value, _SAFE_SCALARS):
        return value
    if isinstance(value, str):
        # An identifier (correlation id, ULID, provider message id) looks opaque but must stay greppable.
        return mask_text(value, opaque=not _is_identifier(key))
    if isinstance(value, bytes | bytearray):
        return mask_text(bytes(value).decode("utf-8", "replace"))
    if _depth > 8:  # a self-referencing structure must not hang the logger
        return MASK
    if isinstance(value, Mapping):
        return {k: mask_value(v, k, _depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [mask_value(v, None, _depth + 1) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # e.g. an OutgoingMessage logged whole: its recipient and payload fields are masked by name.
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {k: mask_value(v, k, _depth + 1) for k, v in fields.items()}
    # Unknown objects would be rendered through repr() later: scrub that text now.
    return mask_text(repr(value))


#: How each plain text key's text is masked: ``True`` opaque words masked (most keys), ``False`` kept (an
#: identifier's key), ``None`` masked by the key's meaning (a recipient, a secret, a body) in mask_value.
#: One dictionary lookup a key instead of two cached calls; bounded like those caches.
_KEY_RULES: dict[str, bool | None] = {}
_KEY_RULES_MAX = 1024
#: The last text each key held that masking left as it was. A log line per record repeats many of
#: them as the very same objects (the bound run id and lane, the event's name, the outcome, a channel's
#: key): masking depends only on the text and its key, so such a value is passed without a look.
_UNCHANGED: dict[str, str] = {}


def _key_rule(key: str) -> bool | None:
    try:
        return _KEY_RULES[key]
    except KeyError:
        rule = None if _kind_of_name(key) is not None else not _is_identifier_name(key)
        if len(_KEY_RULES) < _KEY_RULES_MAX:
            _KEY_RULES[key] = rule
        return rule


def mask_event_dict(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """structlog processor: mask recipients, secrets and bodies anywhere in the event, tracebacks included.

    Each value comes out as :func:`mask_value` under its key makes it; the worker logs an event per
    record, so the common values (texts, numbers and None under keys that name nothing to mask) are
    handled here without a call per value (tests/unit/test_masking.py compares the two).
    """
    if "exc_info" in event_dict:
        # Render the traceback here, so an exception message holding an address is masked too.
        event_dict = format_exc_info(logger, method_name, event_dict)
    unchanged = _UNCHANGED
    for key, value in list(event_dict.items()):
        if value is None or key in _UNTOUCHED_KEYS:
            continue  # None stays None under any key: nothing to mask
        cls = type(value)
        if type(key) is not str:
            event_dict[key] = mask_value(value, key)
            continue
        opaque = _key_rule(key)
        if opaque is None:
            event_dict[key] = mask_value(value, key)
        elif cls is str:
            if unchanged.get(key) is value:
                continue
            # The event and a rendered traceback ("exception", "stack") are free text under this rule too.
            masked = mask_text(value, opaque=opaque)
            if masked is not value:
                event_dict[key] = masked
            elif len(unchanged) < _KEY_RULES_MAX or key in unchanged:
                unchanged[key] = value
        elif cls not in _SAFE_TYPES:
            event_dict[key] = mask_value(value, key)
    return event_dict


def processors() -> list[Callable[[WrappedLogger, str, EventDict], EventDict]]:
    """The masking chain for a project's structlog configuration: place it just before the renderer."""
    return [mask_event_dict]
