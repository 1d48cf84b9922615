"""Typed, lazily read ``NOTIFICATIONS_RETRY`` settings with documented defaults.

Nothing here is read at import time: every access goes through :func:`get_settings`, so
``override_settings(NOTIFICATIONS_RETRY=...)`` reaches every value.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from notifications_retry import bounds
from notifications_retry.lanes import share_problems

SETTINGS_NAME = "NOTIFICATIONS_RETRY"
#: The largest RETRY_AFTER_MAX_SECONDS accepted: 30 days (a next attempt further out is a dead letter's job).
RETRY_AFTER_MAX_SECONDS_LIMIT = bounds.RETRY_AFTER_MAX_SECONDS_LIMIT


@dataclasses.dataclass(frozen=True)
class RetrySettings:
    """Every key of ``NOTIFICATIONS_RETRY`` with its default (docs/settings.md); the keys are public
    (docs/contract.md)."""

    BATCH_SIZE: int = 200
    MAX_DURATION_SECONDS: float = 45.0
    INTERVAL_SECONDS: float = 60.0
    LOCK_KEY: str = "notifications:retry-worker"
    LOCK_DATABASE_ALIAS: str = "default"
    LOCK_IDLE_SESSION_TIMEOUT_SECONDS: int = 90
    LOCK_DATABASE_POOLED: bool = False
    CLAIM_CHUNK_SIZE: int = 500
    LEASE_GRACE_SECONDS: float = 30.0
    TRANSACTION_TIMEOUT_SECONDS: float = 30.0
    JITTER_RATIO: float = 0.1
    CLOCK: str = "database"
    WORKER_THREADS: int = 32
    # A call holds its place until its outcome is committed (engine.in_flight): about a batch delay and a
    # commit after it ends. Room for a channel at max_concurrency 128 and its outcomes in that window.
    WORKER_MAX_IN_FLIGHT: int = 512
    PARTITIONS: int = 1
    COMMIT_THREAD: bool = True
    CLAIM_THREAD: bool = True
    CIRCUIT_FAILURE_THRESHOLD: int = 5
    CIRCUIT_COOLDOWN_SECONDS: float = 30.0
    THROTTLE_DEFAULT_SECONDS: float = 60.0
    ATTEMPTS_BY_TYPE: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # Tenant id (or "*": every other tenant, the null one included) -> sends a second on each channel
    # (None for a named tenant: no limit).
    TENANT_RATE_LIMITS: Mapping[str, float | None] = dataclasses.field(default_factory=dict)
    LANES: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    DEAD_LETTER_RETENTION_DAYS: int = 30
    OUTBOX_RETENTION_DAYS: int = 7
    # Off (None): Sent rows are kept, as in-app rows may be the monolith's inbox (docs/settings.md).
    SENT_RETENTION_DAYS: int | None = None
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
    # Suppression reason -> days a suppression lasts after its last report; a reason not named never
    # expires (docs/suppression.md).
    SUPPRESSION_RETENTION_DAYS: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # Endpoint health (docs/operations.md#endpoint-health): the defaults are argued there.
    HEALTH_WINDOW_SECONDS: int = 86_400
    HEALTH_WARN_RATIO: float = 0.8
    HEALTH_DISABLE_RATIO: float = 0.95
    HEALTH_MIN_ATTEMPTS: int = 50
    HEALTH_REENABLE_COOLDOWN_SECONDS: int = 3600
    # What the public API accepts (docs/settings.md#what-the-api-accepts).
    MAX_PAYLOAD_BYTES: int = bounds.DEFAULT_MAX_PAYLOAD_BYTES
    MAX_PAYLOAD_DEPTH: int = bounds.DEFAULT_MAX_PAYLOAD_DEPTH

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
    # Every numeric key has a documented range (bounds.SETTINGS): NaN, infinity and absurd values that
    # would overflow an interval or a timer are refused like a wrong type.
    for name, bound in bounds.SETTINGS.items():
        problem = bound.problem(name, getattr(conf, name))
        if problem:
            problems.append(problem)
    if conf.CLOCK not in ("database", "system"):
        problems.append(f"CLOCK must be 'database' or 'system', got {conf.CLOCK!r}")
    if not isinstance(conf.LOCK_KEY, str) or not conf.LOCK_KEY:
        problems.append(f"LOCK_KEY must be a non-empty string, got {conf.LOCK_KEY!r}")
    if not isinstance(conf.LOCK_DATABASE_ALIAS, str) or not conf.LOCK_DATABASE_ALIAS:
        problems.append(f"LOCK_DATABASE_ALIAS must be a database alias, got {conf.LOCK_DATABASE_ALIAS!r}")
    if not isinstance(conf.ATTEMPTS_BY_TYPE, Mapping) or any(
        not isinstance(k, str) or not bounds.ATTEMPTS_BY_TYPE_VALUE.contains(v)
        for k, v in conf.ATTEMPTS_BY_TYPE.items()
    ):
        problems.append(
            "ATTEMPTS_BY_TYPE must map notification types to attempt budgets, each "
            f"{bounds.ATTEMPTS_BY_TYPE_VALUE.describe()}"
        )
    if not isinstance(conf.PROVIDERS, Mapping) or any(
        not isinstance(k, str) or not isinstance(v, str) for k, v in conf.PROVIDERS.items()
    ):
        problems.append("PROVIDERS must map provider keys to dotted paths of provider classes")
    if not isinstance(conf.LANES, Mapping):
        problems.append("LANES must be a mapping of lane name to {'priorities': [...], 'channels': [...]}")
    else:
        for name, lane in conf.LANES.items():
            if not isinstance(lane, Mapping) or set(lane) - {"priorities", "channels", "shares"}:
                problems.append(
                    f"LANES[{name!r}] must be a mapping with keys 'priorities', 'channels' and/or 'shares'"
                )
                return problems
        problems.extend(share_problems(conf.LANES))
    for name in ("COMMIT_THREAD", "CLAIM_THREAD"):
        if not isinstance(getattr(conf, name), bool):
            problems.append(f"{name} must be True or False, got {getattr(conf, name)!r}")
    if not isinstance(conf.LOCK_DATABASE_POOLED, bool):
        problems.append(f"LOCK_DATABASE_POOLED must be True or False, got {conf.LOCK_DATABASE_POOLED!r}")
    if not all(isinstance(host, str) and host for host in conf.WEBHOOK_ALLOWED_HOSTS):
        problems.append("WEBHOOK_ALLOWED_HOSTS must be a list of host names")
    if conf.METRICS_PORT is not None and not bounds.METRICS_PORT.contains(conf.METRICS_PORT):
        problems.append(f"METRICS_PORT must be a port number (0 to 65535) or None, got {conf.METRICS_PORT!r}")
    if conf.SENT_RETENTION_DAYS is not None:
        problem = bounds.SENT_RETENTION_DAYS.problem("SENT_RETENTION_DAYS", conf.SENT_RETENTION_DAYS)
        if problem:
            problems.append(f"{problem} (or None: Sent rows are kept)")
    problems.extend(_outbox_problems(conf))
    problems.extend(_suppression_problems(conf))
    problems.extend(_tenant_limit_problems(conf))
    return problems


#: The largest per-tenant rate accepted (sends a second): beyond it a limit limits nothing.
TENANT_RATE_LIMIT_MAX = 1_000_000.0


def tenant_rate_limits(conf: RetrySettings) -> tuple[float | None, dict[uuid.UUID, float | None]]:
    """``TENANT_RATE_LIMITS`` read: the limit of every tenant not named (``"*"``; None: no limit) and
    the named tenants' own (None: that tenant has no limit). Call only on settings
    :func:`settings_problems` accepts."""
    named = {
        uuid.UUID(str(k)): (float(v) if v is not None else None)
        for k, v in conf.TENANT_RATE_LIMITS.items()
        if k != "*"
    }
    default = conf.TENANT_RATE_LIMITS.get("*")
    return (float(default) if default is not None else None), named


def _tenant_limit_problems(conf: RetrySettings) -> list[str]:
    limits = conf.TENANT_RATE_LIMITS
    if not isinstance(limits, Mapping):
        return [f"TENANT_RATE_LIMITS must map tenant ids (or '*') to sends a second, got {limits!r}"]
    problems = []
    seen: set[uuid.UUID] = set()
    for key, rate in limits.items():
        if key != "*":
            try:
                tenant = uuid.UUID(str(key))
            except ValueError:
                problems.append(
                    f"TENANT_RATE_LIMITS names {key!r}, which is neither a tenant id (a UUID) nor '*'"
                )
                continue
            if tenant in seen:
                problems.append(f"TENANT_RATE_LIMITS names tenant {tenant} twice (as {key!r})")
            seen.add(tenant)
        if rate is None and key != "*":
            continue  # a named tenant without a limit, beside a default that limits the others
        if (
            isinstance(rate, bool)
            or not isinstance(rate, int | float)
            or not 0 < rate <= TENANT_RATE_LIMIT_MAX  # NaN fails this too
        ):
            problems.append(
                f"TENANT_RATE_LIMITS[{key!r}] must be sends a second above 0 and at most "
                f"{TENANT_RATE_LIMIT_MAX:g}, got {rate!r}"
            )
    return problems


SUPPRESSION_REASONS = ("hard_bounce", "complaint", "unsubscribed", "manual", "invalid_recipient")


def _suppression_problems(conf: RetrySettings) -> list[str]:
    retention = conf.SUPPRESSION_RETENTION_DAYS
    if not isinstance(retention, Mapping):
        return [f"SUPPRESSION_RETENTION_DAYS must map suppression reasons to days, got {retention!r}"]
    problems = []
    for reason, days in retention.items():
        if reason not in SUPPRESSION_REASONS:
            problems.append(
                f"SUPPRESSION_RETENTION_DAYS names {reason!r}; reasons are {', '.join(SUPPRESSION_REASONS)}"
            )
        elif isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= 36_500:
            problems.append(
                f"SUPPRESSION_RETENTION_DAYS[{reason!r}] must be whole days from 1 to 36500, got {days!r}"
            )
    return problems


def _outbox_problems(conf: RetrySettings) -> list[str]:
    problems: list[str] = []
    if not isinstance(conf.OUTBOX_PUBLISHER, str) or not conf.OUTBOX_PUBLISHER:
        problems.append(
            "OUTBOX_PUBLISHER must be 'log', 'http', 'rabbitmq', 'nats' or a dotted path, "
            f"got {conf.OUTBOX_PUBLISHER!r}"
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
