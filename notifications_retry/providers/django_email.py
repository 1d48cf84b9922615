"""Email through Django's own mail framework: SMTP, or any django-anymail ESP backend, unchanged.

Options (``ChannelConfig.options``):

* ``backend``: dotted path of a Django email backend (default: the project's ``EMAIL_BACKEND``);
* ``backend_options``: keyword arguments for that backend (``host``, ``port``, ``use_tls`` for SMTP;
  ``api_key``, ``server_token``, ``api_url``… for anymail); ``timeout`` defaults to the channel's;
* ``from_email``: the sender when the payload names none (default ``DEFAULT_FROM_EMAIL``);
* ``message_id_domain``: the right-hand side of the Message-ID (default the sender's domain).

The payload's fields are :mod:`.email_message`'s; failures are classified by :mod:`.email_errors`.
The backends block, so the worker runs :meth:`send` on its thread pool, at most the channel's
``max_concurrency`` at once; every send opens its own connection (backends are not thread-safe).
"""

from __future__ import annotations

import contextlib
import smtplib
from collections.abc import Mapping
from typing import Any, ClassVar

from django.conf import settings
from django.core.mail import get_connection
from django.core.mail.backends.base import BaseEmailBackend
from django.utils.module_loading import import_string

from ..exceptions import PermanentProviderError, ProviderError
from . import email_errors
from .base import ChannelSettings, OutgoingMessage, Provider, SendResult
from .email_evidence import failure_evidence, sent_evidence, smtp_peer
from .email_message import InvalidEmailPayload, build_message

OPTION_KEYS = frozenset({"backend", "backend_options", "from_email", "message_id_domain"})
#: The metadata key of the notification id (``notifications_retry.tracking.METADATA_KEY``).
TRACKING_METADATA_KEY = "notification_id"


class DjangoEmailProvider(Provider):
    """Sends one email per notification with ``django.core.mail``; see the module's options."""

    key: ClassVar[str] = "django_email"

    def __init__(self, channel: ChannelSettings) -> None:
        super().__init__(channel)
        options = channel.options
        self.backend_path: str | None = options.get("backend")
        self.backend_options: dict[str, Any] = dict(options.get("backend_options") or {})
        # Passed to the backend: SMTP's socket timeout, anymail's requests timeout.
        self.backend_options.setdefault("timeout", float(channel.timeout_seconds))
        self.from_email: str | None = options.get("from_email")
        self.message_id_domain: str | None = options.get("message_id_domain")

    @classmethod
    def options_problems(cls, options: Mapping[str, Any]) -> list[str]:
        problems = super().options_problems(options)
        if problems:
            return problems
        unknown = sorted(set(options) - OPTION_KEYS)
        if unknown:
            known = ", ".join(sorted(OPTION_KEYS))
            problems.append(f"django_email options {', '.join(unknown)} are unknown; known: {known}")
        backend = options.get("backend")
        if backend is not None:
            if not isinstance(backend, str) or not backend:
                problems.append(f"django_email option 'backend' must be a dotted path, got {backend!r}")
            else:
                problems.extend(_backend_problems(backend))
        backend_options = options.get("backend_options", {})
        if not isinstance(backend_options, Mapping):
            problems.append("django_email option 'backend_options' must be an object of keyword arguments")
        elif "timeout" in backend_options and not _is_seconds(backend_options["timeout"]):
            problems.append(
                "django_email option 'backend_options.timeout' must be a number of seconds, "
                f"got {backend_options['timeout']!r}"
            )
        for name in ("from_email", "message_id_domain"):
            value = options.get(name)
            if value is not None and (not isinstance(value, str) or not value or "\n" in value):
                problems.append(f"django_email option {name!r} must be a one-line string, got {value!r}")
        return problems

    def send(self, message: OutgoingMessage) -> SendResult:
        """Build the email, open a connection, send; every failure classified by ``email_errors``."""
        try:
            email = build_message(
                message.notification_id,
                message.recipient,
                message.payload,
                default_from=self.from_email or settings.DEFAULT_FROM_EMAIL,
                message_id_domain=self.message_id_domain,
            )
        except InvalidEmailPayload as exc:
            raise PermanentProviderError(
                f"invalid email payload: {exc}", kind="invalid_payload", ambiguous=False
            ) from exc
        # anymail sends metadata to the ESP, which echoes it in its tracking events: the app's receiver
        # finds the notification by it (other backends ignore the attribute).
        email.metadata = {TRACKING_METADATA_KEY: str(message.notification_id)}  # type: ignore[attr-defined]
        backend = self._backend()
        phase: email_errors.Phase = "connect"
        failed = True
        peer: str | None = None
        try:
            backend.open()
            phase = "send"
            peer = smtp_peer(backend)  # read while the connection is open: the attempt's evidence
            sent = backend.send_messages([email])
            failed = False
        except Exception as exc:
            error = email_errors.classify(exc, phase)
            if error.evidence is None:
                error.evidence = failure_evidence(exc, peer)
            raise error from exc
        finally:
            _close(backend, failed)
        if not sent:
            # No error and nothing sent: a pre-send hook cancelled it, or the backend has no recipient.
            raise PermanentProviderError(
                "the email backend declined to send the message", kind="not_sent", ambiguous=False
            )
        return SendResult(
            provider_message_id=_provider_message_id(email), evidence=sent_evidence(email, peer)
        )

    def _backend(self) -> BaseEmailBackend:
        try:
            return get_connection(self.backend_path, fail_silently=False, **self.backend_options)
        except ProviderError:
            raise
        except Exception as exc:  # an unimportable path or options the backend refuses
            raise PermanentProviderError(
                f"email backend {self.backend_path or settings.EMAIL_BACKEND!r} cannot be built: {exc}",
                kind="backend_config",
                ambiguous=False,
            ) from exc


def _is_seconds(value: object) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool) and value >= 0)


def _backend_problems(path: str) -> list[str]:
    try:
        backend = import_string(path)
    except (ImportError, ValueError) as exc:  # ValueError: an empty module name (".x")
        return [f"django_email backend {path!r} cannot be imported: {exc}"]
    if not (isinstance(backend, type) and issubclass(backend, BaseEmailBackend)):
        return [f"django_email backend {path!r} is not a Django email backend class"]
    return []


def _close(backend: BaseEmailBackend, failed: bool) -> None:
    """Close the connection; after a failure, drop an SMTP socket without the polite QUIT.

    A server that hung or dropped us would make QUIT wait a whole timeout again, or raise over the
    error that matters.
    """
    connection = getattr(backend, "connection", None)
    if failed and isinstance(connection, smtplib.SMTP):
        with contextlib.suppress(OSError):
            connection.close()
        backend.connection = None  # type: ignore[attr-defined]
    with contextlib.suppress(Exception):
        backend.close()


def _provider_message_id(email: Any) -> str:
    """The ESP's id when anymail reports one, else the Message-ID this provider set."""
    status = getattr(email, "anymail_status", None)
    esp_id = getattr(status, "message_id", None)
    if isinstance(esp_id, str) and esp_id:
        return esp_id[:255]
    return str(email.extra_headers["Message-ID"])[:255]
