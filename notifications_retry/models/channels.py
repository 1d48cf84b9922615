"""Channels: how each one is delivered and retried; and the CHECK constraints of the tables.

A channel's numbers each have a range (:mod:`notifications_retry.conf.bounds`), enforced here by the
field's validators and by a CHECK built by :func:`range_constraint`. :func:`check_constraint` builds
every table's CHECKs (the other table modules import it from here, the lowest of them; migrations
name ``notifications_retry.models.check_constraint``).
"""

from __future__ import annotations

import django
from django.apps import apps
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

from notifications_retry.conf import RetrySettings, bounds
from notifications_retry.conf.channel_settings import ChannelSettings
from notifications_retry.database.triggers import channel_triggers
from notifications_retry.inputs.url_policy import resolution_problems
from notifications_retry.inputs.validation import range_validators
from notifications_retry.rules.backoff import JITTER_RATIO, LEASED_ROUNDS, RATE_HORIZON_SECONDS, BackoffPolicy


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
    # Endpoint health (delivery/health.py writes these; docs/operations.md#endpoint-health).
    health_state = models.CharField(max_length=16, default="ok", editable=False)
    health_reason = models.TextField(blank=True, default="", editable=False)
    health_changed_at = models.DateTimeField(null=True, blank=True, editable=False)
    # A re-enable starts the window afresh: older failures no longer count against the endpoint.
    health_window_start = models.DateTimeField(null=True, blank=True, editable=False)
    # How many health changes the channel has had: the generation of its channel-health events.
    health_changes = models.PositiveIntegerField(default=0, editable=False)
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
            # F("id"), not F("pk"): Django 4.2 checks it in Python (full_clean), and cannot resolve "pk".
            check_constraint(~Q(fallback=models.F("id")), "nr_channel_fallback_not_itself"),
        ]
        triggers = channel_triggers()

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

    # What the channel's configuration decides for each of its records: how it backs off and how long it
    # is leased. The worker's claims (engine.channels) and the monolith's own sends (delivery.handoff)
    # both ask the channel, so a record waits and is leased alike whoever sends it.

    def backoff_policy(self, conf: RetrySettings) -> BackoffPolicy:
        """The retry backoff (``retry_backoff``, base, cap), spread by ``JITTER_RATIO``, and the longest
        wait a ``Retry-After`` gets (``RETRY_AFTER_MAX_SECONDS``, its spread included)."""
        retry_after_max = conf.RETRY_AFTER_MAX_SECONDS
        if not bounds.SETTINGS["RETRY_AFTER_MAX_SECONDS"].contains(retry_after_max):
            # Check E001 reports the value; an outcome must still be decided within a bound.
            retry_after_max = RetrySettings.RETRY_AFTER_MAX_SECONDS
        return BackoffPolicy(
            kind=self.retry_backoff,
            base_seconds=float(self.backoff_base_seconds),
            cap_seconds=float(self.backoff_cap_seconds),
            jitter_ratio=JITTER_RATIO,
            retry_after_max=float(retry_after_max),
        )

    def lease_seconds(self, grace_seconds: float, *, fallback: ChannelConfig | None = None) -> float:
        """How long a claim leases a record: a round of waiting ahead of it and its own call, plus a grace.

        With a ``fallback``, a call may be followed by the fallback's: the lease covers both, so a
        failover never outlives its record's lease (a late outcome would be discarded and the row sent
        again). ``grace_seconds`` is the ``LEASE_GRACE_SECONDS`` setting.
        """
        return (LEASED_ROUNDS + 1) * self._call_seconds(fallback) + RATE_HORIZON_SECONDS + grace_seconds

    def start_allowance_seconds(
        self, grace_seconds: float, *, fallback: ChannelConfig | None = None
    ) -> float:
        """How long after its claim a record's call may still start: the waiting its lease covers, and
        half the grace. The lease then still holds the call (and its fallback's) and the other half of
        the grace for the outcome's commit. Started later, the call could outlive the lease, and the row
        be claimed and sent by another worker meanwhile: such a record is given back unsent instead.
        """
        return LEASED_ROUNDS * self._call_seconds(fallback) + RATE_HORIZON_SECONDS + grace_seconds / 2

    def _call_seconds(self, fallback: ChannelConfig | None) -> float:
        """The longest a record's calls may take: the channel's timeout, and its fallback's after it."""
        timeout = float(self.timeout_seconds)
        if fallback is not None:
            timeout += float(fallback.timeout_seconds)
        return timeout

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
