"""Shared fixtures: a real PostgreSQL (pytest-django), an injected clock, a real HTTP server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from notifications_retry.clock import ManualClock
from tests.support.http_server import ScriptedServer


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def webhook_server(settings: Any) -> Iterator[ScriptedServer]:
    """A scripted receiver on 127.0.0.1, allowlisted (the URL policy refuses loopback otherwise).

    A test that replaces ``NOTIFICATIONS_RETRY`` afterwards keeps the allowlist with
    ``allow_loopback(settings)``.
    """
    allow_loopback(settings)
    server = ScriptedServer().start()
    yield server
    server.stop()


def allow_loopback(settings: Any) -> None:
    """Add 127.0.0.1 to ``WEBHOOK_ALLOWED_HOSTS`` in the test's settings, keeping the other keys."""
    current = dict(getattr(settings, "NOTIFICATIONS_RETRY", {}) or {})
    hosts = list(current.get("WEBHOOK_ALLOWED_HOSTS", ()))
    if "127.0.0.1" not in hosts:
        hosts.append("127.0.0.1")
    settings.NOTIFICATIONS_RETRY = {**current, "WEBHOOK_ALLOWED_HOSTS": hosts}
