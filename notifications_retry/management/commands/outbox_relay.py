"""``manage.py outbox_relay``: parse options, run the relay. No SQL, no HTTP here."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS

from notifications_retry.conf import get_settings, heartbeat_max_age
from notifications_retry.database.locks import LockNotDirect
from notifications_retry.delivery.session import bound_connections
from notifications_retry.management import option_types
from notifications_retry.observability import metrics
from notifications_retry.observability.liveness import check_process_liveness
from notifications_retry.outbox.publishers import BUILTIN_PUBLISHERS
from notifications_retry.outbox.relay import (
    HEARTBEAT_NAME,
    OUTBOX_RELAY_BATCH_SIZE,
    OUTBOX_RELAY_INTERVAL_SECONDS,
    run_relay,
)


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
            help=f"Events claimed and published per batch (default {OUTBOX_RELAY_BATCH_SIZE}).",
        )
        parser.add_argument(
            "--interval",
            type=option_types.positive_float,
            default=None,
            help=f"Pause once the outbox is drained (default {OUTBOX_RELAY_INTERVAL_SECONDS:g}).",
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
        parser.add_argument(
            "--metrics-port",
            type=option_types.port,
            default=None,
            help="Serve Prometheus metrics on this port (default: none; 0 picks a free port): the outbox "
            'gauges, read every 10 s, and notifications_retry_task_failures_total{task="relay"}.',
        )
        parser.add_argument(
            "--metrics-addr",
            type=option_types.ip_address,
            # None, not the address: argparse would run the type's check on a default given as text.
            default=None,
            help=f"Address the metrics endpoint listens on (default {metrics.EXPORTER_ADDR}).",
        )
        parser.add_argument(
            "--heartbeat-file",
            default=None,
            metavar="PATH",
            help="This process's own heartbeat: the relay writes PATH after every batch; with --check, "
            "healthy only when PATH is recent (a pod's liveness probe).",
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="Liveness probe, with --heartbeat-file: exit 0 when the relay writing it did so within "
            f"{heartbeat_max_age(conf):g} s (two of the worker's intervals and MAX_DURATION_SECONDS, at "
            "least 180), 1 otherwise. "
            "Publishes nothing.",
        )

    def execute(self, *args: Any, **options: Any) -> str | None:
        if options.get("check"):
            # A liveness probe runs every few seconds: skip the system checks, they cost more than the probe.
            options["skip_checks"] = True
        return super().execute(*args, **options)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["check"]:
            self._check(options)
            return
        extra = {"url": options["url"]} if options["url"] else {}
        if options["metrics_port"] is not None:
            self._serve_metrics(options["metrics_addr"] or metrics.EXPORTER_ADDR, options["metrics_port"])
        bound_connections(DEFAULT_DB_ALIAS)  # a partition must not hold the relay's connection for long
        try:
            reports = run_relay(
                once=options["once"],
                publisher=options["publisher"],
                options=extra,
                batch_size=options["batch_size"],
                interval=options["interval"],
                heartbeat_file=options["heartbeat_file"],
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

    def _serve_metrics(self, addr: str, port: int) -> None:
        try:
            bound = metrics.start_exporter(port, addr)
        except OSError as exc:
            raise CommandError(
                f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}", returncode=2
            ) from exc
        self.stdout.write(f"serving metrics on {addr}:{bound}")

    def _check(self, options: dict[str, Any]) -> None:
        if not options["heartbeat_file"]:
            raise CommandError(
                "--check reads the relay's heartbeat: give --heartbeat-file PATH", returncode=2
            )
        if options["once"]:
            raise CommandError("--check publishes nothing; it cannot be combined with --once", returncode=2)
        verdict = check_process_liveness(options["heartbeat_file"], lane=HEARTBEAT_NAME)
        if not verdict.healthy:
            raise CommandError(verdict.describe(), returncode=1)
        self.stdout.write(verdict.describe())
