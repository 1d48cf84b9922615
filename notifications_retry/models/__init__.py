"""The app's tables: channels, notifications, the outbox, and the records operators rely on.

Invariants also live in the database (django-pgtrigger): a bug or a hand-written UPDATE cannot
make a forbidden status transition, lower ``attempts`` outside an audited requeue, or rewrite
an outbox event. One module per table group; everything is importable from here (migrations name
``notifications_retry.models.check_constraint``): :mod:`.channels` (with the tables' CHECK constraint
helpers), :mod:`.notifications` (with the queue's health: ``NotificationEntity.objects.backlog()``),
:mod:`.outbox` (with its backlog), :mod:`.recovery` (recovery jobs), :mod:`.health`
(endpoint health: window buckets and changes), :mod:`.suppression` (the suppression list) and
:mod:`.bookkeeping` (the triage audit, heartbeats, backlog samples).
"""

from .bookkeeping import BacklogSample, DeadLetterAction, WorkerHeartbeat
from .channels import ChannelConfig, ChannelConfigQuerySet, check_constraint, range_constraint
from .health import CHANNEL_HEALTH_TOPIC, ChannelHealthBucket, ChannelHealthChange, HealthState
from .notifications import CANCELLED_ERROR_KIND, Backlog, NotificationEntity, NotificationQuerySet, StatusRow
from .outbox import (
    CONTRACT_VERSION,
    DELIVERY_STATUS_TOPIC,
    DISPATCHED_TOPIC,
    Outbox,
    OutboxBacklog,
    OutboxQuerySet,
)
from .recovery import RecoveryJob
from .suppression import ALL_CHANNELS, DeliveryStatus, Suppression, SuppressionChange

__all__ = [
    "ALL_CHANNELS",
    "CANCELLED_ERROR_KIND",
    "CHANNEL_HEALTH_TOPIC",
    "CONTRACT_VERSION",
    "DELIVERY_STATUS_TOPIC",
    "DISPATCHED_TOPIC",
    "Backlog",
    "BacklogSample",
    "ChannelConfig",
    "ChannelConfigQuerySet",
    "ChannelHealthBucket",
    "ChannelHealthChange",
    "DeadLetterAction",
    "DeliveryStatus",
    "HealthState",
    "NotificationEntity",
    "NotificationQuerySet",
    "Outbox",
    "OutboxBacklog",
    "OutboxQuerySet",
    "RecoveryJob",
    "StatusRow",
    "Suppression",
    "SuppressionChange",
    "WorkerHeartbeat",
    "check_constraint",
    "range_constraint",
]
