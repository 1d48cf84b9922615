"""``manage.py notifications_housekeeping``: parse options, run housekeeping. No SQL here."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from notifications_retry.conf import get_settings
from notifications_retry.housekeeping import BACKLOG_SAMPLE_RETENTION_HOURS, run_housekeeping
from notifications_retry.management import option_types


class Command(BaseCommand):
    help = (
        "Mark unresolved dead letters older than the retention unresolvable, delete published outbox "
        "events older than theirs, and delete old backlog samples and expired suppressions (and Sent "
        "notifications older than SENT_RETENTION_DAYS, when set)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        conf = get_settings()
        parser.add_argument(
            "--dead-letter-days",
            type=option_types.positive_int,
            default=None,
            help=f"Retention of unresolved dead letters (default {conf.DEAD_LETTER_RETENTION_DAYS}).",
        )
        parser.add_argument(
            "--outbox-days",
            type=option_types.positive_int,
            default=None,
            help=f"Retention of published outbox events (default {conf.OUTBOX_RETENTION_DAYS}).",
        )
        parser.add_argument(
            "--sample-hours",
            type=option_types.positive_int,
            default=None,
            help=f"Retention of backlog samples (default {BACKLOG_SAMPLE_RETENTION_HOURS}).",
        )
        parser.add_argument(
            "--sent-days",
            type=option_types.positive_int,
            default=None,
            help="Retention of Sent notifications: delete those sent longer ago "
            f"(default SENT_RETENTION_DAYS, {conf.SENT_RETENTION_DAYS}: None keeps them).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        def days(value: int | None) -> timedelta | None:
            return timedelta(days=value) if value else None

        report = run_housekeeping(
            dead_letter_retention=days(options["dead_letter_days"]),
            outbox_retention=days(options["outbox_days"]),
            sample_retention=timedelta(hours=options["sample_hours"]) if options["sample_hours"] else None,
            sent_retention=days(options["sent_days"]),
        )
        self.stdout.write(
            f"set aside {report.set_aside_unreadable} row(s) with unreadable times; "
            f"expired {report.expired_dead_letters} dead letter(s), pruned {report.pruned_outbox} "
            f"outbox event(s) and {report.pruned_backlog_samples} backlog sample(s); "
            f"deleted {report.pruned_suppressions} expired suppression(s) and "
            f"{report.pruned_health_buckets} endpoint-health bucket(s) past the health window; "
            f"deleted {report.pruned_sent} Sent notification(s) past their retention"
        )
