"""Mask recipients (emails, phone numbers, device tokens, URLs) for lists and logs.

The admin shows :func:`mask_recipient` everywhere except the detail page of a user holding the
``view_recipient`` permission; logs use it unconditionally. Masking keeps just enough to tell two
recipients apart while triaging (first character, the domain's first letter and TLD, the last two
digits of a phone number, a token's first four characters), never enough to contact anyone.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

__all__ = ["mask_recipient"]

MASK = "***"
_PHONE = re.compile(r"^\+?[\d\s().-]{6,}$")


def _mask_email(value: str) -> str:
    local, _, domain = value.rpartition("@")
    head = local[:1] if local else ""
    name, dot, tld = domain.rpartition(".")
    if not dot or not name:
        return f"{head}{MASK}@{MASK}"
    return f"{head}{MASK}@{name[:1]}{MASK}.{tld}"


def _mask_phone(value: str) -> str:
    digits = re.sub(r"\D", "", value)
    prefix = "+" if value.lstrip().startswith("+") else ""
    return f"{prefix}{'*' * max(len(digits) - 2, 3)}{digits[-2:]}"


def _mask_url(value: str) -> str:
    parts = urlsplit(value)
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}/{MASK}" if host else MASK


def mask_recipient(value: str) -> str:
    """A recipient with its identifying part hidden; never raises, never returns the input whole."""
    if value is None:  # defensive: log call sites pass whatever they hold
        return ""
    text = str(value).strip()
    if not text:
        return ""
    if "://" in text:
        return _mask_url(text)
    if "@" in text:
        return _mask_email(text)
    if _PHONE.match(text) and sum(c.isdigit() for c in text) >= 6:
        return _mask_phone(text)
    if len(text) <= 6:
        return MASK
    # Opaque tokens (push device tokens, user ids): a short prefix and the length.
    return f"{text[:4]}{MASK}({len(text)})"
