"""The worker commits outcomes on a connection of its own, beside its claims — unless it runs inside
a transaction (a test's), which no other connection could see."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from notifications_retry.engine.completer import Completer, ThreadedCompleter
from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity, Outbox
from tests.factories import ChannelFactory, due_notifications
from tests.support.http_server import Reply

Status = NotificationEntity.Status


def rows(clock, server_url: str, count: int) -> list[NotificationEntity]:
    channel = ChannelFactory(
        key="hook", provider_key="webhook", options={"url": server_url}, max_concurrency=4
    )
    return due_notifications(clock, channel, count)


@pytest.mark.django_db(transaction=True)
def test_outcomes_are_committed_on_the_commit_threads_own_connection(webhook_server, clock):
    webhook_server.responder = lambda r: Reply(200, {"id": "m"})
    created = rows(clock, webhook_server.url, 12)
    worker = Worker(batch_size=50, max_duration=30, clock=clock)
    assert isinstance(worker.completer, ThreadedCompleter)
    commits: list[tuple[str, int]] = []
    inner = worker.completer._completer
    finalize = inner._commit

    def recording(batch, now):
        connection.ensure_connection()
        commits.append((threading.current_thread().name, connection.connection.info.backend_pid))
        return finalize(batch, now)

    inner._commit = recording
    try:
        [stats] = worker.run(once=True)
    finally:
        worker.close()
    assert stats.sent == 12 and stats.processed == 12, "every report reached the tick's stats"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (own_pid,) = cursor.fetchone()
    assert commits and {name for name, _ in commits} == {"notifications-retry-completer"}
    assert own_pid not in {pid for _, pid in commits}, "commits ran beside the claims"
    assert set(NotificationEntity.objects.values_list("status", flat=True)) == {Status.SENT}
    assert Outbox.objects.filter(key__in=[str(r.pk) for r in created]).count() == 12
    assert not [t for t in threading.enumerate() if t.name == "notifications-retry-completer"]


@pytest.mark.parametrize(
    "commit_thread",
    [
        pytest.param(True, marks=pytest.mark.django_db, id="inside-a-transaction"),
        pytest.param(False, marks=pytest.mark.django_db(transaction=True), id="turned-off"),
    ],
)
def test_commits_are_inline_inside_a_transaction_or_when_turned_off(
    webhook_server, settings, clock, commit_thread
):
    settings.NOTIFICATIONS_RETRY = {**settings.NOTIFICATIONS_RETRY, "COMMIT_THREAD": commit_thread}
    webhook_server.responder = lambda r: Reply(200, {"id": "m"})
    rows(clock, webhook_server.url, 3)
    worker = Worker(batch_size=50, max_duration=30, clock=clock)
    assert type(worker.completer) is Completer
    [stats] = worker.run(once=True)
    assert stats.sent == 3
    assert set(NotificationEntity.objects.values_list("status", flat=True)) == {Status.SENT}


@pytest.mark.django_db
def test_commit_thread_must_be_a_bool(settings):
    from notifications_retry.conf import get_settings, settings_problems

    settings.NOTIFICATIONS_RETRY = {"COMMIT_THREAD": "yes"}
    assert any("COMMIT_THREAD must be True or False" in p for p in settings_problems(get_settings()))
