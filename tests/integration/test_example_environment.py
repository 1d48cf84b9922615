"""The example project is pointed at a broker, a direct lock database and an SMTP server by environment
variables alone (docs/development.md, "The example project's environment"), each tried against the real thing.

Every case runs the example project's own command in a subprocess (``example_project.settings``) on
this test's database, with nothing but the documented variables set.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from notifications_retry import api
from notifications_retry.models import NotificationEntity, Outbox
from tests.factories import ChannelFactory
from tests.support.brokers import NatsBox, RabbitMQBox
from tests.support.pgbouncer import PgBouncer, pgbouncer_binary
from tests.support.smtp_server import ScriptedSMTPServer

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def database_url(host: str | None = None, port: int | None = None) -> str:
    db = connection.settings_dict
    auth = (db["USER"] or "postgres") + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{host or db['HOST'] or '127.0.0.1'}:{port or db['PORT'] or 5432}/{db['NAME']}"


def example(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``manage.py ARGS`` of the example project with only the given variables of its own."""
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "NR_", "NOTIFICATIONS_RETRY_"))
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={
            **base,
            "DJANGO_SETTINGS_MODULE": "example_project.settings",
            "DATABASE_URL": database_url(),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_sent_event() -> str:
    ChannelFactory(key="in_app")
    note = api.create_notification(channel="in_app", recipient="user-1", payload={"title": "Hi"})
    api.record_dispatch_sent(note)
    (event,) = Outbox.objects.all()
    return str(event.event_id)


def test_the_relay_publishes_to_rabbitmq_from_the_environment(rabbitmq: RabbitMQBox) -> None:
    event_id = one_sent_event()
    result = example(
        "outbox_relay",
        "--once",
        env={
            "NOTIFICATIONS_RETRY_OUTBOX_PUBLISHER": "rabbitmq",
            "NOTIFICATIONS_RETRY_OUTBOX_PUBLISHER_OPTIONS": json.dumps(rabbitmq.options()),
        },
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (message,) = rabbitmq.drain()
    assert message["body"]["event_id"] == event_id
    assert Outbox.objects.filter(published_at__isnull=True).count() == 0


def test_the_relay_publishes_to_nats_jetstream_from_the_environment(jetstream: NatsBox) -> None:
    event_id = one_sent_event()
    result = example(
        "outbox_relay",
        "--once",
        env={
            "NOTIFICATIONS_RETRY_OUTBOX_PUBLISHER": "nats",
            "NOTIFICATIONS_RETRY_OUTBOX_PUBLISHER_OPTIONS": json.dumps(jetstream.options()),
        },
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (message,) = jetstream.messages()
    assert message["body"]["event_id"] == event_id


@pytest.fixture
def bouncer() -> Iterator[PgBouncer]:
    if pgbouncer_binary() is None:
        pytest.skip("pgbouncer cannot be installed here (bash scripts/ensure-pgbouncer, run by make test)")
    db = settings.DATABASES["default"]
    server = PgBouncer(
        db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432), ignore_startup_parameters="options"
    ).start()
    yield server
    server.stop()


def test_the_lock_database_comes_from_the_environment(bouncer: PgBouncer) -> None:
    ChannelFactory(key="in_app")
    # A direct URL: the worker takes its lock there and ticks.
    direct = example("retry_worker", "--once", env={"NOTIFICATIONS_RETRY_LOCK_DATABASE_URL": database_url()})
    assert direct.returncode == 0, direct.stdout + direct.stderr
    # The same variable pointed through PgBouncer: the worker names the alias the variable made.
    pooled = example(
        "retry_worker",
        "--once",
        env={"NOTIFICATIONS_RETRY_LOCK_DATABASE_URL": bouncer.url(connection.settings_dict["NAME"])},
    )
    assert pooled.returncode == 2, pooled.stdout + pooled.stderr
    assert "LockNotDirect" in pooled.stderr and "database alias 'lock'" in pooled.stderr


def test_the_email_backend_comes_from_the_environment() -> None:
    smtp = ScriptedSMTPServer().start()
    try:
        # A django_email channel without a backend of its own uses the project's EMAIL_BACKEND.
        ChannelFactory(key="email", provider_key="django_email", options={"from_email": "shop@example.com"})
        api.schedule_notification(
            channel="email",
            recipient="ann@example.com",
            payload={"subject": "Shipped", "body": "Your order shipped."},
            send_at=timezone.now(),
        )
        result = example(
            "retry_worker",
            "--once",
            env={
                "DJANGO_EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
                "DJANGO_EMAIL_HOST": "127.0.0.1",
                "DJANGO_EMAIL_PORT": str(smtp.port),
            },
        )
    finally:
        smtp.stop()
    assert result.returncode == 0, result.stdout + result.stderr
    assert [m["To"] for m in smtp.messages] == ["ann@example.com"], result.stdout + result.stderr
    assert NotificationEntity.objects.get().status == NotificationEntity.Status.SENT


def test_the_partitions_come_from_the_environment() -> None:
    ChannelFactory(key="in_app")
    # Alone, a worker owns every partition of the three the variable sets.
    result = example(
        "retry_worker", "--once", env={"NOTIFICATIONS_RETRY_PARTITIONS": "3", "LOG_FORMAT": "json"}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    started = [json.loads(line) for line in result.stderr.splitlines() if "retry-cycle-started" in line]
    assert started and started[0]["partitions"] == [0, 1, 2], result.stdout + result.stderr


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_the_workers_events_are_written_by_structlog_itself_with_the_same_masking(log_format: str) -> None:
    """A worker process of the example project writes its per-record events without the stdlib logging
    module (docs/observability.md), in the format LOG_FORMAT names, recipients masked, on stderr."""
    ChannelFactory(key="in_app")
    api.schedule_notification(
        channel="in_app", recipient="ann@example.com", payload={"body": "hi"}, send_at=timezone.now()
    )
    result = example("retry_worker", "--once", env={"LOG_FORMAT": log_format})
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if "item-sent" in line]
    assert len(lines) == 1, result.stderr
    assert "ann@example.com" not in result.stderr
    if log_format == "json":
        event = json.loads(lines[0])
        assert event["event"] == "item-sent" and event["level"] == "info" and event["channel"] == "in_app"
        assert event["notification_id"] == str(NotificationEntity.objects.get().id)
    else:
        assert "[info" in lines[0] and "channel=in_app" in lines[0]
    assert NotificationEntity.objects.get().status == NotificationEntity.Status.SENT


@pytest.mark.parametrize(
    ("argv", "log_format", "factory"),
    [
        # JSON lines serialized by orjson and written as bytes; console lines written as text.
        ("retry_worker", "json", "BytesLoggerFactory"),
        ("retry_worker", "console", "WriteLoggerFactory"),
        ("runserver", "json", "LoggerFactory"),
        ("runserver", "console", "LoggerFactory"),
    ],
)
def test_only_a_worker_process_leaves_the_stdlib_logging_route(
    argv: str, log_format: str, factory: str
) -> None:
    probe = (
        f"import sys; sys.argv = ['manage.py', {argv!r}]; import example_project.settings; "
        "import structlog; print(type(structlog.get_config()['logger_factory']).__name__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url(), "LOG_FORMAT": log_format},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == factory


@pytest.mark.parametrize(("stderr_is_a_terminal", "log_format"), [(False, "json"), (True, "console")])
def test_without_log_format_the_lines_are_json_unless_stderr_is_a_terminal(
    stderr_is_a_terminal: bool, log_format: str
) -> None:
    """structlog's advice: JSON for a machine (a pipe, a file), key=value lines for a person."""
    probe = "import example_project.settings as s; print(s.LOG_FORMAT)"
    env = {k: v for k, v in os.environ.items() if k != "LOG_FORMAT"}
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe],
            cwd=ROOT,
            env={**env, "DATABASE_URL": database_url()},
            stdout=subprocess.PIPE,
            stderr=follower if stderr_is_a_terminal else subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == log_format
