"""Recipients as the suppression list stores them: one pure function, used on every side of the check.

An email address compares as the ESPs compare it: whole, without case (``Ann@Example.COM`` and
``ann@example.com`` are one mailbox to Postmark, Mailgun, SES and SendGrid, and to their own
suppression lists), its surrounding whitespace and display name dropped. A recipient that is not an
email address (a phone number, a device token, a user id) is kept verbatim: a push token or a user id
may tell its cases apart, and nothing reports on those channels with another spelling. The worker's
claim, the requeue, the API, the admin and the ESP receiver all normalize through here, so a
suppression written by one is found by the others. Only the comparison uses this form: a notification
is still sent to its recipient as written.
"""

from __future__ import annotations

import re
from email.utils import parseaddr

#: Characters that only a display name, a comment or a quoted local part brings: such a recipient is
#: read by the email package's parser; any other is split at its last ``@`` (the claim normalizes a
#: whole batch of recipients, and the parser costs about 30 times as much).
_NEEDS_PARSER = re.compile(r'[<>"(),;]')
_SPACE = re.compile(r"\s")


def _split(recipient: str) -> tuple[str, str] | None:
    """(local part, domain) of an email address, or None for anything else."""
    text = recipient.strip()
    if _NEEDS_PARSER.search(text):
        _, text = parseaddr(text)
    local, at, domain = text.rpartition("@")
    if not (at and local and domain) or "@" in local or _SPACE.search(text):
        return None
    return local, domain


def is_email_address(recipient: str) -> bool:
    """Whether ``recipient`` reads as one email address (``local@domain``, maybe with a display name)."""
    return _split(recipient) is not None


def normalize_recipient(recipient: str) -> str:
    """The form the suppression list stores and compares: an email address case-folded whole, else verbatim.

    ``"Ann <Ann@Example.COM>"`` and ``" ann@example.com "`` become ``"ann@example.com"``;
    ``"+15551234567"`` and ``"device-Token"`` stay as they are.
    """
    if not isinstance(recipient, str):
        raise TypeError(f"recipient must be a string, got {type(recipient).__name__}")
    parts = _split(recipient)
    if parts is None:
        return recipient
    return f"{parts[0]}@{parts[1]}".casefold()


__all__ = ["is_email_address", "normalize_recipient"]
