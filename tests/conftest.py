"""Shared fixtures: a real PostgreSQL (pytest-django), an injected clock, a real HTTP server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from notifications_retry.clock import ManualClock
from tests.support.http_server import ScriptedServer


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def webhook_server() -> Iterator[ScriptedServer]:
    server = ScriptedServer().start()
    yield server
    server.stop()
