"""Outbox event ids derived from their outcome: SQL and Python agree, and the database insists on them.

Events written before migration 0008 kept random ids; they are simulated here by inserting a row with
the outbox's insert trigger disabled, which is how such rows got in: before the rule existed.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction

from notifications_retry.database.triggers import LEGACY_EVENT_OF_NEW_EVENTS_SQL
from notifications_retry.delivery import events
from notifications_retry.engine.worker import Worker
from notifications_retry.models import DISPATCHED_TOPIC, NotificationEntity, Outbox
from notifications_retry.rules.event_ids import NAMESPACE, outbox_event_id
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = pytest.mark.django_db

Status = NotificationEntity.Status
OUTBOX = Outbox._meta.db_table
INSERT = (
    f"INSERT INTO {OUTBOX} (event_id, topic, key, contract_version, generation, payload, created_at) "
    "VALUES (%s, %s, %s, 1, %s, %s::jsonb, now())"
)


def sql_event_id(topic: str, key: str, generation: int) -> uuid.UUID:
    with connection.cursor() as cursor:
        cursor.execute("SELECT nr_outbox_event_id(%s, %s, %s)", [topic, key, generation])
        value = cursor.fetchone()[0]
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


@pytest.mark.parametrize(
    ("topic", "key", "generation"),
    [
        (DISPATCHED_TOPIC, "3f2b6c1e-8d2a-4c1b-9a7e-0f5d4c3b2a19", 0),
        (DISPATCHED_TOPIC, "3f2b6c1e-8d2a-4c1b-9a7e-0f5d4c3b2a19", 1),
        (DISPATCHED_TOPIC, "3F2B6C1E-8D2A-4C1B-9A7E-0F5D4C3B2A19", 0),  # case is part of the text
        ("другая.тема.v1", "ключ:ü€😀", 2_147_483_647),  # non-ASCII: UTF-8 on both sides
        ("", "", 0),
    ],
)
def test_sql_and_python_derive_the_same_version_3_id(topic, key, generation):
    expected = outbox_event_id(topic, key, generation)
    assert sql_event_id(topic, key, generation) == expected
    assert expected == uuid.uuid3(NAMESPACE, f"{topic}\0{key}\0{generation}")
    assert expected.version == 3 and expected.variant == uuid.RFC_4122


def test_the_parts_cannot_run_into_each_other():
    assert outbox_event_id("a", "bc", 1) != outbox_event_id("ab", "c", 1)
    assert outbox_event_id("a", "b1", 0) != outbox_event_id("a", "b", 10)
    assert sql_event_id("a", "bc", 1) != sql_event_id("ab", "c", 1)


def test_the_worker_and_the_orm_write_derived_ids(clock):
    channel = ChannelFactory(key="in_app")
    record = NotificationFactory(
        channel=channel, status=Status.FAILED, attempts=1, next_attempt_at=clock.now() - timedelta(seconds=5)
    )
    Worker(clock=clock, rng=random.Random(3)).tick()
    (event,) = Outbox.objects.all()
    assert event.event_id == outbox_event_id(event.topic, str(record.pk), 0)
    # An ORM insert that forgets the id gets the derived one, not its field default.
    sent = NotificationFactory(channel=channel, status=Status.SENT, attempts=1)
    row = Outbox(key=str(sent.pk), generation=0, payload=_payload(sent), created_at=clock.now())
    row.save(force_insert=True)
    row.refresh_from_db()
    assert row.event_id == outbox_event_id(DISPATCHED_TOPIC, str(sent.pk), 0)


def _payload(record: NotificationEntity, status: str = "Sent") -> dict[str, object]:
    return events.dispatched_payload(
        notification_id=record.pk,
        tenant_id=None,
        channel=record.channel.key,
        status=status,
        attempts=record.attempts,
        provider_message_id="p",
        error=None,
        error_kind=None,
        occurred_at=record.created_at,
    )


def _insert(event_id: uuid.UUID, record: NotificationEntity, generation: int = 0) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            INSERT, [event_id, DISPATCHED_TOPIC, str(record.pk), generation, json.dumps(_payload(record))]
        )


@contextmanager
def before_migration_0008() -> Iterator[None]:
    """Inserts as they were before the rule: the outbox insert trigger off (in this transaction)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgname LIKE 'pgtrigger_nr_outbox_matches_outcome_%'"
        )
        (name,) = cursor.fetchone()
        cursor.execute(f'ALTER TABLE {OUTBOX} DISABLE TRIGGER "{name}"')
        try:
            yield
        finally:
            cursor.execute(f'ALTER TABLE {OUTBOX} ENABLE TRIGGER "{name}"')


def test_a_new_event_must_carry_the_derived_id():
    record = NotificationFactory(channel=ChannelFactory(key="in_app"), status=Status.SENT, attempts=1)
    with pytest.raises(IntegrityError, match="its id must be nr_outbox_event_id"), transaction.atomic():
        _insert(uuid.uuid4(), record)
    _insert(outbox_event_id(DISPATCHED_TOPIC, str(record.pk), 0), record)
    assert Outbox.objects.count() == 1


def test_a_second_event_with_the_derived_id_is_the_unique_event_id():
    record = NotificationFactory(channel=ChannelFactory(key="in_app"), status=Status.SENT, attempts=1)
    derived = outbox_event_id(DISPATCHED_TOPIC, str(record.pk), 0)
    _insert(derived, record)
    with pytest.raises(IntegrityError, match="event_id"), transaction.atomic():
        _insert(derived, record)
    assert Outbox.objects.count() == 1


def test_events_from_before_the_migration_keep_one_event_per_outcome():
    record = NotificationFactory(channel=ChannelFactory(key="in_app"), status=Status.SENT, attempts=1)
    legacy = uuid.uuid4()
    with before_migration_0008():
        _insert(legacy, record)
        # Among themselves, the old rows' partial unique index holds the rule.
        with (
            pytest.raises(IntegrityError, match="nr_outbox_one_legacy_event_per_outcome"),
            transaction.atomic(),
        ):
            _insert(uuid.uuid4(), record)
    # A new event for an outcome an old event announced is refused, though its id is new.
    with pytest.raises(IntegrityError, match="exists already"), transaction.atomic():
        _insert(outbox_event_id(DISPATCHED_TOPIC, str(record.pk), 0), record)
    # The old event keeps its id, and can still be marked published.
    Outbox.objects.filter(event_id=legacy).update(published_at=record.created_at)
    assert list(Outbox.objects.values_list("event_id", flat=True)) == [legacy]


def test_new_events_stay_out_of_the_legacy_index_and_its_lookup_uses_it(clock):
    channel = ChannelFactory(key="in_app")
    for _ in range(3):
        NotificationFactory(
            channel=channel,
            status=Status.FAILED,
            attempts=1,
            next_attempt_at=clock.now() - timedelta(seconds=5),
        )
    Worker(clock=clock, rng=random.Random(3)).tick()
    assert Outbox.objects.count() == 3
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM {OUTBOX} WHERE NOT (event_id = nr_outbox_event_id(topic, key, generation))"
        )
        assert cursor.fetchone()[0] == 0
        # The trigger's lookup of old events is served by their index (the predicates must match).
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(
            f"EXPLAIN SELECT 1 FROM {OUTBOX} l WHERE l.topic = %s AND l.key = %s AND l.generation = 0 "
            "AND NOT (l.event_id = nr_outbox_event_id(l.topic, l.key, l.generation))",
            [DISPATCHED_TOPIC, "k"],
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "nr_outbox_one_legacy_event_per_outcome" in plan, plan


@pytest.mark.parametrize("outbox_rows", [0, 2000])
def test_the_triggers_lookup_of_older_events_probes_their_index_once_per_new_event(outbox_rows):
    """The statement the insert trigger runs over its new events, planned against an outbox empty or
    not: a nested loop whose inner side is the older events' partial index, never a scan or a hash of
    the outbox (which would grow every commit with the outbox)."""
    record = NotificationFactory(channel=ChannelFactory(key="in_app"), status=Status.SENT, attempts=1)
    with connection.cursor() as cursor:
        if outbox_rows:
            cursor.execute(f"ALTER TABLE {OUTBOX} DISABLE TRIGGER USER")
            cursor.execute(
                f"INSERT INTO {OUTBOX} (event_id, topic, key, contract_version, generation, payload, "
                "created_at) SELECT nr_outbox_event_id(%s, %s, g), %s, %s, 1, g, '{}', now() "
                "FROM generate_series(1, %s) g",
                [DISPATCHED_TOPIC, str(record.pk), DISPATCHED_TOPIC, str(record.pk), outbox_rows],
            )
            cursor.execute(f"ALTER TABLE {OUTBOX} ENABLE TRIGGER USER")
            cursor.execute(f"ANALYZE {OUTBOX}")
        cursor.execute(f"CREATE TEMP TABLE new_events ON COMMIT DROP AS SELECT * FROM {OUTBOX} LIMIT 0")
        cursor.execute(
            "INSERT INTO new_events (id, event_id, topic, key, contract_version, generation, payload, "
            "created_at) SELECT g, gen_random_uuid(), %s, %s, 1, 0, '{}', now() "
            "FROM generate_series(1, 200) g",
            [DISPATCHED_TOPIC, str(record.pk)],
        )
        cursor.execute("EXPLAIN " + LEGACY_EVENT_OF_NEW_EVENTS_SQL)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Nested Loop" in plan and "nr_outbox_one_legacy_event_per_outcome" in plan, plan
    assert "Hash" not in plan and f"Seq Scan on {OUTBOX}" not in plan, plan


def test_the_insert_triggers_lookups_probe_indexes_with_plans_made_while_the_outbox_was_empty():
    """PL/pgSQL keeps the trigger's plans for the session. Made while the outbox was empty (a fresh
    install, a purge), they must still probe indexes once it has grown, never scan the outbox once per
    new event until the next ANALYZE."""
    topic = "tests.plans.v1"  # not the dispatched topic: an event of its own, no notification behind it
    insert = (
        f"INSERT INTO {OUTBOX} (event_id, topic, key, contract_version, generation, payload, created_at) "
        "SELECT nr_outbox_event_id(%s, 'k' || g, 0), %s, 'k' || g, 1, 0, '{}', now() "
        "FROM generate_series(%s::int, %s::int) g"
    )
    scans = f"SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = '{OUTBOX}'"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {OUTBOX}")
        assert cursor.fetchone()[0] == 0
        cursor.execute(f"ANALYZE {OUTBOX}")  # the statistics of an empty table; cached plans dropped
        for first in range(6):  # five custom plans, then the generic one the session keeps
            cursor.execute(insert, [topic, topic, first, first])
        cursor.execute(insert, [topic, topic, 100, 1099])
        cursor.execute(scans)
        before = cursor.fetchone()[0]
        cursor.execute(insert, [topic, topic, 2000, 2015])
        cursor.execute(scans)
        assert cursor.fetchone()[0] == before
