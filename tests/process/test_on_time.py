"""A looping worker on its default interval sends rows as they fall due, not at its next tick.

Each scenario would wait for the next tick without wake-ups: the interval is 60 s, and every wait
here gives up well before that.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from notifications_retry import api
from notifications_retry.models import NotificationEntity
from tests.process.conftest import StartWorker
from tests.process.helpers import db_now, requests_by_key, webhook_channel
from tests.support.http_server import ScriptedServer
from tests.support.pgbouncer import PgBouncer, pgbouncer_binary
from tests.support.processes import wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

SENT = NotificationEntity.Status.SENT
#: The default interval: without wake-ups nothing written after the first tick goes out before it.
SETTINGS = {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"], "INTERVAL_SECONDS": 60.0}
#: Far below the interval, far above any wake-up on a loaded machine.
WITHIN = 30.0


@pytest.fixture
def receiver() -> Iterator[ScriptedServer]:
    server = ScriptedServer().start()
    yield server
    server.stop()


def first_tick_done(worker_output: str) -> bool:
    return "cycle-completed" in worker_output


def test_scheduled_rows_go_out_when_they_fall_due(
    start_worker: StartWorker, receiver: ScriptedServer
) -> None:
    channel = webhook_channel(receiver.url)
    worker = start_worker([], SETTINGS)
    wait_until(lambda: first_tick_done(worker.output()), WITHIN, message="the first tick")
    start = db_now()
    scheduled = {
        str(
            api.schedule_notification(
                channel=channel, recipient=f"u{i}", send_at=start + timedelta(seconds=s)
            ).pk
        ): s
        for i, s in enumerate((1.0, 2.5, 4.0))
    }
    wait_until(
        lambda: NotificationEntity.objects.filter(status=SENT).count() == 3, WITHIN, message="every row sent"
    )
    # Never early: each went out once its time had come (the attempt is logged at its claim).
    for row in NotificationEntity.objects.all():
        attempted = datetime.fromisoformat(row.attempt_log[-1]["at"])
        assert attempted >= row.scheduled_at, (attempted, row.scheduled_at)
    assert set(requests_by_key(receiver.requests)) == set(scheduled)


def test_a_hand_off_written_through_pgbouncer_wakes_the_worker_on_its_direct_connection(
    start_worker: StartWorker, receiver: ScriptedServer
) -> None:
    if pgbouncer_binary() is None:
        pytest.skip("pgbouncer cannot be installed here (bash scripts/ensure-pgbouncer, run by make test)")
    db = settings.DATABASES["default"]
    bouncer = PgBouncer(db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432)).start()
    try:
        channel = webhook_channel(receiver.url)
        fresh = api.create_notification(channel=channel, recipient="handed-off")
        worker = start_worker([], SETTINGS)
        wait_until(lambda: first_tick_done(worker.output()), WITHIN, message="the first tick")
        assert not receiver.requests  # a fresh row is the monolith's: the worker leaves it alone
        # The monolith, on its pooled alias (transaction mode: it could not LISTEN), hands the row
        # over: its dispatcher failed, the row is due for a retry now.
        pooled = bouncer.url(connection.settings_dict["NAME"])
        with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as conn:
            conn.execute(
                "UPDATE notifications_retry_notificationentity SET status = 'failed', attempts = 1, "
                "next_attempt_at = now(), error_kind = 'http_5xx' WHERE id = %s",
                (fresh.pk,),
            )
        wait_until(lambda: len(receiver.requests) >= 1, WITHIN, message="the handed-off row sent")
        assert set(requests_by_key(receiver.requests)) == {str(fresh.pk)}
        wait_until(
            lambda: NotificationEntity.objects.get(pk=fresh.pk).status == SENT, WITHIN, message="its outcome"
        )
    finally:
        bouncer.stop()


def test_a_standby_takes_over_at_once_when_the_owner_is_killed(
    start_worker: StartWorker, receiver: ScriptedServer
) -> None:
    channel = webhook_channel(receiver.url)
    owner = start_worker([], SETTINGS, name="owner")
    wait_until(lambda: first_tick_done(owner.output()), WITHIN, message="the owner's first tick")
    standby = start_worker([], SETTINGS, name="standby")
    wait_until(lambda: "retry-cycle" in standby.output(), WITHIN, message="the standby's first tick")

    def schedule(label: str) -> str:
        at = db_now() + timedelta(seconds=0.5)
        return str(api.schedule_notification(channel=channel, recipient=label, send_at=at).pk)

    first = schedule("before")
    wait_until(lambda: len(receiver.requests) >= 1, WITHIN, message="a row sent while both run")
    owner.kill()
    second = schedule("after")
    wait_until(lambda: len(receiver.requests) >= 2, WITHIN, message="a row sent by the standby")
    assert set(requests_by_key(receiver.requests)) == {first, second}
    assert standby.alive()
    wait_until(
        lambda: NotificationEntity.objects.filter(status=SENT).count() == 2, WITHIN, message="both outcomes"
    )
