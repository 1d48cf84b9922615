"""Recovery jobs from the admin: started from the notification list's filter, progress on the job's page,
cancel, permissions, a second job on the same filter refused, the bulk actions still capped."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from notifications_retry.delivery import recovery
from notifications_retry.models import DeadLetterAction, NotificationEntity, RecoveryJob
from tests.factories import ChannelFactory
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
