"""The example project's own app: it only carries the ``demo`` command."""

from __future__ import annotations

from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "example_project.demo"
    label = "demo"
    verbose_name = "notifications_retry demo"
