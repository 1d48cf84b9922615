"""Shared fixtures: a real PostgreSQL (pytest-django), an injected clock, a real HTTP server.

Also ``--bench-check``: the benchmark smoke tests are skipped without it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from notifications_retry.clock import ManualClock
from tests.support.http_server import ScriptedServer
from tests.support.opt_in import skip_unless_asked

BENCH_CHECK_ENV = "NR_BENCH_CHECK"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bench-check",
        action="store_true",
        default=False,
        help="Also run the benchmark commands' smoke tests (@pytest.mark.bench); or set NR_BENCH_CHECK=1.",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The benchmark smoke tests run ``bench/`` code: ``make bench-check``, not the default suite."""
    skip_unless_asked(
        config,
        items,
        marker="bench",
        option="--bench-check",
        env=BENCH_CHECK_ENV,
        reason="benchmark smoke test: run with --bench-check or NR_BENCH_CHECK=1 (make bench-check)",
    )


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


@pytest.fixture(scope="session", autouse=True)
def _close_forgotten_connections(request: pytest.FixtureRequest) -> Iterator[None]:
    """Before the test database is dropped: collect workers a test ticked without closing.

    A ``Worker`` holds its advisory lock on a connection of its own; tests that call ``tick()`` and
    drop the worker leave it to the garbage collector, which the database teardown must not outrun.
    """
    if any(item.get_closest_marker("django_db") for item in request.session.items):
        request.getfixturevalue("django_db_setup")
    yield
    gc.collect()


def allow_loopback(settings: Any) -> None:
    """Add 127.0.0.1 to ``WEBHOOK_ALLOWED_HOSTS`` in the test's settings, keeping the other keys."""
    current = dict(getattr(settings, "NOTIFICATIONS_RETRY", {}) or {})
    hosts = list(current.get("WEBHOOK_ALLOWED_HOSTS", ()))
    if "127.0.0.1" not in hosts:
        hosts.append("127.0.0.1")
    settings.NOTIFICATIONS_RETRY = {**current, "WEBHOOK_ALLOWED_HOSTS": hosts}
