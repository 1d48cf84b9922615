"""The evidence of an email attempt: the SMTP reply (code, enhanced status, text) or the ESP's answer.

``status_code`` holds the SMTP reply code (``250`` once the server took the message, ``550`` for a
refused recipient) or the ESP's HTTP status; ``response_excerpt`` the reply's text, which starts with
its RFC 3463 enhanced status (``5.1.1 user unknown``), or the ESP's answer; ``remote_addr`` the mail
server's address for SMTP (an ESP's HTTP client does not tell which address it reached).
"""

from __future__ import annotations

import smtplib
from typing import Any

from notifications_retry.rules.outcomes import NO_ANSWER, Evidence, answer_text

__all__ = ["failure_evidence", "sent_evidence", "smtp_peer"]

#: What smtplib's sendmail means by success: DATA answered 250 (anything else raises).
SMTP_ACCEPTED = 250


def smtp_peer(backend: Any) -> str | None:
    """The address of an open SMTP backend's connection; None for other backends or a closed one."""
    connection = getattr(backend, "connection", None)
    sock = getattr(connection, "sock", None) if isinstance(connection, smtplib.SMTP) else None
    try:
        return str(sock.getpeername()[0]) if sock is not None else None
    except OSError:
        return None


def _esp_response(obj: Any) -> tuple[int | None, str]:
    """The HTTP status and text of an ESP's answer (a requests ``Response``), when there is one."""
    status = getattr(obj, "status_code", None)
    text = getattr(obj, "text", "")
    return (status if isinstance(status, int) else None), (text if isinstance(text, str) else "")


def sent_evidence(email: Any, peer: str | None) -> Evidence:
    """A delivered email: the ESP's status (its body is not kept), else SMTP's 250."""
    status = getattr(email, "anymail_status", None)
    code, _ = _esp_response(getattr(status, "esp_response", None))
    if code is not None:
        return Evidence(code, "", None)
    if peer is not None:
        return Evidence(SMTP_ACCEPTED, "", peer)
    return NO_ANSWER  # a backend that says nothing (console, locmem, a project's own)


def failure_evidence(exc: BaseException, peer: str | None) -> Evidence:
    """What the server or ESP answered before ``exc``; no status when nothing answered."""
    code: int | None = None
    text: bytes | str = ""
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        replies = sorted(exc.recipients.values(), key=lambda reply: -reply[0])
        if replies:
            code, text = replies[0]
    elif isinstance(exc, smtplib.SMTPResponseException):
        code, text = exc.smtp_code, exc.smtp_error
    else:
        code, text = _esp_response(getattr(exc, "response", None))
        status = getattr(exc, "status_code", None)
        code = status if isinstance(status, int) else code
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return Evidence(code, answer_text(" ".join(text.split())), peer)
