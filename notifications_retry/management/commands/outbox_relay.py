"""``manage.py outbox_relay``: parse options, run the relay. No SQL, no HTTP here."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS

from notifications_retry.conf import get_settings
from notifications_retry.delivery.session import bound_connections
from notifications_retry.locks import LockNotDirect
from notifications_retry.management import option_types
from notifications_retry.outbox.publishers import BUILTIN_PUBLISHERS
from notifications_retry.outbox.relay import run_relay


class Command(BaseCommand):
    help = (
        "Publish unpublished outbox events in order of creation, at least once (a loop, or --once to "
        "drain what can be published now)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        conf = get_settings()
        parser.add_argument(
            "--once",
            action="store_true",
            help="Publish until nothing more can be published now, then exit: 0 when the outbox was "
            "drained, 1 when a publish failure left events unpublished.",
        )
        parser.add_argument(
            "--batch-size",
            type=option_types.positive_int,
            default=None,
            help=f"Events claimed and published per batch (default {conf.OUTBOX_RELAY_BATCH_SIZE}).",
        )
        parser.add_argument(
            "--interval",
            type=option_types.positive_float,
            default=None,
            help=f"Pause once the outbox is drained (default {conf.OUTBOX_RELAY_INTERVAL_SECONDS:g}).",
        )
        parser.add_argument(
            "--publisher",
            default=None,
            help=f"{', '.join(repr(name) for name in BUILTIN_PUBLISHERS)} or a dotted path to a Publisher "
            f"class (default {conf.OUTBOX_PUBLISHER!r}).",
        )
        parser.add_argument(
            "--url", default=None, help="Endpoint of the http publisher (overrides OUTBOX_PUBLISHER_OPTIONS)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        extra = {"url": options["url"]} if options["url"] else {}
        bound_connections(DEFAULT_DB_ALIAS)  # a partition must not hold the relay's connection for long
        try:
            reports = run_relay(
                once=options["once"],
                publisher=options["publisher"],
                options=extra,
                batch_size=options["batch_size"],
                interval=options["interval"],
            )
        except LockNotDirect as exc:  # a configuration to fix, as the worker says it: one line, exit 2
            raise CommandError(f"LockNotDirect: {exc}", returncode=2) from exc
        except ValueError as exc:
            raise CommandError(str(exc), returncode=2) from exc
        published = sum(r.published for r in reports)
        left = options["once"] and any(r.unpublished_left_behind or r.endpoint_down for r in reports)
        self.stdout.write(f"published {published} event(s)" + (", some left unpublished" if left else ""))
        if left:
            raise CommandError("publishing failed; the events stay in the outbox", returncode=1)
