"""notifications_retry: a PostgreSQL-backed retry worker for Django notifications.

The public API is re-exported here but imported on first use: ``import notifications_retry`` (as
Django does while reading ``INSTALLED_APPS``) must not load models before the app registry is ready.
The public names are listed in docs/contract.md.

Packages: :mod:`.models` (the tables), :mod:`.delivery` (the only writer of notification and outbox
rows), :mod:`.engine` (``retry_worker``), :mod:`.providers`, :mod:`.outbox` (the relay and its
publishers), :mod:`.admin`, :mod:`.observability`, :mod:`.management` (the commands), :mod:`.migrations`.

Modules: :mod:`.api` (the monolith's entry points) with :mod:`.direct_send` (``send_now``'s work),
:mod:`.tracking` (ESP events from anymail's tracking signal), :mod:`.housekeeping`, :mod:`.checks`
(system checks), :mod:`.apps`, :mod:`.conf` (the ``NOTIFICATIONS_RETRY`` settings) with :mod:`.bounds` (their
ranges) and :mod:`.lanes`, :mod:`.locks` (the cycle's advisory lock), :mod:`.outcomes` (one pure
``decide``), :mod:`.retry` (backoff), :mod:`.events` and :mod:`.event_ids` (the outbox event),
:mod:`.validation` (input checks), :mod:`.arguments` (the API's other arguments, by type),
:mod:`.recovery_filter` (a recovery job's filter),
:mod:`.url_policy` (where a webhook may post), :mod:`.evidence` (what an attempt's answer left),
:mod:`.health_rules` (endpoint health, one pure decision), :mod:`.db_rules` (the triggers' SQL),
:mod:`.channel_settings`, :mod:`.clock`, :mod:`.deadlines` (a call's deadline that a paused process
does not turn into a timeout), :mod:`.exceptions`, :mod:`.exception_chain`,
:mod:`.signals`, :mod:`.tcp_settings`, :mod:`.version`, :mod:`.addresses` (recipients as the
suppression list stores them), :mod:`.asyncio_bridge` (the one loop on a thread, and running a
coroutine from synchronous code), :mod:`.heap` (the worker process's garbage collector, set for a
long run). pyproject.toml's import contracts place each of them in a layer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .version import __version__

if TYPE_CHECKING:
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
    from .validation import InvalidNotification

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
    "InvalidNotification": "validation",
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
