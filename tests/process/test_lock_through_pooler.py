"""A real worker whose lock alias goes through a real PgBouncer (transaction mode) stops, clearly."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from notifications_retry import api
from notifications_retry.database.locks import LOCK_APPLICATION_NAME
from notifications_retry.models import NotificationEntity, Outbox
from tests.factories import ChannelFactory
from tests.process.conftest import StartWorker, seed_due
from tests.process.helpers import lock_holders
from tests.support.pgbouncer import PgBouncer, pgbouncer_binary
from tests.support.processes import worker_env

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def bouncer() -> Iterator[PgBouncer]:
    if pgbouncer_binary() is None:
        pytest.skip("pgbouncer cannot be installed here (bash scripts/ensure-pgbouncer, run by make test)")
    db = settings.DATABASES["default"]
    # `options` ignored rather than refused: the pooler accepts the lock's connection, as the
    # misconfigured deployment did, so only the lock's own proof can stop the worker.
    server = PgBouncer(
        db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432), ignore_startup_parameters="options"
    ).start()
    yield server
    server.stop()


def test_a_worker_whose_lock_goes_through_pgbouncer_exits_naming_the_setting(
    bouncer: PgBouncer, start_worker: StartWorker
) -> None:
    seed_due(ChannelFactory(key="in_app"), 5)
    worker = start_worker(
        ["--interval", "0.2"],
        settings={"LOCK_DATABASE_ALIAS": "lock"},
        env={
            "DJANGO_SETTINGS_MODULE": "tests.support.lock_alias_settings",
            "NR_TEST_LOCK_DATABASE_URL": bouncer.url(connection.settings_dict["NAME"]),
        },
    )
    # A looping worker, not --once: it must stop, not skip tick after tick.
    status = worker.wait(60)
    output = worker.output()
    assert status != 0, output
    assert "LockNotDirect" in output and "NOTIFICATIONS_RETRY['LOCK_DATABASE_ALIAS']" in output, output
    assert "database alias 'lock'" in output, output
    # No tick ran: nothing was claimed or sent, and no lock was left on any session.
    assert NotificationEntity.objects.filter(status=NotificationEntity.Status.SENT).count() == 0
    assert NotificationEntity.objects.filter(claim_token__isnull=False).count() == 0
    assert lock_holders() == []
    # Nothing leaked onto the pool's one server session, which the next client of the pool gets.
    with psycopg.connect(bouncer.url(connection.settings_dict["NAME"]), autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('idle_session_timeout'), current_setting('application_name')"
        ).fetchone()
    assert row is not None and row[0] == "0" and row[1] != LOCK_APPLICATION_NAME


def test_a_relay_whose_key_locks_go_through_pgbouncer_exits_2_with_one_line(bouncer: PgBouncer) -> None:
    # One event to publish: the relay claims it, then must lock its key on the lock alias.
    ChannelFactory(key="in_app")
    note = api.create_notification(channel="in_app", recipient="user-1", payload={})
    api.record_dispatch_sent(note)
    env = worker_env(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        connection.settings_dict["NAME"],
        {"LOCK_DATABASE_ALIAS": "lock"},
        {
            "DJANGO_SETTINGS_MODULE": "tests.support.lock_alias_settings",
            "NR_TEST_LOCK_DATABASE_URL": bouncer.url(connection.settings_dict["NAME"]),
        },
    )
    result = subprocess.run(
        [sys.executable, "-m", "django", "outbox_relay", "--publisher", "log"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # The worker's words for the same mistake: exit 2 and one line naming the relay's own locks and the
    # setting, no traceback (exit 1 is "publishing failed").
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith("CommandError: LockNotDirect: the outbox relay's key locks must live on"), line
    assert "database alias 'lock'" in line and "NOTIFICATIONS_RETRY['LOCK_DATABASE_ALIAS']" in line, line
    assert Outbox.objects.filter(published_at__isnull=True).count() == 1
