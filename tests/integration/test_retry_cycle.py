"""The job card's tests and the cycle's rules, on a real PostgreSQL with an injected clock."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from notifications_retry import signals
from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity, Outbox
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = pytest.mark.django_db

Status = NotificationEntity.Status


def make_worker(clock, **kwargs):
    return Worker(clock=clock, rng=random.Random(7), **kwargs)


def failed_due(clock, channel, **kwargs):
    kwargs.setdefault("attempts", 1)
    kwargs.setdefault("next_attempt_at", clock.now() - timedelta(seconds=5))
    return NotificationFactory(channel=channel, status=Status.FAILED, **kwargs)


def test_empty_batch_is_a_noop_success(clock):
    ChannelFactory(key="in_app")
    stats = make_worker(clock).tick()
    assert not stats.skipped
    assert (stats.processed, stats.sent, stats.retried, stats.terminal) == (0, 0, 0, 0)
    assert Outbox.objects.count() == 0


def test_due_failed_record_is_sent_with_event(clock):
    record = failed_due(clock, ChannelFactory(key="in_app"))
    stats = make_worker(clock).tick()
    record.refresh_from_db()
    assert stats.sent == 1
    assert record.status == Status.SENT
    assert record.attempts == 2
    assert record.provider_message_id == f"in_app:{record.id}"
    assert record.claim_token is None and record.due_at is None
    event = Outbox.objects.get()
    assert event.key == str(record.id)
    assert event.topic == "pin.notifications.dispatched.v1"
    assert event.contract_version == 1
    assert event.payload["status"] == "Sent"
    assert event.payload["attempts"] == 2
    assert event.payload["provider_message_id"] == record.provider_message_id


def test_retriable_failure_counts_attempt_backs_off_and_emits_nothing(clock):
    channel = ChannelFactory(
        key="email",
        provider_key="stub",
        options={"fail": "retriable"},
        max_attempts=5,
        backoff_base_seconds=60,
        backoff_cap_seconds=3600,
    )
    record = NotificationFactory(
        channel=channel, status=Status.FAILED, attempts=2, next_attempt_at=clock.now() - timedelta(seconds=1)
    )
    stats = make_worker(clock).tick()
    record.refresh_from_db()
    assert stats.retried == 1
    assert record.status == Status.FAILED
    assert record.attempts == 3
    # Exponential: 60 * 2 ** (3 - 1) = 240 s, +-10 % jitter.
    delay = (record.next_attempt_at - clock.now()).total_seconds()
    assert 216 <= delay <= 264
    assert record.dead_lettered_at is None
    assert record.error_kind == "stub_retriable"
    assert Outbox.objects.count() == 0
    assert record.attempt_log[-1]["outcome"] == "retry"


def test_max_attempts_reached_is_terminal_with_event_and_alert(clock):
    channel = ChannelFactory(key="email", provider_key="stub", options={"fail": "retriable"}, max_attempts=3)
    record = failed_due(clock, channel, attempts=2)
    alerts = []

    def receiver(sender, **kwargs):
        alerts.append(kwargs)

    signals.terminal_failure.connect(receiver)
    try:
        stats = make_worker(clock).tick()
    finally:
        signals.terminal_failure.disconnect(receiver)
    record.refresh_from_db()
    assert stats.terminal == 1
    assert record.status == Status.FAILED
    assert record.attempts == 3
    assert record.dead_lettered_at == clock.now()
    assert record.error_kind == "stub_retriable"
    assert "stub told to fail" in record.dead_letter_reason
    assert record.due_at is None
    event = Outbox.objects.get()
    assert event.payload["status"] == "Failed"
    assert event.payload["error_kind"] == "stub_retriable"
    assert [a["notification_id"] for a in alerts] == [record.id]


def test_permanent_failure_is_terminal_at_once(clock):
    channel = ChannelFactory(key="email", provider_key="stub", options={"fail": "permanent"}, max_attempts=5)
    record = failed_due(clock, channel)
    stats = make_worker(clock).tick()
    record.refresh_from_db()
    assert stats.terminal == 1
    assert record.attempts == 2
    assert record.dead_lettered_at is not None
    assert Outbox.objects.get().payload["status"] == "Failed"


def test_disabled_channel_is_skipped_counted_and_untouched(clock):
    channel = ChannelFactory(key="sms", is_enabled=False)
    record = failed_due(clock, channel)
    before = NotificationEntity.objects.values().get(pk=record.pk)
    stats = make_worker(clock).tick()
    assert stats.channel_disabled == 1
    assert stats.processed == 0
    assert NotificationEntity.objects.values().get(pk=record.pk) == before


def test_misconfigured_channel_is_treated_as_disabled(clock):
    channel = ChannelFactory(key="webhook", provider_key="webhook", options={})
    record = failed_due(clock, channel)
    stats = make_worker(clock).tick()
    record.refresh_from_db()
    assert stats.channel_disabled == 1
    assert record.attempts == 1


def test_disabled_rows_do_not_starve_enabled_channels(clock):
    disabled = ChannelFactory(key="sms", is_enabled=False)
    enabled = ChannelFactory(key="in_app")
    for i in range(30):
        failed_due(clock, disabled, next_attempt_at=clock.now() - timedelta(hours=1, seconds=i))
    fresh = [failed_due(clock, enabled) for _ in range(5)]
    stats = make_worker(clock, batch_size=5).tick()
    assert stats.sent == 5
    assert NotificationEntity.objects.filter(pk__in=[r.pk for r in fresh], status=Status.SENT).count() == 5


def test_scheduled_pending_due_is_sent(clock):
    record = NotificationFactory(
        channel=ChannelFactory(key="in_app"),
        status=Status.PENDING,
        scheduled_at=clock.now() - timedelta(seconds=1),
    )
    make_worker(clock).tick()
    record.refresh_from_db()
    assert record.status == Status.SENT
    assert record.attempts == 1


def test_scheduled_pending_not_yet_due_and_fresh_pending_are_untouched(clock):
    channel = ChannelFactory(key="in_app")
    later = NotificationFactory(channel=channel, scheduled_at=clock.now() + timedelta(seconds=1))
    fresh = NotificationFactory(channel=channel, scheduled_at=None)
    stats = make_worker(clock).tick()
    assert stats.processed == 0
    for record in (later, fresh):
        record.refresh_from_db()
        assert record.status == Status.PENDING
        assert record.attempts == 0


def test_failed_not_yet_due_is_untouched(clock):
    record = failed_due(
        clock, ChannelFactory(key="in_app"), next_attempt_at=clock.now() + timedelta(seconds=1)
    )
    assert make_worker(clock).tick().processed == 0
    record.refresh_from_db()
    assert record.attempts == 1


def test_batch_size_and_oldest_due_first(clock):
    channel = ChannelFactory(key="in_app")
    records = [
        failed_due(clock, channel, next_attempt_at=clock.now() - timedelta(minutes=i)) for i in range(10)
    ]
    stats = make_worker(clock, batch_size=3).tick()
    assert stats.sent == 3
    sent = set(NotificationEntity.objects.filter(status=Status.SENT).values_list("pk", flat=True))
    assert sent == {r.pk for r in records[-3:]}


def test_high_priority_first_at_equal_due_time(clock):
    channel = ChannelFactory(key="in_app")
    when = clock.now() - timedelta(minutes=1)
    low = failed_due(clock, channel, next_attempt_at=when, priority=NotificationEntity.Priority.LOW)
    high = failed_due(clock, channel, next_attempt_at=when, priority=NotificationEntity.Priority.HIGH)
    make_worker(clock, batch_size=1).tick()
    assert NotificationEntity.objects.get(pk=high.pk).status == Status.SENT
    assert NotificationEntity.objects.get(pk=low.pk).status == Status.FAILED


def test_expired_deadline_is_terminal_without_send(clock):
    record = failed_due(clock, ChannelFactory(key="in_app"), expires_at=clock.now() - timedelta(seconds=1))
    stats = make_worker(clock).tick()
    record.refresh_from_db()
    assert stats.terminal == 1
    assert record.error_kind == "expired"
    assert record.provider_message_id is None
    assert record.attempts == 1
    assert Outbox.objects.get().payload["status"] == "Failed"


def test_spent_budget_after_a_crash_is_terminal_without_send(clock):
    # The worker died during the last attempt: the lease ran out with attempts == max_attempts.
    channel = ChannelFactory(key="in_app", max_attempts=3)
    record = failed_due(clock, channel, attempts=3)
    stats = make_worker(clock).tick()
    record.refresh_from_db()
    assert stats.terminal == 1
    assert record.error_kind == "attempts_exhausted"
    assert record.provider_message_id is None
    assert record.attempts == 3


def test_provider_that_raises_unexpectedly_fails_only_its_record(clock, settings):
    settings.NOTIFICATIONS_RETRY = {"PROVIDERS": {"exploding": "tests.support.providers.ExplodingProvider"}}
    bad = failed_due(clock, ChannelFactory(key="bad", provider_key="exploding", max_attempts=5))
    good = failed_due(clock, ChannelFactory(key="in_app"))
    stats = make_worker(clock).tick()
    bad.refresh_from_db()
    good.refresh_from_db()
    assert good.status == Status.SENT
    assert bad.status == Status.FAILED and bad.error_kind == "provider_crash"
    assert "boom" in bad.last_error
    assert stats.retried == 1 and stats.sent == 1


def test_per_type_attempt_budget(clock, settings):
    settings.NOTIFICATIONS_RETRY = {"ATTEMPTS_BY_TYPE": {"marketing": 2, "email:transactional": 8}}
    channel = ChannelFactory(key="email", provider_key="stub", options={"fail": "retriable"}, max_attempts=5)
    marketing = failed_due(clock, channel, attempts=1, notification_type="marketing")
    transactional = failed_due(clock, channel, attempts=6, notification_type="transactional")
    make_worker(clock).tick()
    marketing.refresh_from_db()
    transactional.refresh_from_db()
    assert marketing.dead_lettered_at is not None and marketing.attempts == 2
    assert transactional.dead_lettered_at is None and transactional.attempts == 7


def test_retry_after_over_a_fixed_backoff(clock):
    channel = ChannelFactory(
        key="email",
        provider_key="stub",
        options={"fail": "throttled"},
        max_attempts=5,
        retry_backoff="fixed",
        backoff_base_seconds=10,
    )
    record = failed_due(clock, channel)
    make_worker(clock).tick()
    record.refresh_from_db()
    # The stub throttles with Retry-After 60 s: that, not the fixed 10 s backoff (spread up to 10 % later).
    assert 60 <= (record.next_attempt_at - clock.now()).total_seconds() <= 66
    assert record.error_kind == "throttled"


def test_a_503_with_a_short_retry_after_is_tried_again_then_not_after_the_backoff(clock, webhook_server):
    from tests.support.http_server import Reply

    webhook_server.responder = lambda r: Reply(503, headers={"Retry-After": "5"})
    channel = ChannelFactory(key="webhook", provider_key="webhook", options={"url": webhook_server.url})
    record = failed_due(clock, channel)  # the default backoff: 60 s, then 120 s…
    make_worker(clock).tick()
    record.refresh_from_db()
    assert len(webhook_server.requests) == 1
    assert record.error_kind == "http_5xx" and record.attempts == 2
    assert 5 <= (record.next_attempt_at - clock.now()).total_seconds() <= 5.5


def test_throttled_channel_sends_nothing_more_before_retry_after(clock, webhook_server):
    from notifications_retry.engine.channels import QUEUE_ROUNDS
    from tests.support.http_server import Reply

    webhook_server.responder = lambda r: Reply(429, headers={"Retry-After": "120"})
    channel = ChannelFactory(
        key="webhook",
        provider_key="webhook",
        options={"url": webhook_server.url},
        max_concurrency=1,
        max_attempts=5,
    )
    claimed_at_most = QUEUE_ROUNDS + 1  # one call in flight, QUEUE_ROUNDS queued behind it
    records = [
        failed_due(clock, channel, next_attempt_at=clock.now() - timedelta(seconds=i))
        for i in range(claimed_at_most + 2)
    ]
    stats = make_worker(clock).tick()
    assert len(webhook_server.requests) == 1
    # Everything claimed waits for Retry-After; the rest was never claimed. Only the record whose call
    # was made spent an attempt: those queued behind it were given back with theirs.
    assert stats.retried == 1
    oldest_first = sorted(records, key=lambda r: r.next_attempt_at)
    called = webhook_server.keys()[0]
    for record in oldest_first[:claimed_at_most]:
        record.refresh_from_db()
        assert record.next_attempt_at >= clock.now() + timedelta(seconds=120)
        if str(record.pk) == called:
            assert (record.attempts, record.error_kind) == (2, "throttled")
        else:
            assert (record.attempts, record.error_kind, record.claim_token) == (1, "", None)
    for untouched in oldest_first[claimed_at_most:]:
        untouched.refresh_from_db()
        assert untouched.attempts == 1 and untouched.error_kind == ""


def test_inline_channel_throttled_mid_claim_gives_the_rest_back_unsent(clock):
    channel = ChannelFactory(key="email", provider_key="stub", options={"fail": "throttled"}, max_attempts=5)
    records = [
        failed_due(clock, channel, next_attempt_at=clock.now() - timedelta(seconds=i)) for i in range(3)
    ]
    stats = make_worker(clock).tick()
    assert stats.retried == 1
    seen = []
    for record in records:
        record.refresh_from_db()
        assert record.next_attempt_at >= clock.now() + timedelta(seconds=60)
        assert record.claim_token is None
        seen.append((record.attempts, record.last_error))
    # One call was made and spent its attempt; the two behind it keep theirs and wait for the pause.
    assert sorted(seen) == [(1, ""), (1, ""), (2, "stub told to throttle")]


def test_inline_delivery_writes_each_row_once(clock):
    # A provider without I/O delivers inside the claim: no lease is written, one UPDATE per row.
    from django.db import connection

    table = NotificationEntity._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE nr_test_updates (id uuid)")
        cursor.execute(
            "CREATE FUNCTION nr_test_count_update() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN INSERT INTO nr_test_updates VALUES (NEW.id); RETURN NEW; END $$"
        )
        cursor.execute(
            f"CREATE TRIGGER nr_test_count AFTER UPDATE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION nr_test_count_update()"
        )
    record = failed_due(clock, ChannelFactory(key="in_app"))
    slow = ChannelFactory(key="slow", provider_key="stub", options={"delay_seconds": 0.01})
    leased = failed_due(clock, slow)
    make_worker(clock).tick()
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, count(*) FROM nr_test_updates GROUP BY id")
        writes = dict(cursor.fetchall())
    assert writes == {record.pk: 1, leased.pk: 2}, "inline: one write; leased: claim + finalize"
    record.refresh_from_db()
    assert record.status == Status.SENT and record.attempts == 2
    assert record.claim_token is None and record.claim_expires_at is None
    assert [e["attempt"] for e in record.attempt_log] == [2]


@pytest.mark.parametrize("recipient", ["", "   "])
def test_empty_recipient_is_terminal_at_once_without_a_call(clock, webhook_server, recipient):
    channel = ChannelFactory(
        key="webhook", provider_key="webhook", options={"url": webhook_server.url}, max_attempts=5
    )
    bad = failed_due(clock, channel, recipient=recipient)
    good = failed_due(clock, channel)
    stats = make_worker(clock).tick()
    bad.refresh_from_db()
    good.refresh_from_db()
    assert bad.dead_lettered_at is not None and bad.error_kind == "invalid_recipient"
    assert good.status == Status.SENT
    assert webhook_server.keys() == [str(good.id)]
    assert stats.terminal == 1 and stats.sent == 1
