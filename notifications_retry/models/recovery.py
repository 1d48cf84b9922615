"""Recovery jobs: "requeue every dead letter of channel X that died between since and until", in chunks.

A job holds its filter, its counts and a keyset cursor. The runner (``delivery.recovery``) commits each
chunk's requeues, their audit rows and the advanced cursor in one transaction, so a killed runner loses
nothing and a resumed one never requeues a row twice.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q
from django.utils import timezone

from .channels import ChannelConfig, check_constraint
from .notifications import NotificationEntity, NotificationQuerySet


class RecoveryJob(models.Model):
    """A background requeue of every notification matching a filter; progress checkpointed per chunk."""

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        CANCELLED = "cancelled", "Cancelled"
        FAILED = "failed", "Failed"

    class RowStatus(models.TextChoices):
        """Which dead letters the filter takes (``notifications_recover --status``)."""

        DEAD_LETTER = "dead-letter", "Unresolved dead letters"
        DISCARDED = "discarded", "Discarded dead letters"
        UNRESOLVABLE = "unresolvable", "Unresolvable dead letters (retention expired)"

    #: States in which a job still has work to do: at most one such job per filter.
    ACTIVE_STATES = (State.PENDING, State.RUNNING)

    channel = models.ForeignKey(ChannelConfig, on_delete=models.PROTECT, related_name="recovery_jobs")
    since = models.DateTimeField(help_text="Dead-lettered at or after this time.")
    until = models.DateTimeField(help_text="Dead-lettered before this time (and before the job was created).")
    row_status = models.CharField(max_length=16, choices=RowStatus.choices, default=RowStatus.DEAD_LETTER)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    total = models.PositiveIntegerField(default=0, help_text="Rows matching when the job was created.")
    done = models.PositiveIntegerField(default=0, help_text="Rows requeued.")
    failed = models.PositiveIntegerField(default=0, help_text="Rows the requeue refused (see refusals).")
    refusals = models.JSONField(default=dict, blank=True, help_text="Refusal reason -> count.")
    # The keyset cursor: the last (dead_lettered_at, id) a committed chunk went through.
    cursor_at = models.DateTimeField(null=True, blank=True, editable=False)
    cursor_id = models.UUIDField(null=True, blank=True, editable=False)
    started_by = models.CharField(max_length=150, help_text="User name, stored in each requeue's audit row.")
    reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True, help_text="Last committed chunk.")
    finished_at = models.DateTimeField(null=True, blank=True)
    cancelled_by = models.CharField(max_length=150, blank=True, default="")
    last_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [("cancel_recoveryjob", "Can cancel recovery jobs")]
        constraints = [
            # A second job on the same filter would only chase the first one's rows: refused while the
            # first is pending or running.
            models.UniqueConstraint(
                fields=["channel", "since", "until", "row_status"],
                condition=Q(state__in=["pending", "running"]),
                name="nr_recovery_one_active_per_filter",
            ),
            check_constraint(Q(since__lt=models.F("until")), "nr_recovery_since_before_until"),
            check_constraint(
                Q(state__in=["pending", "running", "done", "cancelled", "failed"]), "nr_recovery_state_valid"
            ),
            check_constraint(
                Q(row_status__in=["dead-letter", "discarded", "unresolvable"]), "nr_recovery_row_status_valid"
            ),
        ]
        indexes = [
            models.Index(
                fields=["state"], name="nr_recovery_active_idx", condition=Q(state__in=["pending", "running"])
            )
        ]

    def __str__(self) -> str:
        return f"recovery job #{self.pk} ({self.state})"

    @property
    def is_active(self) -> bool:
        return self.state in self.ACTIVE_STATES

    @property
    def processed(self) -> int:
        return self.done + self.failed

    @property
    def percent(self) -> float:
        """Share of ``total`` processed, 0-100 (100 once done, whatever rows changed meanwhile)."""
        if self.state == self.State.DONE:
            return 100.0
        return min(100.0, 100.0 * self.processed / self.total) if self.total else 0.0

    def matching(self) -> NotificationQuerySet:
        """The rows the filter takes, whatever the cursor: dead letters of the channel in the window.

        ``until`` is capped at the job's creation: a row that dies again after a requeue (this job's, or
        anyone's) is a new failure, left to a new job, so a job can never requeue a row twice.
        """
        rows = NotificationEntity.objects.dead_letters().filter(
            channel_id=self.channel_id,
            dead_lettered_at__gte=self.since,
            dead_lettered_at__lt=min(self.until, self.created_at),
        )
        if self.row_status == self.RowStatus.DEAD_LETTER:
            return rows.filter(resolution="")
        if self.row_status == self.RowStatus.DISCARDED:
            return rows.filter(resolution=NotificationEntity.Resolution.DISCARDED)
        return rows.filter(resolution=NotificationEntity.Resolution.UNRESOLVABLE)

    def remaining(self) -> NotificationQuerySet:
        """Matching rows past the cursor, in cursor order (dead_lettered_at, id)."""
        rows = self.matching()
        if self.cursor_at is not None:
            rows = rows.filter(
                Q(dead_lettered_at__gt=self.cursor_at)
                | Q(dead_lettered_at=self.cursor_at, pk__gt=self.cursor_id)
            )
        return rows.order_by("dead_lettered_at", "pk")

    def filter_description(self) -> dict[str, Any]:
        """The filter, as the command's options name it."""
        return {
            "channel": self.channel.key,
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "status": self.row_status,
        }
