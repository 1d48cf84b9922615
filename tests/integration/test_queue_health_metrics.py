"""The web side's queue-health gauges: read from the database at scrape time, cached, bounded.

``QueueHealthCollector`` is registered in a registry of the test's own (the worker's metric objects
live in this process's default one); the example project's test scrapes it through a real server.
"""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import connection
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from notifications_retry.models import ChannelConfig, NotificationEntity
from notifications_retry.observability.queue_health import GAUGES, UP, QueueHealthCollector
from tests.factories import ChannelFactory, NotificationFactory

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


def scrape(registry: CollectorRegistry) -> dict[str, float]:
    text = generate_latest(registry).decode()
    return {family.name: family.samples[0].value for family in text_string_to_metric_families(text)}


def seed() -> None:
    channel = ChannelFactory(key="email")
    for minutes in (5, 30):  # two Failed rows due since 5 and 30 minutes
        NotificationFactory(
            channel=channel,
            status=NotificationEntity.Status.FAILED,
            attempts=1,
            next_attempt_at=NOW - timedelta(minutes=minutes),
        )
    NotificationFactory(  # waiting for a later retry: backlog, not due
        channel=channel,
        status=NotificationEntity.Status.FAILED,
        attempts=1,
        next_attempt_at=NOW + timedelta(hours=1),
    )
    NotificationFactory(  # a dead letter nobody triaged yet
        channel=channel,
        status=NotificationEntity.Status.FAILED,
        attempts=3,
        next_attempt_at=None,
        dead_lettered_at=NOW - timedelta(hours=2),
        dead_letter_reason="attempts_exhausted: x",
    )


def collector(clock: Clock, **options: object) -> QueueHealthCollector:
    return QueueHealthCollector(
        monotonic=clock,
        now=lambda: NOW,
        worker_metrics_loaded=lambda: False,
        **options,  # type: ignore[arg-type]
    )


@pytest.mark.django_db
def test_the_gauges_are_the_database_s_figures_at_the_scrape() -> None:
    seed()
    registry = CollectorRegistry()
    registry.register(collector(Clock()))
    figures = scrape(registry)
    assert figures == {
        UP: 1.0,
        "notifications_failed_backlog_gauge": 3.0,
        "notifications_retry_due_backlog": 2.0,
        "notifications_retry_oldest_due_age_seconds": 1800.0,
        "notifications_retry_dead_letters_unresolved": 1.0,
    }
    assert {name for name, _, _ in GAUGES} | {UP} == set(figures)


@pytest.mark.django_db
def test_a_lapsed_lease_counts_as_due_since_its_expiry_and_a_running_one_does_not() -> None:
    seed()
    channel = ChannelConfig.objects.get(key="email")
    for expiry in (NOW - timedelta(hours=1), NOW + timedelta(minutes=1)):  # its worker died; in flight
        row = NotificationFactory(
            channel=channel, status=NotificationEntity.Status.FAILED, attempts=2, next_attempt_at=NOW
        )
        NotificationEntity.objects.filter(pk=row.pk).update(claim_token=uuid.uuid4(), claim_expires_at=expiry)
    registry = CollectorRegistry()
    registry.register(collector(Clock()))
    figures = scrape(registry)
    assert figures["notifications_retry_due_backlog"] == 3.0
    assert figures["notifications_retry_oldest_due_age_seconds"] == 3600.0


@pytest.mark.django_db
def test_one_reading_serves_the_scrapes_of_max_age_seconds() -> None:
    seed()
    clock = Clock()
    registry = CollectorRegistry()
    registry.register(collector(clock, max_age_seconds=10))
    assert scrape(registry)["notifications_failed_backlog_gauge"] == 3.0
    NotificationEntity.objects.filter(status=NotificationEntity.Status.FAILED).delete()
    clock.seconds = 9.9
    assert scrape(registry)["notifications_failed_backlog_gauge"] == 3.0  # the cached reading
    clock.seconds = 10.0
    assert scrape(registry)["notifications_failed_backlog_gauge"] == 0.0


@pytest.mark.django_db(transaction=True)
def test_a_reading_that_outlasts_its_timeout_reports_down_and_the_rest_still_serves() -> None:
    seed()
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    table = NotificationEntity._meta.db_table
    registry = CollectorRegistry()
    registry.register(collector(Clock(), statement_timeout_ms=200))
    locked, release = threading.Event(), threading.Event()

    def hold_the_table() -> None:
        with psycopg.connect(**params) as other, other.transaction():
            other.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_table)
    holder.start()
    try:
        assert locked.wait(10)
        figures = scrape(registry)  # the count waits on the lock until its 200 ms run out
    finally:
        release.set()
        holder.join()
    assert figures == {UP: 0.0}
    connection.close()  # this thread's connection is fine, but start the next test afresh


@pytest.mark.django_db
def test_nothing_is_yielded_in_a_process_with_the_worker_s_own_gauges() -> None:
    seed()
    registry = CollectorRegistry()
    registry.register(QueueHealthCollector(now=lambda: NOW, worker_metrics_loaded=lambda: True))
    assert scrape(registry) == {}
