"""A notification's payload as an email: the documented fields, validated, and its stable Message-ID.

The payload of a notification sent by the ``django_email`` provider is a JSON object:

============  ========================  ====================================================
key           type                      meaning
============  ========================  ====================================================
subject       string, required          the Subject header (one line)
body          string                    the plain-text body
html          string                    the HTML body: an alternative of ``body``, or the
                                        only body when there is no ``body``
from          string                    the sender; default the channel's ``from_email``
                                        option, then ``DEFAULT_FROM_EMAIL``
reply_to      string or list of strings Reply-To addresses
headers       object of string→string   extra headers (not Message-ID / X-Notification-Id)
============  ========================  ====================================================

``body`` or ``html`` is required. The recipient is the notification's ``recipient``. Anything else in
the payload is refused, so a misspelt key fails loudly instead of sending a mail without its HTML part.
:func:`payload_problem` applies these rules to a payload alone (the public API's check, before a row
is stored); :func:`build_message` applies them again with the recipient and the sender's default.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from email.headerregistry import Address
from email.utils import parseaddr
from typing import Any

from django.core.mail import EmailMultiAlternatives

NOTIFICATION_ID_HEADER = "X-Notification-Id"
#: Headers the provider owns: a payload cannot set them (the idempotency key must stay intact).
RESERVED_HEADERS = frozenset(
    {"message-id", NOTIFICATION_ID_HEADER.lower(), "to", "cc", "bcc", "from", "reply-to", "subject"}
)
PAYLOAD_KEYS = frozenset({"subject", "body", "html", "from", "reply_to", "headers"})
#: The keys a payload must hold: each group by one of its keys (the provider's declaration).
REQUIRED_PAYLOAD_KEYS: tuple[tuple[str, ...], ...] = (("subject",), ("body", "html"))


class InvalidEmailPayload(ValueError):
    """The payload or the recipient cannot make an email; the message says which field and why."""


def message_id(notification_id: uuid.UUID, domain: str) -> str:
    """The Message-ID of every attempt of one notification: a re-send is recognisable downstream."""
    return f"<notification.{notification_id}@{domain}>"


def _one_line(field: str, value: Any, *, required: bool = False) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value.strip()):
        raise InvalidEmailPayload(f"'{field}' must be a non-empty string, got {_describe(value)}")
    if "\r" in value or "\n" in value:
        raise InvalidEmailPayload(f"'{field}' must be one line (no CR or LF)")
    return value


def _address(field: str, value: Any) -> str:
    text = _one_line(field, value, required=True)
    assert text is not None
    _name, addr = parseaddr(text)
    local, at, domain = addr.rpartition("@")
    if not at or not local or not domain or " " in addr:
        raise InvalidEmailPayload(f"'{field}' is not an email address: {_describe(value)}")
    try:
        Address(addr_spec=addr)
    except (ValueError, IndexError) as exc:  # the email package's parser speaks in these
        raise InvalidEmailPayload(f"'{field}' is not an email address: {exc}") from exc
    return text


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return repr(value[:60])
    return type(value).__name__


def _headers(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidEmailPayload(f"'headers' must be an object of strings, got {_describe(value)}")
    headers: dict[str, str] = {}
    for name, text in value.items():
        if not isinstance(name, str) or not name or any(c in name for c in ": \t\r\n") or not name.isascii():
            raise InvalidEmailPayload(f"header name {name!r} is not a valid header name")
        if name.lower() in RESERVED_HEADERS:
            raise InvalidEmailPayload(f"header {name!r} is set by the provider, not the payload")
        headers[name] = _one_line(f"headers.{name}", text, required=True) or ""
    return headers


@dataclasses.dataclass(frozen=True)
class _Fields:
    """A payload's fields, checked: what every attempt of the notification sends."""

    subject: str
    body: str | None
    html: str | None
    sender: str | None
    reply_to: list[str]
    headers: dict[str, str]


def _fields(payload: Any) -> _Fields:
    if not isinstance(payload, Mapping):
        raise InvalidEmailPayload(f"the payload must be a JSON object, got {_describe(payload)}")
    unknown = sorted(str(k) for k in set(payload) - PAYLOAD_KEYS)
    if unknown:
        raise InvalidEmailPayload(
            f"unknown payload key(s) {', '.join(unknown)}; known: {', '.join(sorted(PAYLOAD_KEYS))}"
        )
    for group in REQUIRED_PAYLOAD_KEYS:
        if all(payload.get(key) is None for key in group):
            raise InvalidEmailPayload(f"{' or '.join(repr(key) for key in group)} is required")
    subject = _one_line("subject", payload.get("subject"), required=True)
    assert subject is not None
    body = payload.get("body")
    if body is not None and not isinstance(body, str):
        raise InvalidEmailPayload(f"'body' must be a string, got {_describe(body)}")
    html = payload.get("html")
    if html is not None and not isinstance(html, str):
        raise InvalidEmailPayload(f"'html' must be a string, got {_describe(html)}")
    sender = _address("from", payload["from"]) if payload.get("from") else None
    reply_to_value = payload.get("reply_to")
    reply_to_list = [reply_to_value] if isinstance(reply_to_value, str) else reply_to_value
    if reply_to_list is not None and not isinstance(reply_to_list, list):
        raise InvalidEmailPayload(f"'reply_to' must be a string or a list, got {_describe(reply_to_value)}")
    reply_to = [_address("reply_to", item) for item in reply_to_list or []]
    return _Fields(subject, body, html, sender, reply_to, _headers(payload.get("headers")))


def payload_problem(payload: Any) -> str | None:
    """Why ``payload`` cannot make an email whatever its recipient and sender default; None when it can."""
    try:
        _fields(payload)
    except InvalidEmailPayload as exc:
        return str(exc)
    return None


def build_message(
    notification_id: uuid.UUID,
    recipient: str,
    payload: Any,
    *,
    default_from: str,
    message_id_domain: str | None,
) -> EmailMultiAlternatives:
    """The email for one notification, identical at every attempt; InvalidEmailPayload when it cannot be."""
    fields = _fields(payload)
    sender = fields.sender or _address("from", default_from)
    to = _address("recipient", recipient)
    domain = message_id_domain or parseaddr(sender)[1].rpartition("@")[2]
    headers = {
        **fields.headers,
        "Message-ID": message_id(notification_id, domain),
        NOTIFICATION_ID_HEADER: str(notification_id),
    }
    email = EmailMultiAlternatives(
        subject=fields.subject,
        # An HTML-only payload makes an HTML-only email, not an empty text part beside the HTML.
        body=fields.body if fields.body is not None else fields.html or "",
        from_email=sender,
        to=[to],
        reply_to=fields.reply_to,
        headers=headers,
    )
    if fields.body is None:
        email.content_subtype = "html"
    elif fields.html is not None:
        email.attach_alternative(fields.html, "text/html")
    return email
