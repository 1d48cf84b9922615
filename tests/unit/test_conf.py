"""The typed settings object: defaults, lazy reading, refusal of unknown keys and bad values."""

from __future__ import annotations

import dataclasses

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from notifications_retry import bounds
from notifications_retry.conf import RetrySettings, get_settings, settings_problems


def test_defaults_match_the_job_card() -> None:
    conf = RetrySettings()
    assert conf.BATCH_SIZE == 200
    assert conf.MAX_DURATION_SECONDS == 45.0
    assert conf.INTERVAL_SECONDS == 60.0
    assert conf.LOCK_KEY == "notifications:retry-worker"
    assert conf.LOCK_IDLE_SESSION_TIMEOUT_SECONDS == 90


def test_defaults_have_no_problems() -> None:
    assert settings_problems(RetrySettings()) == []


def test_override_settings_reaches_every_read() -> None:
    with override_settings(NOTIFICATIONS_RETRY={"BATCH_SIZE": 7}):
        assert get_settings().BATCH_SIZE == 7
    assert get_settings().BATCH_SIZE == 200


def test_missing_or_empty_dict_gives_defaults() -> None:
    with override_settings(NOTIFICATIONS_RETRY=None):
        assert get_settings() == RetrySettings()


def test_unknown_key_is_refused_naming_the_typo() -> None:
    with pytest.raises(ImproperlyConfigured, match="BATCHSIZE"):
        RetrySettings.from_mapping({"BATCHSIZE": 10})


def test_settings_that_are_not_a_dict_are_refused() -> None:
    with (
        override_settings(NOTIFICATIONS_RETRY=["BATCH_SIZE"]),
        pytest.raises(ImproperlyConfigured, match="dict"),
    ):
        get_settings()


def test_webhook_hosts_as_a_bare_string_is_refused() -> None:
    with pytest.raises(ImproperlyConfigured, match="WEBHOOK_ALLOWED_HOSTS"):
        RetrySettings.from_mapping({"WEBHOOK_ALLOWED_HOSTS": "example.com"})


def test_webhook_hosts_list_becomes_a_tuple() -> None:
    assert RetrySettings.from_mapping({"WEBHOOK_ALLOWED_HOSTS": ["a.example"]}).WEBHOOK_ALLOWED_HOSTS == (
        "a.example",
    )


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("BATCH_SIZE", 0, "BATCH_SIZE must be an integer from 1 to 1000000, got 0"),
        ("BATCH_SIZE", "200", "BATCH_SIZE must be an integer from 1 to 1000000"),
        ("BATCH_SIZE", True, "BATCH_SIZE must be an integer from 1 to 1000000"),
        ("BATCH_SIZE", 2_000_000, "BATCH_SIZE must be an integer from 1 to 1000000"),
        ("CLAIM_CHUNK_SIZE", -1, "CLAIM_CHUNK_SIZE"),
        ("MAX_DURATION_SECONDS", 0, "MAX_DURATION_SECONDS must be a number > 0 and <= 86400, got 0"),
        ("MAX_DURATION_SECONDS", float("nan"), "MAX_DURATION_SECONDS must be a number > 0"),
        ("INTERVAL_SECONDS", float("inf"), "INTERVAL_SECONDS must be a number > 0 and <= 86400"),
        ("INTERVAL_SECONDS", 1e13, "INTERVAL_SECONDS must be a number > 0 and <= 86400"),
        ("INTERVAL_SECONDS", -5.0, "INTERVAL_SECONDS"),
        ("LEASE_GRACE_SECONDS", -1, "LEASE_GRACE_SECONDS"),
        ("JITTER_RATIO", 1.0, "JITTER_RATIO"),
        ("JITTER_RATIO", True, "JITTER_RATIO"),
        ("CLOCK", "ntp", "CLOCK"),
        ("LOCK_KEY", "", "LOCK_KEY"),
        ("LOCK_DATABASE_ALIAS", "", "LOCK_DATABASE_ALIAS"),
        ("LOCK_DATABASE_POOLED", "yes", "LOCK_DATABASE_POOLED"),
        ("ATTEMPTS_BY_TYPE", {"marketing": 0}, "ATTEMPTS_BY_TYPE"),
        ("ATTEMPTS_BY_TYPE", {"marketing": 101}, "each an integer from 1 to 100"),
        ("MAX_PAYLOAD_BYTES", 0, "MAX_PAYLOAD_BYTES must be an integer from 1024 to 16777216"),
        ("MAX_PAYLOAD_BYTES", 1 << 30, "MAX_PAYLOAD_BYTES"),
        ("MAX_PAYLOAD_DEPTH", 100_000, "MAX_PAYLOAD_DEPTH must be an integer from 1 to 256"),
        ("WORKER_THREADS", 10_000, "WORKER_THREADS"),
        ("LEASE_GRACE_SECONDS", float("nan"), "LEASE_GRACE_SECONDS"),
        ("LOCK_IDLE_SESSION_TIMEOUT_SECONDS", 10**12, "LOCK_IDLE_SESSION_TIMEOUT_SECONDS"),
        ("PROVIDERS", {"sms": 42}, "PROVIDERS"),
        ("LANES", {"bulk": {"queues": []}}, "LANES['bulk']"),
        ("LANES", [], "LANES must be a mapping"),
        ("WEBHOOK_ALLOWED_HOSTS", ("",), "WEBHOOK_ALLOWED_HOSTS"),
        ("METRICS_PORT", 70000, "METRICS_PORT"),
        ("METRICS_PORT", True, "METRICS_PORT"),
        ("HEARTBEAT_MAX_AGE_SECONDS", 0, "HEARTBEAT_MAX_AGE_SECONDS"),
        ("RETRY_AFTER_MAX_SECONDS", 0, "RETRY_AFTER_MAX_SECONDS"),
        ("RETRY_AFTER_MAX_SECONDS", -60, "RETRY_AFTER_MAX_SECONDS"),
        ("RETRY_AFTER_MAX_SECONDS", float("nan"), "RETRY_AFTER_MAX_SECONDS"),
        ("RETRY_AFTER_MAX_SECONDS", float("inf"), "RETRY_AFTER_MAX_SECONDS"),
        ("RETRY_AFTER_MAX_SECONDS", 31 * 24 * 3600, "RETRY_AFTER_MAX_SECONDS"),
        ("RETRY_AFTER_MAX_SECONDS", "3600", "RETRY_AFTER_MAX_SECONDS"),
        ("RETRY_AFTER_MAX_SECONDS", True, "RETRY_AFTER_MAX_SECONDS"),
    ],
)
def test_wrong_type_or_range_is_described(key: str, value: object, fragment: str) -> None:
    conf = dataclasses.replace(RetrySettings(), **{key: value})
    problems = settings_problems(conf)
    assert any(fragment in p for p in problems), problems


def test_valid_non_default_values_pass() -> None:
    conf = RetrySettings.from_mapping(
        {
            "BATCH_SIZE": 50,
            "JITTER_RATIO": 0,
            "LEASE_GRACE_SECONDS": 0,
            "METRICS_PORT": 9100,
            "LANES": {"bulk": {"priorities": [9]}, "urgent": {"channels": ["sms"]}},
            "ATTEMPTS_BY_TYPE": {"marketing": 3, "email:transactional": 10},
            "PROVIDERS": {"sendgrid": "myproject.providers.SendGrid"},
        }
    )
    assert settings_problems(conf) == []


@pytest.mark.parametrize(("name", "bound"), list(bounds.SETTINGS.items()))
def test_every_numeric_key_refuses_just_outside_its_bounds(name: str, bound: bounds.Bound) -> None:
    below = bound.low if bound.low_open else bound.low - (1 if bound.integer else 0.001)
    above = bound.high if bound.high_open else bound.high + (1 if bound.integer else 0.001)
    for value in (below, above):
        problems = settings_problems(dataclasses.replace(RetrySettings(), **{name: value}))
        assert [p for p in problems if p.startswith(f"{name} must be")], (name, value)
    for value in (bound.low if not bound.low_open else None, bound.high if not bound.high_open else None):
        if value is not None:
            value = int(value) if bound.integer else value
            conf = dataclasses.replace(RetrySettings(), **{name: value})
            assert settings_problems(conf) == [], (name, value)


def test_every_numeric_key_has_bounds() -> None:
    numeric = {
        f.name
        for f in dataclasses.fields(RetrySettings)
        if isinstance(getattr(RetrySettings(), f.name), int | float)
        and not isinstance(getattr(RetrySettings(), f.name), bool)
    }
    assert numeric - set(bounds.SETTINGS) == set()
