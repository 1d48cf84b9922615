"""A notification's payload as an email: the documented fields, validated, and its stable Message-ID.

The payload of a notification sent by the ``django_email`` provider is a JSON object:

============  ========================  ====================================================
key           type                      meaning
============  ========================  ====================================================
subject       string, required          the Subject header (one line)
body          string, required          the plain-text body
html          string                    an HTML alternative of the body
from          string                    the sender; default the channel's ``from_email``
                                        option, then ``DEFAULT_FROM_EMAIL``
reply_to      string or list of strings Reply-To addresses
headers       object of string→string   extra headers (not Message-ID / X-Notification-Id)
============  ========================  ====================================================

The recipient is the notification's ``recipient``. Anything else in the payload is refused, so a
misspelt key fails loudly instead of sending a mail without its HTML part.
"""

from __future__ import annotations

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


def build_message(
    notification_id: uuid.UUID,
    recipient: str,
    payload: Any,
    *,
    default_from: str,
    message_id_domain: str | None,
) -> EmailMultiAlternatives:
    """The email for one notification, identical at every attempt; InvalidEmailPayload when it cannot be."""
    if not isinstance(payload, Mapping):
        raise InvalidEmailPayload(f"the payload must be a JSON object, got {_describe(payload)}")
    unknown = sorted(str(k) for k in set(payload) - PAYLOAD_KEYS)
    if unknown:
        raise InvalidEmailPayload(
            f"unknown payload key(s) {', '.join(unknown)}; known: {', '.join(sorted(PAYLOAD_KEYS))}"
        )
    subject = _one_line("subject", payload.get("subject"), required=True)
    body = payload.get("body")
    if not isinstance(body, str):
        raise InvalidEmailPayload(f"'body' must be a string, got {_describe(body)}")
    html = payload.get("html")
    if html is not None and not isinstance(html, str):
        raise InvalidEmailPayload(f"'html' must be a string, got {_describe(html)}")
    sender = _address("from", payload.get("from") or default_from)
    reply_to_value = payload.get("reply_to")
    reply_to_list = [reply_to_value] if isinstance(reply_to_value, str) else reply_to_value
    if reply_to_list is not None and not isinstance(reply_to_list, list):
        raise InvalidEmailPayload(f"'reply_to' must be a string or a list, got {_describe(reply_to_value)}")
    reply_to = [_address("reply_to", item) for item in reply_to_list or []]
    to = _address("recipient", recipient)
    domain = message_id_domain or parseaddr(sender)[1].rpartition("@")[2]
    headers = {
        **_headers(payload.get("headers")),
        "Message-ID": message_id(notification_id, domain),
        NOTIFICATION_ID_HEADER: str(notification_id),
    }
    email = EmailMultiAlternatives(
        subject=subject or "", body=body, from_email=sender, to=[to], reply_to=reply_to, headers=headers
    )
    if html is not None:
        email.attach_alternative(html, "text/html")
    return email
