"""Shared fixtures: a real PostgreSQL (pytest-django), an injected clock, a real HTTP server.

Also ``--bench-check``: the benchmark smoke tests are skipped without it.
"""

from __future__ import annotations

import gc
import ipaddress
import signal
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from notifications_retry.runtime.clock import ManualClock
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


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as at a terminal. A run started in the background by a non-interactive shell
    (``bash .ci/run &``) inherits SIGINT ignored, and every process the tests start would inherit it
    too: a server the tests stop with Ctrl-C's SIGINT (``demo_admin``, ``runserver``) would then run on.
    Python's own handler is put back, so the processes the tests start get SIGINT's default."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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


#: Names the tests may resolve for real: they answer from the machine itself.
LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


@pytest.fixture(autouse=True)
def _no_public_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests talk to loopback only, DNS included: a lookup of any other name fails at once.

    Channels in tests name public-looking hosts (``hooks.example.com``), which model validation and
    ``check`` look up; without this the lookup would go to the machine's resolver. A test that needs
    a name to resolve installs its own ``getaddrinfo`` over this one.
    """
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name is None or str(name).lower() in LOCAL_NAMES or _is_address(str(name)):
            return real(host, *args, **kwargs)
        raise socket.gaierror(socket.EAI_NONAME, f"tests resolve no public name ({name})")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture(autouse=True)
def _signal_handlers_restored() -> Iterator[None]:
    """A command run in process (``call_command("retry_worker")``, ``outbox_relay``) installs its SIGINT
    and SIGTERM handlers in the test process: they are put back after each test, so Ctrl-C still stops
    the run and no later test meets a stopped worker's handler."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        if signal.getsignal(sig) is not handler and handler is not None:
            signal.signal(sig, handler)


def _is_address(name: str) -> bool:
    """An IP address in any spelling the resolver reads without a lookup (``127.1``, ``0x7f.1`` too)."""
    try:
        ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        try:
            socket.inet_aton(name)
        except (OSError, ValueError):
            return False
    return True


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
