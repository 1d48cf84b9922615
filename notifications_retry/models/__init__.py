"""The app's tables: channels, notifications, the outbox, and the records operators rely on.

Invariants also live in the database (django-pgtrigger): a bug or a hand-written UPDATE cannot
make a forbidden status transition, lower ``attempts`` outside an audited requeue, or rewrite
an outbox event. One module per table group; everything is importable from here (migrations name
``notifications_retry.models.check_constraint``).
"""

from .bookkeeping import BacklogSample, DeadLetterAction, WorkerHeartbeat
from .channels import ChannelConfig, ChannelConfigQuerySet
from .constraints import check_constraint, range_constraint
from .notifications import CANCELLED_ERROR_KIND, NotificationEntity, NotificationQuerySet
from .outbox import CONTRACT_VERSION, DISPATCHED_TOPIC, Outbox
from .recovery import RecoveryJob

__all__ = [
    "CANCELLED_ERROR_KIND",
    "CONTRACT_VERSION",
    "DISPATCHED_TOPIC",
    "BacklogSample",
    "ChannelConfig",
    "ChannelConfigQuerySet",
    "DeadLetterAction",
    "NotificationEntity",
    "NotificationQuerySet",
    "Outbox",
    "RecoveryJob",
    "WorkerHeartbeat",
    "check_constraint",
    "range_constraint",
]
