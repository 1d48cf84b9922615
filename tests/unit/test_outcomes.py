"""decide(): the one rule for sent / retry at / terminal, with the clock and randomness passed in."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from notifications_retry.rules.backoff import BackoffPolicy
from notifications_retry.rules.outcomes import (
    ATTEMPTS_INVALID,
    DEADLINE_FLOOR,
    EXHAUSTED,
    EXPIRED,
    RETRY,
    SENT,
    TERMINAL,
    Failure,
    before_send,
    decide,
)
from tests.support.records import claimed_record

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
FIXED_60 = BackoffPolicy(kind="fixed", base_seconds=60, cap_seconds=3600, jitter_ratio=0)


def run(failure: Failure | None, attempts: int = 1, budget: int = 3, policy: BackoffPolicy = FIXED_60):
    return decide(failure, attempts=attempts, budget=budget, now=NOW, policy=policy, rng=random.Random(7))


def test_no_failure_is_sent():
    decision = run(None)
    assert decision.result == SENT and decision.next_attempt_at is None and decision.error_kind == ""


def test_a_permanent_failure_is_terminal_at_once_whatever_the_budget():
    decision = run(Failure("bad_request", "HTTP 400", retriable=False), attempts=1, budget=10)
    assert (decision.result, decision.error_kind, decision.error) == (TERMINAL, "bad_request", "HTTP 400")
    assert decision.next_attempt_at is None


def test_a_temporary_failure_is_retried_after_the_backoff():
    decision = run(Failure("timeout", "no answer", retriable=True), attempts=1, budget=3)
    assert decision.result == RETRY
    assert decision.next_attempt_at == NOW + timedelta(seconds=60)
    assert decision.error_kind == "timeout"


def test_the_last_allowed_attempt_is_terminal_even_when_temporary():
    assert run(Failure("timeout", "", True), attempts=3, budget=3).result == TERMINAL
    assert run(Failure("timeout", "", True), attempts=2, budget=3).result == RETRY


def test_retry_after_replaces_the_backoff():
    later = run(Failure("throttled", "", True, retry_after=600), attempts=1)
    assert later.next_attempt_at == NOW + timedelta(seconds=600)
    # A 503 with Retry-After: 5 is tried again after 5 s, not after the 60 s backoff.
    shorter = run(Failure("http_5xx", "", True, retry_after=5), attempts=1)
    assert shorter.next_attempt_at == NOW + timedelta(seconds=5)
    # Without Retry-After, the backoff.
    backoff = run(Failure("http_5xx", "", True), attempts=1)
    assert backoff.next_attempt_at == NOW + timedelta(seconds=60)


def test_exponential_backoff_grows_with_the_attempt_number_up_to_the_cap():
    policy = BackoffPolicy(kind="exponential", base_seconds=10, cap_seconds=35, jitter_ratio=0)
    waits = [
        (
            run(Failure("x", "", True), attempts=n, budget=10, policy=policy).next_attempt_at - NOW
        ).total_seconds()
        for n in (1, 2, 3, 4)
    ]
    assert waits == [10, 20, 35, 35]


def test_jitter_comes_from_the_rng_passed_in():
    policy = BackoffPolicy(kind="fixed", base_seconds=100, cap_seconds=1000, jitter_ratio=0.1)
    first = decide(Failure("x", "", True), attempts=1, budget=3, now=NOW, policy=policy, rng=random.Random(1))
    again = decide(Failure("x", "", True), attempts=1, budget=3, now=NOW, policy=policy, rng=random.Random(1))
    assert first == again
    assert NOW + timedelta(seconds=90) <= first.next_attempt_at <= NOW + timedelta(seconds=110)


@pytest.mark.parametrize(
    ("attempts_done", "expires_at", "kind"),
    [
        (3, None, EXHAUSTED),  # the last attempt never finished
        (1, NOW, EXPIRED),  # a deadline equal to now has passed
        (1, NOW - timedelta(seconds=1), EXPIRED),
        (3, NOW - timedelta(seconds=1), EXHAUSTED),  # the budget is checked first
    ],
)
def test_before_send_stops_spent_or_expired_records(attempts_done, expires_at, kind):
    failure = before_send(attempts_done=attempts_done, budget=3, expires_at=expires_at, now=NOW)
    assert failure is not None and failure.kind == kind and not failure.retriable
    assert run(failure, attempts=attempts_done).result == TERMINAL


def test_before_send_lets_a_sendable_record_through():
    assert before_send(attempts_done=2, budget=3, expires_at=NOW + timedelta(seconds=1), now=NOW) is None
    assert before_send(attempts_done=0, budget=1, expires_at=None, now=NOW) is None


@pytest.mark.parametrize(
    ("attempts_done", "text"),
    [
        (
            3,
            "attempt budget of 3 spent (the last attempt never finished: the worker stopped or crashed "
            "during it)",
        ),
        (7, "7 attempts already counted, past the attempt budget of 3 (the budget was lowered since)"),
    ],
)
def test_a_spent_budget_says_whether_the_last_attempt_never_finished_or_the_budget_was_lowered(
    attempts_done, text
):
    failure = before_send(attempts_done=attempts_done, budget=3, expires_at=None, now=NOW)
    assert failure is not None and (failure.kind, failure.error) == (EXHAUSTED, text)


@pytest.mark.parametrize("attempts_done", [2147483647, 101, -1])
def test_an_impossible_attempt_count_is_attempts_invalid_not_a_crash_story(attempts_done):
    failure = before_send(attempts_done=attempts_done, budget=3, expires_at=None, now=NOW)
    assert failure is not None and failure.kind == ATTEMPTS_INVALID and not failure.retriable
    assert failure.error == (
        f"attempt count {attempts_done} is impossible: the worker counts at most 100 attempts (the largest "
        "budget), so it was written outside the app; nothing was sent"
    )
    assert "crashed" not in failure.error


@pytest.mark.parametrize(
    ("expires_at", "text"),
    [
        (
            DEADLINE_FLOOR,
            "deadline -infinity (stored as '-infinity' or a date before year 2) passed before sending",
        ),
        (
            datetime(1969, 7, 20, 20, 17, tzinfo=UTC),
            "deadline 1969-07-20T20:17:00+00:00 (before 1970, so it was always past) passed before sending",
        ),
        (
            NOW - timedelta(seconds=1),
            f"deadline {(NOW - timedelta(seconds=1)).isoformat()} passed before sending",
        ),
    ],
)
def test_an_infinite_or_pre_epoch_deadline_says_so_in_words(expires_at, text):
    failure = before_send(attempts_done=1, budget=3, expires_at=expires_at, now=NOW)
    assert failure is not None and (failure.kind, failure.error) == (EXPIRED, text)


def test_a_claimed_records_ids_as_text_are_their_str_and_none_for_the_null_tenant() -> None:
    tenant = uuid.uuid4()
    record = claimed_record(tenant_id=tenant)
    assert (record.id_text, record.tenant_text) == (str(record.id), str(tenant))
    assert claimed_record(tenant_id=None).tenant_text is None
