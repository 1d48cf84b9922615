"""``manage.py notifications_recover``: start, run, resume, cancel or list recovery jobs. No SQL here.

``--channel KEY --since ISO --until ISO [--status dead-letter]`` starts a job over every matching dead
letter and works through it with a progress bar (``--detach``: leave it to ``--work``). SIGTERM/SIGINT
stop after the chunk in hand; the job goes back to pending and resumes where it stopped.
"""

from __future__ import annotations

import getpass
import signal
import time
from types import FrameType
from typing import Any, TextIO, cast

from django.core.management.base import BaseCommand, CommandError, CommandParser

from notifications_retry.delivery import recovery
from notifications_retry.delivery.recovery_filter import RecoveryInputError, recovery_filter
from notifications_retry.management import option_types
from notifications_retry.management.progress import ProgressBar
from notifications_retry.models import RecoveryJob

FILTER_OPTIONS = ("channel", "since", "until")


class Command(BaseCommand):
    help = (
        "Requeue every dead letter of a channel that died between --since and --until, in the background "
        "of a resumable, audited recovery job. Exit status: 0 done, cancelled or stopped by a signal "
        "(the job resumes later); 1 bad input, a job already active on the filter, or a failed job; "
        "2 bad options."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--channel", help="ChannelConfig key whose dead letters to requeue.")
        parser.add_argument("--since", help="Dead-lettered at or after this ISO 8601 time.")
        parser.add_argument("--until", help="Dead-lettered before this ISO 8601 time.")
        parser.add_argument(
            "--status",
            choices=RecoveryJob.RowStatus.values,
            default=RecoveryJob.RowStatus.DEAD_LETTER,
            help="Which dead letters: unresolved (dead-letter, the default), discarded or unresolvable.",
        )
        parser.add_argument("--reason", default="", help="Stored in each requeue's audit row.")
        parser.add_argument("--actor", default=None, help="Who starts the job (default: the OS user).")
        parser.add_argument(
            "--detach", action="store_true", help="Only create the job; a `--work` runner works through it."
        )
        parser.add_argument("--resume", type=option_types.positive_int, metavar="JOB", help="Run job JOB on.")
        parser.add_argument("--cancel", type=option_types.positive_int, metavar="JOB", help="Cancel job JOB.")
        parser.add_argument("--list", action="store_true", help="List recovery jobs, newest first.")
        parser.add_argument(
            "--work", action="store_true", help="Run the jobs waiting for a runner (pending, or stale)."
        )
        parser.add_argument("--once", action="store_true", help="With --work: exit when none is left.")
        parser.add_argument(
            "--interval",
            type=option_types.positive_float,
            default=5.0,
            help="With --work: seconds between looks for new jobs (default 5).",
        )
        parser.add_argument(
            "--pause",
            type=option_types.non_negative_float,
            default=0.0,
            help="Seconds between chunks, to leave the database to a busy worker (default 0).",
        )
        parser.add_argument(
            "--chunk-size",
            type=option_types.positive_int,
            default=recovery.CHUNK_SIZE,
            help=f"Rows per transaction (default {recovery.CHUNK_SIZE}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self._stop = False
        modes = [m for m in ("resume", "cancel", "list", "work") if options[m]]
        given = [f"--{name}" for name in FILTER_OPTIONS if options[name]]
        if len(modes) > 1 or (modes and given):
            raise CommandError(
                "give a filter (--channel, --since, --until) or one of --resume/--cancel/--list/--work"
            )
        if options["once"] and not options["work"]:
            raise CommandError("--once goes with --work (run the waiting jobs, then exit)")
        actor = options["actor"] or getpass.getuser()
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            if options["list"]:
                self._list()
            elif options["cancel"]:
                job = recovery.cancel_job(options["cancel"], actor=actor)
                self.stdout.write(f"cancelled recovery job #{job.pk} after {job.done} requeue(s)")
            elif options["resume"]:
                self._run(options["resume"], options)
            elif options["work"]:
                self._work(options)
            else:
                self._start(options, actor)
        except RecoveryJob.DoesNotExist:
            raise CommandError(f"no recovery job #{options['resume'] or options['cancel']}") from None
        except (RecoveryInputError, recovery.RecoveryConflict, recovery.RecoveryStateError) as exc:
            raise CommandError(str(exc)) from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _start(self, options: dict[str, Any], actor: str) -> None:
        missing = [f"--{name}" for name in FILTER_OPTIONS if not options[name]]
        if missing:
            raise CommandError(f"missing {', '.join(missing)} (or use --resume/--cancel/--list/--work)")
        selection = recovery_filter(
            channel=options["channel"],
            since=options["since"],
            until=options["until"],
            status=options["status"],
        )
        job = recovery.start_job(selection, actor=actor, reason=options["reason"])
        self.stdout.write(f"recovery job #{job.pk}: {job.total} matching row(s)")
        if not options["detach"]:
            self._run(job.pk, options)

    def _run(self, job_id: int, options: dict[str, Any]) -> None:
        # The raw stream: Django's wrapper would end every write with a newline, and the bar redraws in place.
        stream = cast(TextIO, getattr(self.stdout, "_out", self.stdout))
        bar = ProgressBar(stream)

        def draw(job: RecoveryJob) -> None:
            bar.update(
                processed=job.processed,
                total=job.total,
                detail=f"requeued {job.done}, refused {job.failed}",
                final=not job.is_active or self._stop,
            )

        try:
            job = recovery.run_job(
                job_id,
                chunk_size=options["chunk_size"],
                on_chunk=draw,
                should_stop=lambda: self._stop,
                pause=options["pause"],
            )
        except (recovery.RecoveryStateError, RecoveryJob.DoesNotExist):
            raise
        except Exception as exc:
            raise CommandError(
                f"recovery job #{job_id} failed: {exc} (resume it with --resume {job_id})"
            ) from exc
        self._report(job)

    def _report(self, job: RecoveryJob) -> None:
        summary = f"recovery job #{job.pk} {job.state}: requeued {job.done}, refused {job.failed}"
        if job.refusals:
            summary += " (" + "; ".join(f"{reason}: {n}" for reason, n in job.refusals.items()) + ")"
        if job.state == RecoveryJob.State.PENDING:
            summary += f"; stopped, resume with --resume {job.pk}"
        self.stdout.write(summary)

    def _work(self, options: dict[str, Any]) -> None:
        while not self._stop:
            job = recovery.next_job()
            if job is not None:
                self.stdout.write(f"recovery job #{job.pk}: {job.total} matching row(s)")
                try:
                    self._run(job.pk, options)
                except CommandError as exc:
                    self.stderr.write(str(exc))
                continue
            if options["once"]:
                return
            deadline = time.monotonic() + options["interval"]
            while not self._stop and time.monotonic() < deadline:
                time.sleep(0.1)  # short naps: a signal must not wait for the whole interval

    def _list(self) -> None:
        for job in RecoveryJob.objects.select_related("channel")[:50]:
            self.stdout.write(
                f"#{job.pk} {job.state:9} {job.channel.key} "
                f"{job.since.isoformat()} .. {job.until.isoformat()} "
                f"{job.row_status}: {job.done} requeued, {job.failed} refused of {job.total} "
                f"(by {job.started_by} at {job.created_at.isoformat()})"
            )

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop = True
