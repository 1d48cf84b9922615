"""The filter of a recovery job, read from an operator's words (command options, the admin's form).

Every mistake is refused here with a message naming the option and the value, before any row is read.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from django.utils import timezone

from notifications_retry.exceptions import NotificationsRetryError
from notifications_retry.models import ChannelConfig, RecoveryJob

ISO_EXAMPLE = "2026-03-01T02:00:00+00:00"


class RecoveryInputError(NotificationsRetryError, ValueError):
    """A recovery filter an operator gave is not usable: the message says which part and why."""


@dataclasses.dataclass(frozen=True)
class RecoveryFilter:
    """Which dead letters a recovery job requeues: one channel, a dead-letter time window, a state."""

    channel: ChannelConfig
    since: datetime
    until: datetime
    row_status: str = RecoveryJob.RowStatus.DEAD_LETTER


def parse_moment(text: str, *, option: str) -> datetime:
    """An ISO 8601 date or date-time; one without an offset is read in the project's time zone."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise RecoveryInputError(
            f"{option}: not an ISO 8601 date-time: {text!r} (for example {ISO_EXAMPLE})"
        ) from None
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment)
    return moment


def recovery_filter(
    *, channel: str, since: str | datetime, until: str | datetime, status: str = "dead-letter"
) -> RecoveryFilter:
    """Check and resolve a filter: known channel, readable dates, since before until, a known status."""
    start = since if isinstance(since, datetime) else parse_moment(since, option="--since")
    end = until if isinstance(until, datetime) else parse_moment(until, option="--until")
    if start >= end:
        raise RecoveryInputError(f"--since ({start.isoformat()}) must be before --until ({end.isoformat()})")
    if status not in RecoveryJob.RowStatus.values:
        raise RecoveryInputError(
            f"--status: unknown status {status!r}; one of {', '.join(RecoveryJob.RowStatus.values)}"
        )
    try:
        config = ChannelConfig.objects.get(key=channel)
    except ChannelConfig.DoesNotExist:
        known = ", ".join(ChannelConfig.objects.order_by("key").values_list("key", flat=True)[:50])
        raise RecoveryInputError(
            f"--channel: unknown channel {channel!r}; channels: {known or '(none configured)'}"
        ) from None
    return RecoveryFilter(channel=config, since=start, until=end, row_status=status)
