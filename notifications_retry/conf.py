"""Typed, lazily read ``NOTIFICATIONS_RETRY`` settings with documented defaults.

Nothing here is read at import time: every access goes through :func:`get_settings`, so
``override_settings(NOTIFICATIONS_RETRY=...)`` reaches every value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

SETTINGS_NAME = "NOTIFICATIONS_RETRY"
#: The largest RETRY_AFTER_MAX_SECONDS accepted: 30 days (a next attempt further out is a dead letter's job).
RETRY_AFTER_MAX_SECONDS_LIMIT = 30 * 24 * 3600


@dataclasses.dataclass(frozen=True)
class RetrySettings:
    """Every key of ``NOTIFICATIONS_RETRY`` with its default (see docs/settings.md)."""

    BATCH_SIZE: int = 200
    MAX_DURATION_SECONDS: float = 45.0
    INTERVAL_SECONDS: float = 60.0
    LOCK_KEY: str = "notifications:retry-worker"
    LOCK_DATABASE_ALIAS: str = "default"
    LOCK_IDLE_SESSION_TIMEOUT_SECONDS: int = 90
    LOCK_DATABASE_POOLED: bool = False
    CLAIM_CHUNK_SIZE: int = 100
    LEASE_GRACE_SECONDS: float = 30.0
    JITTER_RATIO: float = 0.1
    CLOCK: str = "database"
    WORKER_THREADS: int = 32
    CIRCUIT_FAILURE_THRESHOLD: int = 5
    CIRCUIT_COOLDOWN_SECONDS: float = 30.0
    THROTTLE_DEFAULT_SECONDS: float = 60.0
    ATTEMPTS_BY_TYPE: Mapping[str, int] = dataclasses.field(default_factory=dict)
    LANES: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    DEAD_LETTER_RETENTION_DAYS: int = 30
    OUTBOX_RETENTION_DAYS: int = 7
    PROVIDERS: Mapping[str, str] = dataclasses.field(default_factory=dict)
    WEBHOOK_ALLOWED_HOSTS: tuple[str, ...] = ()
    RETRY_AFTER_MAX_SECONDS: float = 3600.0
    BULK_ACTION_CAP: int = 1000
    METRICS_PORT: int | None = None
    HEARTBEAT_MAX_AGE_SECONDS: float = 180.0
    # Outbox relay and housekeeping (docs/events.md).
    OUTBOX_PUBLISHER: str = "log"
    OUTBOX_PUBLISHER_OPTIONS: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    OUTBOX_RELAY_BATCH_SIZE: int = 100
    OUTBOX_RELAY_INTERVAL_SECONDS: float = 1.0
    OUTBOX_RELAY_MAX_BACKOFF_SECONDS: float = 60.0
    BACKLOG_SAMPLE_RETENTION_HOURS: int = 48

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> RetrySettings:
        """Build the settings object, refusing unknown keys so typos do not pass silently."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ImproperlyConfigured(
                f"{SETTINGS_NAME} has unknown key(s): {', '.join(unknown)}; "
                f"known keys: {', '.join(sorted(known))}"
            )
        values = dict(raw)
        if "WEBHOOK_ALLOWED_HOSTS" in values:
            hosts = values["WEBHOOK_ALLOWED_HOSTS"]
            # A bare string would be split into characters: refuse it rather than allow "e", "x"…
            if isinstance(hosts, str) or not isinstance(hosts, list | tuple | set | frozenset):
                raise ImproperlyConfigured(
                    f"{SETTINGS_NAME}['WEBHOOK_ALLOWED_HOSTS'] must be a list of host names, got {hosts!r}"
                )
            values["WEBHOOK_ALLOWED_HOSTS"] = tuple(hosts)
        return cls(**values)


def settings_problems(conf: RetrySettings) -> list[str]:
    """Describe every value of the wrong type or range; empty when all is well."""
    problems: list[str] = []
    positive_ints = (
        "BATCH_SIZE",
        "CLAIM_CHUNK_SIZE",
        "WORKER_THREADS",
        "CIRCUIT_FAILURE_THRESHOLD",
        "DEAD_LETTER_RETENTION_DAYS",
        "OUTBOX_RETENTION_DAYS",
        "BULK_ACTION_CAP",
        "LOCK_IDLE_SESSION_TIMEOUT_SECONDS",
    )
    for name in positive_ints:
        value = getattr(conf, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"{name} must be a positive integer, got {value!r}")
    positive_numbers = (
        "MAX_DURATION_SECONDS",
        "INTERVAL_SECONDS",
        "CIRCUIT_COOLDOWN_SECONDS",
        "THROTTLE_DEFAULT_SECONDS",
        "HEARTBEAT_MAX_AGE_SECONDS",
    )
    for name in positive_numbers:
        value = getattr(conf, name)
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            problems.append(f"{name} must be a positive number, got {value!r}")
    if (
        not isinstance(conf.LEASE_GRACE_SECONDS, int | float)
        or isinstance(conf.LEASE_GRACE_SECONDS, bool)
        or conf.LEASE_GRACE_SECONDS < 0
    ):
        problems.append(f"LEASE_GRACE_SECONDS must be a number >= 0, got {conf.LEASE_GRACE_SECONDS!r}")
    if (
        not isinstance(conf.JITTER_RATIO, int | float)
        or isinstance(conf.JITTER_RATIO, bool)
        or not 0 <= conf.JITTER_RATIO < 1
    ):
        problems.append(f"JITTER_RATIO must be a number in [0, 1), got {conf.JITTER_RATIO!r}")
    if conf.CLOCK not in ("database", "system"):
        problems.append(f"CLOCK must be 'database' or 'system', got {conf.CLOCK!r}")
    if not isinstance(conf.LOCK_KEY, str) or not conf.LOCK_KEY:
        problems.append(f"LOCK_KEY must be a non-empty string, got {conf.LOCK_KEY!r}")
    if not isinstance(conf.LOCK_DATABASE_ALIAS, str) or not conf.LOCK_DATABASE_ALIAS:
        problems.append(f"LOCK_DATABASE_ALIAS must be a database alias, got {conf.LOCK_DATABASE_ALIAS!r}")
    if not isinstance(conf.ATTEMPTS_BY_TYPE, Mapping) or any(
        not isinstance(k, str) or not isinstance(v, int) or isinstance(v, bool) or v < 1
        for k, v in conf.ATTEMPTS_BY_TYPE.items()
    ):
        problems.append("ATTEMPTS_BY_TYPE must map notification types to positive integers")
    if not isinstance(conf.PROVIDERS, Mapping) or any(
        not isinstance(k, str) or not isinstance(v, str) for k, v in conf.PROVIDERS.items()
    ):
        problems.append("PROVIDERS must map provider keys to dotted paths of provider classes")
    if not isinstance(conf.LANES, Mapping):
        problems.append("LANES must be a mapping of lane name to {'priorities': [...], 'channels': [...]}")
    else:
        for name, lane in conf.LANES.items():
            if not isinstance(lane, Mapping) or set(lane) - {"priorities", "channels"}:
                problems.append(f"LANES[{name!r}] must be a mapping with keys 'priorities' and/or 'channels'")
    if not isinstance(conf.LOCK_DATABASE_POOLED, bool):
        problems.append(f"LOCK_DATABASE_POOLED must be True or False, got {conf.LOCK_DATABASE_POOLED!r}")
    if not all(isinstance(host, str) and host for host in conf.WEBHOOK_ALLOWED_HOSTS):
        problems.append("WEBHOOK_ALLOWED_HOSTS must be a list of host names")
    if (
        not isinstance(conf.RETRY_AFTER_MAX_SECONDS, int | float)
        or isinstance(conf.RETRY_AFTER_MAX_SECONDS, bool)
        or not 0 < conf.RETRY_AFTER_MAX_SECONDS <= RETRY_AFTER_MAX_SECONDS_LIMIT
    ):
        problems.append(
            f"RETRY_AFTER_MAX_SECONDS must be a number in (0, {RETRY_AFTER_MAX_SECONDS_LIMIT}], "
            f"got {conf.RETRY_AFTER_MAX_SECONDS!r}"
        )
    if conf.METRICS_PORT is not None and (
        not isinstance(conf.METRICS_PORT, int)
        or isinstance(conf.METRICS_PORT, bool)
        or not 0 <= conf.METRICS_PORT <= 65535
    ):
        problems.append(f"METRICS_PORT must be a port number or None, got {conf.METRICS_PORT!r}")
    problems.extend(_outbox_problems(conf))
    return problems


def _outbox_problems(conf: RetrySettings) -> list[str]:
    problems: list[str] = []
    for name in ("OUTBOX_RELAY_BATCH_SIZE", "BACKLOG_SAMPLE_RETENTION_HOURS"):
        value = getattr(conf, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"{name} must be a positive integer, got {value!r}")
    for name in ("OUTBOX_RELAY_INTERVAL_SECONDS", "OUTBOX_RELAY_MAX_BACKOFF_SECONDS"):
        value = getattr(conf, name)
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            problems.append(f"{name} must be a positive number, got {value!r}")
    if not isinstance(conf.OUTBOX_PUBLISHER, str) or not conf.OUTBOX_PUBLISHER:
        problems.append(
            f"OUTBOX_PUBLISHER must be 'log', 'http' or a dotted path, got {conf.OUTBOX_PUBLISHER!r}"
        )
    if not isinstance(conf.OUTBOX_PUBLISHER_OPTIONS, Mapping):
        problems.append("OUTBOX_PUBLISHER_OPTIONS must be a mapping (for 'http': {'url': ...})")
    return problems


def get_settings() -> RetrySettings:
    """Read ``NOTIFICATIONS_RETRY`` now (cheap; never cached, so overrides apply)."""
    raw = getattr(django_settings, SETTINGS_NAME, {}) or {}
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured(f"{SETTINGS_NAME} must be a dict, got {type(raw).__name__}")
    return RetrySettings.from_mapping(raw)
