"""App configuration: registers system checks and the anymail tracking receiver; starts nothing (no
exporter, no threads)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.apps import AppConfig


class NotificationsRetryConfig(AppConfig):
    name = "notifications_retry"
    label = "notifications_retry"
    verbose_name = "Notification retries"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Each module by a name of its own: ``from . import checks`` would first ask the package for an
        # attribute ``checks``, running its lazy export of the public names (``__getattr__``) for nothing.
        from .checks import check_settings  # noqa: F401  (importing the module registers the checks)

        # ESP events (bounces, complaints, delivery) reach the suppression list and delivery status
        # through anymail's tracking signal, when anymail is installed; the receiver is defined in
        # ``tracking`` and connected here, where Django's start-up connects an app's receivers.
        try:
            from anymail.signals import tracking
        except ImportError:
            return
        from .tracking import DISPATCH_UID, on_tracking

        tracking.connect(on_tracking, dispatch_uid=DISPATCH_UID)

    def channel_problems(self, provider_key: str, options: Mapping[str, Any]) -> list[str]:
        """What stops a channel with this provider and these options from sending; empty when it can work."""
        from .providers import channel_problems

        return channel_problems(provider_key, options)
