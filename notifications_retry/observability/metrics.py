"""Prometheus metric objects (their names are public: docs/contract.md). Nothing is served on import:
``retry_worker --metrics-port`` calls :func:`start_exporter`. A web process never imports this module:
its django-prometheus ``/metrics`` carries the queue-health gauges through
:mod:`notifications_retry.observability.queue_health`, read from the database at the scrape.

Labels are low-cardinality only (channel, outcome, error_kind, lane): never a notification or tenant id.
A labelled series exists only once created; :func:`precreate_series` creates the known ones at zero
so that ``increase()`` sees a first batch (a series first scraped at N looks like no increase at all).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server

PROCESSED = Counter(
    "notifications_retry_processed_total", "Records the worker finished, by outcome.", ["channel", "outcome"]
)
SENT = Counter("notifications_retry_sent_total", "Records delivered by the retry worker.", ["channel"])
RETRIED = Counter(
    "notifications_retry_retried_total",
    "Retriable failures scheduled for another attempt.",
    ["channel", "error_kind"],
)
TERMINAL_FAILED = Counter(
    "notifications_retry_terminal_failed_total",
    "Records that became dead letters.",
    ["channel", "error_kind"],
)
CHANNEL_DISABLED = Counter(
    "notifications_retry_channel_disabled_total",
    "Due records left waiting because their channel is disabled or misconfigured.",
    ["channel"],
)
FAILOVERS = Counter(
    "notifications_retry_failovers_total",
    "Attempts a channel's provider refused unambiguously (or could not take: circuit open, paused) and that "
    "went to its fallback channel, by whether the fallback delivered them (outcome sent / failed).",
    ["channel", "fallback", "outcome"],
)


def count_health_change(sender: Any = None, *, channel: str, state: str, **_: Any) -> None:
    """A ``channel_health_changed`` receiver: the worker connects it (a web process serves no metric)."""
    CHANNEL_HEALTH_CHANGES.labels(channel, state).inc()


#: The outcome label values of ``notifications_retry_failovers_total``.
FAILOVER_OUTCOMES = ("sent", "failed")
CHANNEL_HEALTH_CHANGES = Counter(
    "notifications_retry_channel_health_changes_total",
    "Changes of a channel's endpoint health, by the state entered (warning, disabled, ok).",
    ["channel", "state"],
)
FAILED_BACKLOG = Gauge("notifications_failed_backlog_gauge", "Failed records waiting for a retry.")
DUE_BACKLOG = Gauge("notifications_retry_due_backlog", "Records due now.")
OLDEST_DUE_AGE = Gauge("notifications_retry_oldest_due_age_seconds", "Age of the oldest due record (lag).")
CYCLE_DURATION = Histogram(
    "notifications_retry_cycle_duration_ms",
    "Duration of a tick in milliseconds.",
    ["lane"],
    buckets=(10, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 20000, 30000, 45000, 60000, 120000),
)
LAST_CYCLE_DURATION = Gauge(
    "notifications_retry_last_cycle_duration_ms",
    "Duration of the last completed tick in milliseconds.",
    ["lane"],
)
LAST_TICK_STARTED = Gauge(
    "notifications_retry_last_tick_started_timestamp_seconds",
    "Unix time this process last started a tick it owns (with the lock).",
    ["lane"],
)
LAST_TICK_COMPLETED = Gauge(
    "notifications_retry_last_tick_completed_timestamp_seconds",
    "Unix time of the last completed tick.",
    ["lane"],
)
LOCK_HELD = Gauge("notifications_retry_lock_held", "1 while this process owns the cycle's lock.", ["lane"])
CIRCUIT_STATE = Gauge(
    "notifications_retry_circuit_state",
    "Circuit breaker per channel: 0 closed, 1 half open, 2 open.",
    ["channel"],
)
CIRCUIT_STATE_VALUES = {"closed": 0, "half_open": 1, "open": 2}
TENANTS_HELD = Gauge(
    "notifications_retry_tenants_held",
    "Tenants at their TENANT_RATE_LIMITS limit on a channel, as this worker's last claim of it saw them.",
    ["channel"],
)
POISONED = Counter(
    "notifications_retry_poisoned_rows_total",
    "Due rows the claim could not read or lease, set aside (logged as item-quarantined).",
)
OUTCOME_COMMIT_DEFERRED = Counter(
    "notifications_retry_outcome_commits_deferred_total",
    "Commits of outcomes put off because the database was unreachable (the outcomes are kept).",
)
OUTBOX_UNPUBLISHED = Gauge(
    "notifications_retry_outbox_unpublished", "Outbox events not published yet (the relay's backlog)."
)
OUTBOX_OLDEST_UNPUBLISHED_AGE = Gauge(
    "notifications_retry_outbox_oldest_unpublished_age_seconds",
    "Age of the oldest outbox event not published yet (0: none waits).",
)
TASK_FAILURES = Counter(
    "notifications_retry_task_failures_total",
    "Failures of the relay and housekeeping, by task (relay: each event a publisher refused or could not "
    "take, each batch the database failed; housekeeping: each step that raised).",
    ["task"],
)

#: The outcome label values of ``notifications_retry_processed_total``.
OUTCOMES = ("sent", "retry", "terminal")

#: Error kinds the library reports itself: the worker's own terminal kinds, the built-in providers'
#: (webhook, its HTTP transport, stub) and the exceptions' defaults. Custom providers add theirs.
BUILTIN_ERROR_KINDS = (
    "attempts_exhausted",
    "attempts_invalid",
    "expired",
    "undecodable_payload",
    "payload_too_large",
    "payload_invalid",
    "http_4xx",
    "http_5xx",
    "http_unexpected",
    "throttled",
    "timeout",
    "connection",
    "transport",
    "serialization",
    "invalid_request",
    "stub_retriable",
    "stub_permanent",
    "retriable",
    "permanent",
    "provider_error",
    "provider_crash",
    "invalid_recipient",
    "cancelled",
    "dispatch_failed",
    "url_refused",
    "invalid_payload",
    "backend_config",
    "backend_error",
    "dns",
    "circuit_open",
    "not_sent",
    "recipients_refused",
    "smtp_4xx",
    "smtp_5xx",
    "smtp_config",
    "smtp_protocol",
)


def precreate_series(
    channels: Iterable[str],
    error_kinds: Iterable[str],
    lanes: Iterable[str],
    failovers: Iterable[tuple[str, str]] = (),
) -> None:
    """Create every labelled counter series of ``channels`` x ``error_kinds`` (and of ``lanes``) at zero.

    Call it at worker start, before the first tick: a counter whose series first appears already at N
    (a first batch of dead letters, the first batch after a restart) shows no ``increase()``, so
    ``NotificationsTerminalFailuresSpike`` would miss it. Existing values are left alone. Timestamp and
    duration gauges are not created: a zero there would read as "last tick in 1970"; the circuit gauge
    starts at 0 (closed), as a new breaker does. ``failovers`` are (channel, fallback) pairs: their
    ``notifications_retry_failovers_total`` series start at zero too.
    """
    kinds = list(dict.fromkeys(error_kinds))
    for channel in dict.fromkeys(channels):
        SENT.labels(channel)
        CHANNEL_DISABLED.labels(channel)
        for outcome in OUTCOMES:
            PROCESSED.labels(channel, outcome)
        for kind in kinds:
            RETRIED.labels(channel, kind)
            TERMINAL_FAILED.labels(channel, kind)
        CIRCUIT_STATE.labels(channel)
    for channel, fallback in dict.fromkeys(failovers):
        for outcome in FAILOVER_OUTCOMES:
            FAILOVERS.labels(channel, fallback, outcome)
    for lane in dict.fromkeys(lanes):
        CYCLE_DURATION.labels(lane)
        LOCK_HELD.labels(lane)


#: The address the commands' metrics endpoint listens on unless ``--metrics-addr`` names another.
EXPORTER_ADDR = "127.0.0.1"


def start_exporter(port: int, addr: str = EXPORTER_ADDR, registry: Any = REGISTRY) -> int:
    """Serve ``/metrics`` of ``registry`` on ``addr:port`` from a daemon thread; returns the bound port.

    Only the worker command calls this (never ``AppConfig.ready()``): a web process already exposes the
    same registry through django-prometheus, and two exporters in one process would fight over the port.
    """
    result = start_http_server(port, addr=addr, registry=registry)
    # prometheus_client >= 0.20 returns (server, thread); older versions return None.
    if isinstance(result, tuple):
        return int(result[0].server_port)
    return port
