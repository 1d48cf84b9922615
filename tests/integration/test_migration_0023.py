"""Migration 0023 on a suppression list written under the earlier rule (local part kept as written).

Entries are rewritten case-folded whole, entries of one channel that differ only by case are merged
(earliest row kept, most severe reason, never-expiring wins), other channels and non-email recipients
are left alone, and reversing it is a no-op. Runs the migration executor in a subprocess on a scratch
database of the test server (migrating the shared test database back and forth would disturb the
other tests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.databases import scratch_database

ROOT = Path(__file__).resolve().parents[2]
BEFORE = ("notifications_retry", "0022_channel_fallback_check_by_id")
AFTER = ("notifications_retry", "0023_suppression_addresses_without_case")

SCENARIO = r"""
import json
from datetime import datetime, timezone
import django
django.setup()
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = tuple(json.loads(%(before)r))
AFTER = tuple(json.loads(%(after)r))


def migrate(target):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target])


def rows():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, address, channel, reason, source, detail, first_event_at, last_event_at, events, "
            "expires_at FROM notifications_retry_suppression ORDER BY id"
        )
        return [
            [value.isoformat() if isinstance(value, datetime) else value for value in row]
            for row in cursor.fetchall()
        ]


def at(day):
    return datetime(2026, 3, day, 10, tzinfo=timezone.utc)


migrate(BEFORE)
INSERT = (
    "INSERT INTO notifications_retry_suppression (address, channel, reason, source, detail, first_event_at, "
    "last_event_at, events, expires_at) VALUES (%%s, %%s, %%s, %%s, %%s, %%s, %%s, %%s, %%s) RETURNING id"
)
ids = {}
with connection.cursor() as cursor:
    for name, values in [
        # Three spellings of one mailbox on '*': the second is the earliest, the third the most severe.
        ("john_manual", ("john@example.com", "*", "manual", "operator: ann", "", at(5), at(5), 1, at(20))),
        ("john_bounce", ("John@example.com", "*", "hard_bounce", "Postmark", "5.1.1", at(2), at(3), 2, None)),
        ("john_complaint", ("JOHN@example.com", "*", "complaint", "Mailgun", "spam", at(4), at(9), 1, at(9))),
        # The same mailbox on one channel: an entry of its own, rewritten.
        ("john_email", ("John@example.com", "email", "unsubscribed", "Postmark", "", at(1), at(1), 1, None)),
        # Alone, and already in the new form: left as it is.
        ("ann", ("ann@example.com", "*", "manual", "operator: ann", "", at(1), at(1), 1, None)),
        # Not email addresses: verbatim, case and all.
        ("token", ("TokenAbC", "*", "manual", "operator: ann", "", at(1), at(1), 1, None)),
        ("token_lower", ("tokenabc", "*", "manual", "operator: ann", "", at(2), at(2), 1, None)),
        # Two that both expire: the merged one expires at the later.
        ("mia_early", ("Mia@example.com", "*", "hard_bounce", "SES", "a", at(1), at(1), 1, at(10))),
        ("mia_late", ("mia@EXAMPLE.com", "*", "invalid_recipient", "SMTP", "b", at(2), at(2), 1, at(12))),
    ]:
        cursor.execute(INSERT, values)
        ids[name] = cursor.fetchone()[0]
before = rows()
migrate(AFTER)
after = rows()
migrate(BEFORE)  # reversible: a no-op
reversed_rows = rows()
migrate(AFTER)  # and forward again: nothing left to change
again = rows()
result = {"ids": ids, "before": before, "after": after, "reversed": reversed_rows, "again": again}
print("RESULT " + json.dumps(result))
"""


def run_scenario() -> dict:
    with scratch_database("nr_mig0023") as database:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "NR_TEST_DATABASE_NAME": database.name,
        }
        code = SCENARIO % {"before": json.dumps(BEFORE), "after": json.dumps(AFTER)}
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_suppressions_are_case_folded_and_case_duplicates_merged_reversibly():
    result = run_scenario()
    ids = result["ids"]
    after = {row[0]: row[1:] for row in result["after"]}
    # One row per mailbox and channel; the earliest of each group survives, the others are gone.
    assert sorted(after) == sorted(
        ids[name] for name in ("john_bounce", "john_email", "ann", "token", "token_lower", "mia_early")
    )
    address, channel, reason, source, detail, first, last, events, expires = after[ids["john_bounce"]]
    assert (address, channel, reason) == ("john@example.com", "*", "complaint")  # the most severe
    assert (source, detail) == ("Mailgun", "spam")  # the latest report's
    assert (first, last, events) == ("2026-03-02T10:00:00+00:00", "2026-03-09T10:00:00+00:00", 4)
    assert expires is None  # one of them never expired: the merged entry never does
    assert after[ids["john_email"]][:3] == ["john@example.com", "email", "unsubscribed"]
    assert after[ids["ann"]][0] == "ann@example.com"
    assert (after[ids["token"]][0], after[ids["token_lower"]][0]) == ("TokenAbC", "tokenabc")
    mia = after[ids["mia_early"]]
    assert (mia[0], mia[2], mia[7], mia[8]) == (
        "mia@example.com",
        "hard_bounce",
        2,
        "2026-03-12T10:00:00+00:00",
    )
    # Reversing changes nothing, and a second run finds nothing left to do.
    assert result["reversed"] == result["after"] == result["again"]
