"""A real worker whose data connections (Django's, and the send loop's claims and commits) go through a
real PgBouncer in transaction mode, its lock on a direct connection: every row is sent once, with its
outcome and its event, and nothing is left on the pool's one server session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from notifications_retry.models import NotificationEntity, Outbox
from tests.process.conftest import StartWorker, seed_due
from tests.process.helpers import requests_by_key, webhook_channel
from tests.support.http_server import Reply, ScriptedServer
from tests.support.pgbouncer import PgBouncer, pgbouncer_binary

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

ROWS = 300


@pytest.fixture
def bouncer() -> Iterator[PgBouncer]:
    if pgbouncer_binary() is None:
        pytest.skip("pgbouncer cannot be installed here (bash scripts/ensure-pgbouncer, run by make test)")
    db = settings.DATABASES["default"]
    server = PgBouncer(db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432)).start()
    yield server
    server.stop()


@pytest.fixture
def receiver() -> Iterator[ScriptedServer]:
    server = ScriptedServer(lambda request: Reply(200, {"id": "m"}, delay=0.005)).start()
    yield server
    server.stop()


def test_claims_and_commits_through_pgbouncer_in_transaction_mode_send_every_row_once(
    bouncer: PgBouncer, receiver: ScriptedServer, start_worker: StartWorker
) -> None:
    seed_due(webhook_channel(receiver.url, max_concurrency=16), ROWS)
    name = connection.settings_dict["NAME"]
    direct = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    worker = start_worker(
        ["--once", "--batch-size", str(ROWS * 2)],
        {"LOCK_DATABASE_ALIAS": "lock", "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]},
        url=bouncer.url(name),
        env={
            "DJANGO_SETTINGS_MODULE": "tests.support.lock_alias_settings",
            "NR_TEST_LOCK_DATABASE_URL": direct,
        },
    )
    status = worker.wait(120)
    output = worker.output()
    assert status == 0, output[-3000:]
    assert "claim-fallback" not in output and "commit-fallback" not in output, output[-3000:]
    by_key = requests_by_key(receiver.requests)
    assert len(by_key) == ROWS and len(receiver.requests) == ROWS, "every row sent, none twice"
    assert NotificationEntity.objects.filter(status=NotificationEntity.Status.SENT).count() == ROWS
    assert NotificationEntity.objects.filter(claim_token__isnull=False).count() == 0
    assert Outbox.objects.count() == ROWS
    # The transaction bounds were SET LOCAL: the pool's one server session keeps its own settings.
    with psycopg.connect(bouncer.url(name), autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('statement_timeout'), "
            "current_setting('idle_in_transaction_session_timeout')"
        ).fetchone()
    assert row == ("0", "0")
