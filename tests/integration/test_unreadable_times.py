"""Rows with times Python's datetime cannot hold are set aside as dead letters, with their reason.

PostgreSQL stores 'infinity', '-infinity' and year 12000, which raw SQL can write and the API cannot;
psycopg refuses to read them. Such a time in ``next_attempt_at``, ``scheduled_at`` or ``expires_at`` of a
row still waiting made the row wait forever with no reason recorded, and every page that loads it fail
(the admin's changelist too, for every row on it). Housekeeping sets such a row aside (error kind
``unreadable_time``, one Failed event, its times cleared), and every worker does so for a row whose due
time is one after its first tick; readable rows and leased rows are never touched.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import DataError, connection, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from notifications_retry.delivery import unreadable_times
from notifications_retry.engine.worker import Worker
from notifications_retry.housekeeping import run_housekeeping
from notifications_retry.models import ChannelConfig, NotificationEntity, Outbox
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = pytest.mark.django_db
Status = NotificationEntity.Status
TABLE = NotificationEntity._meta.db_table
YEAR_12000 = "12000-01-01 00:00+00"
CHANGE = "admin:notifications_retry_notificationentity_change"
CHANGELIST = "admin:notifications_retry_notificationentity_changelist"

#: Every column and status the sweep reads, and the value PostgreSQL prints for each far time.
PRINTED = {YEAR_12000: "12000-01-01 00:00:00+00", "infinity": "infinity", "-infinity": "-infinity"}
#: The row each column is written on: the status whose due time it is (a deadline: a Pending row due
#: in an hour, so nothing but the sweep reaches it).
STATUS_OF = {"next_attempt_at": Status.FAILED, "scheduled_at": Status.PENDING, "expires_at": Status.PENDING}


def set_time(pk: object, column: str, value: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET {column} = %s::timestamptz WHERE id = %s", [value, pk])


def waiting(channel: ChannelConfig, status: str, *, due_in: float = 3600, **fields: Any) -> Any:
    """A row of ``status`` due in ``due_in`` seconds (negative: due already)."""
    when = timezone.now() + timedelta(seconds=due_in)
    at = {"next_attempt_at": when} if status == Status.FAILED else {"scheduled_at": when}
    attempts = 1 if status == Status.FAILED else 0
    return NotificationFactory(channel=channel, status=status, attempts=attempts, **at, **fields)


def healthy(channel: ChannelConfig, n: int = 5) -> list[NotificationEntity]:
    return [waiting(channel, Status.FAILED, due_in=-5) for _ in range(n)]


def snapshot(*pks: object) -> list[tuple[Any, ...]]:
    """What the sweep could change, read in SQL (as text: the row may hold a time Python cannot read)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, status, attempts, next_attempt_at::text, scheduled_at::text, expires_at::text, "
            f"due_at::text, dead_lettered_at::text, error_kind, updated_at::text, attempt_log::text "
            f"FROM {TABLE} WHERE id = ANY(%s) ORDER BY id",
            [list(pks)],
        )
        return list(cursor.fetchall())


def tick() -> Any:
    worker = Worker(rng=random.Random(3))
    try:
        return worker.tick()
    finally:
        worker.close()


def assert_set_aside(pk: object, columns: dict[str, str], attempts: int) -> None:
    row = NotificationEntity.objects.get(pk=pk)  # loads: every time is readable now
    assert row.status == Status.FAILED and row.dead_lettered_at is not None
    assert row.error_kind == unreadable_times.UNREADABLE_TIME == "unreadable_time"
    assert row.attempts == attempts, "no attempt counted: nothing was sent"
    assert row.claim_token is None and row.due_at is None
    for column, value in columns.items():
        assert getattr(row, column) is None, f"{column} cleared"
        assert f"{column} is '{value}'" in row.dead_letter_reason
    assert "written past the API" in row.dead_letter_reason
    assert row.dead_letter_reason.startswith("unreadable_time: ")
    assert row.attempt_log[-1]["outcome"] == "terminal"
    assert row.attempt_log[-1]["error_kind"] == "unreadable_time"
    events = list(Outbox.objects.filter(key=str(pk)))
    assert len(events) == 1, "one dispatched event"
    assert events[0].payload["status"] == "Failed"
    assert events[0].payload["error_kind"] == "unreadable_time"
    assert events[0].payload["attempts"] == attempts
    assert events[0].payload["error"] == row.last_error


@pytest.mark.parametrize("value", [YEAR_12000, "infinity", "-infinity"])
@pytest.mark.parametrize("column", ["next_attempt_at", "scheduled_at", "expires_at"])
def test_housekeeping_sets_aside_a_row_whose_time_python_cannot_read(
    admin_client: Client, column: str, value: str
) -> None:
    channel = ChannelFactory(key="app", provider_key="in_app")
    odd = waiting(channel, STATUS_OF[column])
    set_time(odd.pk, column, value)
    # Readable rows, at the bounds and just inside them, are never touched.
    bounds = waiting(channel, Status.FAILED)
    set_time(bounds.pk, "next_attempt_at", "9999-12-30 00:00+00")
    set_time(bounds.pk, "expires_at", "9999-12-30 00:00+00")
    inside = waiting(channel, Status.PENDING)
    set_time(inside.pk, "scheduled_at", "0001-01-02 00:00+00")  # long due: the claim's
    others = healthy(channel)
    untouched = snapshot(bounds.pk, inside.pk, *(o.pk for o in others))
    with pytest.raises(DataError, match="timestamp too"), transaction.atomic():  # what every page met
        admin_client.get(reverse(CHANGELIST))

    report = run_housekeeping()

    assert report.set_aside_unreadable == 1
    assert_set_aside(odd.pk, {column: PRINTED[value]}, attempts=odd.attempts)
    assert snapshot(bounds.pk, inside.pk, *(o.pk for o in others)) == untouched
    assert admin_client.get(reverse(CHANGE, args=[odd.pk])).status_code == 200
    page = admin_client.get(reverse(CHANGELIST))
    assert page.status_code == 200 and str(odd.pk) in page.content.decode()
    # The lane's other rows go out as usual.
    stats = tick()
    assert stats.error == "" and stats.poisoned == 0 and stats.sent == 6  # the five, and the long-due row
    assert run_housekeeping().set_aside_unreadable == 0, "set aside once"
    assert Outbox.objects.filter(key=str(odd.pk)).count() == 1


def test_every_unreadable_time_of_a_row_is_named_and_cleared() -> None:
    channel = ChannelFactory(key="app", provider_key="in_app")
    odd = waiting(channel, Status.FAILED)
    for column, value in [("next_attempt_at", "infinity"), ("scheduled_at", "-infinity")]:
        set_time(odd.pk, column, value)
    set_time(odd.pk, "expires_at", YEAR_12000)
    assert run_housekeeping().set_aside_unreadable == 1
    assert_set_aside(
        odd.pk,
        {"next_attempt_at": "infinity", "scheduled_at": "-infinity", "expires_at": PRINTED[YEAR_12000]},
        attempts=1,
    )


def test_leased_rows_dead_letters_and_sent_rows_are_not_the_sweep_s() -> None:
    channel = ChannelFactory(key="app", provider_key="in_app")
    leased = waiting(channel, Status.FAILED)
    dead = waiting(channel, Status.FAILED, dead_lettered_at=timezone.now(), error_kind="http_4xx")
    sent = NotificationFactory(channel=channel, status=Status.SENT, attempts=1)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {TABLE} SET claim_token = gen_random_uuid(), "
            "claim_expires_at = now() + interval '1 minute' WHERE id = %s",
            [leased.pk],
        )
    for row in (leased, dead, sent):
        set_time(row.pk, "expires_at", "infinity")
    before = snapshot(leased.pk, dead.pk, sent.pk)
    assert run_housekeeping().set_aside_unreadable == 0
    assert snapshot(leased.pk, dead.pk, sent.pk) == before
    assert not Outbox.objects.exists()


def test_a_worker_sets_aside_a_row_it_could_never_take_after_its_first_tick(admin_client: Client) -> None:
    """``retry_worker`` (here ``--once``, which runs no housekeeping) sets aside the rows whose due time is
    unreadable, on the two ends of the due index; the lane's other rows are sent by the same tick."""
    channel = ChannelFactory(key="app", provider_key="in_app")
    never = [waiting(channel, status) for status in (Status.FAILED, Status.PENDING, Status.FAILED)]
    set_time(never[0].pk, "next_attempt_at", YEAR_12000)
    set_time(never[1].pk, "scheduled_at", "infinity")
    set_time(never[2].pk, "next_attempt_at", "infinity")
    # Not due for an hour, its deadline unreadable: not on the due index's ends, so housekeeping's.
    deadline = waiting(channel, Status.FAILED)
    set_time(deadline.pk, "expires_at", "infinity")
    others = healthy(channel)

    call_command("retry_worker", "--once", "--no-relay")

    assert set(
        NotificationEntity.objects.filter(pk__in=[o.pk for o in others]).values_list("status", flat=True)
    ) == {Status.SENT}
    assert_set_aside(never[0].pk, {"next_attempt_at": PRINTED[YEAR_12000]}, attempts=1)
    assert_set_aside(never[1].pk, {"scheduled_at": "infinity"}, attempts=0)
    assert_set_aside(never[2].pk, {"next_attempt_at": "infinity"}, attempts=1)
    assert snapshot(deadline.pk)[0][5] == "infinity"
    assert run_housekeeping().set_aside_unreadable == 1
    assert_set_aside(deadline.pk, {"expires_at": "infinity"}, attempts=1)
    assert admin_client.get(reverse(CHANGELIST)).status_code == 200


@pytest.mark.parametrize("column", ["next_attempt_at", "scheduled_at"])
def test_a_row_due_since_before_year_one_is_sent_and_every_page_loads_it(
    admin_client: Client, column: str
) -> None:
    """A due time of '-infinity' reads as long due (the worker's wait, engine.wakeup): the claim takes it
    as any due row, and what the worker writes leaves no time Python cannot read."""
    channel = ChannelFactory(key="app", provider_key="in_app")
    odd = waiting(channel, STATUS_OF[column], due_in=-5)
    set_time(odd.pk, column, "-infinity")
    stats = tick()
    assert stats.error == "" and stats.sent == 1
    row = NotificationEntity.objects.get(pk=odd.pk)
    assert row.status == Status.SENT
    assert admin_client.get(reverse(CHANGE, args=[odd.pk])).status_code == 200
    assert admin_client.get(reverse(CHANGELIST)).status_code == 200


def test_batches_are_short_transactions_of_at_most_their_limit() -> None:
    channel = ChannelFactory(key="app", provider_key="in_app")
    for _ in range(5):
        set_time(waiting(channel, Status.FAILED).pk, "next_attempt_at", "infinity")
    assert list(unreadable_times.due_ends(timezone.now(), limit=2)) == [2, 2, 1]
    assert list(unreadable_times.everywhere(timezone.now(), limit=2)) == [0]
    assert NotificationEntity.objects.filter(error_kind="unreadable_time").count() == 5
