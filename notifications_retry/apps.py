"""App configuration: registers system checks; starts nothing (no exporter, no threads)."""

from __future__ import annotations

from django.apps import AppConfig


class NotificationsRetryConfig(AppConfig):
    name = "notifications_retry"
    label = "notifications_retry"
    verbose_name = "Notification retries"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the checks)
