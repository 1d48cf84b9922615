"""Migration 0008 on a database with events already in it: ids kept, one event per outcome kept.

Runs in a subprocess on a scratch database of the test server (migrating the shared test database
back and forth would disturb the other tests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from tests.support.databases import database_name

ROOT = Path(__file__).resolve().parents[2]

SCENARIO = r"""
import json, uuid
import django
django.setup()
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

call_command("migrate", "notifications_retry", "0007", verbosity=0)
from django.db.migrations.loader import MigrationLoader

# The models as of 0007: today's have columns later migrations add.
state = MigrationLoader(connection).project_state(("notifications_retry", "0007_channel_fallback"))
ChannelConfig = state.apps.get_model("notifications_retry", "ChannelConfig")
NotificationEntity = state.apps.get_model("notifications_retry", "NotificationEntity")

channel = ChannelConfig.objects.create(key="in_app", provider_key="in_app")
now = timezone.now()
rows = [NotificationEntity.objects.create(channel=channel, recipient="r", status="sent", attempts=1)
        for _ in range(2)]
old_ids = [uuid.uuid4(), uuid.uuid4()]
INSERT = ("INSERT INTO notifications_retry_outbox (event_id, topic, key, contract_version, generation, "
          "payload, created_at, published_at) "
          "VALUES (%s, 'pin.notifications.dispatched.v1', %s, 1, 0, %s, %s, NULL)")
PUBLISH = "UPDATE notifications_retry_outbox SET published_at = now() WHERE event_id = %s"
with connection.cursor() as cursor:
    for row, event_id in zip(rows, old_ids):
        payload = {"notification_id": str(row.pk), "status": "Sent"}
        cursor.execute(INSERT, [event_id, str(row.pk), json.dumps(payload), now])
    cursor.execute(PUBLISH, [old_ids[0]])

call_command("migrate", verbosity=0)
from notifications_retry.rules.event_ids import outbox_event_id

result = {}
with connection.cursor() as cursor:
    cursor.execute("SELECT event_id::text FROM notifications_retry_outbox ORDER BY id")
    result["ids"] = [r[0] for r in cursor.fetchall()]
    try:
        with transaction.atomic():
            payload = {"notification_id": str(rows[1].pk), "status": "Sent"}
            cursor.execute(INSERT, [outbox_event_id("pin.notifications.dispatched.v1", str(rows[1].pk), 0),
                                    str(rows[1].pk), json.dumps(payload), now])
        result["repeat"] = "accepted"
    except IntegrityError as exc:
        result["repeat"] = str(exc)
    cursor.execute(PUBLISH, [old_ids[1]])
    result["marked"] = cursor.rowcount
    cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'notifications_retry_notificationentity'")
    result["reloptions"] = cursor.fetchone()[0]
result["old_ids"] = [str(i) for i in old_ids]
print("RESULT " + json.dumps(result))
"""


@pytest.fixture
def scratch_database():
    url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    name = database_name(f"nr_mig0008_{os.getpid()}_{uuid.uuid4().hex[:6]}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_existing_events_keep_their_ids_and_their_outcomes(scratch_database):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "NR_TEST_DATABASE_NAME": scratch_database,
    }
    done = subprocess.run(
        [sys.executable, "-c", SCENARIO], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    assert result["ids"] == result["old_ids"]  # no event id was rewritten, published or not
    assert "exists already" in result["repeat"]  # an old event's outcome cannot be announced again
    assert result["marked"] == 1  # an old unpublished event can still be published
    assert result["reloptions"] == ["fillfactor=70"]
