"""Signals the monolith can hook: alerts on terminal failures."""

from __future__ import annotations

from django.dispatch import Signal

#: Sent after a notification became a dead letter (committed). Keyword arguments:
#: ``notification_id``, ``channel``, ``error_kind``, ``error``, ``attempts``.
terminal_failure = Signal()

#: Sent after a channel's health state changed (committed): automatically (``actor`` "system": a
#: warning, a disable by failure ratio or 410 Gone, a warning cleared) or by an operator's re-enable.
#: Keyword arguments: ``channel``, ``state`` (ok / warning / disabled), ``previous_state``, ``reason``,
#: ``actor``, ``attempts`` and ``failure_ratio`` (the window's, None for a re-enable), ``occurred_at``.
channel_health_changed = Signal()
