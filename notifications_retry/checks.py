"""System checks ``notifications_retry.E00x`` / ``W00x``."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, register
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from .conf import get_settings, settings_problems


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E001: settings of the wrong type or range; E002: PostgreSQL is required."""
    messages: list[CheckMessage] = []
    try:
        conf = get_settings()
    except (ImproperlyConfigured, TypeError) as exc:
        return [Error(str(exc), id="notifications_retry.E001")]
    for problem in settings_problems(conf):
        messages.append(Error(f"NOTIFICATIONS_RETRY: {problem}", id="notifications_retry.E001"))
    alias = conf.LOCK_DATABASE_ALIAS
    for name in {"default", alias}:
        if name not in connections.settings:
            messages.append(Error(f"database alias {name!r} is not in DATABASES", id="notifications_retry.E002"))
            continue
        if connections[name].vendor != "postgresql":
            messages.append(
                Error(
                    f"notifications_retry requires PostgreSQL (advisory locks, SKIP LOCKED, triggers); "
                    f"database {name!r} is {connections[name].vendor}",
                    id="notifications_retry.E002",
                )
            )
    return messages
