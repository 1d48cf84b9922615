"""Channel numbers cannot poison the worker: each range is held by validation, the database and check.

A ``timeout_seconds`` of 1e13 once passed validation and check, then every tick died with ``interval out
of range``. Each field is tried just past its range (and with NaN and infinity where it is a float):
``full_clean`` refuses it, a raw UPDATE is refused by a CHECK constraint, and a row that got past the
constraints anyway (dropped for the test) is reported by check E007 and set aside by the worker.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.apps import apps
from django.core.checks import run_checks
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction

from notifications_retry.conf import bounds
from notifications_retry.engine.worker import Worker
from notifications_retry.models import ChannelConfig, NotificationEntity
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = pytest.mark.django_db

TABLE = ChannelConfig._meta.db_table
MIGRATION = importlib.import_module("notifications_retry.migrations.0005_hostile_input_guards")


def outside(bound: bounds.Bound) -> list[float]:
    step = 1 if bound.integer else 0.0001
    values = [bound.low - step, bound.high + step]
    if not bound.integer:
        values += [float("nan"), float("inf"), 1e13]
    return values


CASES = [(field, value) for field, bound in bounds.CHANNEL_FIELDS.items() for value in outside(bound)]


def build(**overrides: Any) -> ChannelConfig:
    values: dict[str, Any] = dict(key="email", provider_key="stub", max_attempts=3, timeout_seconds=5.0)
    values.update(overrides)
    if overrides.get("backoff_base_seconds", 0) > 3600:
        values.setdefault("backoff_cap_seconds", bounds.BACKOFF_CAP_SECONDS.high)
    return ChannelConfig(**values)


@pytest.mark.parametrize(("field", "value"), CASES)
def test_full_clean_refuses_a_value_outside_the_range(field: str, value: float) -> None:
    with pytest.raises(ValidationError) as info:
        build(**{field: value}).full_clean()
    assert field in info.value.message_dict, info.value.message_dict


@pytest.mark.parametrize(("field", "bound"), list(bounds.CHANNEL_FIELDS.items()))
def test_the_ends_of_each_range_pass(field: str, bound: bounds.Bound) -> None:
    for value in (bound.low, bound.high):
        value = int(value) if bound.integer else value
        channel = build(**{field: value})
        if field == "backoff_cap_seconds":
            channel.backoff_base_seconds = 1
        if field == "backoff_base_seconds":
            channel.backoff_cap_seconds = bounds.BACKOFF_CAP_SECONDS.high
        channel.full_clean()
        assert channel.bounds_problems() == []


@pytest.mark.parametrize(("field", "value"), CASES)
def test_the_database_refuses_a_value_outside_the_range(field: str, value: float) -> None:
    channel = ChannelFactory(key="in_app", backoff_base_seconds=1)
    literal = repr(value) if value == value and abs(value) != float("inf") else f"'{value}'"
    # cap < base also breaks nr_channel_backoff_cap_gte_base, which PostgreSQL may report first
    rule = f"nr_channel_{field}_range" + ("|nr_channel_backoff_cap_gte_base" if "backoff" in field else "")
    with pytest.raises(IntegrityError, match=rule), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET {field} = {literal}::float8 WHERE id = %s", [channel.pk])
    fresh = ChannelConfig.objects.get(pk=channel.pk)
    assert getattr(fresh, field) == getattr(channel, field)


def test_the_timeout_from_the_incident_is_refused_by_validation_and_the_database() -> None:
    with pytest.raises(ValidationError, match="less than or equal to 300"):
        build(timeout_seconds=1e13).full_clean()
    with pytest.raises(IntegrityError, match="nr_channel_timeout_seconds_range"), transaction.atomic():
        build(timeout_seconds=1e13).save()
    assert not ChannelConfig.objects.exists()


@pytest.fixture
def constraints_dropped() -> Iterator[None]:
    """Drop the range constraints inside the test's transaction (rolled back after it)."""
    with connection.cursor() as cursor:
        for field in bounds.CHANNEL_FIELDS:
            cursor.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT nr_channel_{field}_range")
    yield


def poison(channel: ChannelConfig, field: str, value: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET {field} = %s::float8 WHERE id = %s", [value, channel.pk])


@pytest.mark.usefixtures("constraints_dropped")
def test_check_e007_names_a_channel_that_got_past_the_constraints() -> None:
    bad = ChannelFactory(key="sms")
    ChannelFactory(key="in_app")
    poison(bad, "timeout_seconds", "1e13")
    poison(bad, "max_concurrency", "100000")
    found = [m for m in run_checks(databases=["default"]) if m.id == "notifications_retry.E007"]
    assert len(found) == 1
    assert "'sms'" in found[0].msg
    assert "timeout_seconds must be a number from 0.001 to 300, got 10000000000000.0" in found[0].msg
    assert "max_concurrency must be an integer from 1 to 512, got 100000" in found[0].msg
    # Plain `check` (no --database) reads the channels too, and says the same.
    assert [m.msg for m in run_checks() if m.id == "notifications_retry.E007"] == [found[0].msg]


@pytest.mark.usefixtures("constraints_dropped")
def test_check_e007_sees_nan() -> None:
    poison(ChannelFactory(key="sms"), "rate_limit_per_second", "NaN")
    found = [m.msg for m in run_checks(databases=["default"]) if m.id == "notifications_retry.E007"]
    assert found and "rate_limit_per_second" in found[0] and "nan" in found[0]


@pytest.mark.usefixtures("constraints_dropped")
def test_the_worker_sets_a_poisoned_channel_aside_and_sends_the_others(clock: Any) -> None:
    bad, good = ChannelFactory(key="sms"), ChannelFactory(key="in_app")
    poison(bad, "timeout_seconds", "1e13")
    due = clock.now() - timedelta(seconds=5)
    stuck = NotificationFactory(channel=bad, status="failed", attempts=1, next_attempt_at=due)
    healthy = [
        NotificationFactory(channel=good, status="failed", attempts=1, next_attempt_at=due) for _ in range(5)
    ]
    stats = Worker(clock=clock, rng=random.Random(7)).tick()
    assert stats.sent == 5
    assert NotificationEntity.objects.filter(pk__in=[r.pk for r in healthy], status="sent").count() == 5
    stuck.refresh_from_db()
    assert (stuck.status, stuck.attempts, stuck.claim_token) == ("failed", 1, None)
    assert stats.channel_disabled == 1


@pytest.mark.usefixtures("constraints_dropped")
def test_the_migration_names_channels_out_of_range_before_adding_constraints() -> None:
    poison(ChannelFactory(key="sms"), "timeout_seconds", "1e13")
    poison(ChannelFactory(key="push"), "max_attempts", "0")
    ChannelFactory(key="in_app")
    editor = SimpleNamespace(connection=connection)
    with pytest.raises(RuntimeError) as info:
        MIGRATION.refuse_channels_out_of_range(apps, editor)
    message = str(info.value)
    assert "channel 'sms': timeout_seconds = 10000000000000.0 is outside 0.001 to 300" in message
    assert "channel 'push': max_attempts = 0 is outside 1 to 100" in message
    assert "in_app" not in message


def test_the_migrations_ranges_match_the_code() -> None:
    assert {f: (b.low, b.high) for f, b in bounds.CHANNEL_FIELDS.items()} == MIGRATION.CHANNEL_RANGES
