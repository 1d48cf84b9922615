"""Recovery jobs on a real PostgreSQL: a job finishes, audits each requeue, refuses a second job on its
filter, leaves rows outside it alone, stops on cancel, and bad input is refused with a clear message."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command

from notifications_retry.delivery import recovery
from notifications_retry.delivery.recovery_filter import RecoveryInputError, recovery_filter
from notifications_retry.models import DeadLetterAction, NotificationEntity, RecoveryJob
from notifications_retry.runtime.clock import ManualClock
from tests.factories import ChannelFactory
from tests.support.dead_letters import seed_dead_letters

pytestmark = pytest.mark.django_db

SINCE = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
UNTIL = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
WINDOW = ["--since", "2026-03-01T02:00:00+00:00", "--until", "2026-03-01T08:00:00Z"]


def recover(*args: str) -> str:
    out = io.StringIO()
    call_command("notifications_recover", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def dead_in_window(channel) -> int:
    return NotificationEntity.objects.filter(
        channel=channel, dead_lettered_at__gte=SINCE, dead_lettered_at__lt=UNTIL
    ).count()


@pytest.fixture
def hook():
    return ChannelFactory(
        key="hook", provider_key="webhook", max_attempts=5, options={"url": "http://127.0.0.1:9/"}
    )


def test_a_job_requeues_every_matching_dead_letter_once_audited_and_nothing_else(hook):
    other = ChannelFactory(key="sms", max_attempts=5)
    seed_dead_letters(hook, 1234, first=SINCE, step_us=10_000_000)  # 02:00 .. 05:25
    seed_dead_letters(hook, 3, first=SINCE - timedelta(hours=1))  # before the window
    seed_dead_letters(hook, 3, first=UNTIL)  # at its end: excluded
    seed_dead_letters(hook, 4, first=SINCE + timedelta(hours=1), resolution="discarded")
    seed_dead_letters(other, 5, first=SINCE + timedelta(hours=1))

    out = recover(
        "--channel", "hook", *WINDOW, "--status", "dead-letter", "--chunk-size", "100", "--actor", "ann"
    )

    job = RecoveryJob.objects.get()
    assert (job.state, job.total, job.done, job.failed) == ("done", 1234, 1234, 0)
    assert job.cursor_at is not None and job.finished_at is not None
    assert f"recovery job #{job.pk} done: requeued 1234, refused 0" in out
    requeued = NotificationEntity.objects.filter(requeue_count=1)
    assert requeued.count() == 1234
    assert not requeued.exclude(attempts=0).exists() and not requeued.exclude(dead_lettered_at=None).exists()
    assert NotificationEntity.objects.filter(requeue_count__gt=1).count() == 0
    # Each requeue has its audit row, with who started the job and which job it was.
    audits = DeadLetterAction.objects.filter(action=DeadLetterAction.Action.REQUEUE)
    assert audits.count() == 1234
    assert set(audits.values_list("actor", flat=True)) == {"ann"}
    assert set(audits.values_list("reason", flat=True)) == {f"recovery job #{job.pk}"}
    assert set(audits.values_list("attempts_before", flat=True)) == {5}
    # Outside the filter: untouched dead letters.
    assert NotificationEntity.objects.filter(dead_lettered_at__isnull=False).count() == 3 + 3 + 4 + 5


def test_a_second_job_on_the_same_filter_is_refused_while_the_first_is_active(hook):
    seed_dead_letters(hook, 50, first=SINCE)
    recover("--channel", "hook", *WINDOW, "--detach")
    with pytest.raises(CommandError, match=r"recovery job #\d+ \(pending\) already covers this filter"):
        recover("--channel", "hook", *WINDOW)
    assert RecoveryJob.objects.count() == 1
    assert NotificationEntity.objects.filter(requeue_count=1).count() == 0


def test_a_job_on_a_filter_already_recovered_finds_nothing_left_to_do(hook):
    seed_dead_letters(hook, 300, first=SINCE)
    recover("--channel", "hook", *WINDOW)
    recover("--channel", "hook", *WINDOW)
    first, second = RecoveryJob.objects.order_by("pk")
    assert (first.done, second.total, second.done, second.failed) == (300, 0, 0, 0)
    assert DeadLetterAction.objects.count() == 300


def test_rows_that_die_again_after_the_job_started_are_left_to_a_new_job(hook):
    clock = ManualClock(UNTIL + timedelta(days=1))
    seed_dead_letters(hook, 10, first=SINCE)
    selection = recovery_filter(channel="hook", since=SINCE, until=UNTIL + timedelta(days=30))
    job = recovery.start_job(selection, actor="ann", clock=clock)
    recovery.begin(job.pk, clock=clock)
    recovery.run_chunk(job.pk, chunk_size=4, clock=clock)
    # One of the requeued rows fails for good again, after the job was created, inside its window.
    row = NotificationEntity.objects.filter(requeue_count=1).first()
    NotificationEntity.objects.filter(pk=row.pk).update(
        dead_lettered_at=clock.advance(60), attempts=5, next_attempt_at=None
    )
    final = recovery.run_job(job.pk, chunk_size=4, clock=clock)
    assert (final.state, final.done, final.failed) == ("done", 10, 0)
    row.refresh_from_db()
    assert row.requeue_count == 1 and row.dead_lettered_at is not None


def test_refused_rows_are_counted_failed_with_their_reason(hook):
    seed_dead_letters(hook, 5, first=SINCE)
    NotificationEntity.objects.filter(pk__in=NotificationEntity.objects.values("pk")[:2]).update(
        error_kind="cancelled"
    )
    out = recover("--channel", "hook", *WINDOW)
    job = RecoveryJob.objects.get()
    assert (job.state, job.done, job.failed) == ("done", 3, 2)
    reason = "cancelled by the application: requeuing would send what it withdrew"
    assert job.refusals == {reason: 2}
    assert f"{reason}: 2" in out


def test_cancel_stops_a_job_after_its_chunk_and_keeps_what_it_requeued(hook):
    seed_dead_letters(hook, 1000, first=SINCE)
    job = recovery.start_job(recovery_filter(channel="hook", since=SINCE, until=UNTIL), actor="ann")

    def cancel_after_the_second_chunk(current: RecoveryJob) -> None:
        if current.done == 200 and current.state == "running":
            recovery.cancel_job(current.pk, actor="bob")

    final = recovery.run_job(job.pk, chunk_size=100, on_chunk=cancel_after_the_second_chunk)
    assert (final.state, final.done, final.cancelled_by) == ("cancelled", 200, "bob")
    assert NotificationEntity.objects.filter(requeue_count=1).count() == 200
    assert NotificationEntity.objects.filter(dead_lettered_at__isnull=False).count() == 800
    with pytest.raises(CommandError, match=rf"recovery job #{job.pk} is cancelled: nothing to resume"):
        recover("--resume", str(job.pk))
    with pytest.raises(CommandError, match=rf"recovery job #{job.pk} is cancelled: nothing to cancel"):
        recover("--cancel", str(job.pk))


def test_cancel_from_the_command_before_any_runner_took_the_job(hook):
    seed_dead_letters(hook, 10, first=SINCE)
    recover("--channel", "hook", *WINDOW, "--detach")
    job = RecoveryJob.objects.get()
    assert f"cancelled recovery job #{job.pk}" in recover("--cancel", str(job.pk), "--actor", "bob")
    assert recover("--work", "--once") == ""
    job.refresh_from_db()
    assert (job.state, job.done, job.cancelled_by) == ("cancelled", 0, "bob")
    assert NotificationEntity.objects.filter(requeue_count=1).count() == 0


def test_work_runs_detached_jobs_and_takes_over_a_stale_one(hook):
    seed_dead_letters(hook, 30, first=SINCE)
    seed_dead_letters(hook, 20, first=UNTIL + timedelta(hours=1))
    recover("--channel", "hook", *WINDOW, "--detach")
    stale = recovery.start_job(
        recovery_filter(channel="hook", since=UNTIL, until=UNTIL + timedelta(hours=2)), actor="ann"
    )
    recovery.begin(stale.pk)
    RecoveryJob.objects.filter(pk=stale.pk).update(heartbeat_at=datetime(2026, 1, 1, tzinfo=UTC))
    out = recover("--work", "--once")
    assert sorted(RecoveryJob.objects.values_list("state", "done")) == [("done", 20), ("done", 30)]
    assert out.count("done: requeued") == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--channel", "hook", "--since", "yesterday", "--until", "2026-03-01"], "--since: not an ISO 8601"),
        (["--channel", "hook", "--since", "2026-03-01", "--until", "2026-02-30"], "--until: not an ISO 8601"),
        (["--channel", "nope", *WINDOW], "--channel: unknown channel 'nope'; channels: hook"),
        (
            ["--channel", "hook", "--since", "2026-03-02", "--until", "2026-03-01"],
            r"--since \(2026-03-02T00:00:00\+00:00\) must be before --until",
        ),
        (["--channel", "hook", "--since", "2026-03-01"], "missing --until"),
        (["--resume", "1", "--channel", "hook"], "give a filter"),
        (["--resume", "999"], "no recovery job #999"),
        (["--channel", "hook", *WINDOW, "--status", "sent"], "invalid choice: 'sent'"),
        (["--resume", "0"], "must be >= 1"),
        (["--channel", "hook", *WINDOW, "--once"], "--once goes with --work"),
        (["--channel", "hook", *WINDOW, "--pause", "-1"], "must be >= 0"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message_and_changes_nothing(hook, args, message):
    seed_dead_letters(hook, 5, first=SINCE)
    with pytest.raises(CommandError, match=message):
        recover(*args)
    assert RecoveryJob.objects.count() == 0
    assert NotificationEntity.objects.filter(requeue_count=1).count() == 0


def test_the_filter_reads_dates_without_an_offset_in_the_project_time_zone_and_a_date_as_midnight(hook):
    selection = recovery_filter(channel="hook", since="2026-03-01T02:00", until="2026-03-02")
    assert selection.since == SINCE and selection.until == datetime(2026, 3, 2, tzinfo=UTC)
    with pytest.raises(RecoveryInputError, match="must be before"):
        recovery_filter(channel="hook", since=UNTIL, until=SINCE)


def test_the_database_refuses_a_second_active_job_on_a_filter_whatever_the_code(hook):
    from django.db import IntegrityError, transaction

    RecoveryJob.objects.create(channel=hook, since=SINCE, until=UNTIL, started_by="a", state="running")
    RecoveryJob.objects.create(channel=hook, since=SINCE, until=UNTIL, started_by="a", state="done")
    with pytest.raises(IntegrityError), transaction.atomic():
        RecoveryJob.objects.create(channel=hook, since=SINCE, until=UNTIL, started_by="b")


def test_a_pause_between_chunks_sleeps_after_each_chunk_that_leaves_work(hook):
    seed_dead_letters(hook, 250, first=SINCE)
    job = recovery.start_job(recovery_filter(channel="hook", since=SINCE, until=UNTIL), actor="ann")
    slept: list[float] = []
    final = recovery.run_job(job.pk, chunk_size=100, pause=0.25, sleep=slept.append)
    assert (final.state, final.done) == ("done", 250)
    assert slept == [0.25, 0.25, 0.25]  # after 100, 200 and 250 rows; none once the job is done


def test_a_chunk_that_fails_marks_the_job_failed_with_the_error_and_resume_completes_it(hook):
    from django.db import connection

    seed_dead_letters(hook, 300, first=SINCE)
    poisoned = NotificationEntity.objects.order_by("dead_lettered_at")[150]
    with connection.cursor() as cursor:  # the database refuses one row's requeue, as a broken one would
        cursor.execute(
            "CREATE FUNCTION nr_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "RAISE EXCEPTION 'disk full (simulated)'; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER nr_test_refuse BEFORE UPDATE ON notifications_retry_notificationentity "
            f"FOR EACH ROW WHEN (OLD.id = '{poisoned.pk}') EXECUTE FUNCTION nr_test_refuse()"
        )
    failed = r"(?s)recovery job #\d+ failed: .*disk full \(simulated\).*--resume"
    with pytest.raises(CommandError, match=failed):
        recover("--channel", "hook", *WINDOW, "--chunk-size", "100")
    job = RecoveryJob.objects.get()
    assert (job.state, job.done) == ("failed", 100) and "disk full (simulated)" in job.last_error
    assert NotificationEntity.objects.filter(requeue_count=1).count() == 100  # the failed chunk left nothing
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER nr_test_refuse ON notifications_retry_notificationentity")
    assert f"recovery job #{job.pk} done: requeued 300" in recover("--resume", str(job.pk))
    assert NotificationEntity.objects.filter(requeue_count=1).count() == 300
    assert DeadLetterAction.objects.count() == 300
