"""``manage.py demo``: migrate, create channels and due notifications, run one tick, show the result."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.db import connection
from django.utils import timezone

from notifications_retry.models import ChannelConfig, NotificationEntity, Outbox

#: Every demo run tags its rows with one correlation id, so reruns only report their own rows.
CORRELATION_PREFIX = "demo-"


class Command(BaseCommand):
    help = "Set up demo channels and due notifications, run the retry worker once, and print what happened."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--loop",
            action="store_true",
            help="After the demo tick, keep the worker running (Ctrl-C stops it gracefully).",
        )
        parser.add_argument("--interval", type=float, default=5.0, help="Seconds between ticks with --loop.")

    def handle(self, *args: Any, **options: Any) -> None:
        self._say(f"database: {_describe_database()}")
        call_command("migrate", interactive=False, verbosity=0)
        self._say("migrated")
        channels = _channels()
        run = f"{CORRELATION_PREFIX}{uuid.uuid4().hex[:8]}"
        now = timezone.now()
        rows = _notifications(channels, run, now)
        before = {row.pk: _state(row) for row in rows}
        self._say(f"created {len(rows)} notifications (run {run})\n")

        from notifications_retry.engine.worker import Worker

        stats = Worker(batch_size=200, max_duration=45.0, interval=60.0).tick()
        after = {
            row.pk: row
            for row in NotificationEntity.objects.filter(correlation_id__startswith=f"{run}:").select_related(
                "channel"
            )
        }
        events = dict(
            Outbox.objects.filter(key__in=[str(pk) for pk in after]).values_list("key", "payload__status")
        )
        table = [
            ("case", "channel", "before", "after", "attempts", "next attempt", "event", "provider id / error")
        ]
        for row in rows:
            done = after[row.pk]
            detail = done.provider_message_id or done.last_error or ""
            table.append(
                (
                    row.correlation_id.split(":", 1)[1],
                    done.channel.key,
                    before[row.pk],
                    _state(done),
                    str(done.attempts),
                    _when(done.next_attempt_at, now),
                    events.get(str(row.pk)) or "-",
                    detail[:48],
                )
            )
        # The headline counts this run's rows, like the table: the same tick also takes rows that
        # earlier runs left due (a disabled channel's, a retry whose time has come).
        counts = _run_counts(rows, before, after, now)
        self._say(
            "worker tick: " + ", ".join(f"{k}={v}" for k, v in counts.items()) + f", skipped={stats.skipped}"
        )
        earlier = {
            "processed": stats.processed - counts["processed"],
            "channel_disabled": stats.channel_disabled - counts["channel_disabled"],
        }
        if any(earlier.values()):
            self._say(
                "  (the same tick also handled rows of earlier demo runs: "
                + ", ".join(f"{k}={v}" for k, v in earlier.items() if v)
                + ")"
            )
        self._say("")
        self.stdout.write(_render(table))
        self._say(
            "\nFresh Pending rows (no scheduled_at) belong to the monolith's dispatcher: the worker left "
            "the fresh one alone.\nDead letters are triaged in the admin: `make demo-admin` creates a demo "
            "superuser, prints its password and serves http://127.0.0.1:8000/admin/ on this data."
        )
        if not os.environ.get("DATABASE_URL"):
            self._say(
                "The embedded PostgreSQL stops when this command exits (`make demo-stop` stops a leftover)."
            )
        if options["loop"]:
            self._say(f"\nworker loop every {options['interval']:g}s; Ctrl-C stops it at a record boundary")
            interval = options["interval"]
            # A tick may not outlast the interval (the command warns otherwise).
            call_command("retry_worker", "--interval", str(interval), "--max-duration", f"{interval * 0.8:g}")

    def _say(self, text: str) -> None:
        self.stdout.write(text)


def _run_counts(
    rows: list[NotificationEntity],
    before: dict[Any, str],
    after: dict[Any, NotificationEntity],
    now: datetime,
) -> dict[str, int]:
    """What the tick did to this run's rows, counted as the worker counts (TickStats)."""
    counts = dict.fromkeys(("processed", "sent", "retried", "terminal", "channel_disabled"), 0)
    for row in rows:
        done = after[row.pk]
        if done.dead_lettered_at is not None:
            counts["terminal"] += 1
        elif done.status == NotificationEntity.Status.SENT:
            counts["sent"] += 1
        elif done.attempts > row.attempts:
            counts["retried"] += 1
        elif not done.channel.is_enabled and _was_due(row, now) and _state(done) == before[row.pk]:
            counts["channel_disabled"] += 1
    counts["processed"] = counts["sent"] + counts["retried"] + counts["terminal"]
    return counts


def _was_due(row: NotificationEntity, now: datetime) -> bool:
    due_at = row.next_attempt_at if row.status == NotificationEntity.Status.FAILED else row.scheduled_at
    return due_at is not None and due_at <= now


def _describe_database() -> str:
    if not os.environ.get("DATABASE_URL"):
        from example_project.embedded_postgres import data_dir

        return f"embedded PostgreSQL (pgserver) in {data_dir()}"
    settings = connection.settings_dict
    host = settings.get("HOST") or (settings.get("OPTIONS") or {}).get("host") or "local socket"
    return f"PostgreSQL {settings.get('NAME')} on {host}"


def _channels() -> dict[str, ChannelConfig]:
    specs: dict[str, dict[str, Any]] = {
        "in_app": {"provider_key": "in_app", "is_enabled": True, "options": {}, "max_attempts": 5},
        # An external channel still behind its feature flag: the stub, told to fail retriably.
        "email": {
            "provider_key": "stub",
            "is_enabled": True,
            "options": {"fail": "retriable"},
            "max_attempts": 3,
        },
        "sms": {"provider_key": "stub", "is_enabled": False, "options": {}, "max_attempts": 3},
    }
    channels = {}
    for key, values in specs.items():
        channel, _ = ChannelConfig.objects.update_or_create(key=key, defaults=values)
        channels[key] = channel
    return channels


def _notifications(channels: dict[str, ChannelConfig], run: str, now: datetime) -> list[NotificationEntity]:
    past = now - timedelta(minutes=5)
    # Email rows are "marketing": ATTEMPTS_BY_TYPE gives them 3 attempts, so attempts=2 is the last one.
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("failed in_app, retry due", "in_app", {"status": "failed", "attempts": 1, "next_attempt_at": past}),
        ("scheduled in_app, due", "in_app", {"status": "pending", "scheduled_at": past}),
        ("failed email, retry due", "email", {"status": "failed", "attempts": 1, "next_attempt_at": past}),
        ("failed email, last attempt", "email", {"status": "failed", "attempts": 2, "next_attempt_at": past}),
        ("scheduled sms, disabled", "sms", {"status": "pending", "scheduled_at": past}),
        (
            "scheduled in_app, later",
            "in_app",
            {"status": "pending", "scheduled_at": now + timedelta(hours=1)},
        ),
        ("fresh in_app (dispatcher's)", "in_app", {"status": "pending"}),
    ]
    rows = []
    for index, (case, channel, fields) in enumerate(cases):
        rows.append(
            NotificationEntity.objects.create(
                channel=channels[channel],
                recipient=f"user{index}@example.com",
                payload={"subject": "Your order shipped", "case": case},
                notification_type="marketing" if channel == "email" else "transactional",
                correlation_id=f"{run}:{case}",
                created_at=now - timedelta(minutes=10),
                **fields,
                **_earlier_attempts(fields.get("attempts", 0), channel, now),
            )
        )
    return rows


def _earlier_attempts(attempts: int, channel: str, now: datetime) -> dict[str, Any]:
    """The attempt log, last error and kind a Failed row with ``attempts`` behind it would hold, so the
    admin's attempt count and its history agree (one entry per attempt, as the worker writes them)."""
    if not attempts:
        return {}
    error = "stub told to fail (retriable)" if channel == "email" else "in_app store was unavailable"
    log = [
        {
            "attempt": n,
            "at": (now - timedelta(minutes=10 - 2 * n)).isoformat(),
            "outcome": "retry",
            "generation": 0,
            "error_kind": "stub_retriable" if channel == "email" else "retriable",
            "error": error,
        }
        for n in range(1, attempts + 1)
    ]
    return {"attempt_log": log, "last_error": error, "error_kind": log[-1]["error_kind"]}


def _state(row: NotificationEntity) -> str:
    if row.dead_lettered_at is not None:
        return "failed (dead letter)"
    if row.status == NotificationEntity.Status.PENDING:
        return "pending (fresh)" if row.scheduled_at is None else "pending (scheduled)"
    return str(row.status)


def _when(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "-"
    seconds = (moment - now).total_seconds()
    return f"in {seconds:.0f}s" if seconds >= 0 else f"{-seconds:.0f}s ago"


def _render(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)
