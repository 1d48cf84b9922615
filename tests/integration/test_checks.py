"""System checks E00x / W00x, each provoked on purpose; the database check against real PostgreSQL."""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection, connections
from django.test import override_settings

from notifications_retry.checks import check_channels, check_database
from notifications_retry.providers.base import Provider
from tests.factories import ChannelFactory
from tests.support.mailers import USES_MAILERS, MailerOptions, mailer_options_for
from tests.support.processes import free_port

# The channel check reads the database on plain `check`: every test here may.
pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


class CustomProvider(Provider):
    key = "custom"


class NotAProvider:
    pass


POSTMARK = "anymail.backends.postmark.EmailBackend"
SMTP = "django.core.mail.backends.smtp.EmailBackend"


@pytest.fixture
def mailer_options(settings: Any) -> MailerOptions:
    """Options of a django_email channel sending through a backend, for the running Django version."""
    return mailer_options_for(settings)


def ids(**kwargs: Any) -> list[str]:
    return [m.id for m in run_checks(**kwargs) if m.id and m.id.startswith("notifications_retry.")]


def messages_with(check_id: str, **kwargs: Any) -> list[str]:
    return [m.msg for m in run_checks(**kwargs) if m.id == check_id]


@pytest.fixture
def extra_alias() -> Iterator[Any]:
    """Add a DATABASES alias (copied from default) for the duration of a test."""
    added: list[str] = []

    def add(name: str, **changes: Any) -> None:
        entry = copy.deepcopy(settings.DATABASES["default"])
        entry.update(changes)
        connections.settings[name] = entry
        settings.DATABASES[name] = entry
        added.append(name)

    yield add
    for name in added:
        connections.settings.pop(name, None)
        settings.DATABASES.pop(name, None)
        if hasattr(connections._connections, name):  # type: ignore[attr-defined]
            delattr(connections._connections, name)  # type: ignore[attr-defined]


def test_default_configuration_is_clean() -> None:
    assert ids() == []


def test_e001_unknown_key() -> None:
    with override_settings(NOTIFICATIONS_RETRY={"BATCH_SZE": 5}):
        assert "notifications_retry.E001" in ids()
        assert any("BATCH_SZE" in m for m in messages_with("notifications_retry.E001"))


@pytest.mark.parametrize(
    "bad",
    [
        {"BATCH_SIZE": 0},
        {"BATCH_SIZE": "ten"},
        {"CIRCUIT_BREAKER": {"cooldown_seconds": 0}},
        {"ENDPOINT_HEALTH": {"warn_ratio": 2}},
        {"CLOCK": "sundial"},
        {"METRICS_PORT": -1},
    ],
)
def test_e001_wrong_type_or_range(bad: dict[str, Any]) -> None:
    with override_settings(NOTIFICATIONS_RETRY=bad):
        assert ids().count("notifications_retry.E001") == 1


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ({"HEALTH_MIN_ATTEMPTS": 10}, "HEALTH_MIN_ATTEMPTS: moved to ENDPOINT_HEALTH['min_attempts']"),
        ({"CLAIM_CHUNK_SIZE": 100}, "CLAIM_CHUNK_SIZE: removed: a constant now, 500 rows"),
        ({"ENDPOINT_HEALTH": {"min_attempt": 10}}, "ENDPOINT_HEALTH'] has unknown key(s): 'min_attempt'"),
        ({"CIRCUIT_BREAKER": 5}, "CIRCUIT_BREAKER'] must be a dict"),
    ],
)
def test_e001_removed_key_or_bad_group_names_what_to_write(bad: dict[str, Any], said: str) -> None:
    with override_settings(NOTIFICATIONS_RETRY=bad):
        assert ids() == ["notifications_retry.E001"]
        [message] = messages_with("notifications_retry.E001")
    assert said in message


def test_e001_settings_not_a_dict() -> None:
    with override_settings(NOTIFICATIONS_RETRY="BATCH_SIZE=5"):
        assert "notifications_retry.E001" in ids()


def test_e002_non_postgresql_lock_alias(extra_alias: Any) -> None:
    extra_alias("other", ENGINE="django.db.backends.sqlite3", NAME=":memory:")
    # The check itself: from Django 6.1 run_checks() has the model checks query every alias.
    with override_settings(NOTIFICATIONS_RETRY={"LOCK_DATABASE_ALIAS": "other"}):
        found = [m.msg for m in check_database() if m.id == "notifications_retry.E002"]
    assert found and "sqlite" in found[0]


def test_e003_provider_that_does_not_import() -> None:
    with override_settings(NOTIFICATIONS_RETRY={"PROVIDERS": {"sendgrid": "no.such.module.Provider"}}):
        found = messages_with("notifications_retry.E003")
    assert len(found) == 1 and "sendgrid" in found[0]


def test_e003_provider_that_is_not_a_provider() -> None:
    path = f"{__name__}.NotAProvider"
    with override_settings(NOTIFICATIONS_RETRY={"PROVIDERS": {"custom": path}}):
        found = messages_with("notifications_retry.E003")
    assert len(found) == 1 and "not a" in found[0]


def test_a_valid_custom_provider_passes() -> None:
    with override_settings(NOTIFICATIONS_RETRY={"PROVIDERS": {"custom": f"{__name__}.CustomProvider"}}):
        assert ids() == []


def test_w005_replacing_a_builtin_provider() -> None:
    with override_settings(NOTIFICATIONS_RETRY={"PROVIDERS": {"in_app": f"{__name__}.CustomProvider"}}):
        assert ids() == ["notifications_retry.W005"]


def test_e004_lock_alias_declared_pooled() -> None:
    with override_settings(NOTIFICATIONS_RETRY={"LOCK_DATABASE_POOLED": True}):
        found = messages_with("notifications_retry.E004")
    assert len(found) == 1 and "LOCK_DATABASE_POOLED" in found[0]


def test_e004_lock_alias_with_transaction_pooling_switch(extra_alias: Any) -> None:
    extra_alias("bouncer", DISABLE_SERVER_SIDE_CURSORS=True)
    with override_settings(NOTIFICATIONS_RETRY={"LOCK_DATABASE_ALIAS": "bouncer"}):
        found = messages_with("notifications_retry.E004")
    assert len(found) == 1 and "DISABLE_SERVER_SIDE_CURSORS" in found[0]


def test_e004_lock_alias_with_psycopg_pool(extra_alias: Any) -> None:
    extra_alias("pooled", OPTIONS={"pool": True})
    with override_settings(NOTIFICATIONS_RETRY={"LOCK_DATABASE_ALIAS": "pooled"}):
        assert "notifications_retry.E004" in ids()


def test_a_pooled_default_with_a_direct_lock_alias_is_fine(extra_alias: Any) -> None:
    # The usual production layout: the app goes through PgBouncer, the lock connects directly.
    extra_alias("direct")
    with override_settings(NOTIFICATIONS_RETRY={"LOCK_DATABASE_ALIAS": "direct"}):
        assert ids() == []


@pytest.mark.parametrize("port", ["6432", "6543"])
def test_e006_lock_alias_on_a_known_pooler_port(extra_alias: Any, port: str) -> None:
    extra_alias("maybe_bouncer", PORT=port)
    with override_settings(NOTIFICATIONS_RETRY={"LOCK_DATABASE_ALIAS": "maybe_bouncer"}):
        assert ids() == ["notifications_retry.E006"]
        found = messages_with("notifications_retry.E006")
    assert port in found[0] and "'maybe_bouncer'" in found[0]


def test_e006_can_be_silenced_when_the_port_is_postgresql_itself(extra_alias: Any) -> None:
    extra_alias("direct_on_6432", PORT="6432")
    with override_settings(
        NOTIFICATIONS_RETRY={"LOCK_DATABASE_ALIAS": "direct_on_6432"},
        SILENCED_SYSTEM_CHECKS=["notifications_retry.E006"],
    ):
        assert [m.id for m in run_checks() if not m.is_silenced()] == []


@pytest.mark.parametrize(
    "host",
    [
        "pgbouncer",
        "db-pgbouncer.internal",
        "aws-0-eu-west-1.pooler.supabase.com",
        "app.proxy-c1x2.eu-west-1.rds.amazonaws.com",
    ],
)
def test_w007_lock_alias_on_a_host_named_as_a_pooler(extra_alias: Any, host: str) -> None:
    extra_alias("named_bouncer", HOST=host)
    with override_settings(NOTIFICATIONS_RETRY={"LOCK_DATABASE_ALIAS": "named_bouncer"}):
        assert ids() == ["notifications_retry.W007"]
        (found,) = messages_with("notifications_retry.W007")
    assert host.lower() in found and "'named_bouncer'" in found


def test_w007_not_for_a_host_named_otherwise(extra_alias: Any) -> None:
    extra_alias("direct", HOST="db-primary.internal")
    with override_settings(NOTIFICATIONS_RETRY={"LOCK_DATABASE_ALIAS": "direct"}):
        assert ids() == []


def test_e005_lock_alias_missing() -> None:
    with override_settings(NOTIFICATIONS_RETRY={"LOCK_DATABASE_ALIAS": "nowhere"}):
        found = messages_with("notifications_retry.E005")
    assert len(found) == 1 and "nowhere" in found[0]


def test_w003_tick_longer_than_interval() -> None:
    with override_settings(NOTIFICATIONS_RETRY={"MAX_DURATION_SECONDS": 60, "INTERVAL_SECONDS": 60}):
        assert ids() == ["notifications_retry.W003"]


@pytest.mark.django_db
def test_w002_broken_enabled_channel_is_reported_by_plain_check() -> None:
    ChannelFactory(key="hooks", provider_key="webhook", options={})
    ChannelFactory(key="ghost", provider_key="carrier_pigeon")
    ChannelFactory(key="off", provider_key="carrier_pigeon", is_enabled=False)
    ChannelFactory(key="fine", provider_key="in_app")
    ChannelFactory(key="inside", provider_key="webhook", options={"url": "http://10.0.0.5/hook"})
    for found in (
        messages_with("notifications_retry.W002"),
        messages_with("notifications_retry.W002", databases=["default"]),
    ):
        assert len(found) == 3
        assert any("'hooks'" in m and "url" in m for m in found)
        assert any("'ghost'" in m and "carrier_pigeon" in m for m in found)
        assert any("'inside'" in m and "internal address" in m for m in found)
    assert check_channels(databases=["other"]) == []  # `check --database other` does not read default


@pytest.mark.django_db
def test_plain_check_command_prints_the_refused_channel() -> None:
    ChannelFactory(key="metadata", provider_key="webhook", options={"url": "http://169.254.169.254/latest"})
    out = io.StringIO()
    call_command("check", stdout=out, stderr=out)
    assert "notifications_retry.W002" in out.getvalue() and "'metadata'" in out.getvalue()


def test_plain_check_says_when_the_database_is_unreachable() -> None:
    # A real `manage.py check` whose database is down: it says what it could not check, and passes.
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{free_port()}/postgres",
        "DJANGO_SETTINGS_MODULE": "tests.settings",
    }
    env.pop("NR_TEST_DATABASE_NAME", None)
    result = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert "notifications_retry.W006" in output and "channels were not checked" in output
    assert "OperationalError" in output


@pytest.mark.django_db
def test_w002_silent_when_the_table_does_not_exist_yet() -> None:
    # migrate runs database checks before the app's tables exist: the check must not fail there.
    with connection.cursor() as cursor:
        cursor.execute("SAVEPOINT before_rename")
        cursor.execute("ALTER TABLE notifications_retry_channelconfig RENAME TO nr_hidden")
        try:
            assert ids(databases=["default"]) == []
        finally:
            cursor.execute("ROLLBACK TO SAVEPOINT before_rename")


def test_check_command_fails_on_errors() -> None:
    with (
        override_settings(NOTIFICATIONS_RETRY={"BATCH_SIZE": -1}),
        pytest.raises(SystemCheckError, match="E001"),
    ):
        call_command("check")


@pytest.mark.django_db
def test_w002_an_allowlist_that_excludes_an_existing_channel_s_host() -> None:
    # Allowing a local receiver alone silently refused the public webhook the channel already used.
    ChannelFactory(
        key="partner_hook", provider_key="webhook", options={"url": "https://hooks.example.com/notify"}
    )
    ChannelFactory(key="local_hook", provider_key="webhook", options={"url": "http://127.0.0.1:8001/hooks"})
    with override_settings(NOTIFICATIONS_RETRY={"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}):
        (found,) = messages_with("notifications_retry.W002")
    assert "'partner_hook'" in found and "not in WEBHOOK_ALLOWED_HOSTS" in found and "add '*'" in found
    with override_settings(NOTIFICATIONS_RETRY={"WEBHOOK_ALLOWED_HOSTS": ["*", "127.0.0.1"]}):
        assert messages_with("notifications_retry.W002") == []


@pytest.mark.django_db
def test_w008_an_anymail_channel_without_its_credentials_is_named_by_plain_check(
    settings: Any, mailer_options: MailerOptions
) -> None:
    # The README's Postmark channel, its server token forgotten: it passed check, then dead-lettered.
    settings.ANYMAIL = {}
    ChannelFactory(key="email", provider_key="django_email", options=mailer_options(POSTMARK))
    ChannelFactory(
        key="tokened", provider_key="django_email", options=mailer_options(POSTMARK, {"server_token": "t"})
    )
    ChannelFactory(
        key="smtp", provider_key="django_email", options=mailer_options(SMTP, {"host": "127.0.0.1"})
    )
    (found,) = messages_with("notifications_retry.W008")
    assert "channel 'email' will fail every send" in found and "server_token" in found.lower(), found
    assert "notifications_retry.W002" not in ids()  # the channel is not set aside: a warning only
    out = io.StringIO()
    call_command("check", stdout=out, stderr=out)
    assert "notifications_retry.W008" in out.getvalue() and "'email'" in out.getvalue()
    settings.ANYMAIL = {"POSTMARK_SERVER_TOKEN": "from-settings"}
    assert messages_with("notifications_retry.W008") == []


@pytest.mark.django_db
def test_w008_also_for_a_channel_on_the_projects_default_email_backend(settings: Any) -> None:
    settings.ANYMAIL = {}
    if USES_MAILERS:
        settings.MAILERS = {"default": {"BACKEND": POSTMARK}}
    else:
        settings.EMAIL_BACKEND = POSTMARK
    ChannelFactory(key="email", provider_key="django_email", options={})
    (found,) = messages_with("notifications_retry.W008")
    assert "'email'" in found and "server_token" in found.lower()
