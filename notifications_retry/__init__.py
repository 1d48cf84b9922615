"""notifications_retry: a PostgreSQL-backed retry worker for Django notifications.

The public API is re-exported here but imported on first use: ``import notifications_retry`` (as
Django does while reading ``INSTALLED_APPS``) must not load models before the app registry is ready.
The public names are listed in docs/contract.md.

Modules: :mod:`.api` (the monolith's entry points) with :mod:`.direct_send` (``send_now``'s work),
:mod:`.tracking` (ESP events from anymail's tracking signal), :mod:`.housekeeping`, :mod:`.checks`
(system checks), :mod:`.apps`, :mod:`.exceptions` (the app's errors, and reading an exception),
:mod:`.signals` and :mod:`.version`.

Folders: :mod:`.conf` (the ``NOTIFICATIONS_RETRY`` settings and their ranges), :mod:`.models` (the
tables), :mod:`.delivery` (the only writer of notification and outbox rows), :mod:`.engine`
(``retry_worker``), :mod:`.providers`, :mod:`.outbox` (the relay and its publishers), :mod:`.rules`
(the rules of delivery, pure), :mod:`.inputs` (what callers hand the app, validated),
:mod:`.database` (the lock's connection, the triggers), :mod:`.runtime` (clock, event loop,
deadlines), :mod:`.admin`, :mod:`.observability`, :mod:`.management` (the commands),
:mod:`.migrations`. pyproject.toml's import contracts place each of them in a layer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .version import __version__

if TYPE_CHECKING:
    from notifications_retry.inputs.validation import InvalidNotification

    from .api import (
        CANCELLED,
        QueueStats,
        TriageResult,
        cancel_notification,
        create_notification,
        discard_dead_letters,
        is_suppressed,
        notification_created,
        queue_stats,
        record_dispatch_failure,
        record_dispatch_sent,
        requeue_dead_letters,
        schedule_notification,
        send_now,
        suppress,
        unsuppress,
    )
    from .exceptions import (
        ChannelConfigurationError,
        InvalidTransition,
        NotificationsRetryError,
        PermanentProviderError,
        ProviderError,
        ProviderThrottled,
        RetryableProviderError,
    )

_EXPORTS: dict[str, str] = {
    "CANCELLED": "api",
    "QueueStats": "api",
    "TriageResult": "api",
    "cancel_notification": "api",
    "create_notification": "api",
    "discard_dead_letters": "api",
    "notification_created": "api",
    "queue_stats": "api",
    "requeue_dead_letters": "api",
    "schedule_notification": "api",
    "record_dispatch_sent": "api",
    "record_dispatch_failure": "api",
    "send_now": "api",
    "suppress": "api",
    "unsuppress": "api",
    "is_suppressed": "api",
    "InvalidNotification": "inputs.validation",
    "ChannelConfigurationError": "exceptions",
    "InvalidTransition": "exceptions",
    "NotificationsRetryError": "exceptions",
    "PermanentProviderError": "exceptions",
    "ProviderError": "exceptions",
    "ProviderThrottled": "exceptions",
    "RetryableProviderError": "exceptions",
}

__all__ = [
    "CANCELLED",
    "ChannelConfigurationError",
    "InvalidNotification",
    "InvalidTransition",
    "NotificationsRetryError",
    "PermanentProviderError",
    "ProviderError",
    "ProviderThrottled",
    "QueueStats",
    "RetryableProviderError",
    "TriageResult",
    "__version__",
    "cancel_notification",
    "create_notification",
    "discard_dead_letters",
    "is_suppressed",
    "notification_created",
    "queue_stats",
    "record_dispatch_failure",
    "record_dispatch_sent",
    "requeue_dead_letters",
    "schedule_notification",
    "send_now",
    "suppress",
    "unsuppress",
]


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first access (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
