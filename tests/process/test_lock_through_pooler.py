"""A real worker whose lock alias goes through a real PgBouncer (transaction mode) stops, clearly."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from notifications_retry.locks import LOCK_APPLICATION_NAME
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory
from tests.process.conftest import StartWorker, seed_due
from tests.process.helpers import lock_holders
from tests.support.pgbouncer import PgBouncer, pgbouncer_binary

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
