"""``manage.py retry_worker``: parse options, run the worker. No SQL, no HTTP here. Options: docs/contract.md.

``--metrics-port`` serves Prometheus metrics from this process (never started by importing the app);
``--check`` is a liveness probe: exit 1 when the lane's last completed tick is too old (with
``--heartbeat-file``, when this process's own heartbeat file is).
Exit statuses are listed in ``EXIT_STATUSES`` (and docs/operations.md). Before its first tick the
process's garbage collector is set for a run of hours (:func:`prepare_for_long_run`).
"""

from __future__ import annotations

import gc
from typing import Any

import structlog
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS

from notifications_retry.conf import get_settings, heartbeat_max_age
from notifications_retry.database.locks import LockNotDirect
from notifications_retry.delivery.session import bound_connections
from notifications_retry.engine import failures
from notifications_retry.engine.loop_tasks import OutboxGauges, UnreadableDueTimes
from notifications_retry.engine.worker import Worker
from notifications_retry.management import option_types
from notifications_retry.observability import metrics
from notifications_retry.observability.liveness import check_liveness, check_process_liveness
from notifications_retry.version import __version__

log = structlog.get_logger("notifications_retry.command")


EXIT_STATUSES = (
    "Exit status: 0 after a tick (or a graceful stop, or --once while another instance holds the lock); "
    "1 --check found the last tick too old; 2 bad options; "
    f"{failures.EXIT_STATUS[failures.UNREACHABLE]} --once could not reach the database "
    "(or the database failed the tick); "
    f"{failures.EXIT_STATUS[failures.NOT_MIGRATED]} --once found the database not migrated."
)


#: The youngest generation's threshold a worker runs with (unless the project set a larger one, or 0).
YOUNG_THRESHOLD = 20_000


def prepare_for_long_run() -> None:
    """Set the worker process's garbage collector for a send loop that runs for hours: collect and
    freeze what is loaded, and raise the youngest generation's threshold (a threshold the project set
    higher, or 0 for no automatic collection, is kept). Called once, before the first tick.

    - What the process has loaded by then (Django, the app, its libraries) lives as long as the process.
      The collector's full passes walked all of it again each time, stalling the send loop for tens of
      milliseconds; frozen (``gc.freeze``), it is no longer walked.
    - The youngest generation is collected whenever 700 more container objects are alive than at the
      last collection (CPython's default). A worker with a hundred calls in flight keeps more than that
      alive at once (each call's request, answer, task and timer), so at the default the collector ran
      every few answers, walking the same live calls, and every tenth run walked the middle generation
      too. A young generation of :data:`YOUNG_THRESHOLD` objects holds the calls in flight of any
      channel's concurrency a worker runs, and costs only the cyclic garbage it lets wait longer
      (docs/performance.md, "Where the loop's time goes at c=128").
    """
    gc.collect()
    gc.freeze()
    young, *older = gc.get_threshold()
    if 0 < young < YOUNG_THRESHOLD:
        gc.set_threshold(YOUNG_THRESHOLD, *older)


class Command(BaseCommand):
    help = (
        "Re-send due Failed notifications and send due deferred ones (one tick with --once, else a loop). "
        + EXIT_STATUSES
    )

    def check(self, *args: Any, **kwargs: Any) -> None:
        """Django's system checks, less W006: an unreachable database is this command's own one-line
        error (exit 3), which the warning would only say a second time, in five lines.

        The setting is changed and put back here rather than with ``override_settings``, whose module
        (``django.test``) would cost every start of the worker about 15 ms of imports."""
        silenced = list(getattr(settings, "SILENCED_SYSTEM_CHECKS", []))
        settings.SILENCED_SYSTEM_CHECKS = [*silenced, "notifications_retry.W006"]
        try:
            super().check(*args, **kwargs)
        finally:
            settings.SILENCED_SYSTEM_CHECKS = silenced

    def get_version(self) -> str:
        """The app's version (``--version``), not Django's."""
        return __version__

    def add_arguments(self, parser: CommandParser) -> None:
        conf = get_settings()
        parser.add_argument("--once", action="store_true", help="Run one tick and exit (cron, k8s CronJob).")
        parser.add_argument(
            "--interval",
            type=option_types.positive_float,
            default=None,
            help=f"Most seconds between tick starts, > 0 (default {conf.INTERVAL_SECONDS:g}; a row "
            "falling due starts one sooner); "
            "longer after ticks that failed on the database (doubling from 1 s up to 30 s).",
        )
        parser.add_argument(
            "--batch-size",
            type=option_types.positive_int,
            default=None,
            help=f"Most records a tick takes (default {conf.BATCH_SIZE}).",
        )
        parser.add_argument(
            "--max-duration",
            type=option_types.positive_float,
            default=None,
            help=f"Seconds after which a tick takes no new records (default {conf.MAX_DURATION_SECONDS:g}).",
        )
        parser.add_argument(
            "--max-in-flight",
            type=option_types.positive_int,
            default=None,
            help=f"Most provider calls this worker has in flight across all its channels "
            f"(default WORKER_MAX_IN_FLIGHT, {conf.WORKER_MAX_IN_FLIGHT}); a channel's max_concurrency is "
            "a total over all workers.",
        )
        parser.add_argument(
            "--lane", default=None, help="Run one lane of NOTIFICATIONS_RETRY['LANES'] with its own lock."
        )
        parser.add_argument(
            "--no-relay",
            action="store_true",
            help="Do not publish the outbox from this worker: a separate `manage.py outbox_relay` does "
            "(default: the worker publishes it between ticks, with OUTBOX_PUBLISHER).",
        )
        parser.add_argument(
            "--no-housekeeping",
            action="store_true",
            help="Do not run housekeeping from this worker: a scheduled `manage.py "
            "notifications_housekeeping` does (default: one elected worker runs it every hour; never "
            "with --once).",
        )
        parser.add_argument(
            "--metrics-port",
            type=option_types.port,
            default=None,
            help="Serve Prometheus metrics on this port (default: METRICS_PORT, or none; "
            "0 picks a free port, logged as metrics-exporter-started).",
        )
        parser.add_argument(
            "--metrics-addr",
            type=option_types.ip_address,
            # None, not the address: argparse would run the type's check on a default given as text.
            default=None,
            help=f"Address the metrics endpoint listens on (default {metrics.EXPORTER_ADDR}; 0.0.0.0 in a "
            "container scraped from outside).",
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="Liveness probe: exit 0 when the lane's last completed tick is recent "
            "enough, 1 otherwise. Runs no tick.",
        )
        parser.add_argument(
            "--heartbeat-file",
            default=None,
            metavar="PATH",
            help="This process's own heartbeat: the worker writes PATH at each tick's start and end and "
            "every few seconds while it waits; with --check, healthy only when PATH is recent, so a "
            "probe judges its own pod, not the lane (which another worker may keep ticking).",
        )
        parser.add_argument(
            "--max-age",
            type=option_types.positive_float,
            default=None,
            help=f"With --check: seconds after which the last completed tick is too old (default "
            f"{heartbeat_max_age(conf):g}: two intervals and MAX_DURATION_SECONDS, at least 180).",
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
        if options["max_age"] is not None:
            raise CommandError("--max-age only applies to --check", returncode=2)
        port = options["metrics_port"] if options["metrics_port"] is not None else get_settings().METRICS_PORT
        if port is not None:
            self._serve_metrics(options["metrics_addr"] or metrics.EXPORTER_ADDR, port)
        if not options["once"]:
            self._warn_about_overlap(options)
        # This process is the worker's: a partition must not hold its connections for the kernel's
        # quarter of an hour of retransmissions.
        bound_connections(DEFAULT_DB_ALIAS)
        try:
            worker = Worker(
                batch_size=options["batch_size"],
                max_duration=options["max_duration"],
                interval=options["interval"],
                lane=options["lane"],
                max_in_flight=options["max_in_flight"],
                heartbeat_file=options["heartbeat_file"],
                serving_metrics=port is not None,
            )
            self._add_tasks(worker, options)
            worker.install_signal_handlers()
            # The collector set for a long run: what is loaded by now frozen, a young generation that
            # holds the calls in flight.
            prepare_for_long_run()
            ticks = worker.run(once=options["once"])
        except LockNotDirect as exc:
            raise CommandError(f"LockNotDirect: {exc}", returncode=2) from exc
        except ValueError as exc:
            raise CommandError(str(exc), returncode=2) from exc
        # A loop that was stopped exits 0 whatever its last tick did; --once reports its one tick.
        if options["once"] and ticks and ticks[-1].error:
            status = failures.EXIT_STATUS.get(ticks[-1].error_kind, 3)
            raise CommandError(ticks[-1].error, returncode=status)

    def _add_tasks(self, worker: Worker, options: dict[str, Any]) -> None:
        """What the worker's loop runs besides its ticks (engine.loop_tasks). The outbox's gauges only
        when this process serves ``/metrics``: elsewhere they would be set where nothing reads them."""
        if worker.options.serving_metrics:
            worker.tasks.add(OutboxGauges(worker.clock))
        # Every worker, elected or not: a row it can never take is set aside after its first tick.
        worker.tasks.add(UnreadableDueTimes(worker.clock))
        # Imported when used: a worker started without them loads no publisher and no housekeeping.
        if not options["no_relay"]:
            from notifications_retry.outbox.relay import relay_task

            worker.tasks.add(relay_task(worker.lock, clock=worker.clock, batch_size=worker.batch_size))
        if not options["no_housekeeping"] and not options["once"]:
            from notifications_retry.housekeeping import HousekeepingTask

            worker.tasks.add(HousekeepingTask(worker.lock, clock=worker.clock, monotonic=worker.monotonic))
        log.info("worker-tasks", lane=worker.lane, tasks=worker.tasks.names)

    def _warn_about_overlap(self, options: dict[str, Any]) -> None:
        """Ticks never overlap: a tick allowed to outlast the interval delays the next one."""
        conf = get_settings()
        interval = options["interval"] if options["interval"] is not None else conf.INTERVAL_SECONDS
        max_duration = (
            options["max_duration"] if options["max_duration"] is not None else conf.MAX_DURATION_SECONDS
        )
        if max_duration >= interval:
            self.stderr.write(
                self.style.WARNING(
                    f"warning: --max-duration {max_duration:g} is not shorter than --interval {interval:g}: "
                    "a tick that runs that long delays the next one (ticks never overlap); "
                    "give --max-duration less than --interval"
                )
            )

    def _check(self, options: dict[str, Any]) -> None:
        conflicting = [
            f"--{name.replace('_', '-')}"
            for name in ("once", "interval", "batch_size", "max_duration", "max_in_flight", "metrics_port")
            if options[name] not in (None, False)
        ]
        if conflicting:
            raise CommandError(
                f"--check runs no tick; it cannot be combined with {', '.join(conflicting)}", returncode=2
            )
        lane = options["lane"]
        if lane and lane != "default" and lane not in get_settings().LANES:
            raise CommandError(
                f"unknown lane {lane!r}; configured lanes: {sorted(get_settings().LANES) or 'none'}",
                returncode=2,
            )
        if options["heartbeat_file"]:
            verdict = check_process_liveness(options["heartbeat_file"], lane=lane, max_age=options["max_age"])
        else:
            verdict = check_liveness(lane=lane, max_age=options["max_age"])
        if not verdict.healthy:
            raise CommandError(verdict.describe(), returncode=1)
        self.stdout.write(verdict.describe())

    def _serve_metrics(self, addr: str, port: int) -> None:
        try:
            bound = metrics.start_exporter(port, addr)
        except OSError as exc:
            raise CommandError(
                f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}", returncode=2
            ) from exc
        log.info("metrics-exporter-started", addr=addr, port=bound)
