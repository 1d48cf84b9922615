"""What operators rely on besides the rows themselves: the triage audit, heartbeats, backlog samples."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from .notifications import NotificationEntity


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
        # The lane alone: the admin shows the tick's time beside it, in its own format.
        return f"lane {self.lane}"


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
