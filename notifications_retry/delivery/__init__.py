"""The only code that writes notification and outbox rows.

- :mod:`.create` inserts a new Pending notification (``api.create_notification``);
- :mod:`.claim` leases due rows for sending (and settles those that cannot be sent any more), on
  Django's connection or an asynchronous one (the worker's claims of asynchronous channels), with
  its statements and plan in :mod:`.claim_statements`, with the size and shape limits every claimed
  row is held to and the give-back of the leases that lapsed first (their worker died);
- :mod:`.finalize` applies outcomes and their outbox events under the claim token, on Django's
  connection or an asynchronous one (the worker's commits on its send loop), and gives back leases
  that were never used;
- :mod:`.handoff` records the outcome of the monolith's own first send;
- :mod:`.cancel` and :mod:`.triage` are the operators' and the monolith's state changes, and
  :mod:`.recovery` runs a recovery job's requeues in chunks;
- :mod:`.retention` deletes old Sent rows in batches, when ``SENT_RETENTION_DAYS`` is set (housekeeping);
- :mod:`.unreadable_times` sets aside, as dead letters, waiting rows whose times Python cannot read
  (written past the API), and clears those times;
- :mod:`.suppression` reads and writes the suppression list (the claim's one lookup per batch);
- :mod:`.esp_reports` applies what an ESP reported after a send: delivery status, its outbox event,
  the suppression it calls for;
- :mod:`.health` counts each batch's provider calls into a channel's health window and applies its
  automatic changes (and the operator's re-enable), with their outbox events;
- :mod:`.session` runs a transaction's statements, written once as data, on Django's cursor or an
  asynchronous psycopg one, bounds the transactions and keeps the connections alive (it writes no
  rows);
- :mod:`.wakeup` is what a waiting worker asks: LISTEN, and when its next row falls due (it writes no
  rows);
- :mod:`.events` builds the outbox events' payloads (``dispatched``, ``delivery-status``) the writers
  store, marks events published (the relay) and prunes old published ones (housekeeping);
- :mod:`.recovery_filter` reads a recovery job's filter from an operator's words.

The provider is always called with no transaction open: claim short, call, finalize short.
"""

from __future__ import annotations

from notifications_retry.delivery.claim import (
    ChannelClaim,
    ClaimBatch,
    ClaimRequest,
    Partitions,
    TenantCaps,
    claim_due,
    claim_due_async,
    claim_query,
)
from notifications_retry.delivery.finalize import (
    MAX_ERROR_CHARS,
    CommitUnavailable,
    FinalizeReport,
    NeedsDjango,
    finalize,
    finalize_async,
    release,
)
from notifications_retry.rules.outcomes import (
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
    "ClaimRequest",
    "ClaimedRecord",
    "CommitUnavailable",
    "FinalizeReport",
    "NeedsDjango",
    "Outcome",
    "Partitions",
    "TenantCaps",
    "attempt_budget",
    "claim_due",
    "claim_due_async",
    "claim_query",
    "finalize",
    "finalize_async",
    "release",
]
