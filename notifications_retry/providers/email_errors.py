"""Every failure of a Django mail backend, classified in one place (docs/providers.md, "Email").

Two families reach here: ``smtplib`` errors (Django's SMTP backend, and any backend built on it) and
django-anymail errors (every ESP backend). Rules:

* an SMTP reply decides by its code: 4xx retriable, 5xx permanent; its enhanced status code
  (``5.1.1``) is kept in the message; a 5xx whose enhanced status says the mailbox itself is gone
  (``5.1.1`` bad address, ``5.1.10`` null MX, ``5.2.1`` disabled) is ``mailbox_unavailable``, which also
  puts the address on the suppression list;
* no usable reply (refused, DNS, timeout, dropped connection) is retriable;
* an ESP's HTTP answer decides as for the webhook: 429 throttled and 503 with ``Retry-After``,
  other 5xx and 408 retriable, any other 4xx permanent; all recipients refused is permanent.

Each error also says whether it is *ambiguous* (the mail may be out all the same): only failures
before the server took responsibility for the message are unambiguous. For SMTP that is anything
raised while connecting and logging in, and any reply refusing the transaction (the server accepts
a message only with the 250 after its data); a dropped connection or a timeout once the transaction
has started is ambiguous.
"""

from __future__ import annotations

import re
import smtplib
import socket
from typing import Literal

from notifications_retry.exceptions import causes
from notifications_retry.rules.outcomes import MAILBOX_UNAVAILABLE as MAILBOX_UNAVAILABLE_KIND

from ..exceptions import PermanentProviderError, ProviderError, RetryableProviderError
from .http_status import status_error

#: Where the failure happened: opening the connection (connect, EHLO, STARTTLS, login) or sending.
Phase = Literal["connect", "send"]

_ENHANCED_STATUS = re.compile(r"^\s*([245]\.\d{1,3}\.\d{1,3})\b")

#: Enhanced status codes (RFC 3463, RFC 7505) that name the recipient's mailbox as gone for good.
MAILBOX_GONE = frozenset({"5.1.1", "5.1.10", "5.2.1"})
#: The error kind of such a reply (``notifications_retry.rules.outcomes.MAILBOX_UNAVAILABLE``).
MAILBOX_UNAVAILABLE = MAILBOX_UNAVAILABLE_KIND


def enhanced_status(text: str) -> str | None:
    """The RFC 3463 enhanced status code at the start of an SMTP reply's text, if any."""
    match = _ENHANCED_STATUS.match(text)
    return match.group(1) if match else None


def _reply_text(raw: bytes | str) -> str:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    return " ".join(text.split())[:300]


def smtp_reply_error(code: int, raw: bytes | str, where: str) -> ProviderError:
    """An SMTP reply that refused the message: 4xx retriable, 5xx permanent; never ambiguous."""
    text = _reply_text(raw)  # the enhanced status code (5.1.1) leads the text: kept whole
    reason = f"SMTP {code} at {where}: {text}" if text else f"SMTP {code} at {where}"
    if 400 <= code < 500:
        error: ProviderError = RetryableProviderError(reason, kind="smtp_4xx", ambiguous=False)
    elif 500 <= code < 600:
        # Only a reply to the recipient or its message speaks of the recipient's mailbox (at MAIL FROM a
        # 5.1.x names the sender).
        gone = where in ("RCPT TO", "DATA") and enhanced_status(text) in MAILBOX_GONE
        kind = MAILBOX_UNAVAILABLE if gone else "smtp_5xx"
        error = PermanentProviderError(reason, kind=kind, ambiguous=False)
    else:  # not a refusal code at all: the conversation went wrong, try again later
        error = RetryableProviderError(reason, kind="smtp_protocol", ambiguous=False)
    return error


def _classify_smtp(exc: smtplib.SMTPException, phase: Phase) -> ProviderError:
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        # Every recipient refused (one, here): the worst reply decides, a 5xx over a 4xx.
        replies = sorted(exc.recipients.values(), key=lambda reply: -reply[0])
        code, raw = replies[0] if replies else (451, b"recipient refused")
        return smtp_reply_error(code, raw, "RCPT TO")
    if isinstance(exc, smtplib.SMTPResponseException):
        where = {
            smtplib.SMTPConnectError: "connect",
            smtplib.SMTPHeloError: "EHLO",
            smtplib.SMTPAuthenticationError: "AUTH",
            smtplib.SMTPSenderRefused: "MAIL FROM",
            smtplib.SMTPDataError: "DATA",
        }.get(type(exc), "connect" if phase == "connect" else "send")
        return smtp_reply_error(exc.smtp_code, exc.smtp_error, where)
    if isinstance(exc, smtplib.SMTPServerDisconnected) and isinstance(exc.__context__, TimeoutError):
        # smtplib reports a read that timed out as a disconnection; the timeout is its context.
        return _classify_os_error(exc.__context__, phase)
    if isinstance(exc, smtplib.SMTPServerDisconnected):
        return RetryableProviderError(
            f"SMTP server closed the connection: {exc}", kind="connection", ambiguous=phase != "connect"
        )
    if isinstance(exc, smtplib.SMTPNotSupportedError):
        return PermanentProviderError(
            f"SMTP server lacks a needed extension: {exc}", kind="smtp_config", ambiguous=phase != "send"
        )
    return RetryableProviderError(
        f"SMTP error: {type(exc).__name__}: {exc}", kind="smtp_protocol", ambiguous=phase != "connect"
    )


def _classify_os_error(exc: OSError, phase: Phase) -> ProviderError:
    if isinstance(exc, TimeoutError | socket.timeout):
        return RetryableProviderError(
            f"mail server did not answer in time ({phase}): {exc}",
            kind="timeout",
            ambiguous=phase != "connect",
        )
    if isinstance(exc, socket.gaierror):
        return RetryableProviderError(
            f"mail server name does not resolve: {exc}", kind="dns", ambiguous=False
        )
    if isinstance(exc, ConnectionRefusedError):
        return RetryableProviderError(
            f"mail server refused the connection: {exc}", kind="connection", ambiguous=False
        )
    return RetryableProviderError(
        f"mail connection failed ({phase}): {type(exc).__name__}: {exc}",
        kind="connection",
        ambiguous=phase != "connect",
    )


def _connect_failed(exc: BaseException) -> bool:
    """Whether a transport error happened before any byte of the request could reach the ESP."""
    connect_errors = {"ConnectTimeout", "NewConnectionError", "NameResolutionError", "ConnectionRefusedError"}
    return any(connect_errors & {cls.__name__ for cls in type(e).__mro__} for e in causes(exc))


def _anymail_error(exc: Exception) -> bool:
    try:
        from anymail.exceptions import AnymailError
    except ImportError:  # anymail is optional: without it no backend can raise its errors
        return False
    return isinstance(exc, AnymailError)


def _classify_anymail(exc: Exception) -> ProviderError:
    from anymail.exceptions import (
        AnymailInvalidAddress,
        AnymailRecipientsRefused,
        AnymailSerializationError,
        AnymailUnsupportedFeature,
    )

    summary = " ".join(str(exc).split())[:300]
    if isinstance(exc, AnymailRecipientsRefused):
        return PermanentProviderError(
            f"ESP refused the recipient: {summary}", kind="recipients_refused", ambiguous=False
        )
    if isinstance(exc, AnymailInvalidAddress | AnymailUnsupportedFeature | AnymailSerializationError):
        return PermanentProviderError(
            f"ESP cannot send this message: {summary}", kind="invalid_payload", ambiguous=False
        )
    status = getattr(exc, "status_code", None)
    response = getattr(exc, "response", None)
    if isinstance(status, int):
        headers = getattr(response, "headers", None)
        retry_after = headers.get("Retry-After") if headers is not None else None
        return status_error(status, retry_after, f"ESP answered HTTP {status}: {summary}")
    if _connect_failed(exc):
        return RetryableProviderError(f"cannot reach the ESP: {summary}", kind="connection", ambiguous=False)
    names = {cls.__name__ for cls in type(exc).__mro__}
    kind = "timeout" if names & {"Timeout", "ReadTimeout"} else "connection"
    return RetryableProviderError(f"ESP call failed: {summary}", kind=kind)


def classify(exc: Exception, phase: Phase) -> ProviderError:
    """The classified error for anything a mail backend raised (the cause is kept by the caller)."""
    if isinstance(exc, ProviderError):
        return exc
    if _anymail_error(exc):
        return _classify_anymail(exc)
    if isinstance(exc, smtplib.SMTPException):
        return _classify_smtp(exc, phase)
    if isinstance(exc, OSError):
        return _classify_os_error(exc, phase)
    # A backend this module does not know: nothing says it was refused, so retry it (and flag it).
    return RetryableProviderError(f"mail backend failed: {type(exc).__name__}: {exc}", kind="backend_error")
