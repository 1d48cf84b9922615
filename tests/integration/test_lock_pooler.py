"""The cycle's lock refuses a pooled connection (a real PgBouncer in transaction mode) and leaks nothing."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.db import connection, connections
from django.test import override_settings

from notifications_retry.database.locks import LOCK_APPLICATION_NAME, AdvisoryLock, LockNotDirect
from tests.support.pgbouncer import PgBouncer, pgbouncer_binary

pytestmark = pytest.mark.django_db(transaction=True)

ADVISORY_HOLDERS = """
SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = %s)
"""


def advisory_holders() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(ADVISORY_HOLDERS, [connection.settings_dict["NAME"]])
        return [row[0] for row in cursor.fetchall()]


@pytest.fixture
def alias() -> Iterator[Any]:
    """Add a DATABASES alias (the test database's entry with changes) for the duration of a test."""
    added: list[str] = []

    def add(name: str, **changes: Any) -> str:
        entry = copy.deepcopy(settings.DATABASES["default"])
        entry.update(changes)
        connections.settings[name] = entry
        settings.DATABASES[name] = entry
        added.append(name)
        return name

    yield add
    for name in added:
        connections.settings.pop(name, None)
        settings.DATABASES.pop(name, None)
        if hasattr(connections._connections, name):  # type: ignore[attr-defined]
            delattr(connections._connections, name)  # type: ignore[attr-defined]


@pytest.fixture(
    params=[
        # PgBouncer's default: a client's startup `options` is refused outright.
        pytest.param("", id="options-refused"),
        # A common production setting: `options` is accepted and dropped, the session never sees it.
        pytest.param("options", id="options-ignored"),
    ]
)
def bouncer(request: pytest.FixtureRequest) -> Iterator[PgBouncer]:
    if pgbouncer_binary() is None:
        pytest.skip("pgbouncer cannot be installed here (bash scripts/ensure-pgbouncer, run by make test)")
    db = settings.DATABASES["default"]
    server = PgBouncer(
        db.get("HOST") or "127.0.0.1",
        int(db.get("PORT") or 5432),
        pool_mode="transaction",
        ignore_startup_parameters=request.param,
    ).start()
    yield server
    server.stop()


def pooled_session_settings(bouncer: PgBouncer) -> tuple[str, str, str]:
    """What another client of the pool sees on the (single) server session: timeout, app name, source."""
    with psycopg.connect(bouncer.url(connection.settings_dict["NAME"]), autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('idle_session_timeout'), current_setting('application_name'), "
            "(SELECT source FROM pg_settings WHERE name = 'idle_session_timeout')"
        ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def test_the_lock_refuses_a_transaction_pooler_naming_the_setting_to_fix(bouncer, alias):
    pooled = alias("pooled", HOST="127.0.0.1", PORT=str(bouncer.port))
    lock = AdvisoryLock("notifications:test-pooled", using=pooled, idle_session_timeout=7)
    try:
        with pytest.raises(LockNotDirect) as refused:
            lock.acquire()
        message = str(refused.value)
        assert "LOCK_DATABASE_ALIAS" in message and "'pooled'" in message and "directly" in message
        assert not lock.held
        # Refused before any lock was tried: nothing stranded on a pooled server session.
        assert advisory_holders() == []
        with pytest.raises(LockNotDirect):
            lock.prove_direct()
    finally:
        lock.close()
    # Nothing leaked onto the pool's server session, which the next client gets (pool size 1).
    timeout, application_name, source = pooled_session_settings(bouncer)
    assert (timeout, source) == ("0", "default")
    assert application_name != LOCK_APPLICATION_NAME


def test_a_direct_lock_gets_its_settings_at_connect_time_and_only_there(alias):
    lock = AdvisoryLock("notifications:test-direct", using=alias("direct"), idle_session_timeout=7)
    try:
        assert lock.prove_direct()
        assert lock.acquire() and lock.still_held()
        assert lock._conn is not None
        row = lock._conn.execute(
            "SELECT current_setting('idle_session_timeout'), current_setting('application_name'), "
            "(SELECT source FROM pg_settings WHERE name = 'idle_session_timeout')"
        ).fetchone()
        # "client": from the startup packet (connection options), not a SET run on the session.
        assert row == ("7s", LOCK_APPLICATION_NAME, "client")
        with connection.cursor() as cursor:
            cursor.execute("SHOW idle_session_timeout")
            assert cursor.fetchone()[0] == "0"
        assert advisory_holders() == [lock._conn.info.backend_pid]
    finally:
        lock.close()
    assert advisory_holders() == []


def test_the_alias_own_connection_options_are_kept(alias):
    direct = alias("with_options", OPTIONS={"options": "-c statement_timeout=4321"})
    lock = AdvisoryLock("notifications:test-options", using=direct, idle_session_timeout=9)
    try:
        assert lock.acquire()
        assert lock._conn is not None
        row = lock._conn.execute(
            "SELECT current_setting('statement_timeout'), current_setting('idle_session_timeout')"
        ).fetchone()
        assert row == ("4321ms", "9s")
    finally:
        lock.close()


def test_a_session_that_is_not_the_proven_one_is_refused_at_acquisition(alias):
    # A proxy that passed the connect-time proof but then ran the lock elsewhere: stand in for it by
    # making the proven pid differ from the session's. The lock must refuse and leave nothing held.
    lock = AdvisoryLock("notifications:test-moved", using=alias("direct"))
    try:
        assert lock.acquire()
        lock.release()
        assert lock._pid is not None
        lock._pid += 1
        with pytest.raises(LockNotDirect, match="LOCK_DATABASE_ALIAS"):
            lock.acquire()
        assert not lock.held
        assert advisory_holders() == []
        # The next acquisition opens and proves a fresh session.
        assert lock.acquire()
    finally:
        lock.close()


def test_check_database_proves_the_lock_session_e004_through_a_pooler(bouncer, alias):
    pooled = alias("pooled", HOST="127.0.0.1", PORT=str(bouncer.port))
    with override_settings(NOTIFICATIONS_RETRY={"LOCK_DATABASE_ALIAS": pooled}):
        # Without --database the check opens nothing (and the port says nothing here).
        assert [m for m in run_checks() if m.id == "notifications_retry.E004"] == []
        found = [m for m in run_checks(databases=[pooled]) if m.id == "notifications_retry.E004"]
    assert len(found) == 1 and "LOCK_DATABASE_ALIAS" in found[0].msg, found
    assert advisory_holders() == []


def test_check_database_passes_a_direct_lock_session(alias):
    direct = alias("direct")
    with override_settings(NOTIFICATIONS_RETRY={"LOCK_DATABASE_ALIAS": direct}):
        assert [m.id for m in run_checks(databases=[direct]) if m.id.startswith("notifications_retry.")] == []


def test_a_session_without_the_startup_timeout_is_refused(alias, monkeypatch):
    # A proxy that passes the server's key through but drops the startup `options`: stand in for it
    # by opening the connection without the lock's session settings.
    from notifications_retry.database import locks

    real = locks.dedicated_connection

    def dropping_options(using: str, application_name: str, **kwargs: Any) -> Any:
        return real(using, application_name, session_settings={})

    monkeypatch.setattr(locks, "dedicated_connection", dropping_options)
    lock = AdvisoryLock("notifications:test-dropped", using=alias("direct"), idle_session_timeout=11)
    try:
        with pytest.raises(LockNotDirect, match="idle_session_timeout is 0s, not the 11s"):
            lock.acquire()
        assert advisory_holders() == []
    finally:
        lock.close()
