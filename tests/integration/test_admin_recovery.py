"""Recovery jobs from the admin: started from the notification list's filter, progress on the job's page,
cancel, permissions, a second job on the same filter refused, the bulk actions still capped."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from notifications_retry import api
from notifications_retry.delivery import recovery
from notifications_retry.engine.worker import Worker
from notifications_retry.models import DeadLetterAction, NotificationEntity, RecoveryJob, Suppression
from notifications_retry.runtime.clock import ManualClock
from tests.factories import ChannelFactory
from tests.support.admin_pages import assert_admin_times
from tests.support.dead_letters import seed_dead_letters

pytestmark = pytest.mark.django_db

SINCE = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
LIST = "admin:notifications_retry_notificationentity_changelist"
START = "admin:notifications_retry_recoveryjob_start"


def staff(*perms: str, username: str = "operator") -> Client:
    user = User.objects.create_user(username, is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="notifications_retry", codename__in=perms)
    )
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def operator() -> Client:
    return staff("view_notificationentity", "requeue_notificationentity", "view_recoveryjob")


@pytest.fixture
def hook():
    channel = ChannelFactory(key="hook", max_attempts=5)
    seed_dead_letters(channel, 1500, first=SINCE, step_us=1_000_000)
    return channel


def start_link(response: Any) -> str:
    html = response.content.decode()
    marker = 'id="nr-recover-all"'
    assert marker in html, "no 'requeue all matching' link"
    href = html[: html.index(marker)].rsplit('href="', 1)[1].split('"', 1)[0]
    return href.replace("&amp;", "&")


def test_the_list_links_its_filter_to_a_recovery_job_that_requeues_every_match_past_the_cap(operator, hook):
    query = (
        f"?channel__id__exact={hook.pk}&dead_letter=unresolved"
        "&dead_lettered_at__from=2026-03-01&dead_lettered_at__to=2026-03-01&error_kind=http_503"
    )
    url = start_link(operator.get(reverse(LIST) + query))
    page = operator.get(url)
    html = page.content.decode()
    assert page.status_code == 200, url
    assert 'id="nr-matching">1500<' in html, (
        url,
        page.context["matching"],
    )  # more than BULK_ACTION_CAP, which a job does not have
    assert "error_kind" in html and 'id="nr-ignored"' in html  # said plainly: the job does not filter by it
    form = page.context["form"]
    assert (
        form.initial["since"] == "2026-03-01T00:00:00+00:00"
        and form.initial["until"] == "2026-03-02T00:00:00+00:00"
    )

    response = operator.post(
        url,
        {**{k: form.initial[k] for k in ("channel", "since", "until", "status")}, "reason": "partner back"},
    )
    job = RecoveryJob.objects.get()
    assert response.status_code == 302 and response["Location"].endswith(f"/recoveryjob/{job.pk}/change/")
    assert (job.state, job.total, job.started_by, job.reason) == ("pending", 1500, "operator", "partner back")
    assert LogEntry.objects.filter(object_id=str(job.pk)).exists()

    page = operator.get(response["Location"]).content.decode()
    assert 'id="nr-waiting"' in page and 'http-equiv="refresh"' in page and "0.0%" in page

    recovery.run_job(job.pk, chunk_size=400)
    page = operator.get(response["Location"]).content.decode()
    assert "100.0% · 1500 requeued, 0 refused of 1500" in page and 'http-equiv="refresh"' not in page
    assert set(DeadLetterAction.objects.values_list("actor", "reason").distinct()) == {
        ("operator", f"recovery job #{job.pk}: partner back")
    }


def test_a_second_job_on_the_same_filter_is_refused_with_a_link_to_the_first(operator, hook):
    data = {
        "channel": hook.pk,
        "since": "2026-03-01T02:00:00+00:00",
        "until": "2026-03-01T08:00:00+00:00",
        "status": "dead-letter",
        "reason": "x",
    }
    operator.post(reverse(START), data)
    page = operator.post(reverse(START), data)
    first = RecoveryJob.objects.get()
    assert page.status_code == 200 and RecoveryJob.objects.count() == 1
    assert f"recovery job #{first.pk} (pending) already covers this filter" in page.content.decode()
    assert 'id="nr-conflict"' in page.content.decode()


def test_bad_dates_are_refused_on_the_form(operator, hook):
    data = {
        "channel": hook.pk,
        "since": "yesterday",
        "until": "2026-03-01",
        "status": "dead-letter",
        "reason": "x",
    }
    page = operator.post(reverse(START), data)
    assert page.status_code == 200 and "since: not an ISO 8601 date-time" in page.content.decode()
    data.update(since="2026-03-02")
    page = operator.post(reverse(START), data)
    assert "must be before until" in page.content.decode()
    assert RecoveryJob.objects.count() == 0


def test_cancel_from_the_job_page_stops_it_and_keeps_what_it_requeued(operator, hook):
    job = recovery.start_job(
        recovery.RecoveryFilter(channel=hook, since=SINCE, until=datetime(2026, 3, 2, tzinfo=UTC)),
        actor="ann",
    )
    recovery.begin(job.pk)
    recovery.run_chunk(job.pk, chunk_size=100)
    change = reverse("admin:notifications_retry_recoveryjob_change", args=[job.pk])
    assert 'id="nr-cancel-job"' in operator.get(change).content.decode()
    operator.post(reverse("admin:notifications_retry_recoveryjob_cancel", args=[job.pk]))
    job.refresh_from_db()
    assert (job.state, job.done, job.cancelled_by) == ("cancelled", 100, "operator")
    assert recovery.run_chunk(job.pk).state == "cancelled"
    assert NotificationEntity.objects.filter(requeue_count=1).count() == 100
    assert 'id="nr-cancel-job"' not in operator.get(change).content.decode()


def test_without_the_requeue_permission_no_job_can_be_started_or_cancelled(hook):
    viewer = staff("view_notificationentity", "view_recoveryjob", username="viewer")
    job = recovery.start_job(
        recovery.RecoveryFilter(channel=hook, since=SINCE, until=datetime(2026, 3, 2, tzinfo=UTC)),
        actor="ann",
    )
    assert 'id="nr-recover-all"' not in viewer.get(reverse(LIST)).content.decode()
    assert viewer.get(reverse(START)).status_code == 403
    assert (
        viewer.post(reverse("admin:notifications_retry_recoveryjob_cancel", args=[job.pk])).status_code == 403
    )
    job.refresh_from_db()
    assert job.state == "pending"
    change = reverse("admin:notifications_retry_recoveryjob_change", args=[job.pk])
    assert 'id="nr-cancel-job"' not in viewer.get(change).content.decode()


def test_the_bulk_action_keeps_its_cap(operator, hook):
    ids = list(NotificationEntity.objects.values_list("pk", flat=True)[:10])
    response = operator.post(
        reverse(LIST),
        {"action": "requeue_selected", "select_across": "1", "index": "0", "_selected_action": ids},
        follow=True,
    )
    assert "1500 notifications match; the cap for one action is 1000" in response.content.decode()
    assert NotificationEntity.objects.filter(requeue_count=1).count() == 0


def test_a_plain_dates_to_takes_that_whole_day_in_the_list_as_on_the_start_page(operator):
    channel = ChannelFactory(key="hook", max_attempts=5)
    seed_dead_letters(channel, 10, first=datetime(2026, 3, 1, 12, tzinfo=UTC))  # that day, at noon
    seed_dead_letters(channel, 3, first=datetime(2026, 3, 2, 0, 0, 1, tzinfo=UTC))  # the next day
    query = (
        f"?channel__id__exact={channel.pk}&dead_lettered_at__from=2026-03-01&dead_lettered_at__to=2026-03-01"
    )
    listed = operator.get(reverse(LIST) + query)
    assert listed.context["cl"].result_count == 10
    assert 'value="2026-03-01"' in listed.content.decode()  # the form keeps the date it filters by
    assert 'id="nr-matching">10<' in operator.get(start_link(listed)).content.decode()


@pytest.fixture
def clock() -> ManualClock:
    """Two days after the dead letters of these tests (``SINCE``): a job then matches them all."""
    return ManualClock(datetime(2026, 3, 3, 12, 0, tzinfo=UTC))


def recipients(*names: str) -> list[NotificationEntity]:
    return list(NotificationEntity.objects.filter(recipient__in=names).order_by("recipient"))


def test_recovery_beside_a_suppression_refuses_the_suppressed_recipients_and_says_why(operator, clock):
    """Twenty dead letters, three of them to recipients now suppressed on their channel (one typed
    with another case): the job requeues 17 and refuses 3 as suppressed, in its counts and on its page;
    the three stay dead letters, untouched, and the worker's next tick sends the 17 only."""
    hook = ChannelFactory(key="hook", provider_key="in_app", max_attempts=5)
    ChannelFactory(key="sms")
    seed_dead_letters(hook, 20, first=SINCE, step_us=1_000_000)
    api.suppress("USER3@example.com", reason="hard_bounce")  # every channel, typed with another case
    api.suppress("user4@example.com", channel="hook", reason="unsubscribed")
    api.suppress("user5@example.com", channel="sms")  # another channel: user5 is requeued
    Suppression.objects.create(address="user6@example.com", reason="manual", source="t", expires_at=SINCE)
    job = recovery.start_job(
        recovery.RecoveryFilter(channel=hook, since=SINCE, until=datetime(2026, 3, 2, tzinfo=UTC)),
        actor="ann",
        clock=clock,
    )
    job = recovery.run_job(job.pk, chunk_size=7, clock=clock)
    assert (job.state, job.total, job.done, job.failed) == ("done", 20, 18, 2)
    assert job.refusals == {
        "suppressed: recipient is on the suppression list (hard_bounce, channel *)": 1,
        "suppressed: recipient is on the suppression list (unsubscribed, channel hook)": 1,
    }
    for row in recipients("user3@example.com", "user4@example.com"):
        assert (row.dead_lettered_at is not None, row.requeue_count, row.attempts) == (True, 0, 5)
        assert not row.triage_log.exists()
    assert NotificationEntity.objects.filter(requeue_count=1).count() == 18

    page = operator.get(reverse("admin:notifications_retry_recoveryjob_change", args=[job.pk]))
    html = page.content.decode()
    assert "100.0% · 18 requeued, 2 refused of 20" in html
    assert "suppressed: recipient is on the suppression list (hard_bounce, channel *): 1" in html

    worker = Worker(clock=clock, rng=random.Random(1))
    try:
        worker.run(once=True)
    finally:
        worker.close()
    assert NotificationEntity.objects.filter(status="sent").count() == 18
    assert NotificationEntity.objects.filter(error_kind="suppressed").count() == 0  # none failed again


def test_retry_now_and_the_api_refuse_a_suppressed_recipient_too(operator):
    """The admin's "retry now" (the bulk action and the detail page) and ``api.requeue_dead_letters``
    go through the same requeue: a suppressed recipient is refused with the reason, and the
    confirmation page counts it before anything is done."""
    hook = ChannelFactory(key="hook", max_attempts=5)
    seed_dead_letters(hook, 4, first=SINCE)
    api.suppress("User1@Example.com")
    one, two, three, four = recipients(*(f"user{i}@example.com" for i in range(1, 5)))
    selected = {"action": "requeue_selected", "index": "0", "_selected_action": [one.pk, two.pk, three.pk]}
    confirmation = operator.post(reverse(LIST), selected).content.decode()
    assert 'id="nr-eligible">2<' in confirmation and 'id="nr-refused">1<' in confirmation
    assert 'id="nr-suppressed">1<' in confirmation
    done = operator.post(reverse(LIST), {**selected, "confirm": "yes", "reason": "x"}, follow=True)
    assert "Requeued 2 notification(s)." in done.content.decode()
    assert "Refused 1 notification(s): suppressed: recipient is on the suppression list" in (
        done.content.decode()
    )
    one.refresh_from_db()
    assert (one.requeue_count, one.dead_lettered_at is not None) == (0, True)

    result = api.requeue_dead_letters([one.pk, four.pk], actor="api-user")
    assert result.done == [four.pk]
    assert result.refused[one.pk].startswith("suppressed: ")

    change = reverse("admin:notifications_retry_notificationentity_change", args=[one.pk])
    triage = reverse("admin:notifications_retry_notificationentity_triage", args=[one.pk, "requeue"])
    assert triage not in operator.get(change).content.decode()  # not offered: it would be refused
    api.unsuppress("user1@example.com")
    assert triage in operator.get(change).content.decode()


def test_a_recipient_suppressed_after_its_requeue_shows_not_attempted_in_the_timeline(admin_client, clock):
    """Requeued by a recovery job, then suppressed before the worker's claim: the claim settles it with
    no attempt, and the timeline says "not attempted: suppressed", not an attempt "#0" by "replay"."""
    hook = ChannelFactory(key="hook", provider_key="in_app", max_attempts=5)
    seed_dead_letters(hook, 1, first=SINCE)
    job = recovery.start_job(
        recovery.RecoveryFilter(channel=hook, since=SINCE, until=datetime(2026, 3, 2, tzinfo=UTC)),
        actor="ann",
        clock=clock,
    )
    assert recovery.run_job(job.pk, clock=clock).done == 1
    api.suppress("user1@example.com")
    worker = Worker(clock=clock, rng=random.Random(1))
    try:
        worker.run(once=True)
    finally:
        worker.close()
    (row,) = NotificationEntity.objects.all()
    assert (row.error_kind, row.attempts, row.requeue_count) == ("suppressed", 0, 1)
    page = admin_client.get(reverse("admin:notifications_retry_notificationentity_change", args=[row.pk]))
    timeline = page.content.decode().split('class="nr-timeline"', 1)[1].split("</ol>", 1)[0]
    assert "not attempted: suppressed" in timeline
    assert "#0" not in timeline and ">replay<" not in timeline and "no answer recorded" not in timeline
    assert "left no entry" not in page.content.decode()


def test_the_recovery_job_pages_show_every_time_in_the_admin_format(operator, clock):
    hook = ChannelFactory(key="hook", max_attempts=5)
    seed_dead_letters(hook, 3, first=SINCE)
    job = recovery.start_job(
        recovery.RecoveryFilter(channel=hook, since=SINCE, until=datetime(2026, 3, 2, tzinfo=UTC)),
        actor="ann",
        clock=clock,
    )
    recovery.run_job(job.pk, clock=clock)
    listing = operator.get(reverse("admin:notifications_retry_recoveryjob_changelist")).content.decode()
    page = operator.get(reverse("admin:notifications_retry_recoveryjob_change", args=[job.pk]))
    for html in (listing, page.content.decode()):
        stamps = assert_admin_times(html)
        assert "2026-03-01 02:00:00 UTC to 2026-03-02 00:00:00 UTC (unresolved dead letters)" in html
        assert len(stamps) >= 3, stamps  # the window's two ends, when it was created
    assert len(assert_admin_times(page.content.decode())) >= 6  # and started, its last chunk, finished
