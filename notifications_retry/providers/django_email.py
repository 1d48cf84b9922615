"""Email through Django's own mail framework: SMTP, or any django-anymail ESP backend, unchanged.

Options (``ChannelConfig.options``):

* on Django 6.1 and later, ``mailer``: the alias of an entry of the ``MAILERS`` setting (default
  ``"default"``), whose ``BACKEND`` and ``OPTIONS`` build the connection (``mail.mailers``);
* before Django 6.1, ``backend``: dotted path of a Django email backend (default: the project's
  ``EMAIL_BACKEND``), and ``backend_options``: keyword arguments for that backend (``host``, ``port``,
  ``use_tls`` for SMTP; ``api_key``, ``server_token``, ``api_url``… for anymail);
* ``from_email``: the sender when the payload names none (default ``DEFAULT_FROM_EMAIL``);
* ``message_id_domain``: the right-hand side of the Message-ID (default the sender's domain).

Each Django version is given the key it builds connections with, so neither emits a deprecation
warning: Django 6.1 deprecates ``mail.get_connection()`` and ``EMAIL_BACKEND`` for ``MAILERS``, which
earlier versions do not have. The other version's key is refused with the key to use. The backend's
``timeout`` defaults to the channel's ``timeout_seconds`` (unless ``backend_options`` or the
``MAILERS`` entry's ``OPTIONS`` set one).

The payload's fields are :mod:`.email_message`'s; failures are classified by :mod:`.email_errors`.
The backends block, so the worker runs :meth:`send` on its thread pool, at most the channel's
``max_concurrency`` at once; every send opens its own connection (backends are not thread-safe).
"""

from __future__ import annotations

import contextlib
import smtplib
from collections.abc import Mapping
from typing import Any, ClassVar

import django
from django.conf import settings
from django.core import mail
from django.core.mail.backends.base import BaseEmailBackend
from django.utils.module_loading import import_string

from ..exceptions import PermanentProviderError, ProviderError
from . import email_errors, email_message
from .base import ChannelSettings, OutgoingMessage, Provider, SendResult
from .email_evidence import failure_evidence, sent_evidence, smtp_peer
from .email_message import InvalidEmailPayload, build_message

#: Django 6.1 builds email connections from the ``MAILERS`` setting (``mail.mailers``).
USES_MAILERS = django.VERSION[:2] >= (6, 1)
_COMMON_KEYS = frozenset({"from_email", "message_id_domain"})
MAILERS_KEYS = frozenset({"mailer"})
BACKEND_KEYS = frozenset({"backend", "backend_options"})
#: The option keys this Django version takes.
OPTION_KEYS = _COMMON_KEYS | (MAILERS_KEYS if USES_MAILERS else BACKEND_KEYS)
DEFAULT_MAILER = "default"
#: The metadata key of the notification id (``notifications_retry.tracking.METADATA_KEY``).
TRACKING_METADATA_KEY = "notification_id"
_DEFAULT_SMTP_BACKEND = "django.core.mail.backends.smtp.EmailBackend"


class DjangoEmailProvider(Provider):
    """Sends one email per notification with ``django.core.mail``; see the module's options."""

    key: ClassVar[str] = "django_email"
    required_payload_keys = email_message.REQUIRED_PAYLOAD_KEYS

    def __init__(self, channel: ChannelSettings) -> None:
        super().__init__(channel)
        options = channel.options
        self.from_email: str | None = options.get("from_email")
        self.message_id_domain: str | None = options.get("message_id_domain")

    @classmethod
    def options_problems(cls, options: Mapping[str, Any]) -> list[str]:
        problems = super().options_problems(options)
        if problems:
            return problems
        problems.extend(_version_key_problems(options))
        unknown = sorted(set(options) - OPTION_KEYS - MAILERS_KEYS - BACKEND_KEYS)
        if unknown:
            known = ", ".join(sorted(OPTION_KEYS))
            problems.append(f"django_email options {', '.join(unknown)} are unknown; known: {known}")
        if USES_MAILERS:
            problems.extend(_mailer_problems(options.get("mailer", DEFAULT_MAILER), "mailer" in options))
        else:
            problems.extend(_backend_option_problems(options))
        for name in ("from_email", "message_id_domain"):
            value = options.get(name)
            if value is not None and (not isinstance(value, str) or not value or "\n" in value):
                problems.append(f"django_email option {name!r} must be a one-line string, got {value!r}")
        return problems

    @classmethod
    def options_warnings(cls, options: Mapping[str, Any]) -> list[str]:
        """An anymail ESP backend whose settings (its credentials) are missing: every send would fail.

        The backend is built as a send builds it, with no connection opened: anymail reads its settings
        (``get_anymail_setting``) when a backend is made, and raises ``AnymailConfigurationError``
        naming the missing one. Other backends are not built here (one may connect or write files).
        """
        anymail_error = _anymail_configuration_error()
        if anymail_error is None or not _is_anymail_backend(_backend_class_path(options)):
            return []
        try:
            backend = _build_backend(options, timeout=None)
        except anymail_error as exc:
            return [f"{_backend_name(options)} is not configured: {' '.join(str(exc).split())}"]
        except Exception:  # not a credential: options_problems and the send report it
            return []
        with contextlib.suppress(Exception):
            backend.close()
        return []

    @classmethod
    def payload_problems(cls, payload: Mapping[str, Any]) -> list[str]:
        problem = email_message.payload_problem(payload)
        return [problem] if problem else []

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
            return _build_backend(self.channel.options, timeout=float(self.channel.timeout_seconds))
        except ProviderError:
            raise
        except Exception as exc:  # an unimportable path, an unknown mailer, options the backend refuses
            raise PermanentProviderError(
                f"{_backend_name(self.channel.options)} cannot be built: {exc}",
                kind="backend_config",
                ambiguous=False,
            ) from exc


def _build_backend(options: Mapping[str, Any], *, timeout: float | None) -> BaseEmailBackend:
    """The connection for a channel's options, as this Django version builds one (no deprecated call).

    ``timeout`` is the channel's: the backend's unless its own options set one.
    """
    if USES_MAILERS:
        alias = options.get("mailer") or DEFAULT_MAILER
        backend: BaseEmailBackend = mail.mailers[alias]
        entry = (_mailers_setting() or {}).get(alias)
        own = (entry.get("OPTIONS") if isinstance(entry, Mapping) else None) or {}
        # MAILERS builds the backend from its OPTIONS alone; the attribute is where SMTP and anymail
        # keep the timeout their constructor takes, read when a connection or request is made.
        if timeout is not None and "timeout" not in own and hasattr(backend, "timeout"):
            backend.timeout = timeout
        return backend
    kwargs = dict(options.get("backend_options") or {})
    if timeout is not None:
        kwargs.setdefault("timeout", timeout)
    return mail.get_connection(options.get("backend"), fail_silently=False, **kwargs)


def _backend_name(options: Mapping[str, Any]) -> str:
    if USES_MAILERS:
        return f"email mailer {options.get('mailer') or DEFAULT_MAILER!r}"
    return f"email backend {_backend_class_path(options)!r}"


def _backend_class_path(options: Mapping[str, Any]) -> str | None:
    """The dotted path of the backend class the options build; None when it cannot be known quietly."""
    if not USES_MAILERS:
        backend = options.get("backend")
        return backend if isinstance(backend, str) else str(settings.EMAIL_BACKEND)
    mailers = _mailers_setting()
    if mailers is None:
        return None  # the deprecated EMAIL_BACKEND: Django itself warns the project about it
    entry = mailers.get(options.get("mailer") or DEFAULT_MAILER)
    if not isinstance(entry, Mapping):
        return None
    return str(entry.get("BACKEND", _DEFAULT_SMTP_BACKEND))


def _mailers_setting() -> Mapping[str, Any] | None:
    """The MAILERS setting (Django 6.1+), None when the project does not define it."""
    mailers = getattr(settings, "MAILERS", None)
    return mailers if isinstance(mailers, Mapping) else None


def _anymail_configuration_error() -> type[Exception] | None:
    try:
        from anymail.exceptions import AnymailConfigurationError
    except ImportError:  # anymail is an optional extra
        return None
    error: type[Exception] = AnymailConfigurationError
    return error


def _is_anymail_backend(path: str | None) -> bool:
    if path is None:
        return False
    try:
        from anymail.backends.base import AnymailBaseBackend

        backend = import_string(path)
    except ImportError:
        return False
    return isinstance(backend, type) and issubclass(backend, AnymailBaseBackend)


def _version_key_problems(options: Mapping[str, Any]) -> list[str]:
    """The key of the other Django version, named with the one to use on this version."""
    version = django.get_version()
    if USES_MAILERS:
        used = sorted(BACKEND_KEYS & set(options))
        if used:
            return [
                f"django_email option{'s' if len(used) > 1 else ''} {' and '.join(map(repr, used))} "
                f"{'are' if len(used) > 1 else 'is'} for Django before 6.1; on Django {version} name an "
                "entry of the MAILERS setting in 'mailer' (its BACKEND and OPTIONS replace 'backend' "
                "and 'backend_options')"
            ]
        return []
    if "mailer" in options:
        return [
            "django_email option 'mailer' names an entry of the MAILERS setting, which needs Django 6.1 "
            f"or later; on Django {version} use 'backend' (and 'backend_options')"
        ]
    return []


def _mailer_problems(alias: object, named: bool) -> list[str]:
    """What stops the MAILERS entry a channel names (``named``), or the default one, from sending."""
    if not isinstance(alias, str) or not alias:
        return [f"django_email option 'mailer' must be the alias of a MAILERS entry, got {alias!r}"]
    which = f"option 'mailer' names {alias!r}" if named else f"a channel without 'mailer' uses {alias!r}"
    mailers = _mailers_setting()
    if mailers is None:
        # Without MAILERS, Django 6.1 still builds "default" from the deprecated EMAIL_* settings.
        return [] if alias == DEFAULT_MAILER else [f"django_email {which}, but MAILERS is not set"]
    if alias not in mailers:
        known = ", ".join(sorted(map(str, mailers)))
        return [f"django_email {which}, which is not in MAILERS (known: {known or 'none'})"]
    entry = mailers[alias]
    backend = entry.get("BACKEND", _DEFAULT_SMTP_BACKEND) if isinstance(entry, Mapping) else None
    if not isinstance(backend, str) or not backend:
        return [f"MAILERS[{alias!r}]['BACKEND'] must be a dotted path, got {backend!r}"]
    return _backend_problems(backend)


def _backend_option_problems(options: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
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
    return problems


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
