"""Typed, lazily read ``NOTIFICATIONS_RETRY`` settings with documented defaults.

Beside them: :mod:`.bounds` (the documented range of every numeric setting and channel field) and
:mod:`.channel_settings` (the part of a channel's configuration a provider receives). Lanes (which
channels and priorities a worker serves, and its share of each channel's limits) are read here too.

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

from notifications_retry.conf import bounds

# --------------------------------------------------------------------------------------------------
# Lanes: which channels and priorities a worker serves, and its share of each channel's limits.
#
# A lane's share of a channel's ``rate_limit_per_second`` and ``max_concurrency`` is static: set in
# ``LANES[name]["shares"][channel_key]`` (a fraction in (0, 1]), else an even split among the configured
# lanes that can send on the channel. Nothing is negotiated at run time, so an idle lane's part is not lent
# to the others: the split is the configuration's promise, easy to read and to check.
#
# The default lane (a worker started without ``--lane``) serves every channel at its whole limit, unless
# ``LANES`` names ``"default"`` too, in which case it takes its part like any other lane.
# --------------------------------------------------------------------------------------------------

DEFAULT_LANE = "default"

LaneSettings = Mapping[str, Mapping[str, Any]]


def lane_channels(lanes: LaneSettings, lane: str) -> frozenset[str] | None:
    """The channel keys ``lane`` can send on; ``None`` for every channel."""
    if lane not in lanes:
        return None
    channels = lanes[lane].get("channels")
    return frozenset(channels) if channels else None


def covers(lanes: LaneSettings, lane: str, channel_key: str) -> bool:
    """Whether ``lane`` can send on ``channel_key``."""
    keys = lane_channels(lanes, lane)
    return keys is None or channel_key in keys


def share(lanes: LaneSettings, lane: str, channel_key: str) -> float:
    """The fraction of ``channel_key``'s limits that ``lane`` may use, in (0, 1]."""
    if lane not in lanes:
        return 1.0
    shares = lanes[lane].get("shares")
    explicit = shares.get(channel_key) if isinstance(shares, Mapping) else None
    if explicit is not None:
        return float(explicit)
    sharers = sum(1 for name in lanes if covers(lanes, name, channel_key))
    return 1.0 / max(1, sharers)


def shared_limits(
    lanes: LaneSettings, lane: str, channel_key: str, *, max_concurrency: int, rate_limit: float | None
) -> tuple[int, float | None]:
    """This lane's concurrency (at least one call) and rate limit (``None``: no limit) on a channel."""
    part = share(lanes, lane, channel_key)
    concurrency = max(1, int(max_concurrency * part))
    return concurrency, (float(rate_limit) * part if rate_limit else None)


def share_problems(lanes: LaneSettings) -> list[str]:
    """What is wrong with the lanes' ``shares`` (for the settings check)."""
    problems: list[str] = []
    totals: dict[str, float] = {}
    for name, lane in lanes.items():
        shares = lane.get("shares") or {}
        if not isinstance(shares, Mapping):
            problems.append(f"LANES[{name!r}]['shares'] must map channel keys to fractions in (0, 1]")
            continue
        for key, value in shares.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
                problems.append(
                    f"LANES[{name!r}]['shares'][{key!r}] must be a fraction in (0, 1], got {value!r}"
                )
                continue
            if not covers(lanes, name, key):
                problems.append(
                    f"LANES[{name!r}]['shares'] names channel {key!r}, which the lane does not serve"
                )
    for name in lanes:
        for key in _channels_named(lanes):
            if covers(lanes, name, key):
                totals[key] = totals.get(key, 0.0) + share(lanes, name, key)
    for key, total in sorted(totals.items()):
        if total > 1.0 + 1e-9:
            problems.append(
                f"the lanes' shares of channel {key!r} add up to {total:g}, more than its whole limit"
            )
    return problems


def _channels_named(lanes: LaneSettings) -> set[str]:
    named: set[str] = set()
    for lane in lanes.values():
        named.update(lane.get("channels") or ())
        shares = lane.get("shares")
        if isinstance(shares, Mapping):
            named.update(shares)
    return named


SETTINGS_NAME = "NOTIFICATIONS_RETRY"
#: The largest RETRY_AFTER_MAX_SECONDS accepted: 30 days (a next attempt further out is a dead letter's job).
RETRY_AFTER_MAX_SECONDS_LIMIT = bounds.RETRY_AFTER_MAX_SECONDS_LIMIT


@dataclasses.dataclass(frozen=True)
class CircuitBreaker:
    """``CIRCUIT_BREAKER``: when a failing channel's rows wait, and for how long (docs/settings.md)."""

    #: Consecutive retriable failures of one channel that open its circuit.
    failure_threshold: int = 5
    #: How long an open circuit stays open before one trial call is let through.
    cooldown_seconds: float = 30.0


@dataclasses.dataclass(frozen=True)
class EndpointHealth:
    """``ENDPOINT_HEALTH``: when a channel's share of failed calls warns or disables it
    (docs/operations.md#endpoint-health argues the defaults)."""

    #: The sliding window of the failure ratio, kept in 24 buckets.
    window_seconds: int = 86_400
    #: Share of failed calls (with at least ``min_attempts``) that puts a channel in ``warning``.
    warn_ratio: float = 0.8
    #: Share of failed calls (with at least ``min_attempts``) that disables a channel.
    disable_ratio: float = 0.95
    #: Calls the window must hold before its ratio warns or disables.
    min_attempts: int = 50
    #: After an automatic disable, the admin's re-enable is refused for this long.
    reenable_cooldown_seconds: int = 3600


#: The keys whose value is a group of settings tuned together: a dict that merges over the defaults.
GROUPS: dict[str, type[CircuitBreaker] | type[EndpointHealth]] = {
    "CIRCUIT_BREAKER": CircuitBreaker,
    "ENDPOINT_HEALTH": EndpointHealth,
}

_CONSTANT = "removed: a constant now, {value} ({where})"
_MOVED = "moved to {group}[{key!r}]"
#: Keys 0.2.0 removed, and what became of each. Before 1.0 there are no aliases: naming one is refused
#: (check E001) with this, so that no project runs on a value that is silently ignored.
REMOVED_KEYS: dict[str, str] = {
    "COMMIT_THREAD": "removed: outcomes are always committed beside the claims, as a task of the worker's "
    "send loop (the name was older than the send loop)",
    "CLAIM_THREAD": "removed: on a backlog of inline rows a second claim is always under way beside the "
    "first (the name was older than the send loop)",
    "WORKER_THREADS": "removed: derived, synchronous providers get up to WORKER_MAX_IN_FLIGHT threads, "
    "each channel's max_concurrency bounding its own calls",
    "CLAIM_CHUNK_SIZE": _CONSTANT.format(value="500 rows", where="engine.dispatcher.CLAIM_CHUNK_SIZE"),
    "JITTER_RATIO": _CONSTANT.format(value="0.1", where="rules.backoff.JITTER_RATIO"),
    "BULK_ACTION_CAP": _CONSTANT.format(value="1000 rows", where="admin.triage_actions.BULK_ACTION_CAP"),
    "OUTBOX_RELAY_BATCH_SIZE": _CONSTANT.format(
        value="100 events", where="outbox.relay.OUTBOX_RELAY_BATCH_SIZE; outbox_relay --batch-size"
    ),
    "OUTBOX_RELAY_INTERVAL_SECONDS": _CONSTANT.format(
        value="1 s", where="outbox.relay.OUTBOX_RELAY_INTERVAL_SECONDS; outbox_relay --interval"
    ),
    "OUTBOX_RELAY_MAX_BACKOFF_SECONDS": _CONSTANT.format(
        value="60 s", where="outbox.relay.OUTBOX_RELAY_MAX_BACKOFF_SECONDS"
    ),
    "BACKLOG_SAMPLE_RETENTION_HOURS": _CONSTANT.format(
        value="48 h",
        where="housekeeping.BACKLOG_SAMPLE_RETENTION_HOURS; notifications_housekeeping --sample-hours",
    ),
    "THROTTLE_DEFAULT_SECONDS": _CONSTANT.format(
        value="60 s", where="engine.flow_control.THROTTLE_DEFAULT_SECONDS"
    ),
    "LOCK_IDLE_SESSION_TIMEOUT_SECONDS": _CONSTANT.format(
        value="90 s", where="database.locks.LOCK_IDLE_SESSION_TIMEOUT_SECONDS"
    ),
    "TRANSACTION_TIMEOUT_SECONDS": _CONSTANT.format(
        value="30 s", where="delivery.session.TRANSACTION_TIMEOUT_SECONDS"
    ),
    "HEARTBEAT_MAX_AGE_SECONDS": "removed: derived, max(180, 2 * INTERVAL_SECONDS + MAX_DURATION_SECONDS) "
    "(conf.heartbeat_max_age; retry_worker --check --max-age still overrides it)",
    "CIRCUIT_FAILURE_THRESHOLD": _MOVED.format(group="CIRCUIT_BREAKER", key="failure_threshold"),
    "CIRCUIT_COOLDOWN_SECONDS": _MOVED.format(group="CIRCUIT_BREAKER", key="cooldown_seconds"),
    "HEALTH_WINDOW_SECONDS": _MOVED.format(group="ENDPOINT_HEALTH", key="window_seconds"),
    "HEALTH_WARN_RATIO": _MOVED.format(group="ENDPOINT_HEALTH", key="warn_ratio"),
    "HEALTH_DISABLE_RATIO": _MOVED.format(group="ENDPOINT_HEALTH", key="disable_ratio"),
    "HEALTH_MIN_ATTEMPTS": _MOVED.format(group="ENDPOINT_HEALTH", key="min_attempts"),
    "HEALTH_REENABLE_COOLDOWN_SECONDS": _MOVED.format(
        group="ENDPOINT_HEALTH", key="reenable_cooldown_seconds"
    ),
}


@dataclasses.dataclass(frozen=True)
class RetrySettings:
    """Every key of ``NOTIFICATIONS_RETRY`` with its default (docs/settings.md); the keys are public
    (docs/contract.md)."""

    BATCH_SIZE: int = 200
    MAX_DURATION_SECONDS: float = 45.0
    INTERVAL_SECONDS: float = 60.0
    LOCK_KEY: str = "notifications:retry-worker"
    LOCK_DATABASE_ALIAS: str = "default"
    LOCK_DATABASE_POOLED: bool = False
    LEASE_GRACE_SECONDS: float = 30.0
    CLOCK: str = "database"
    # A call holds its place until its outcome is committed (engine.flow_control): about a batch delay and a
    # commit after it ends. Room for a channel at max_concurrency 128 and its outcomes in that window.
    WORKER_MAX_IN_FLIGHT: int = 512
    PARTITIONS: int = 1
    CIRCUIT_BREAKER: CircuitBreaker = dataclasses.field(default_factory=lambda: CircuitBreaker())
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
    METRICS_PORT: int | None = None
    # Outbox relay and housekeeping (docs/events.md).
    OUTBOX_PUBLISHER: str = "log"
    OUTBOX_PUBLISHER_OPTIONS: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Suppression reason -> days a suppression lasts after its last report; a reason not named never
    # expires (docs/suppression.md).
    SUPPRESSION_RETENTION_DAYS: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # Endpoint health (docs/operations.md#endpoint-health): the defaults are argued there.
    ENDPOINT_HEALTH: EndpointHealth = dataclasses.field(default_factory=lambda: EndpointHealth())
    # What the public API accepts (docs/settings.md#what-the-api-accepts).
    MAX_PAYLOAD_BYTES: int = bounds.DEFAULT_MAX_PAYLOAD_BYTES
    MAX_PAYLOAD_DEPTH: int = bounds.DEFAULT_MAX_PAYLOAD_DEPTH

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> RetrySettings:
        """Build the settings object, refusing unknown keys so typos do not pass silently, and removed
        keys naming what became of each; a group's dict merges over its defaults."""
        removed = [key for key in raw if key in REMOVED_KEYS]
        if removed:
            raise ImproperlyConfigured(
                f"{SETTINGS_NAME} has key(s) removed in 0.2.0 (docs/upgrading.md): "
                + "; ".join(f"{key}: {REMOVED_KEYS[key]}" for key in removed)
            )
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
        for name, group in GROUPS.items():
            if name in values:
                values[name] = _group(name, group, values[name])
        return cls(**values)


def _group(name: str, group: type[CircuitBreaker] | type[EndpointHealth], value: object) -> Any:
    """A group's dict over its defaults: the keys it names replace theirs, an unknown key is refused."""
    if isinstance(value, group):
        return value
    inner = [f.name for f in dataclasses.fields(group)]
    if not isinstance(value, Mapping):
        raise ImproperlyConfigured(
            f"{SETTINGS_NAME}['{name}'] must be a dict with any of the keys {', '.join(inner)}, got {value!r}"
        )
    unknown = [key for key in value if key not in inner]
    if unknown:
        raise ImproperlyConfigured(
            f"{SETTINGS_NAME}['{name}'] has unknown key(s): {', '.join(map(repr, unknown))}; "
            f"known keys: {', '.join(inner)}"
        )
    return group(**value)


def heartbeat_max_age(conf: RetrySettings) -> float:
    """Seconds after which a lane's last completed tick is too old: its worker is reported unhealthy
    (``retry_worker --check``, the admin dashboard). Two intervals and a tick's longest run, so a
    worker that missed one tick is not yet called dead; never under 180 s, so a short interval does not
    turn a pause (a slow database, a garbage collection, a deploy) into a restart."""
    return max(HEARTBEAT_MAX_AGE_FLOOR_SECONDS, 2 * conf.INTERVAL_SECONDS + conf.MAX_DURATION_SECONDS)


#: The least :func:`heartbeat_max_age`: three intervals of the default 60 s, the alert's window too.
HEARTBEAT_MAX_AGE_FLOOR_SECONDS = 180.0


def settings_problems(conf: RetrySettings) -> list[str]:
    """Describe every value of the wrong type or range; empty when all is well."""
    problems: list[str] = []
    # Every numeric key has a documented range (bounds.SETTINGS): NaN, infinity and absurd values that
    # would overflow an interval or a timer are refused like a wrong type.
    for name, bound in bounds.SETTINGS.items():
        problem = bound.problem(name, getattr(conf, name))
        if problem:
            problems.append(problem)
    for group, inner in bounds.GROUPS.items():
        values = getattr(conf, group)
        for key, bound in inner.items():
            problem = bound.problem(f"{group}[{key!r}]", getattr(values, key))
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
