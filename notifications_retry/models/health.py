"""Endpoint health: failed attempts per channel in time buckets, and the audit of each state change."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from .channels import ChannelConfig

#: The topic of a channel's health changes (docs/events.md).
CHANNEL_HEALTH_TOPIC = "pin.notifications.channel-health.v1"


class HealthState(models.TextChoices):
    OK = "ok", "OK"
    WARNING = "warning", "Warning: failure ratio past HEALTH_WARN_RATIO"
    DISABLED = "disabled", "Disabled automatically"


class ChannelHealthBucket(models.Model):
    """Provider calls and failed ones of one channel in one slice of the health window.

    Finalize adds to the current bucket of each channel it wrote outcomes for (one upsert a batch);
    the window's ratio is the sum of its buckets, so no notification row is ever scanned for it.
    """

    channel = models.ForeignKey(ChannelConfig, on_delete=models.CASCADE, related_name="health_buckets")
    bucket_start = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "bucket_start"], name="nr_health_one_bucket"),
        ]

    def __str__(self) -> str:
        return f"{self.channel_id} @ {self.bucket_start}: {self.failures}/{self.attempts}"


class ChannelHealthChange(models.Model):
    """Each change of a channel's health state: automatic (actor ``system``) or an operator's re-enable."""

    channel = models.ForeignKey(ChannelConfig, on_delete=models.CASCADE, related_name="health_log")
    state = models.CharField(max_length=16, choices=HealthState.choices)
    previous_state = models.CharField(max_length=16, choices=HealthState.choices)
    reason = models.TextField()
    actor = models.CharField(max_length=150, default="system", help_text="'system', or the operator.")
    attempts = models.PositiveIntegerField(null=True, blank=True, help_text="Calls in the window.")
    failure_ratio = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "channel health change"

    def __str__(self) -> str:
        return f"{self.channel_id}: {self.previous_state} -> {self.state} ({self.actor})"
