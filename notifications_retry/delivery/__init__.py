"""The only code that writes notification and outbox rows.

- :mod:`.claim` leases due rows for sending (and settles those that cannot be sent any more);
- :mod:`.finalize` applies outcomes and their outbox events under the claim token, and gives back
  leases that were never used;
- :mod:`.handoff` records the outcome of the monolith's own first send;
- :mod:`.cancel` and :mod:`.triage` are the operators' and the monolith's state changes.

The provider is always called with no transaction open: claim short, call, finalize short.
"""

from __future__ import annotations

from notifications_retry.delivery.claim import ChannelClaim, ClaimBatch, claim_due, claim_query
from notifications_retry.delivery.finalize import (
    MAX_ERROR_CHARS,
    CommitUnavailable,
    FinalizeReport,
    finalize,
    release,
)
from notifications_retry.outcomes import (
    EXHAUSTED,
    EXPIRED,
    RETRY,
    SENT,
    TERMINAL,
    UNDECODABLE,
    ClaimedRecord,
    Outcome,
    attempt_budget,
)

__all__ = [
    "EXHAUSTED",
    "EXPIRED",
    "MAX_ERROR_CHARS",
    "RETRY",
    "SENT",
    "TERMINAL",
    "UNDECODABLE",
    "ChannelClaim",
    "ClaimBatch",
    "ClaimedRecord",
    "CommitUnavailable",
    "FinalizeReport",
    "Outcome",
    "attempt_budget",
    "claim_due",
    "claim_query",
    "finalize",
    "release",
]
