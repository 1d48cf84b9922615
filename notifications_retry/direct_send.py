"""One notification sent now from synchronous code, outside the worker: :func:`api.send_now`'s work.

Lease the fresh row, call its channel's provider with no transaction open, and settle the outcome under
the lease, as the worker does for a claimed row; every row write is :mod:`notifications_retry.delivery`'s.
"""

from __future__ import annotations

import random
import time
import uuid

from django.db import connection

from notifications_retry.conf import get_settings
from notifications_retry.delivery.finalize import release
from notifications_retry.delivery.handoff import lease_fresh, settle_leased, settle_suppressed
from notifications_retry.exceptions import ChannelConfigurationError, InvalidTransition
from notifications_retry.models import ChannelConfig, NotificationEntity
from notifications_retry.observability.excerpts import masked
from notifications_retry.providers import (
    OutgoingMessage,
    Provider,
    SendResult,
    channel_problems,
    get_provider_class,
)
from notifications_retry.rules.outcomes import NO_ANSWER, ClaimedRecord, Failure, evidence_of, failure_of
from notifications_retry.runtime.asyncio_bridge import run_sync
from notifications_retry.runtime.clock import default_clock

__all__ = ["send_now"]


def send_now(pk: uuid.UUID, *, rng: random.Random | None = None) -> NotificationEntity:
    """Lease, send and settle the fresh notification ``pk``; see :func:`notifications_retry.api.send_now`."""
    if connection.in_atomic_block:
        raise InvalidTransition("send_now calls a provider: it must not run inside a database transaction")
    clock = default_clock(get_settings().CLOCK)
    stopped = settle_suppressed(pk, now=clock.now())
    if stopped is not None:
        return NotificationEntity.objects.get(pk=stopped.record.id)
    record, channel = lease_fresh(pk, now=clock.now())
    failure: Failure | None = None
    message_id: str | None = None
    provider = _provider_or_release(record, channel)
    started = time.monotonic()
    try:
        result = _call_once(provider, OutgoingMessage.of(record, channel.key))
        message_id, evidence = result.provider_message_id, result.evidence or NO_ANSWER
    except Exception as exc:
        failure = failure_of(exc)
        evidence = masked(evidence_of(exc), recipient=record.recipient, payload=record.payload)
    finally:
        provider.close()
    settle_leased(
        record,
        channel,
        failure=failure,
        provider_message_id=message_id,
        now=clock.now(),
        rng=rng or random.Random(),
        evidence=evidence,
        duration_ms=(time.monotonic() - started) * 1000,
    )
    return NotificationEntity.objects.get(pk=record.id)


def _provider_or_release(record: ClaimedRecord, channel: ChannelConfig) -> Provider:
    """The channel's provider, built under the same guard as the worker's channel load.

    A channel row that cannot work (an unknown provider key, options raw SQL made malformed) is the
    channel's problem, not the row's: the lease is given back with its attempt, the row waits for the
    channel to be fixed as the worker leaves it waiting, and the caller gets a clear error.
    """
    problems = channel_problems(channel.provider_key, channel.options)
    if not problems:
        try:
            return get_provider_class(channel.provider_key)(channel.settings())
        except Exception as exc:
            problems = [f"{type(exc).__name__}: {exc}"]
    release([record])
    raise ChannelConfigurationError(f"channel {channel.key!r} cannot send: {'; '.join(problems)}")


def _call_once(provider: Provider, message: OutgoingMessage) -> SendResult:
    """One call from synchronous code: ``send`` when the provider has it, else ``send_async`` on a
    loop of its own (the provider's connections are released on that loop before it closes)."""
    if type(provider).send is not Provider.send:
        return provider.send(message)

    async def call() -> SendResult:
        try:
            return await provider.send_async(message)
        finally:
            provider.close()

    return run_sync(call())
