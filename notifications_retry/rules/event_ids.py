"""Outbox event ids, derived from the outcome they announce: one id per (topic, key, generation).

An event's id is the RFC 4122 version-3 (MD5, name-based) UUID of ``topic NUL key NUL generation``
under :data:`NAMESPACE`. The database computes the same value with the SQL function
``nr_outbox_event_id(topic, key, generation)`` (created by migration 0008): the worker's bulk insert
calls it, and the outbox's insert trigger refuses a new event whose id is anything else. The id
stays what consumers deduplicate by, and, being a function of the outcome, its unique index alone
keeps a second event for the same outcome out — no wide (topic, key, generation) index to write.

NUL separates the parts because PostgreSQL text cannot contain it: two different outcomes never
share a name. Events written before migration 0008 keep their random ids (a published id never
changes); a partial unique index over exactly those rows keeps one event per outcome among them,
and the insert trigger checks new events against them.
"""

from __future__ import annotations

import uuid

from django.db import models

#: Fixed for ever: changing it would give an outcome's event a second id.
NAMESPACE = uuid.UUID("6f1c1d1e-8a43-5b55-9d0e-3c2b8f6f0a71")

#: The SQL function migration 0008 creates; same arguments, same result as :func:`outbox_event_id`.
SQL_FUNCTION = "nr_outbox_event_id"


def outbox_event_id(topic: str, key: str, generation: int) -> uuid.UUID:
    """The event id of the outbox event for one outcome (what the database's function returns)."""
    return uuid.uuid3(NAMESPACE, f"{topic}\0{key}\0{int(generation)}")


#: The id the database derives for an outbox row's outcome, as a query expression; rows with another id
#: are the events written before migration 0008.
DERIVED_EVENT_ID = models.Func(
    models.F("topic"),
    models.F("key"),
    models.F("generation"),
    function=SQL_FUNCTION,
    output_field=models.UUIDField(),
)
