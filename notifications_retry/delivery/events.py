"""The app's events: ``pin.notifications.dispatched.v1`` and ``pin.notifications.delivery-status.v1``.

Their payloads are built here and nowhere else; so are the outbox rows' writes after their insert
(:func:`mark_published` for the relay, :func:`prune_published_outbox` for housekeeping). Events are
inserted with their outcome (:mod:`.finalize`); unpublished events are never touched after that (the
outbox trigger refuses it too).

Two shapes, both here: the ``payload`` stored in an outbox row (built once, at the outcome), and the
``envelope`` the relay publishes (event id, topic, key, contract version, generation, payload). The
JSON Schema ``schemas/notification_dispatched.v1.json`` describes the envelope
(``schemas/notification_delivery_status.v1.json`` the delivery-status one's); both are public
(docs/contract.md).
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from importlib import resources
from typing import Any

from notifications_retry.models import CONTRACT_VERSION, DISPATCHED_TOPIC, Outbox
from notifications_retry.rules.event_ids import outbox_event_id

SENT = "Sent"
FAILED = "Failed"

SCHEMA_RESOURCE = "schemas/notification_dispatched.v1.json"
DELIVERY_STATUS_SCHEMA_RESOURCE = "schemas/notification_delivery_status.v1.json"
DELIVERY_STATES = ("delivered", "opened", "bounced", "complained")


def dispatched_payload(
    *,
    notification_id: uuid.UUID | str,
    tenant_id: uuid.UUID | str | None,
    channel: str,
    status: str,
    attempts: int,
    provider_message_id: str | None,
    error: str | None,
    error_kind: str | None,
    occurred_at: datetime,
    delivered_by: str | None = None,
) -> dict[str, Any]:
    """The event body (schema: ``schemas/notification_dispatched.v1.json``); the ids as UUIDs or as
    their text.

    ``delivered_by`` names the fallback channel that delivered a Sent notification after its own
    channel refused it (a failover); it is an optional addition to contract v1, present only then.
    """
    if status not in (SENT, FAILED):
        raise ValueError(f"dispatched events carry status Sent or Failed, got {status!r}")
    if delivered_by is not None and status != SENT:
        raise ValueError("only a Sent event names the channel that delivered it")
    payload = {
        "notification_id": str(notification_id),
        "tenant_id": str(tenant_id) if tenant_id else None,
        "channel": channel,
        "status": status,
        "attempts": attempts,
        "provider_message_id": provider_message_id,
        "error": error or None,
        "error_kind": error_kind or None,
        "occurred_at": occurred_at.isoformat(),
        "contract_version": CONTRACT_VERSION,
    }
    if delivered_by is not None:
        payload["delivered_by"] = delivered_by
    return payload


def delivery_status_payload(
    *,
    notification_id: uuid.UUID,
    tenant_id: uuid.UUID | None,
    channel: str,
    state: str,
    state_at: datetime,
    esp: str,
    provider_message_id: str,
    occurred_at: datetime,
) -> dict[str, Any]:
    """The delivery-status event body (schema: ``schemas/notification_delivery_status.v1.json``)."""
    if state not in DELIVERY_STATES:
        raise ValueError(f"delivery states are {', '.join(DELIVERY_STATES)}, got {state!r}")
    return {
        "notification_id": str(notification_id),
        "tenant_id": str(tenant_id) if tenant_id else None,
        "channel": channel,
        "state": state,
        "state_at": state_at.isoformat(),
        "esp": esp,
        "provider_message_id": provider_message_id,
        "occurred_at": occurred_at.isoformat(),
        "contract_version": CONTRACT_VERSION,
    }


def dispatched_event(*, generation: int, created_at: datetime, **payload_fields: Any) -> Outbox:
    """An unsaved outbox row for one outcome; ``generation`` is the record's requeue count."""
    payload = dispatched_payload(occurred_at=created_at, **payload_fields)
    return Outbox(
        event_id=outbox_event_id(DISPATCHED_TOPIC, payload["notification_id"], generation),
        topic=DISPATCHED_TOPIC,
        key=payload["notification_id"],
        contract_version=CONTRACT_VERSION,
        generation=generation,
        payload=payload,
        created_at=created_at,
    )


def envelope(event: Outbox) -> dict[str, Any]:
    """The event as published: what consumers receive and the schema describes."""
    return {
        "event_id": str(event.event_id),
        "topic": event.topic,
        "key": event.key,
        "contract_version": event.contract_version,
        "generation": event.generation,
        "created_at": event.created_at.isoformat(),
        "payload": event.payload,
    }


@functools.cache
def schema(resource: str = SCHEMA_RESOURCE) -> dict[str, Any]:
    """The JSON Schema of a published event (the dispatched one's by default), read from the package data."""
    text = resources.files("notifications_retry").joinpath(resource).read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


HEALTH_SCHEMA_RESOURCE = "schemas/channel_health.v1.json"


@functools.cache
def health_schema() -> dict[str, Any]:
    """The JSON Schema of a published ``pin.notifications.channel-health.v1`` event."""
    text = resources.files("notifications_retry").joinpath(HEALTH_SCHEMA_RESOURCE).read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def delivery_status_schema() -> dict[str, Any]:
    """The JSON Schema of a published ``pin.notifications.delivery-status.v1`` event."""
    return schema(DELIVERY_STATUS_SCHEMA_RESOURCE)


#: Rows deleted per statement: keeps each transaction short on a large outbox.
DELETE_CHUNK = 5000


def mark_published(ids: Sequence[int], now: datetime) -> int:
    """Mark the events ``ids`` published at ``now`` (those not marked already); returns how many."""
    return Outbox.objects.filter(pk__in=ids, published_at__isnull=True).update(published_at=now)


def prune_published_outbox(*, older_than: datetime, chunk: int = DELETE_CHUNK) -> int:
    """Delete published events published before ``older_than``; unpublished ones are never touched."""
    return sum(prune_published_outbox_batches(older_than=older_than, chunk=chunk))


def prune_published_outbox_batches(*, older_than: datetime, chunk: int = DELETE_CHUNK) -> Iterator[int]:
    """:func:`prune_published_outbox` one short transaction at a time: yields each one's deletions."""
    while True:
        ids = list(
            Outbox.objects.filter(published_at__isnull=False, published_at__lt=older_than)
            .order_by("id")
            .values_list("id", flat=True)[:chunk]
        )
        if not ids:
            return
        # The published_at filter again: the trigger refuses unpublished rows, never rely on that alone.
        deleted, _ = Outbox.objects.filter(pk__in=ids, published_at__isnull=False).delete()
        yield deleted
        if len(ids) < chunk:
            return
