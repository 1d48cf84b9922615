"""Endpoint health, written with the outcomes: window counts, automatic state changes, re-enabling.

:func:`record` runs inside finalize's transaction: it adds the batch's provider calls to each
channel's current bucket (one upsert), then sums the window of each channel the batch called and
applies what :func:`notifications_retry.rules.endpoint_health.assess` says. A change updates the channel
(``disabled`` also sets ``is_enabled`` False: its rows wait, untouched), records a
:class:`~notifications_retry.models.ChannelHealthChange` and inserts a
``pin.notifications.channel-health.v1`` outbox event, all in that transaction; the log event, the
metric and the ``channel_health_changed`` signal follow its commit. Its statements are
:func:`window_steps`, so that a commit on the send loop's connection runs them too; a change is
written through Django's ORM (that rare batch is committed on Django's connection). The sums read each
called channel's row: the commit also tells which of them are disabled now (by this change, another
worker's or an operator's), and the worker stops calling those at once (engine.dispatcher).

:func:`reenable` is the operator's way back (the admin's action): audited, refused during the
cooldown after an automatic disable, and it starts the window afresh. :func:`prune_buckets` deletes the
buckets that slid out of the window (housekeeping runs it): the table stays one window's worth.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import structlog
from django.db import transaction

from notifications_retry.conf import get_settings
from notifications_retry.delivery.session import Statement, Steps, json_document, run_steps
from notifications_retry.exceptions import InvalidTransition
from notifications_retry.models import (
    CHANNEL_HEALTH_TOPIC,
    CONTRACT_VERSION,
    ChannelConfig,
    ChannelHealthBucket,
    ChannelHealthChange,
    Outbox,
)
from notifications_retry.rules import endpoint_health as endpoint_health
from notifications_retry.rules.endpoint_health import DISABLED, OK, Thresholds, Transition, Window
from notifications_retry.rules.outcomes import SENT, THROTTLED, Outcome
from notifications_retry.signals import channel_health_changed

log = structlog.get_logger("notifications_retry.health")

_CHANNEL = ChannelConfig._meta.db_table
_BUCKET = ChannelHealthBucket._meta.db_table

# Channel ids in ascending order: two finalizes that share channels lock their buckets in one order.
_UPSERT = f"""
INSERT INTO {_BUCKET} (channel_id, bucket_start, attempts, failures)
SELECT v.channel_id, %(start)s, v.attempts, v.failures
FROM jsonb_to_recordset(%(rows)s::jsonb) AS v(channel_id bigint, attempts int, failures int)
ORDER BY v.channel_id
ON CONFLICT (channel_id, bucket_start) DO UPDATE
SET attempts = {_BUCKET}.attempts + EXCLUDED.attempts, failures = {_BUCKET}.failures + EXCLUDED.failures
"""

# A disabled channel's buckets are not summed (it is not judged), but its row is read: is_enabled.
_WINDOW = f"""
SELECT c.id, c.health_state, c.is_enabled, COALESCE(sum(b.attempts), 0), COALESCE(sum(b.failures), 0)
FROM {_CHANNEL} c
LEFT JOIN {_BUCKET} b ON b.channel_id = c.id AND c.health_state <> 'disabled'
     AND b.bucket_start >= GREATEST(%(since)s, COALESCE(c.health_window_start, %(since)s))
WHERE c.id = ANY(%(ids)s)
GROUP BY c.id
"""


def counted(o: Outcome) -> bool:
    """Whether an outcome is a call endpoint health counts. Throttling (429) is not: the endpoint is up
    and asks to slow down, which the rate limit and the circuit handle. A failover's delivery is left
    out: the answer was the fallback's. No evidence: no provider was called."""
    return not (o.evidence is None or o.delivered_by or (o.result != SENT and o.error_kind == THROTTLED))


def disables_at_once(o: Outcome) -> bool:
    """Whether this outcome alone disables its channel once committed (a counted call answered 410
    Gone): the worker stops calling the channel as soon as it has the outcome, before the commit."""
    return (
        o.result != SENT
        and o.evidence is not None
        and counted(o)
        and endpoint_health.gone(o.evidence.status_code)
    )


@dataclasses.dataclass(slots=True)
class _Calls:
    """A batch's counted calls of one channel (see
    :class:`~notifications_retry.rules.endpoint_health.Window`)."""

    attempts: int = 0
    failures: int = 0
    gone: bool = False
    circuit_open_for: float = 0.0


def _counts(outcomes: Sequence[Outcome]) -> dict[int, _Calls]:
    """Per channel: counted calls, failed ones, whether one answered 410, and the longest its circuit
    had been open at a failed probe."""
    counts: dict[int, _Calls] = {}
    for o in outcomes:
        if not counted(o):
            continue
        calls = counts.setdefault(o.record.channel_id, _Calls())
        calls.attempts += 1
        if o.result != SENT:
            calls.failures += 1
            calls.gone = calls.gone or disables_at_once(o)
            calls.circuit_open_for = max(calls.circuit_open_for, o.circuit_open_for or 0.0)
    return counts


@dataclasses.dataclass(frozen=True, slots=True)
class HealthChange:
    """A change the window calls for: ``channel_id`` from ``expected`` by ``transition``."""

    channel_id: int
    expected: str
    transition: Transition
    window: Window


@dataclasses.dataclass(frozen=True, slots=True)
class Judged:
    """What :func:`window_steps` found: the changes to apply, and the called channels found disabled
    (``is_enabled`` False: by their health check or by an operator), by id."""

    changes: list[HealthChange]
    disabled: list[int]


def record(cursor: Any, outcomes: Sequence[Outcome], now: datetime) -> list[int]:
    """Add ``outcomes``' provider calls to the health window, then apply any change (caller's
    transaction); returns the called channels disabled now (found so, or by this change), by id."""
    judged = run_steps(window_steps(outcomes, now), cursor)
    disabled = list(judged.disabled)
    for found in judged.changes:
        entry = change(found.channel_id, found.expected, found.transition, now, window=found.window)
        if entry is not None and entry.state == DISABLED:
            disabled.append(found.channel_id)
    return disabled


def window_steps(outcomes: Sequence[Outcome], now: datetime) -> Steps[Judged]:
    """The statements that add the calls to their buckets and sum the windows (delivery.session);
    returns the changes to apply (:func:`change` writes them through Django's ORM) and the called
    channels found disabled."""
    counts = _counts(outcomes)
    if not counts:
        return Judged([], [])
    limits = Thresholds.of(get_settings())
    rows = [
        {"channel_id": c, "attempts": n.attempts, "failures": n.failures} for c, n in sorted(counts.items())
    ]
    start = endpoint_health.bucket_start(now, limits)
    yield Statement(_UPSERT, {"rows": json_document(rows), "start": start}, rows=False)
    since = now - timedelta(seconds=limits.window_seconds)
    # Every channel the batch called, not only those that failed in it: a batch of successes can bring
    # a window of earlier failures to its min_attempts, and the share is then judged, as documented.
    # The sum reads at most one window's buckets a channel, in the round trip the batch makes anyway.
    sums = yield Statement(_WINDOW, {"since": since, "ids": list(counts)})
    changes: list[HealthChange] = []
    disabled: list[int] = []
    for cid, state, enabled, attempts, failures in sums:
        if not enabled:
            disabled.append(cid)
        calls = counts[cid]
        window = Window(int(attempts), int(failures), calls.gone, calls.circuit_open_for)
        transition = endpoint_health.assess(state, window, limits)
        if transition is not None:
            changes.append(HealthChange(cid, state, transition, window))
    return Judged(changes, disabled)


def prune_buckets(*, now: datetime) -> int:
    """Delete the buckets wholly before the health window (``ENDPOINT_HEALTH["window_seconds"]``): no sum
    reads them."""
    limits = Thresholds.of(get_settings())
    since = endpoint_health.bucket_start(now - timedelta(seconds=limits.window_seconds), limits)
    deleted, _ = ChannelHealthBucket.objects.filter(bucket_start__lt=since).delete()
    return deleted


def change(
    channel_id: int,
    expected: str,
    transition: Transition,
    now: datetime,
    *,
    actor: str = "system",
    window: Window | None = None,
) -> ChannelHealthChange | None:
    """Move a channel from ``expected`` to ``transition.state`` (caller's transaction); None if another
    writer changed it first (the UPDATE is conditional, so two workers never announce one change twice)."""
    fields: dict[str, Any] = {
        "health_state": transition.state,
        "health_reason": transition.reason,
        "health_changed_at": now,
        "updated_at": now,
    }
    if transition.state == DISABLED:
        fields["is_enabled"] = False  # the rows wait, as a disabled channel's always do
    elif actor != "system":
        # An operator's re-enable: the window starts afresh.
        fields.update(is_enabled=True, health_window_start=now)
    if not ChannelConfig.objects.filter(pk=channel_id, health_state=expected).update(**fields):
        return None
    channel = ChannelConfig.objects.only("key", "health_changes").get(pk=channel_id)
    generation = channel.health_changes + 1
    ChannelConfig.objects.filter(pk=channel_id).update(health_changes=generation)
    entry = ChannelHealthChange.objects.create(
        channel_id=channel_id,
        state=transition.state,
        previous_state=expected,
        reason=transition.reason,
        actor=actor,
        attempts=window.attempts if window else None,
        failure_ratio=round(window.ratio, 4) if window else None,
        created_at=now,
    )
    Outbox(
        topic=CHANNEL_HEALTH_TOPIC,
        key=channel.key,
        contract_version=CONTRACT_VERSION,
        generation=generation,
        payload=health_payload(channel.key, entry),
        created_at=now,
    ).save()
    transaction.on_commit(lambda: announce(channel.key, entry))
    return entry


def health_payload(key: str, entry: ChannelHealthChange) -> dict[str, Any]:
    """The event body (schema: ``schemas/channel_health.v1.json``)."""
    return {
        "channel": key,
        "state": entry.state,
        "previous_state": entry.previous_state,
        "reason": entry.reason,
        "actor": entry.actor,
        "attempts": entry.attempts,
        "failure_ratio": entry.failure_ratio,
        "occurred_at": entry.created_at.isoformat(),
        "contract_version": CONTRACT_VERSION,
    }


def announce(key: str, entry: ChannelHealthChange) -> None:
    """After the commit: the log event and the operator's signal (the worker counts it in its metrics)."""
    level = log.info if entry.state == OK else log.warning
    level(
        "channel-health-changed",
        channel=key,
        state=entry.state,
        previous_state=entry.previous_state,
        reason=entry.reason,
        actor=entry.actor,
        attempts=entry.attempts,
        failure_ratio=entry.failure_ratio,
    )
    channel_health_changed.send(
        sender=ChannelConfig,
        channel=key,
        state=entry.state,
        previous_state=entry.previous_state,
        reason=entry.reason,
        actor=entry.actor,
        attempts=entry.attempts,
        failure_ratio=entry.failure_ratio,
        occurred_at=entry.created_at,
    )


class HealthCooldown(InvalidTransition):
    """A re-enable asked for during the cooldown after an automatic disable."""


def reenable(channel_id: int, *, actor: str, reason: str = "", now: datetime) -> ChannelHealthChange:
    """Re-enable a channel the health check disabled: audited, not before the cooldown has passed.

    The window starts afresh, so the failures that disabled it no longer count: disabling it again
    takes ``ENDPOINT_HEALTH["min_attempts"]`` new calls failing past the ratio (or another 410).
    """
    limits = Thresholds.of(get_settings())
    with transaction.atomic():
        channel = ChannelConfig.objects.select_for_update().get(pk=channel_id)
        if channel.health_state != DISABLED:
            raise InvalidTransition(f"channel {channel.key} was not disabled by its health check")
        wait = endpoint_health.reenable_wait(channel.health_changed_at, now, limits)
        if wait > 0:
            raise HealthCooldown(
                f"channel {channel.key} was disabled automatically at {channel.health_changed_at:%H:%M:%S} "
                f"UTC; it may be re-enabled in {int(wait // 60)} min {int(wait % 60)} s "
                "(ENDPOINT_HEALTH['reenable_cooldown_seconds'])"
            )
        text = f"re-enabled by {actor}" + (f": {reason}" if reason else "")
        entry = change(channel.pk, DISABLED, Transition(OK, text), now, actor=actor)
        assert entry is not None  # the row is locked: no one else can have changed it
        return entry
