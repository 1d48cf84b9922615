"""A looping worker on its default interval whose connections are cut while it waits between ticks.

A pooler's or proxy's idle cut, a failover or ``pg_terminate_backend`` ends the worker's sessions while
it waits for the next due row. The wait reconnects (with a short backoff) and its poll goes on, so a row
due 5 s later goes out on time, not at the next tick 60 s on; so it does beside rows scheduled in year
12000, which PostgreSQL stores and Python's datetime cannot hold.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection

from notifications_retry import api
from notifications_retry.engine.wakeup import POLL_SECONDS
from notifications_retry.models import NotificationEntity
from tests.process.conftest import StartWorker
from tests.process.helpers import db_now, requests_by_key, webhook_channel
from tests.support.http_server import ScriptedServer
from tests.support.processes import wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

#: The default interval (no INTERVAL_SECONDS, no --interval): a worker that waits it out sends the row
#: about 50 s late.
SETTINGS = {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
#: When the row falls due, after the cut.
DUE_IN = 5.0
#: How late the row may go out: one poll and a backoff's reconnect (about 2 s on an idle machine),
#: plus room for a loaded one; far below the 50 s a worker waiting out its interval shows.
LATE_BOUND = POLL_SECONDS + 8.0
#: Far below the interval, far above a first tick on a loaded machine.
WITHIN = 30.0

# Rows PostgreSQL accepts and psycopg cannot read back ("timestamp too large"): a retry and a schedule
# in year 12000, written by raw SQL as other code could.
FAR_ROWS = """
INSERT INTO notifications_retry_notificationentity (
    id, tenant_id, recipient, payload, notification_type, priority, status, attempts, next_attempt_at,
    scheduled_at, last_error, error_kind, attempt_log, dead_letter_reason, resolution, requeue_count,
    correlation_id, created_at, updated_at, channel_id)
VALUES (gen_random_uuid(), NULL, 'far-retry', '{"subject": "Hello"}', '', 5, 'failed', 1,
        '12000-01-01 00:00+00', NULL, '', 'seed', '[]', '', '', 0, '', now(), now(), %(channel)s),
       (gen_random_uuid(), NULL, 'far-schedule', '{"subject": "Hello"}', '', 5, 'pending', 0,
        NULL, '12000-01-01 00:00+00', '', '', '[]', '', '', 0, '', now(), now(), %(channel)s)
"""


@pytest.fixture
def receiver() -> Iterator[ScriptedServer]:
    server = ScriptedServer().start()
    yield server
    server.stop()


def cut_connections() -> int:
    """Terminate every other session of the test database (the worker's), as a failover would."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return len(cursor.fetchall())


@pytest.mark.parametrize("far", [False, True], ids=["cut", "cut-beside-year-12000-rows"])
def test_a_row_due_after_the_connections_were_cut_goes_out_on_time(
    start_worker: StartWorker, receiver: ScriptedServer, far: bool
) -> None:
    channel = webhook_channel(receiver.url)
    if far:
        with connection.cursor() as cursor:
            cursor.execute(FAR_ROWS, {"channel": channel.pk})
    worker = start_worker([], SETTINGS)
    wait_until(lambda: "cycle-completed" in worker.output(), WITHIN, message="the first tick")
    time.sleep(1.0)  # into the wait between ticks
    assert cut_connections() >= 1, "the worker's lock connection, on which it waits"
    due_mono = time.monotonic() + DUE_IN
    row = api.schedule_notification(
        channel=channel, recipient="after-the-cut", send_at=db_now() + timedelta(seconds=DUE_IN)
    )
    try:
        wait_until(lambda: str(row.pk) in requests_by_key(receiver.requests), DUE_IN + LATE_BOUND + 5)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}: the row was not sent; the worker's log:\n{worker.output()[-3000:]}"
        ) from None
    late = requests_by_key(receiver.requests)[str(row.pk)][0].received_at - due_mono
    assert late <= LATE_BOUND, (late, worker.output()[-3000:])
    output = worker.output()
    assert "wakeup-wait-failed" in output and "wakeup-wait-recovered" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert worker.alive()
    if far:
        # Never due, never claimed: the rows in year 12000 wait untouched.
        assert set(
            NotificationEntity.objects.filter(recipient__startswith="far-").values_list(
                "attempts", "claim_token"
            )
        ) <= {(0, None), (1, None)}
