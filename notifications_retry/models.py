"""The app's tables: channels, notifications, the outbox, and the records operators rely on.

Invariants also live in the database (django-pgtrigger): a bug or a hand-written UPDATE cannot
make a forbidden status transition, lower ``attempts`` outside an audited requeue, or rewrite
an outbox event.
"""

from __future__ import annotations

import uuid
from typing import Any

import django
from django.apps import apps
from django.core.exceptions import ValidationError
from django.core.validators import MaxLengthValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from . import bounds
from .channel_settings import ChannelSettings
from .db_rules import notification_triggers, outbox_triggers
from .event_ids import DERIVED_EVENT_ID, outbox_event_id
from .outcomes import CANCELLED
from .url_policy import resolution_problems
from .validation import range_validators, reject_invalid_payload, reject_unstorable_text

DISPATCHED_TOPIC = "pin.notifications.dispatched.v1"
CONTRACT_VERSION = 1

#: ``error_kind`` of a notification the application cancelled (``api.cancel_notification``).
CANCELLED_ERROR_KIND = CANCELLED  # one name for the error kind of a cancel (outcomes.py)


def check_constraint(condition: Q, name: str) -> models.CheckConstraint:
    """A CheckConstraint on every supported Django (``check=`` became ``condition=`` in 5.1)."""
    if django.VERSION >= (5, 1):
        return models.CheckConstraint(condition=condition, name=name)
    return models.CheckConstraint(check=condition, name=name)  # type: ignore[call-arg]


def range_constraint(field: str, bound: bounds.Bound, *, nullable: bool = False) -> models.CheckConstraint:
    """CHECK low <= field <= high (PostgreSQL sorts NaN above every number, so it fails the upper end)."""
    condition = Q(**{f"{field}__gte": bound.low}) & Q(**{f"{field}__lte": bound.high})
    if nullable:
        condition = Q(**{f"{field}__isnull": True}) | condition
    return check_constraint(condition, f"nr_channel_{field}_range")


class ChannelConfigQuerySet(models.QuerySet["ChannelConfig"]):
    def enabled(self) -> ChannelConfigQuerySet:
        return self.filter(is_enabled=True)


class ChannelConfig(models.Model):
    """How one channel (email, sms, push, in_app, webhook…) is delivered and retried."""

    class Backoff(models.TextChoices):
        FIXED = "fixed", "Fixed"
        EXPONENTIAL = "exponential", "Exponential"

    key = models.SlugField(max_length=64, unique=True, help_text="Channel slug: email, sms, push, in_app…")
    is_enabled = models.BooleanField(default=True, help_text="Disabled: rows wait untouched.")
    provider_key = models.CharField(max_length=64, help_text="Key of the provider adapter in the registry.")
    # Every number has a documented range (bounds.CHANNEL_FIELDS, docs/settings.md#channel-fields),
    # enforced by these validators, a CHECK constraint each and check E006.
    max_attempts = models.PositiveIntegerField(default=5, validators=range_validators(bounds.MAX_ATTEMPTS))
    retry_backoff = models.CharField(max_length=16, choices=Backoff.choices, default=Backoff.EXPONENTIAL)
    backoff_base_seconds = models.PositiveIntegerField(
        default=60, validators=range_validators(bounds.BACKOFF_BASE_SECONDS)
    )
    backoff_cap_seconds = models.PositiveIntegerField(
        default=3600, validators=range_validators(bounds.BACKOFF_CAP_SECONDS)
    )
    timeout_seconds = models.FloatField(default=10.0, validators=range_validators(bounds.TIMEOUT_SECONDS))
    rate_limit_per_second = models.FloatField(
        null=True,
        blank=True,
        validators=range_validators(bounds.RATE_LIMIT_PER_SECOND),
        help_text="Empty: no limit.",
    )
    max_concurrency = models.PositiveIntegerField(
        default=10, validators=range_validators(bounds.MAX_CONCURRENCY)
    )
    options = models.JSONField(default=dict, blank=True, help_text='Provider options, e.g. {"url": …}.')
    # Deleting the fallback channel only ends the failover: the primary keeps sending on its own.
    fallback = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="fallback_for",
        help_text="When this channel's provider refuses an attempt before processing it (connection "
        "refused, 429/503, circuit open), the same attempt goes to this channel's provider. Empty: none.",
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ChannelConfigQuerySet.as_manager()

    class Meta:
        verbose_name = "channel"
        ordering = ["key"]
        constraints = [
            *(
                range_constraint(field, bound, nullable=field == "rate_limit_per_second")
                for field, bound in bounds.CHANNEL_FIELDS.items()
            ),
            check_constraint(
                Q(backoff_cap_seconds__gte=models.F("backoff_base_seconds")),
                "nr_channel_backoff_cap_gte_base",
            ),
            check_constraint(Q(retry_backoff__in=["fixed", "exponential"]), "nr_channel_backoff_valid"),
            check_constraint(~Q(fallback=models.F("pk")), "nr_channel_fallback_not_itself"),
        ]

    def __str__(self) -> str:
        return self.key

    def settings(self) -> ChannelSettings:
        """The detached view a provider receives."""
        return ChannelSettings(
            key=self.key,
            provider_key=self.provider_key,
            timeout_seconds=self.timeout_seconds,
            max_concurrency=self.max_concurrency,
            options=dict(self.options or {}),
        )

    def configuration_problems(self) -> list[str]:
        """What stops this channel from sending; empty when it can work."""
        return self.bounds_problems() + self.provider_problems()

    def provider_problems(self) -> list[str]:
        """An unknown provider key, or options the provider refuses."""
        # The provider registry is asked through the app config: the models import no provider.
        app = apps.get_app_config("notifications_retry")
        options = self.options if self.options is not None else {}
        return app.channel_problems(self.provider_key, options)  # type: ignore[attr-defined,no-any-return]

    def bounds_problems(self) -> list[str]:
        """Numbers outside their documented range: only reachable past the CHECK constraints."""
        problems = [
            problem
            for field, bound in bounds.CHANNEL_FIELDS.items()
            if not (field == "rate_limit_per_second" and self.rate_limit_per_second is None)
            and (problem := bound.problem(field, getattr(self, field)))
        ]
        if not problems and self.backoff_cap_seconds < self.backoff_base_seconds:
            problems.append("backoff_cap_seconds must be at least backoff_base_seconds")
        return problems

    def fallback_problems(self) -> list[str]:
        """What is wrong with the fallback: itself, missing, disabled, or part of a cycle."""
        if self.fallback_id is None:
            return []
        if self.pk is not None and self.fallback_id == self.pk:
            return ["a channel cannot be its own fallback"]
        fallback = ChannelConfig.objects.filter(pk=self.fallback_id).first()
        if fallback is None:
            return [f"fallback channel #{self.fallback_id} does not exist"]
        problems = [] if fallback.is_enabled else [f"fallback channel {fallback.key!r} is disabled"]
        # Walk the chain as the database holds it, starting from this channel's new fallback; meeting a
        # channel already on the chain again is a cycle (also one written past this validation).
        on_chain = {self.pk} if self.pk is not None else set()
        chain = [self.key]
        current: ChannelConfig | None = fallback
        while current is not None:
            if current.pk in on_chain:
                problems.append("fallback channels form a cycle: " + " → ".join([*chain, current.key]))
                break
            on_chain.add(current.pk)
            chain.append(current.key)
            next_id = current.fallback_id
            current = ChannelConfig.objects.filter(pk=next_id).first() if next_id is not None else None
        return problems

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}
        fallback_problems = self.fallback_problems()
        if fallback_problems:
            errors["fallback"] = fallback_problems
        if (
            self.backoff_cap_seconds is not None
            and self.backoff_base_seconds is not None
            and (self.backoff_cap_seconds < self.backoff_base_seconds)
        ):
            errors.setdefault("backoff_cap_seconds", []).append("The cap must be at least the base delay.")
        problems = self.provider_problems()  # the numbers are the field validators' to report
        if not problems and self.provider_key == "webhook" and isinstance(self.options, dict):
            problems = resolution_problems(self.options.get("url"))  # a name that resolves inside
        if problems:
            field = "provider_key" if "provider key" in problems[0] else "options"
            errors.setdefault(field, []).extend(problems)
        if errors:
            raise ValidationError(errors)


class NotificationQuerySet(models.QuerySet["NotificationEntity"]):
    def due(self, now: Any) -> NotificationQuerySet:
        """Rows the worker may claim at ``now`` (the trigger-maintained ``due_at`` says when)."""
        return self.filter(due_at__lte=now)

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
    # The API's rules (validation.py) as field validators, so full_clean and forms refuse the same.
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

    @property
    def is_dead_letter(self) -> bool:
        return self.dead_lettered_at is not None


class Outbox(models.Model):
    """A transactional outbox row: written with the status change, published by the relay."""

    id = models.BigAutoField(primary_key=True)
    event_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    topic = models.CharField(max_length=128, default=DISPATCHED_TOPIC)
    key = models.CharField(max_length=64, help_text="The NotificationId as text.")
    contract_version = models.PositiveSmallIntegerField(default=CONTRACT_VERSION)
    generation = models.PositiveIntegerField(
        default=0, help_text="The notification's requeue count at the outcome: one event per outcome."
    )
    payload = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)
    published_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "outbox event"
        verbose_name_plural = "outbox"
        constraints = [
            # New events cannot repeat an outcome: their id is derived from it and unique. Events
            # written before that (random ids) are the only rows this index holds.
            models.UniqueConstraint(
                fields=["topic", "key", "generation"],
                condition=~Q(event_id=DERIVED_EVENT_ID),
                name="nr_outbox_one_legacy_event_per_outcome",
            ),
        ]
        indexes = [
            models.Index(
                fields=["id"], name="nr_outbox_unpublished_idx", condition=Q(published_at__isnull=True)
            ),
            models.Index(
                fields=["published_at"],
                name="nr_outbox_published_idx",
                condition=Q(published_at__isnull=False),
            ),
        ]
        triggers = outbox_triggers()

    def __str__(self) -> str:
        return f"{self.topic} {self.key} ({'published' if self.published_at else 'pending'})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        # The database accepts a new event only under the id derived from its outcome.
        if self._state.adding:
            self.event_id = outbox_event_id(self.topic, self.key, self.generation)
        super().save(*args, **kwargs)


class DeadLetterAction(models.Model):
    """Audit trail of triage: who requeued, discarded or expired a dead letter, when and why."""

    class Action(models.TextChoices):
        REQUEUE = "requeue", "Requeued"
        DISCARD = "discard", "Discarded"
        EXPIRE = "expire", "Marked unresolvable"

    notification = models.ForeignKey(NotificationEntity, on_delete=models.CASCADE, related_name="triage_log")
    action = models.CharField(max_length=16, choices=Action.choices)
    actor = models.CharField(max_length=150, help_text="User name, or 'system' for housekeeping.")
    reason = models.TextField(blank=True, default="")
    attempts_before = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.action} {self.notification_id} by {self.actor}"


class WorkerHeartbeat(models.Model):
    """Last tick of each lane's owner: for liveness probes and the dashboard."""

    lane = models.CharField(max_length=64, primary_key=True)
    hostname = models.CharField(max_length=255, blank=True, default="")
    pid = models.PositiveIntegerField(default=0)
    last_tick_started_at = models.DateTimeField(null=True, blank=True)
    last_tick_completed_at = models.DateTimeField(null=True, blank=True)
    last_tick_stats = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"{self.lane} @ {self.last_tick_completed_at}"


class BacklogSample(models.Model):
    """A point of the backlog over time, written by the worker at the end of a tick."""

    taken_at = models.DateTimeField(db_index=True)
    due_backlog = models.PositiveIntegerField(default=0)
    failed_backlog = models.PositiveIntegerField(default=0)
    dead_letters_unresolved = models.PositiveIntegerField(default=0)
    oldest_due_age_seconds = models.FloatField(default=0)

    class Meta:
        ordering = ["taken_at"]

    def __str__(self) -> str:
        return f"{self.taken_at}: {self.due_backlog} due"
