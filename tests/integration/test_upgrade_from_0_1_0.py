"""An upgrade from 0.1.0's schema (migration 0010) to the newest, with rows in every state.

The rows are written with the models as they were at 0010 (the migration state's historical models and
0.1.0's own SQL function for event ids), as a 0.1.0 deployment left them: fresh, scheduled and failed
rows due and not yet due, a lease whose worker died and one still running, Sent rows and dead letters,
outbox events published and not, and channels enabled and disabled. After ``migrate`` (to whatever is
newest) no row is lost or changed, the rules of the newest schema hold for them (``due_at``), and a
worker tick, ``retry_worker --once`` run in the same process, sends exactly the rows that are due.

Runs in a subprocess on a scratch database of the test server: migrating the shared test database
back and forth would disturb the other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.databases import scratch_database

ROOT = Path(__file__).resolve().parents[2]
RELEASE_0_1_0 = "0010_cheaper_due_at_and_event_ids"

SCENARIO = r"""
import json, uuid
from datetime import timedelta
import django
django.setup()
from django.core.management import call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.utils import timezone

call_command("migrate", "notifications_retry", "RELEASE", verbosity=0)
state = MigrationLoader(connection).project_state(("notifications_retry", "RELEASE"))
Channel = state.apps.get_model("notifications_retry", "ChannelConfig")
Notification = state.apps.get_model("notifications_retry", "NotificationEntity")

now = timezone.now()
hour = timedelta(hours=1)
in_app = Channel.objects.create(key="in_app", provider_key="in_app", max_attempts=5)
stub = Channel.objects.create(key="stub_ok", provider_key="stub", max_attempts=5)
Channel.objects.create(key="sms_off", provider_key="stub", is_enabled=False)
off = Channel.objects.get(key="sms_off")

def row(case, channel, **fields):
    fields.setdefault("payload", {"case": case})
    return Notification.objects.create(channel=channel, recipient=f"{case}@example.com",
                                       correlation_id=case, **fields)

failure = [{"attempt": 1, "at": (now - hour).isoformat(), "outcome": "retry", "error_kind": "http_503",
            "error": "503"}]
rows = {
    "fresh": row("fresh", in_app),
    "scheduled_due": row("scheduled_due", in_app, scheduled_at=now - hour),
    "scheduled_later": row("scheduled_later", in_app, scheduled_at=now + 24 * hour),
    "scheduled_disabled": row("scheduled_disabled", off, scheduled_at=now - hour),
    "failed_due": row("failed_due", stub, status="failed", attempts=1, next_attempt_at=now - hour,
                      error_kind="http_503", last_error="503", attempt_log=failure),
    "failed_later": row("failed_later", in_app, status="failed", attempts=1, next_attempt_at=now + 24 * hour,
                        error_kind="http_503", last_error="503", attempt_log=failure),
    # A 0.1.0 claim counted the attempt and set the lease: one whose worker died, one still running.
    "lease_lapsed": row("lease_lapsed", in_app, scheduled_at=now - 2 * hour, attempts=1,
                        claim_token=uuid.uuid4(), claim_expires_at=now - hour),
    "lease_running": row("lease_running", in_app, scheduled_at=now - 2 * hour, attempts=1,
                         claim_token=uuid.uuid4(), claim_expires_at=now + 24 * hour),
    "sent": row("sent", in_app, status="sent", attempts=1, provider_message_id="in_app:1",
                attempt_log=[{"attempt": 1, "at": now.isoformat(), "outcome": "sent"}]),
    "sent_unannounced": row("sent_unannounced", in_app, status="sent", attempts=2,
                            provider_message_id="in_app:2"),
    "dead_letter": row("dead_letter", stub, status="failed", attempts=5, dead_lettered_at=now - hour,
                       error_kind="http_500", last_error="500", attempt_log=failure),
}
# 0.1.0's own function derives each event's id (migration 0008).
EVENT = ("INSERT INTO notifications_retry_outbox (event_id, topic, key, contract_version, generation, "
         "payload, created_at, published_at) "
         "VALUES (nr_outbox_event_id('pin.notifications.dispatched.v1', %s, 0), "
         "'pin.notifications.dispatched.v1', %s, 1, 0, %s, %s, NULL)")
with connection.cursor() as cursor:
    for case, status in (("sent", "Sent"), ("sent_unannounced", "Sent"), ("dead_letter", "Failed")):
        key = str(rows[case].pk)
        cursor.execute(EVENT, [key, key, json.dumps({"notification_id": key, "status": status}), now])
    # 0.1.0's relay marks what it published: the first event was published, the others not yet.
    cursor.execute("UPDATE notifications_retry_outbox SET published_at = %s WHERE key = %s",
                   [now, str(rows["sent"].pk)])

NOTIFICATION_COLUMNS = ("id::text, channel_id, recipient, payload, status, attempts, next_attempt_at, "
                        "scheduled_at, claim_token::text, claim_expires_at, dead_lettered_at, error_kind, "
                        "provider_message_id, correlation_id, attempt_log, requeue_count")

def snapshot():
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {NOTIFICATION_COLUMNS} FROM notifications_retry_notificationentity "
                       "ORDER BY id")
        notifications = {r[0]: [str(v) for v in r] for r in cursor.fetchall()}
        cursor.execute("SELECT event_id::text, topic, key, generation, payload, published_at "
                       "FROM notifications_retry_outbox ORDER BY id")
        outbox = [[str(v) for v in r] for r in cursor.fetchall()]
        cursor.execute("SELECT id, key, provider_key, is_enabled, options, max_attempts "
                       "FROM notifications_retry_channelconfig ORDER BY id")
        channels = [[str(v) for v in r] for r in cursor.fetchall()]
    return {"notifications": notifications, "outbox": outbox, "channels": channels}

result = {"ids": {case: str(r.pk) for case, r in rows.items()}, "before": snapshot()}
call_command("migrate", verbosity=0)
result["after_migrate"] = snapshot()
with connection.cursor() as cursor:
    cursor.execute("SELECT id::text, due_at, status, scheduled_at, next_attempt_at, claim_token IS NOT NULL, "
                   "dead_lettered_at IS NOT NULL FROM notifications_retry_notificationentity")
    result["due"] = [[str(v) for v in r] for r in cursor.fetchall()]
    cursor.execute("SELECT id::text, health_state FROM notifications_retry_channelconfig")
    result["health"] = dict(cursor.fetchall())
    cursor.execute("SELECT name FROM django_migrations WHERE app = 'notifications_retry' "
                   "ORDER BY name DESC LIMIT 1")
    result["migrated_to"] = cursor.fetchone()[0]

call_command("retry_worker", "--once", verbosity=0)
result["after_tick"] = snapshot()
with connection.cursor() as cursor:
    cursor.execute("SELECT key, payload->>'status', count(*) FROM notifications_retry_outbox "
                   "GROUP BY key, payload->>'status'")
    result["events"] = [[str(v) for v in r] for r in cursor.fetchall()]
print("RESULT " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def upgrade() -> dict:
    with scratch_database("nr_upgrade") as scratch:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "NR_TEST_DATABASE_NAME": scratch.name,
        }
        done = subprocess.run(
            [sys.executable, "-c", SCENARIO.replace("RELEASE", RELEASE_0_1_0)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT ") :]))


#: Columns of the notification snapshot, by name.
COLUMNS = [
    *("id", "channel_id", "recipient", "payload", "status", "attempts", "next_attempt_at", "scheduled_at"),
    *("claim_token", "claim_expires_at", "dead_lettered_at", "error_kind", "provider_message_id"),
    *("correlation_id", "attempt_log", "requeue_count"),
]
DUE = {"scheduled_due", "failed_due", "lease_lapsed"}


def column(row: list[str], name: str) -> str:
    return row[COLUMNS.index(name)]


def test_it_starts_from_0_1_0s_last_migration_and_ends_at_the_newest(upgrade: dict) -> None:
    newest = max(
        p.stem for p in (ROOT / "notifications_retry" / "migrations").glob("[0-9][0-9][0-9][0-9]_*.py")
    )
    assert upgrade["migrated_to"] == newest
    assert len(upgrade["before"]["notifications"]) == len(upgrade["ids"]) == 11


def test_migrate_loses_and_changes_no_row_event_or_channel(upgrade: dict) -> None:
    assert upgrade["after_migrate"]["notifications"] == upgrade["before"]["notifications"]
    assert upgrade["after_migrate"]["outbox"] == upgrade["before"]["outbox"]
    assert upgrade["after_migrate"]["channels"] == upgrade["before"]["channels"]
    assert set(upgrade["health"].values()) == {"ok"}  # the health columns' defaults, for existing channels


def test_every_row_is_due_as_the_newest_rules_say(upgrade: dict) -> None:
    for pk, due_at, status, scheduled_at, next_attempt_at, leased, dead in upgrade["due"]:
        if leased == "True" or dead == "True" or status == "sent":
            expected = "None"  # a lease (0020), a dead letter or a Sent row is in no due index
        elif status == "failed":
            expected = next_attempt_at
        else:
            expected = scheduled_at  # None for a fresh row: the dispatcher's, never the worker's
        assert due_at == expected, (pk, status, due_at, expected)


def test_the_tick_after_the_upgrade_sends_exactly_the_due_rows(upgrade: dict) -> None:
    before, after = upgrade["after_migrate"]["notifications"], upgrade["after_tick"]["notifications"]
    assert set(after) == set(before)  # nothing lost
    for case, pk in upgrade["ids"].items():
        old, new = before[pk], after[pk]
        if case in DUE:
            assert column(new, "status") == "sent", (case, new)
            assert column(new, "claim_token") == "None" and column(new, "claim_expires_at") == "None"
            # A lapsed lease's attempt was counted by the 0.1.0 claim that never finished it.
            counted = 0 if case == "lease_lapsed" else 1
            assert int(column(new, "attempts")) >= int(column(old, "attempts")) + counted
            assert column(new, "provider_message_id").startswith(("in_app:", "stub")), new
        else:
            assert new == old, case  # not due, held by a running lease, on a disabled channel, or final


def test_each_row_sent_by_the_tick_has_one_event_and_the_old_events_are_kept(upgrade: dict) -> None:
    events = {(key, status): int(count) for key, status, count in upgrade["events"]}
    for case in DUE:
        assert events[(upgrade["ids"][case], "Sent")] == 1, case
    ids = upgrade["ids"]
    assert events[(ids["sent"], "Sent")] == events[(ids["sent_unannounced"], "Sent")] == 1
    assert events[(ids["dead_letter"], "Failed")] == 1
    assert len(events) == len(DUE) + 3
    old = {row[0]: row for row in upgrade["after_migrate"]["outbox"]}
    kept = {row[0]: row for row in upgrade["after_tick"]["outbox"] if row[0] in old}
    assert set(kept) == set(old)
    for event_id, row in old.items():
        # Id, topic, key, generation and payload never change; a published event stays published as it
        # was (a worker that also relays may publish the others).
        assert kept[event_id][:5] == row[:5]
        if row[5] != "None":
            assert kept[event_id][5] == row[5]
