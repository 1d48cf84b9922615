"""The suppression list and what ESPs report after a send: suppressions, their audit, delivery status."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q
from django.utils import timezone

from notifications_retry.conf import bounds
from notifications_retry.inputs.validation import normalize_recipient

from .channels import check_constraint
from .notifications import NotificationEntity

#: ``Suppression.channel`` of a suppression that applies to every channel.
ALL_CHANNELS = "*"


class Suppression(models.Model):
    """A recipient not to be sent to, on one channel or on every one (``*``), and why.

    ``address`` is stored normalized (:func:`notifications_retry.inputs.validation.normalize_recipient`): an
    email address case-folded whole, anything else verbatim. One row per (address, channel): a new
    event for it extends the row (``last_event_at``, ``events``, ``expires_at``) instead of adding one.
    """

    class Reason(models.TextChoices):
        HARD_BOUNCE = "hard_bounce", "Hard bounce"
        COMPLAINT = "complaint", "Spam complaint"
        UNSUBSCRIBED = "unsubscribed", "Unsubscribed"
        MANUAL = "manual", "Added by hand"
        INVALID_RECIPIENT = "invalid_recipient", "Invalid recipient"

    address = models.TextField(help_text="Normalized: an email address case-folded whole, else verbatim.")
    channel = models.CharField(max_length=64, default=ALL_CHANNELS, help_text="A channel key, or * for all.")
    reason = models.CharField(max_length=32, choices=Reason.choices)
    source = models.CharField(
        max_length=255, help_text="Who reported it: an ESP's name, the SMTP reply, or the operator."
    )
    detail = models.TextField(blank=True, default="", help_text="The last report's own words (masked).")
    first_event_at = models.DateTimeField(default=timezone.now)
    last_event_at = models.DateTimeField(default=timezone.now)
    events = models.PositiveIntegerField(default=1, help_text="Reports received for this address.")
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never expires.")

    class Meta:
        constraints = [
            # Also the index of the claim's one lookup per batch: address = ANY(the batch's recipients).
            models.UniqueConstraint(fields=["address", "channel"], name="nr_suppression_one_per_channel"),
            check_constraint(
                Q(reason__in=["hard_bounce", "complaint", "unsubscribed", "manual", "invalid_recipient"]),
                "nr_suppression_reason_valid",
            ),
            check_constraint(~Q(address=""), "nr_suppression_address_not_empty"),
        ]
        indexes = [
            models.Index(
                fields=["expires_at"], name="nr_suppression_expiry_idx", condition=Q(expires_at__isnull=False)
            )
        ]

    def __str__(self) -> str:
        return f"{self.address} on {self.channel} ({self.reason})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.address = normalize_recipient(self.address)[: bounds.RECIPIENT_MAX_LENGTH]
        super().save(*args, **kwargs)


class SuppressionChange(models.Model):
    """Audit of the suppression list's hand-made changes: who added or removed which address, and why."""

    class Action(models.TextChoices):
        ADD = "add", "Added"
        REMOVE = "remove", "Removed"

    address = models.TextField()
    channel = models.CharField(max_length=64)
    action = models.CharField(max_length=16, choices=Action.choices)
    reason = models.CharField(max_length=32, blank=True, default="")
    actor = models.CharField(max_length=150, help_text="User name, or 'api' for the application.")
    note = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.action} {self.address} on {self.channel} by {self.actor}"


class DeliveryStatus(models.Model):
    """What the ESP reported about a Sent notification: the latest state and when each was reached.

    A table of its own: the notification row (Sent is final, and the hot table's bytes are counted)
    is never rewritten for it, and only notifications an ESP reported on have a row here.
    """

    class State(models.TextChoices):
        DELIVERED = "delivered", "Delivered"
        OPENED = "opened", "Opened"
        BOUNCED = "bounced", "Bounced"
        COMPLAINED = "complained", "Complained"

    notification = models.OneToOneField(
        NotificationEntity, on_delete=models.CASCADE, primary_key=True, related_name="delivery_status"
    )
    state = models.CharField(max_length=16, choices=State.choices)
    state_at = models.DateTimeField(help_text="When the ESP says the current state was reached.")
    esp = models.CharField(max_length=64, blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)
    opened_at = models.DateTimeField(null=True, blank=True)
    bounced_at = models.DateTimeField(null=True, blank=True)
    complained_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "delivery status"
        verbose_name_plural = "delivery statuses"
        constraints = [
            check_constraint(
                Q(state__in=["delivered", "opened", "bounced", "complained"]), "nr_delivery_state_valid"
            )
        ]

    def __str__(self) -> str:
        return f"{self.notification_id}: {self.state}"
