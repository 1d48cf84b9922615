"""Signals the monolith can hook: alerts on terminal failures."""

from __future__ import annotations

from django.dispatch import Signal

#: Sent after a notification became a dead letter (committed). Keyword arguments:
#: ``notification_id``, ``channel``, ``error_kind``, ``error``, ``attempts``.
terminal_failure = Signal()
