"""``manage.py retry_worker``: parse options, run the worker. No SQL, no HTTP here."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from notifications_retry.conf import get_settings
from notifications_retry.worker import run_worker


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {number}")
    return number


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def _non_negative_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


class Command(BaseCommand):
    help = "Re-send due Failed notifications and send due deferred ones (one tick with --once, else a loop)."

    def add_arguments(self, parser: CommandParser) -> None:
        conf = get_settings()
        parser.add_argument("--once", action="store_true", help="Run one tick and exit (cron, k8s CronJob).")
        parser.add_argument("--interval", type=_non_negative_float, default=None,
                            help=f"Seconds between tick starts (default {conf.INTERVAL_SECONDS:g}).")
        parser.add_argument("--batch-size", type=_positive_int, default=None,
                            help=f"Most records a tick takes (default {conf.BATCH_SIZE}).")
        parser.add_argument("--max-duration", type=_positive_float, default=None,
                            help=f"Seconds after which a tick takes no new records (default "
                                 f"{conf.MAX_DURATION_SECONDS:g}).")
        parser.add_argument("--lane", default=None,
                            help="Run one lane of NOTIFICATIONS_RETRY['LANES'] with its own lock.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            run_worker(once=options["once"], batch_size=options["batch_size"],
                       max_duration=options["max_duration"], interval=options["interval"], lane=options["lane"])
        except ValueError as exc:
            raise CommandError(str(exc), returncode=2) from exc
