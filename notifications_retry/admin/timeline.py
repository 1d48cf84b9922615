"""The attempt timeline of a notification's page: each attempt's answer, evidence and trigger, in order.

Reads ``attempt_log`` as finalize writes it. Entries older than the evidence fields lack
them and show as such; nothing here trusts an entry's shape (the log is JSON any hand may have edited).
"""

from __future__ import annotations

from typing import Any

from django.utils.safestring import SafeString

from notifications_retry.rules.outcomes import SUPPRESSED

from .display import fragment, timestamp
from .filters import status_class

#: Error kinds of an entry the claim wrote without an attempt: nothing was sent, no attempt counted.
NOT_ATTEMPTED = frozenset({SUPPRESSED})


def not_attempted(entry: dict[str, Any]) -> str:
    """Why the entry's send was never tried (its error kind), or "" for an attempt."""
    kind = entry.get("error_kind")
    return str(kind) if kind in NOT_ATTEMPTED and "status_code" not in entry else ""


def _row(entry: dict[str, Any], previous_generation: int | None) -> dict[str, Any]:
    called = "status_code" in entry
    code = entry.get("status_code")
    duration = entry.get("duration_ms")
    generation = entry.get("generation") or 0
    return {
        "attempt": entry.get("attempt"),
        # Settled by the claim before any send (a suppressed recipient): said so, with no attempt
        # number and no trigger, since nothing was attempted.
        "not_attempted": not_attempted(entry),
        "generation": generation,
        # A requeue starts a new run: the timeline marks where.
        "new_run": previous_generation is not None and generation != previous_generation,
        "at": timestamp(entry.get("at")),
        "outcome": entry.get("outcome", ""),
        "trigger": entry.get("trigger", ""),
        "called": called,
        "status_code": code,
        "status_class": status_class(code) if called else "",
        "duration": f"{duration:,.0f} ms" if isinstance(duration, int | float) else "",
        "remote_addr": entry.get("remote_addr") or "",
        "error_kind": entry.get("error_kind", ""),
        "error": entry.get("error", ""),
        "excerpt": entry.get("response_excerpt") or "",
        "delivered_by": entry.get("delivered_by", ""),
    }


def timeline(attempt_log: Any, *, attempts: int = 0, requeue_count: int = 0) -> SafeString | str:
    """The timeline fragment, newest attempt last; a plain sentence when there is nothing to show.

    The attempt count and the timeline must agree: attempts of this generation that left no entry (rows
    written by hand, a crash mid-send) are said, not silently missing.
    """
    entries = [e for e in (attempt_log or []) if isinstance(e, dict)] if isinstance(attempt_log, list) else []
    logged = sum(1 for e in entries if (e.get("generation") or 0) == requeue_count and not not_attempted(e))
    unlogged = max(0, attempts - logged)
    if not entries and not unlogged:
        return "No attempts recorded."
    rows, previous = [], None
    for entry in entries:
        rows.append(_row(entry, previous))
        previous = rows[-1]["generation"]
    return fragment("attempt_timeline", rows=rows, unlogged=unlogged, attempts=attempts)
