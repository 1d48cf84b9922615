"""The typed settings object: defaults, lazy reading, refusal of unknown keys and bad values."""

from __future__ import annotations

import dataclasses
import importlib
import re

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from notifications_retry.conf import (
    GROUPS,
    REMOVED_KEYS,
    CircuitBreaker,
    EndpointHealth,
    RetrySettings,
    bounds,
    get_settings,
    heartbeat_max_age,
    settings_problems,
)


def test_defaults_match_the_job_card() -> None:
    conf = RetrySettings()
    assert conf.BATCH_SIZE == 200
    assert conf.MAX_DURATION_SECONDS == 45.0
    assert conf.INTERVAL_SECONDS == 60.0
    assert conf.LOCK_KEY == "notifications:retry-worker"
    assert CircuitBreaker(failure_threshold=5, cooldown_seconds=30.0) == conf.CIRCUIT_BREAKER
    assert conf.ENDPOINT_HEALTH.disable_ratio == 0.95 and conf.ENDPOINT_HEALTH.min_attempts == 50


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
        ("MAX_DURATION_SECONDS", 0, "MAX_DURATION_SECONDS must be a number > 0 and <= 86400, got 0"),
        ("MAX_DURATION_SECONDS", float("nan"), "MAX_DURATION_SECONDS must be a number > 0"),
        ("INTERVAL_SECONDS", float("inf"), "INTERVAL_SECONDS must be a number > 0 and <= 86400"),
        ("INTERVAL_SECONDS", 1e13, "INTERVAL_SECONDS must be a number > 0 and <= 86400"),
        ("INTERVAL_SECONDS", -5.0, "INTERVAL_SECONDS"),
        ("LEASE_GRACE_SECONDS", -1, "LEASE_GRACE_SECONDS"),
        ("CLOCK", "ntp", "CLOCK"),
        ("LOCK_KEY", "", "LOCK_KEY"),
        ("LOCK_DATABASE_ALIAS", "", "LOCK_DATABASE_ALIAS"),
        ("LOCK_DATABASE_POOLED", "yes", "LOCK_DATABASE_POOLED"),
        ("ATTEMPTS_BY_TYPE", {"marketing": 0}, "ATTEMPTS_BY_TYPE"),
        ("ATTEMPTS_BY_TYPE", {"marketing": 101}, "each an integer from 1 to 100"),
        ("MAX_PAYLOAD_BYTES", 0, "MAX_PAYLOAD_BYTES must be an integer from 1024 to 16777216"),
        ("MAX_PAYLOAD_BYTES", 1 << 30, "MAX_PAYLOAD_BYTES"),
        ("MAX_PAYLOAD_DEPTH", 100_000, "MAX_PAYLOAD_DEPTH must be an integer from 1 to 256"),
        ("LEASE_GRACE_SECONDS", float("nan"), "LEASE_GRACE_SECONDS"),
        ("PROVIDERS", {"sms": 42}, "PROVIDERS"),
        ("LANES", {"bulk": {"queues": []}}, "LANES['bulk']"),
        ("LANES", [], "LANES must be a mapping"),
        ("WEBHOOK_ALLOWED_HOSTS", ("",), "WEBHOOK_ALLOWED_HOSTS"),
        ("METRICS_PORT", 70000, "METRICS_PORT"),
        ("METRICS_PORT", True, "METRICS_PORT"),
        ("CIRCUIT_BREAKER", CircuitBreaker(failure_threshold=True), "CIRCUIT_BREAKER['failure_threshold']"),
        ("ENDPOINT_HEALTH", EndpointHealth(warn_ratio=float("nan")), "ENDPOINT_HEALTH['warn_ratio']"),
        ("ENDPOINT_HEALTH", EndpointHealth(window_seconds="1d"), "ENDPOINT_HEALTH['window_seconds'] must be"),  # type: ignore[arg-type]
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
            "CIRCUIT_BREAKER": {"cooldown_seconds": 5},
            "ENDPOINT_HEALTH": {"window_seconds": 3600, "min_attempts": 1},
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


@pytest.mark.parametrize(
    ("group", "key", "bound"),
    [(group, key, bound) for group, inner in bounds.GROUPS.items() for key, bound in inner.items()],
)
def test_every_inner_key_of_a_group_refuses_just_outside_its_bounds(
    group: str, key: str, bound: bounds.Bound
) -> None:
    below = bound.low if bound.low_open else bound.low - (1 if bound.integer else 0.001)
    above = bound.high if bound.high_open else bound.high + (1 if bound.integer else 0.001)
    for value in (below, above):
        problems = settings_problems(RetrySettings.from_mapping({group: {key: value}}))
        assert [p for p in problems if p.startswith(f"{group}[{key!r}] must be")], (group, key, value)
    for value in (bound.low if not bound.low_open else None, bound.high if not bound.high_open else None):
        if value is not None:
            value = int(value) if bound.integer else value
            assert settings_problems(RetrySettings.from_mapping({group: {key: value}})) == [], (key, value)


def test_every_inner_key_has_bounds_and_every_bound_a_key() -> None:
    assert set(GROUPS) == set(bounds.GROUPS)
    for name, group in GROUPS.items():
        assert {f.name for f in dataclasses.fields(group)} == set(bounds.GROUPS[name]), name


def test_a_partial_group_merges_over_its_defaults() -> None:
    conf = RetrySettings.from_mapping({"ENDPOINT_HEALTH": {"warn_ratio": 0.5}, "CIRCUIT_BREAKER": {}})
    assert dataclasses.replace(EndpointHealth(), warn_ratio=0.5) == conf.ENDPOINT_HEALTH
    assert CircuitBreaker() == conf.CIRCUIT_BREAKER
    with override_settings(NOTIFICATIONS_RETRY={"CIRCUIT_BREAKER": {"failure_threshold": 2}}):
        assert get_settings().CIRCUIT_BREAKER.failure_threshold == 2
        assert get_settings().CIRCUIT_BREAKER.cooldown_seconds == 30.0


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (
            {"disable": 0.9},
            "NOTIFICATIONS_RETRY['ENDPOINT_HEALTH'] has unknown key(s): 'disable'; known keys: ",
        ),
        ({"HEALTH_WARN_RATIO": 0.5}, "unknown key(s): 'HEALTH_WARN_RATIO'"),
        ({1: 0.5}, "unknown key(s): 1"),
        (0.95, "NOTIFICATIONS_RETRY['ENDPOINT_HEALTH'] must be a dict with any of the keys window_seconds, "),
        (None, "must be a dict"),
    ],
)
def test_a_group_refuses_an_unknown_inner_key_or_a_value_that_is_not_a_dict(value: object, said: str) -> None:
    with pytest.raises(ImproperlyConfigured) as info:
        RetrySettings.from_mapping({"ENDPOINT_HEALTH": value})
    assert said in str(info.value)


@pytest.mark.parametrize("key", sorted(REMOVED_KEYS))
def test_a_removed_key_is_refused_naming_what_became_of_it(key: str) -> None:
    assert key not in {f.name for f in dataclasses.fields(RetrySettings)}
    with pytest.raises(ImproperlyConfigured) as info:
        RetrySettings.from_mapping({"BATCH_SIZE": 10, key: 1})
    said = str(info.value)
    assert f"{key}: {REMOVED_KEYS[key]}" in said and "removed in 0.2.0" in said
    assert "unknown" not in said


def test_removed_keys_are_named_together() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"COMMIT_THREAD: .*; CIRCUIT_COOLDOWN_SECONDS: moved to"):
        RetrySettings.from_mapping({"COMMIT_THREAD": True, "CIRCUIT_COOLDOWN_SECONDS": 5})


def test_every_constant_a_removed_key_names_exists_with_the_value_it_states() -> None:
    # "a constant now, 500 rows (engine.dispatcher.CLAIM_CHUNK_SIZE; ...)": the upgrade note stays true.
    named = {
        key: re.fullmatch(r"removed: a constant now, ([\d.]+)(?: [a-z]+)? \(([\w.]+)\.([A-Z_]+)\b.*", text)
        for key, text in REMOVED_KEYS.items()
        if "a constant now" in text
    }
    assert len(named) == 10 and all(named.values()), named
    for key, match in named.items():
        assert match is not None
        value, module, name = match.groups()
        constant = getattr(importlib.import_module(f"notifications_retry.{module}"), name)
        assert name == key and constant == float(value), (key, constant)
    moved = {key: text for key, text in REMOVED_KEYS.items() if text.startswith("moved to")}
    for key, text in moved.items():
        group, inner = re.fullmatch(r"moved to (\w+)\['(\w+)'\]", text).groups()  # type: ignore[union-attr]
        assert inner in {f.name for f in dataclasses.fields(GROUPS[group])}, key


@pytest.mark.parametrize(
    ("interval", "duration", "max_age"),
    [(60.0, 45.0, 180.0), (5.0, 4.0, 180.0), (100.0, 50.0, 250.0), (86_400.0, 86_400.0, 259_200.0)],
)
def test_the_heartbeat_age_is_two_intervals_and_a_tick_never_under_180_s(
    interval: float, duration: float, max_age: float
) -> None:
    conf = RetrySettings(INTERVAL_SECONDS=interval, MAX_DURATION_SECONDS=duration)
    assert heartbeat_max_age(conf) == max_age
    assert heartbeat_max_age(conf) > conf.INTERVAL_SECONDS  # a healthy worker never looks dead between ticks
