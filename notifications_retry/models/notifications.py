"""Notifications: one row per notification, the retry checkpoint."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MaxLengthValidator
from django.db import connections, models
from django.db.models import Count, DateTimeField, Min, Q, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from notifications_retry.conf import bounds
from notifications_retry.database.triggers import notification_triggers
from notifications_retry.inputs.validation import reject_invalid_payload, reject_unstorable_text
from notifications_retry.rules.outcomes import CANCELLED

from .channels import ChannelConfig, check_constraint

#: ``error_kind`` of a notification the application cancelled (``api.cancel_notification``).
CANCELLED_ERROR_KIND = CANCELLED  # one name for the error kind of a cancel (rules/outcomes.py)

#: The earliest time read back: PostgreSQL stores times Python cannot hold (``-infinity``, a year before
#: 1, written by raw SQL), and reading one would fail every tick's statistics and so the heartbeat.
EARLIEST_READABLE = datetime(1, 1, 2, tzinfo=UTC)


def oldest(field: str) -> Greatest:
    """``Min(field)``, read no earlier than :data:`EARLIEST_READABLE` (a bound, not NULL, over no rows:
    the callers look at the count first)."""
    return Greatest(Min(field), Value(EARLIEST_READABLE, output_field=DateTimeField()))


def age_seconds(now: datetime, since: datetime | None) -> float:
    """Seconds from ``since`` to ``now``, never below 0; 0 when there is nothing (``since`` None)."""
    return max(0.0, (now - since).total_seconds()) if since else 0.0


@dataclasses.dataclass(frozen=True)
class StatusRow:
    """One (status, channel) group: how many rows and how old the oldest is."""

    status: str
    channel: str
    count: int
    oldest_age_seconds: float


@dataclasses.dataclass(frozen=True)
class Backlog:
    """What is waiting for the worker now."""

    due: int
    failed_backlog: int
    dead_letters_unresolved: int
    oldest_due_age_seconds: float


class NotificationQuerySet(models.QuerySet["NotificationEntity"]):
    def due(self, now: Any) -> NotificationQuerySet:
        """Rows the worker may claim at ``now`` (the trigger-maintained ``due_at`` says when). A lease
        that lapsed counts once the next claim gave it back (``claim_expires_at`` cleared)."""
        return self.filter(due_at__lte=now)

    def lapsed(self, now: Any) -> NotificationQuerySet:
        """Leased rows past their lease's expiry (their worker died) that no claim gave back yet: due
        too, from their expiry (``nr_lease_expiry_idx``)."""
        return self.filter(claim_expires_at__lte=now)

    def dead_letters(self) -> NotificationQuerySet:
        """Terminal failures, resolved or not."""
        return self.filter(dead_lettered_at__isnull=False)

    def unresolved_dead_letters(self) -> NotificationQuerySet:
        return self.dead_letters().filter(resolution="")

    def failed_backlog(self) -> NotificationQuerySet:
        """Failed rows still waiting for a retry (not dead letters)."""
        return self.filter(status=NotificationEntity.Status.FAILED, dead_lettered_at__isnull=True)

    # The triage rules, in one place: the admin (offers, confirmation counts) and the triage service
    # (which refuses the rest) both ask these.

    def requeueable(self, now: Any) -> NotificationQuerySet:
        """Dead letters a requeue may send again: not cancelled by the application, deadline not passed."""
        return self.dead_letters().exclude(error_kind=CANCELLED_ERROR_KIND).exclude(expires_at__lte=now)

    def discardable(self) -> NotificationQuerySet:
        """Dead letters not discarded yet."""
        return self.dead_letters().exclude(resolution=NotificationEntity.Resolution.DISCARDED)

    # Queue health, from the rules above: the worker's gauges and heartbeat sample, the web process's
    # gauges, the admin's dashboard and ``api.queue_stats`` read these.

    def backlog(self, now: datetime) -> Backlog:
        """Due rows, retry backlog, unresolved dead letters and the age of the oldest due row. A lapsed
        lease no claim gave back yet (its worker died) counts as due since its expiry.

        One statement: each figure is its own aggregate over its rule's query (each on its own index),
        joined as one row. A worker counts it with its heartbeat, idle or not; four round trips were
        three statements more each time."""
        parts = [
            (self.due(now), "due_at"),
            (self.lapsed(now), "claim_expires_at"),
            (self.failed_backlog(), None),
            (self.unresolved_dead_letters(), None),
        ]
        selects: list[str] = []
        params: list[Any] = []
        for number, (rows, since) in enumerate(parts):
            sql, sql_params = rows.order_by().values(since or "pk").query.sql_with_params()
            figures = "count(*)" if since is None else f"count(*), greatest(min({since}), %s)"
            selects.append(f"(SELECT {figures} FROM ({sql}) AS part) AS p{number}")
            params.extend(sql_params if since is None else [EARLIEST_READABLE, *sql_params])
        with connections[self.db].cursor() as cursor:
            cursor.execute(f"SELECT * FROM {', '.join(selects)}", params)
            due, due_oldest, lapsed, lapsed_oldest, failed, dead_letters = cursor.fetchone()
        first = min((at for count, at in ((due, due_oldest), (lapsed, lapsed_oldest)) if count), default=None)
        return Backlog(
            due=due + lapsed,
            failed_backlog=failed,
            dead_letters_unresolved=dead_letters,
            oldest_due_age_seconds=age_seconds(now, first),
        )

    def status_breakdown(self, now: datetime) -> list[StatusRow]:
        """Counts and oldest age by status and channel (a full scan: for dashboards, not for ticks)."""
        rows = (
            self.values("status", "channel__key")
            .annotate(count=Count("pk"), oldest=oldest("created_at"))
            .order_by("status", "channel__key")
        )
        return [
            StatusRow(
                status=r["status"],
                channel=r["channel__key"],
                count=r["count"],
                oldest_age_seconds=age_seconds(now, r["oldest"]),
            )
            for r in rows
        ]


class NotificationEntity(models.Model):
    """One notification to one recipient on one channel; its row is the retry checkpoint."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        SENT = "sent", "Sent"
        FAILED = "failed", "Failed"

    class Priority(models.IntegerChoices):
        HIGH = 0, "High"
        NORMAL = 5, "Normal"
        LOW = 9, "Low"

    class Resolution(models.TextChoices):
        UNRESOLVED = "", "Unresolved"
        DISCARDED = "discarded", "Discarded"
        UNRESOLVABLE = "unresolvable", "Unresolvable (retention expired)"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False, verbose_name="NotificationId")
    # Indexed only where triage looks (not Sent): see Meta.indexes.
    tenant_id = models.UUIDField(null=True, blank=True)
    channel = models.ForeignKey(
        ChannelConfig, on_delete=models.PROTECT, related_name="notifications", db_index=False
    )
    # The API's rules (inputs/validation.py) as field validators, so full_clean and forms refuse the same.
    recipient = models.TextField(
        validators=[MaxLengthValidator(bounds.RECIPIENT_MAX_LENGTH), reject_unstorable_text]
    )
    payload = models.JSONField(default=dict, blank=True, validators=[reject_invalid_payload])
    notification_type = models.CharField(
        max_length=bounds.NOTIFICATION_TYPE_MAX_LENGTH,
        validators=[reject_unstorable_text],
        blank=True,
        default="",
        help_text="e.g. transactional, marketing: sets the attempt budget.",
    )
    priority = models.PositiveSmallIntegerField(choices=Priority.choices, default=Priority.NORMAL)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    scheduled_at = models.DateTimeField(null=True, blank=True, help_text="Deferred (quiet hours) until then.")
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Not sent after this deadline.")
    due_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="Maintained by a trigger: when the worker may take the row.",
    )
    claim_token = models.UUIDField(null=True, blank=True, editable=False)
    claim_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    # NULL (no id from the provider) is kept apart from "", and finalize COALESCEs on it.
    provider_message_id = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    last_error = models.TextField(blank=True, default="")
    error_kind = models.CharField(max_length=64, blank=True, default="")
    attempt_log = models.JSONField(default=list, blank=True, editable=False)
    dead_lettered_at = models.DateTimeField(null=True, blank=True)
    dead_letter_reason = models.TextField(blank=True, default="")
    resolution = models.CharField(max_length=16, choices=Resolution.choices, blank=True, default="")
    resolved_at = models.DateTimeField(null=True, blank=True)
    requeue_count = models.PositiveIntegerField(default=0)
    # What starts the next attempt when it is not the worker's schedule: "manual" (an operator's
    # requeue) or "replay" (a recovery job's). Finalize writes it into that attempt's log entry and
    # clears it. NULL rather than "": a NULL column costs no byte in the row.
    next_trigger = models.CharField(max_length=8, null=True, blank=True, editable=False)  # noqa: DJ001
    correlation_id = models.CharField(
        max_length=bounds.CORRELATION_ID_MAX_LENGTH,
        blank=True,
        default="",
        validators=[reject_unstorable_text],
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = NotificationQuerySet.as_manager()

    class Meta:
        verbose_name = "notification"
        permissions = [
            ("requeue_notificationentity", "Can requeue dead-lettered notifications"),
            ("discard_notificationentity", "Can discard dead-lettered notifications"),
            ("view_recipient", "Can see notification recipients unmasked"),
        ]
        indexes = [
            # Partial indexes: a tick's cost must not grow with the number of Sent rows.
            models.Index(fields=["due_at", "priority"], name="nr_due_idx", condition=Q(due_at__isnull=False)),
            models.Index(
                fields=["channel", "due_at", "priority"],
                name="nr_channel_due_idx",
                condition=Q(due_at__isnull=False),
            ),
            # The claim's round-robin across tenants (delivery/claim_statements.py): a skip scan over a
            # channel's tenants, then each tenant's due rows in claim order, resumed after the last
            # row taken (the id makes that position exact).
            models.Index(
                fields=["channel", "tenant_id", "due_at", "priority", "id"],
                name="nr_channel_tenant_due_idx",
                condition=Q(due_at__isnull=False),
            ),
            # Leases, by expiry: the wake-up's and the claim's way to a lease whose worker died (a
            # leased row has no due_at, triggers.DUE_AT_RULE).
            models.Index(
                fields=["claim_expires_at"],
                name="nr_lease_expiry_idx",
                condition=Q(claim_expires_at__isnull=False),
            ),
            models.Index(
                fields=["dead_lettered_at"],
                name="nr_dead_letter_idx",
                condition=Q(dead_lettered_at__isnull=False),
            ),
            # Admin-only indexes stay off the hot path: a Sent row (the bulk of the table, and the outcome
            # of nearly every write) enters neither. The provider message id has no index: every Sent
            # row would enter it, and only the admin's search reads it (docs/performance.md, "Where the
            # bytes go").
            models.Index(
                fields=["status", "created_at"], name="nr_status_created_idx", condition=~Q(status="sent")
            ),
            models.Index(fields=["tenant_id"], name="nr_tenant_idx", condition=~Q(status="sent")),
        ]
        constraints = [
            check_constraint(Q(status__in=["pending", "sent", "failed"]), "nr_notification_status_valid"),
            check_constraint(
                Q(dead_lettered_at__isnull=True) | Q(status="failed"), "nr_dead_letter_is_failed"
            ),
            check_constraint(
                Q(resolution="") | Q(dead_lettered_at__isnull=False), "nr_resolution_needs_dead_letter"
            ),
            check_constraint(Q(resolution__in=["", "discarded", "unresolvable"]), "nr_resolution_valid"),
        ]
        triggers = notification_triggers()

    def __str__(self) -> str:
        return f"{self.channel_id}:{self.id} ({self.status})"

    def clean_fields(self, exclude: Any = None) -> None:
        """Check the payload first, iteratively: Django's JSONField.validate encodes it recursively,
        so a payload nested past Python's recursion limit would raise RecursionError instead."""
        errors: dict[str, list[ValidationError]] = {}
        if exclude is None or "payload" not in exclude:
            try:
                reject_invalid_payload(self.payload)
            except ValidationError as exc:
                errors["payload"] = exc.error_list
                exclude = {*(exclude or ()), "payload"}
        try:
            super().clean_fields(exclude=exclude)
        except ValidationError as exc:
            errors.update(exc.error_dict)
        if errors:
            raise ValidationError(errors)
