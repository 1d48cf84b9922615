"""Claim, lease and finalize: SKIP LOCKED, expired leases, late finalizes, the single-owner lock."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from django.db import connection

from notifications_retry.database.locks import AdvisoryLock
from notifications_retry.delivery import RETRY, SENT, ChannelClaim, ClaimRequest, Outcome, claim_due, finalize
from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity, Outbox
from tests.factories import ChannelFactory, NotificationFactory, due_notifications

Status = NotificationEntity.Status


def due_records(clock, channel, n):
    return due_notifications(clock, channel, n)


def plan(channel, limit=100, lease=60.0):
    return [ChannelClaim(channel.pk, limit, lease)]


def budgets(channel):
    return {channel.pk: (channel.max_attempts, channel.key)}


def other_connection():
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=False)


@pytest.mark.django_db(transaction=True)
def test_rows_locked_by_another_transaction_are_skipped(clock):
    channel = ChannelFactory(key="in_app")
    records = due_records(clock, channel, 4)
    locked_id = records[0].pk
    with other_connection() as other:
        other.execute(
            f"SELECT 1 FROM {NotificationEntity._meta.db_table} WHERE id = %s FOR UPDATE", (locked_id,)
        )
        batch = claim_due(ClaimRequest(clock.now(), plan(channel), total=10, budgets=budgets(channel)))
        other.rollback()
    claimed = {r.id for r in batch.records}
    assert locked_id not in claimed
    assert claimed == {r.pk for r in records[1:]}


@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_never_share_a_row(clock):
    channel = ChannelFactory(key="in_app")
    due_records(clock, channel, 60)
    results: list[set] = []
    errors: list[BaseException] = []

    def claimer():
        from django.db import connection as thread_connection

        try:
            got: set = set()
            for _ in range(10):
                got |= {
                    r.id
                    for r in claim_due(
                        ClaimRequest(clock.now(), plan(channel, limit=5), total=5, budgets=budgets(channel))
                    ).records
                }
            results.append(got)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            thread_connection.close()

    threads = [threading.Thread(target=claimer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sum(len(r) for r in results) == len(set().union(*results)) == 60


@pytest.mark.django_db
def test_claim_counts_attempt_and_leases_without_changing_status(clock):
    channel = ChannelFactory(key="in_app", timeout_seconds=5)
    (record,) = due_records(clock, channel, 1)
    batch = claim_due(ClaimRequest(clock.now(), plan(channel, lease=40), total=10, budgets=budgets(channel)))
    row = NotificationEntity.objects.get(pk=record.pk)
    assert row.status == Status.FAILED
    assert row.attempts == 2 == batch.records[0].attempts
    assert row.claim_token == batch.records[0].claim_token
    assert row.claim_expires_at == clock.now() + timedelta(seconds=40)
    assert row.due_at is None, "a leased row is in no due index"
    # Leased: not claimable again until the lease runs out.
    assert (
        claim_due(ClaimRequest(clock.now(), plan(channel), total=10, budgets=budgets(channel))).records == []
    )


@pytest.mark.django_db
def test_expired_lease_is_claimed_again_and_the_late_finalize_changes_nothing(clock):
    channel = ChannelFactory(key="in_app")
    (record,) = due_records(clock, channel, 1)
    first = claim_due(
        ClaimRequest(clock.now(), plan(channel, lease=30), total=1, budgets=budgets(channel))
    ).records[0]
    clock.advance(31)
    second = claim_due(
        ClaimRequest(clock.now(), plan(channel, lease=30), total=1, budgets=budgets(channel))
    ).records[0]
    assert second.id == first.id and second.claim_token != first.claim_token
    assert second.attempts == 3
    late = finalize([Outcome(first, SENT, provider_message_id="late")], clock.now())
    assert late.stale and not late.applied
    row = NotificationEntity.objects.get(pk=record.pk)
    assert (
        row.status == Status.FAILED
        and row.provider_message_id is None
        and row.claim_token == second.claim_token
    )
    assert Outbox.objects.count() == 0
    current = finalize([Outcome(second, SENT, provider_message_id="on-time")], clock.now())
    assert current.applied
    assert NotificationEntity.objects.get(pk=record.pk).provider_message_id == "on-time"
    assert Outbox.objects.count() == 1


@pytest.mark.django_db
def test_finalize_applies_each_record_even_if_one_fails(clock):
    channel = ChannelFactory(key="in_app")
    due_records(clock, channel, 3)
    records = claim_due(ClaimRequest(clock.now(), plan(channel), total=3, budgets=budgets(channel))).records
    good = [Outcome(r, SENT, provider_message_id="ok") for r in records[:2]]
    # A retry outcome with no next_attempt_at on a row we then make unfinalizable by stealing its lease.
    NotificationEntity.objects.filter(pk=records[2].id).update(claim_token=None)
    report = finalize([*good, Outcome(records[2], RETRY, next_attempt_at=clock.now())], clock.now())
    assert {o.record.id for o in report.applied} == {r.id for r in records[:2]}
    assert [o.record.id for o in report.stale] == [records[2].id]


@pytest.mark.django_db(transaction=True)
def test_advisory_lock_is_exclusive_and_dies_with_its_connection():
    first = AdvisoryLock("notifications:test-lock")
    second = AdvisoryLock("notifications:test-lock")
    try:
        assert first.acquire()
        assert first.still_held()
        assert not second.acquire()
        first._conn.close()  # the owner's connection dies (process killed, network cut)
        assert not first.still_held()
        # The server frees the lock when it notices the disconnect: within moments, not a TTL.
        deadline = time.monotonic() + 1.0
        while not second.acquire() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert second.held
    finally:
        first.close()
        second.close()


@pytest.mark.django_db(transaction=True)
def test_hung_owner_loses_the_lock_by_idle_session_timeout():
    owner = AdvisoryLock("notifications:test-idle", idle_session_timeout=1)
    other = AdvisoryLock("notifications:test-idle")
    try:
        assert owner.acquire()
        time.sleep(2.5)
        assert other.acquire()
        assert not owner.still_held()
    finally:
        owner.close()
        other.close()


@pytest.mark.django_db(transaction=True)
def test_a_tick_is_skipped_when_another_instance_owns_the_lock(clock):
    channel = ChannelFactory(key="in_app")
    due_records(clock, channel, 2)
    holder = AdvisoryLock("notifications:retry-worker")
    try:
        assert holder.acquire()
        stats = Worker(clock=clock).tick()
        assert stats.skipped and stats.processed == 0
        assert NotificationEntity.objects.filter(status=Status.SENT).count() == 0
    finally:
        holder.close()
    assert Worker(clock=clock).tick().sent == 2


@pytest.mark.django_db(transaction=True)
def test_tick_stops_claiming_when_the_lock_is_lost(clock):
    # 20 sends of 0.1 s one at a time take 2 s; the lock is asked every 0.5 s (LOCK_CHECK_SECONDS) and
    # its session dies at the second question, about halfway through.
    channel = ChannelFactory(
        key="email", provider_key="stub", options={"delay_seconds": 0.1}, max_concurrency=1
    )
    due_records(clock, channel, 20)
    worker = Worker(clock=clock)
    original = worker.lock.still_held
    calls = {"n": 0}

    def flaky_still_held():
        calls["n"] += 1
        if calls["n"] == 2:
            worker.lock._conn.close()
        return original()

    worker.lock.still_held = flaky_still_held
    stats = worker.tick()
    worker.close()
    assert stats.lock_lost
    assert stats.claims < 20
    assert NotificationEntity.objects.filter(status=Status.SENT).count() == stats.sent


@pytest.mark.django_db
def test_stop_request_finishes_records_in_hand_and_claims_no_more(clock):
    channel = ChannelFactory(
        key="email", provider_key="stub", options={"delay_seconds": 0.02}, max_concurrency=2
    )
    due_records(clock, channel, 30)
    worker = Worker(clock=clock)
    original = worker.executor.send_async

    async def send_then_stop(rt, record):
        worker.stop()
        return await original(rt, record)

    worker.executor.send_async = send_then_stop
    stats = worker.tick()
    worker.close()
    assert stats.stopped
    leased = NotificationEntity.objects.filter(claim_token__isnull=False).count()
    assert leased == 0, "every claimed record was finalized or given back"
    sent = NotificationEntity.objects.filter(status=Status.SENT).count()
    # The stop came during the first call, before the second start's first step: that one never
    # called its provider (a start asks again whether it may send, however short its wait).
    assert sent == stats.sent == 1, "only the call in flight was finished"
    # Claimed but not started: handed back as they were, attempt refunded.
    assert NotificationEntity.objects.filter(status=Status.FAILED, attempts=1).count() == 30 - sent


@pytest.mark.django_db
def test_max_duration_stops_new_claims(clock):
    channel = ChannelFactory(
        key="email", provider_key="stub", options={"delay_seconds": 0.05}, max_concurrency=1
    )
    due_records(clock, channel, 40)
    stats = Worker(clock=clock, max_duration=0.2).tick()
    assert stats.deadline_reached
    assert 0 < stats.sent < 40
    assert NotificationEntity.objects.filter(claim_token__isnull=False).count() == 0


@pytest.mark.django_db
def test_recovered_leases_are_claimed_apart_from_fresh_rows(clock):
    # Rows in flight when a worker died come back in a group of their own, never beside healthy rows
    # that have not crashed a worker: a poison record that kills the process takes none of them down.
    channel = ChannelFactory(key="in_app", max_attempts=10)
    due_records(clock, channel, 5)
    crashed = claim_due(
        ClaimRequest(clock.now(), plan(channel, lease=30), total=3, budgets=budgets(channel))
    ).records
    clock.advance(31)
    batch = claim_due(ClaimRequest(clock.now(), plan(channel), total=10, budgets=budgets(channel)))
    assert {r.id for r in batch.records} == {r.id for r in crashed} and batch.more
    rest = claim_due(ClaimRequest(clock.now(), plan(channel), total=10, budgets=budgets(channel)))
    assert len(rest.records) == 2 and not {r.id for r in rest.records} & {r.id for r in crashed}


@pytest.mark.django_db
def test_worker_recovers_every_expired_lease_in_one_tick(clock):
    channel = ChannelFactory(key="in_app", max_attempts=10)
    due_records(clock, channel, 6)
    claim_due(ClaimRequest(clock.now(), plan(channel, lease=30), total=4, budgets=budgets(channel)))
    clock.advance(31)
    stats = Worker(clock=clock).tick()
    assert stats.sent == 6


@pytest.mark.django_db
def test_recovered_leases_come_back_in_groups_that_halve_with_each_death(clock):
    from notifications_retry.delivery.claim_statements import RECOVERY_GROUP

    channel = ChannelFactory(key="hook-recovery", provider_key="in_app")
    expired = clock.now() - timedelta(seconds=5)
    once = [
        NotificationFactory(
            channel=channel,
            status=Status.FAILED,
            attempts=1,
            claim_token=uuid.uuid4(),
            claim_expires_at=expired,
            next_attempt_at=expired,
        )
        for _ in range(RECOVERY_GROUP + 4)
    ]
    plan = [ChannelClaim(channel.pk, 100, 60.0)]
    budgets = {channel.pk: (10, channel.key)}
    first = claim_due(ClaimRequest(clock.now(), plan, total=100, budgets=budgets))
    assert len(first.records) == RECOVERY_GROUP and first.more
    second = claim_due(ClaimRequest(clock.now(), plan, total=100, budgets=budgets))
    assert len(second.records) == 4
    # Leased again by those claims, and never finished: each row was now in flight at two deaths.
    NotificationEntity.objects.filter(pk__in=[r.pk for r in once]).update(claim_expires_at=expired)
    halved = claim_due(ClaimRequest(clock.now(), plan, total=100, budgets=budgets))
    assert len(halved.records) == RECOVERY_GROUP // 2 and halved.more


@pytest.mark.django_db
def test_a_logged_attempt_of_the_first_run_is_no_crash(clock):
    # finalize leaves a first run's generation (0) out of its attempt_log entry; the claim's count of
    # a recovered row's crashes reads a missing generation as 0. The rows' first attempt (the
    # factory's) and the last were never logged: two deaths, so they come back 8 at a time. Read as
    # "not this run", the logged attempt would make a third, and they would come back 4 at a time.
    from notifications_retry.delivery.claim_statements import RECOVERY_GROUP

    channel = ChannelFactory(key="in_app", max_attempts=10)
    due_records(clock, channel, RECOVERY_GROUP + 4)
    records = claim_due(ClaimRequest(clock.now(), plan(channel), total=100, budgets=budgets(channel))).records
    retried = [Outcome(r, RETRY, next_attempt_at=clock.now()) for r in records]
    assert len(finalize(retried, clock.now()).applied) == RECOVERY_GROUP + 4
    entries = [row.attempt_log[-1] for row in NotificationEntity.objects.all()]
    assert all("generation" not in entry and entry["outcome"] == "retry" for entry in entries)
    # Claimed again, and the worker dies with them: three attempts counted, one logged.
    claim_due(ClaimRequest(clock.now(), plan(channel, lease=30), total=100, budgets=budgets(channel)))
    clock.advance(31)
    first = claim_due(ClaimRequest(clock.now(), plan(channel), total=100, budgets=budgets(channel)))
    assert {r.attempts for r in first.records} == {4}
    assert len(first.records) == RECOVERY_GROUP // 2 and first.more
