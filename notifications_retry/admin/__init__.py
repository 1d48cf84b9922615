"""The triage console: notifications, dead letters, channels, the outbox, and the queue health page.

Nothing here writes notification rows: requeue and discard go through
:mod:`notifications_retry.delivery.triage`, which locks, checks the state, audits and updates in one
transaction. The admin adds what only it knows: who asked, the reason typed on the confirmation page (stored
in the triage log and in an admin ``LogEntry``), permission checks that answer 403, and messages with the
counts. The suppression list's changes go through :mod:`notifications_retry.delivery.suppression`
likewise, audited. Importing this package registers the model admins (Django's admin autodiscovery does).

Modules: :mod:`.notifications` (the list and detail) with :mod:`.triage_actions` and :mod:`.filters`,
:mod:`.channels`, :mod:`.outbox`, :mod:`.read_only` (the audit and heartbeats), :mod:`.suppressions`
(the suppression list, its audit, ESP delivery statuses), :mod:`.dashboard` (queue health) with
:mod:`.chart`, :mod:`.recovery` (recovery jobs: started from the list's filter, their progress,
cancel), :mod:`.timeline` (a notification's attempts), :mod:`.channel_health` (endpoint health
and the re-enable action) and :mod:`.display` (what every page shows alike).
"""

from __future__ import annotations

from .channels import ChannelConfigAdmin, ChannelConfigForm
from .chart import backlog_chart
from .dashboard import dashboard_context, dashboard_view
from .display import format_age
from .notifications import NotificationEntityAdmin
from .outbox import OutboxAdmin
from .read_only import DeadLetterActionAdmin, WorkerHeartbeatAdmin
from .recovery import RecoveryJobAdmin
from .suppressions import DeliveryStatusAdmin, SuppressionAdmin, SuppressionChangeAdmin

__all__ = [
    "ChannelConfigAdmin",
    "ChannelConfigForm",
    "DeadLetterActionAdmin",
    "DeliveryStatusAdmin",
    "NotificationEntityAdmin",
    "OutboxAdmin",
    "RecoveryJobAdmin",
    "SuppressionAdmin",
    "SuppressionChangeAdmin",
    "WorkerHeartbeatAdmin",
    "backlog_chart",
    "dashboard_context",
    "dashboard_view",
    "format_age",
]
