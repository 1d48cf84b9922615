"""No channel row stops the worker: whatever raw SQL writes into ``options`` or ``provider_key``.

A bad migration, a restore or a hand-written UPDATE can put any JSON in a channel's options. Every path
that reads them (the system check, the worker's channel load, the send) turns what the provider's checks
raise into a problem of that channel alone: it waits as a disabled one does, and the others keep sending.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from notifications_retry.checks import check_channels
from notifications_retry.engine.worker import Worker
from notifications_retry.models import ChannelConfig, NotificationEntity
from notifications_retry.providers import BUILTIN_PROVIDERS, Provider
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.mailers import USES_MAILERS

ROOT = Path(__file__).resolve().parents[2]
Status = NotificationEntity.Status
#: The options that stopped every delivery: urlsplit raises on an unclosed IPv6 bracket.
UNPARSABLE_URL = {"url": "http://[::1"}

# JSON as jsonb stores it: no NaN or infinities, no NUL character.
_text = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=30)
_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _text
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)
#: URL-shaped text: pieces of hosts, brackets, ports and credentials after a scheme; any host but
#: 127.0.0.1 is refused by the allowlist before a connection, and nothing listens on its port 9.
_url_pieces = [
    "[",
    "]",
    "::1",
    "127.0.0.1",
    ":",
    ":9",
    ":99999",
    ":-1",
    "%",
    "@",
    "u:p@",
    "/",
    "?",
    "#",
    "a",
    ".",
]
_url = st.tuples(
    st.sampled_from(["http://", "https://", "ftp://", "http:", ""]),
    st.lists(st.sampled_from(_url_pieces), min_size=1, max_size=6).map("".join),
).map("".join)
#: Keys every built-in provider reads, so the values reach the code that uses them.
_known_keys = ["url", "headers", "secret", "fail", "fail_recipients", "delay_seconds", "backend", "mailer"]
#: Options shaped like what each built-in provider reads, drawn three times as often as any JSON.
_shaped = {
    "webhook": st.fixed_dictionaries({"url": _url}, optional={"headers": _json, "secret": _json}),
    "stub": st.fixed_dictionaries(
        {}, optional={"fail": _json, "fail_recipients": _json, "delay_seconds": _json}
    ),
    "django_email": st.fixed_dictionaries(
        {},
        optional={"backend": _json | _url, "backend_options": _json, "mailer": _json, "from_email": _json},
    ),
    "in_app": st.dictionaries(_text, _json, max_size=3),
}
_any_options = _json | st.dictionaries(st.sampled_from(_known_keys), _json, max_size=4)


def _options(provider_key: str | None) -> st.SearchStrategy[Any]:
    shaped = st.one_of(*_shaped.values()) if provider_key is None else _shaped[provider_key]
    return st.one_of(shaped, shaped, shaped, _any_options)


def _write_raw(key: str, provider_key: str, options: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE notifications_retry_channelconfig SET provider_key = %s, options = %s::jsonb "
            "WHERE key = %s",
            [provider_key, json.dumps(options), key],
        )


def _due(channel: ChannelConfig, n: int) -> list[NotificationEntity]:
    now = timezone.now()
    return [
        NotificationFactory(
            channel=channel, status=Status.FAILED, attempts=1, next_attempt_at=now - timedelta(seconds=5)
        )
        for _ in range(n)
    ]


def _statuses(rows: list[NotificationEntity]) -> set[str]:
    return set(
        NotificationEntity.objects.filter(pk__in=[r.pk for r in rows]).values_list("status", flat=True)
    )


def _attempts(rows: list[NotificationEntity]) -> set[int]:
    return set(
        NotificationEntity.objects.filter(pk__in=[r.pk for r in rows]).values_list("attempts", flat=True)
    )


def _tick() -> Any:
    worker = Worker(rng=random.Random(1))
    try:
        return worker.tick()
    finally:
        worker.close()


@pytest.fixture
def only_loopback_allowed(settings: Any) -> None:
    # Whatever URL a generated channel names, the policy refuses it before any connection: only
    # 127.0.0.1 is allowed, and nothing listens on port 9 there.
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}


@pytest.mark.django_db
def test_an_unparsable_webhook_url_is_a_problem_of_that_channel_alone(only_loopback_allowed: None) -> None:
    healthy = ChannelFactory(key="in_app", provider_key="in_app")
    ChannelFactory(key="hooks", provider_key="webhook", options={"url": "http://127.0.0.1:9/"})
    _write_raw("hooks", "webhook", UNPARSABLE_URL)
    found = [m.msg for m in check_channels(databases=["default"]) if m.id == "notifications_retry.W002"]
    assert len(found) == 1 and "'hooks'" in found[0] and "Invalid IPv6 URL" in found[0]
    waiting = _due(ChannelConfig.objects.get(key="hooks"), 2)
    rows = _due(healthy, 3)
    stats = _tick()
    assert stats.error == ""
    assert _statuses(rows) == {Status.SENT}
    assert _attempts(waiting) == {1}


class RaisingCheckProvider(Provider):
    """A provider whose option check raises on every channel (a plug-in's bug)."""

    key = "raising_check"

    @classmethod
    def options_problems(cls, options: Any) -> list[str]:
        raise KeyError("boom")


class RaisingConstructorProvider(Provider):
    """A provider that passes its check and raises when built (an option it converts)."""

    key = "raising_constructor"

    def __init__(self, channel: Any) -> None:
        raise TypeError("cannot convert the options")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("provider_key", "options", "reason"),
    [
        ("raising_check", {}, "KeyError"),
        ("raising_constructor", {}, "cannot convert the options"),
        # Options the built-in providers once raised on (unhashable, unimportable), now refused by name.
        ("stub", {"fail": ["retriable"]}, "stub option 'fail'"),
        ("stub", {"fail_recipients": [{}]}, "list of strings"),
        *(
            [
                ("django_email", {"mailer": ["default"]}, "alias of a MAILERS entry"),
                ("django_email", {"mailer": "nope"}, "not in MAILERS"),
            ]
            if USES_MAILERS
            else [
                ("django_email", {"backend": ".x"}, "Empty module name"),
                ("django_email", {"backend_options": {"timeout": []}}, "number of seconds"),
            ]
        ),
    ],
)
def test_a_provider_that_raises_on_its_options_leaves_that_channel_waiting(
    settings: Any, provider_key: str, options: Any, reason: str
) -> None:
    settings.NOTIFICATIONS_RETRY = {
        "PROVIDERS": {
            "raising_check": f"{__name__}.RaisingCheckProvider",
            "raising_constructor": f"{__name__}.RaisingConstructorProvider",
        }
    }
    healthy = ChannelFactory(key="healthy", provider_key="in_app")
    ChannelFactory(key="odd", provider_key="in_app")
    _write_raw("odd", provider_key, options)
    messages = [m.msg for m in check_channels(databases=["default"]) if m.id == "notifications_retry.W002"]
    if provider_key != "raising_constructor":  # the check builds no provider
        assert len(messages) == 1 and "'odd'" in messages[0] and reason in messages[0]
    rows = _due(healthy, 2)
    waiting = _due(ChannelConfig.objects.get(key="odd"), 2)
    with capture_logs() as logs:
        assert _tick().error == ""
    assert _statuses(rows) == {Status.SENT}
    assert _attempts(waiting) == {1}
    disabled = [e for e in logs if e["event"] == "channel-disabled"]
    assert [e["channel"] for e in disabled] == ["odd"] and reason in disabled[0]["reason"]


@pytest.mark.django_db
@pytest.mark.parametrize("provider_key", [*sorted(BUILTIN_PROVIDERS), None])
def test_no_options_or_provider_key_written_by_raw_sql_stops_the_check_or_the_tick(
    only_loopback_allowed: None, provider_key: str | None
) -> None:
    healthy = ChannelFactory(key="healthy", provider_key="in_app")
    ChannelFactory(key="odd", provider_key="in_app")
    odd = ChannelConfig.objects.get(key="odd")
    keys = st.just(provider_key) if provider_key else _text.filter(lambda k: len(k) <= 64)

    @settings(
        max_examples=60,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(key=keys, options=_options(provider_key))
    def property(key: str, options: Any) -> None:
        _write_raw("odd", key, options)
        check_channels(databases=["default"])  # never raises
        rows = _due(healthy, 2)
        _due(odd, 1)
        assert _tick().error == ""
        assert _statuses(rows) == {Status.SENT}

    property()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("skip_checks", [False, True])
def test_retry_worker_once_sends_the_healthy_channel_and_exits_0(skip_checks: bool) -> None:
    healthy = ChannelFactory(key="in_app", provider_key="in_app")
    ChannelFactory(key="hooks", provider_key="webhook", options={"url": "http://127.0.0.1:9/"})
    _write_raw("hooks", "webhook", UNPARSABLE_URL)
    _due(ChannelConfig.objects.get(key="hooks"), 1)
    rows = _due(healthy, 3)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "django",
            "retry_worker",
            "--once",
            *(["--skip-checks"] if skip_checks else []),
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "NR_TEST_DATABASE_NAME": connection.settings_dict["NAME"],
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "channel-disabled" in result.stdout + result.stderr
    assert _statuses(rows) == {Status.SENT}
