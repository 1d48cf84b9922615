"""What an HTTP answer other than 2xx means for a send, for every provider that posts: the webhook's
receiver and an ESP's API (the table of docs/contract.md), and how long its ``Retry-After`` asks to wait.

One home for both providers: :mod:`.webhook` and :mod:`.email_errors` classify an answer here, and a
change of the table changes both.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.conf import settings as django_settings

from notifications_retry.rules.backoff import retry_after_seconds

from ..conf import RETRY_AFTER_MAX_SECONDS_LIMIT, SETTINGS_NAME, RetrySettings, get_settings
from ..exceptions import PermanentProviderError, ProviderError, ProviderThrottled, RetryableProviderError


def status_error(status: int, retry_after: str | None, reason: str) -> ProviderError:
    """What an HTTP answer other than 2xx means, for every HTTP provider (the table of docs/contract.md).

    ``retry_after`` is the answer's ``Retry-After`` header, honoured for 429 and 503. Ambiguity: 429
    and 503 refuse a request before processing it, so nothing went out and a fallback may be tried.
    Every other answer is ambiguous, the 4xx included: the receiver may have acted before refusing
    (a 409 for an ``Idempotency-Key`` still in progress means the first request may be delivering).
    A permanent failure never fails over, so nothing is lost by the safe answer there.
    """
    if status == 429:
        return ProviderThrottled(
            reason, kind="throttled", retry_after=parse_retry_after(retry_after), ambiguous=False
        )
    if status == 503:
        return RetryableProviderError(
            reason, kind="http_5xx", retry_after=parse_retry_after(retry_after), ambiguous=False
        )
    if status == 408:
        return RetryableProviderError(reason, kind="timeout")
    if status >= 500:
        return RetryableProviderError(reason, kind="http_5xx")
    if 400 <= status < 500:
        return PermanentProviderError(reason, kind="http_4xx")
    return PermanentProviderError(f"{reason} (redirects are not followed)", kind="http_unexpected")


def parse_retry_after(
    value: str | None, now: datetime | None = None, *, maximum: float | None = None
) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date); None if absent/bad.

    Clamped to ``[0, maximum]`` (default: the ``RETRY_AFTER_MAX_SECONDS`` setting): an absurd value
    (``999999999999``, a date in year 9999) waits the maximum and never raises.
    """
    return retry_after_seconds(
        value, now=now or datetime.now(UTC), maximum=retry_after_max() if maximum is None else maximum
    )


#: (the NOTIFICATIONS_RETRY object read, the Retry-After maximum) — see retry_after_max.
_max_cache: list[tuple[object, float]] = []


def retry_after_max() -> float:
    """The ``RETRY_AFTER_MAX_SECONDS`` setting, read again whenever ``NOTIFICATIONS_RETRY`` is replaced.

    An answer may need it on every send; building the whole settings object per send cost a tenth of the
    client's CPU. ``override_settings`` (and a settings reload) replace the dict, which is what is
    compared.
    """
    raw = getattr(django_settings, SETTINGS_NAME, None)
    if _max_cache and _max_cache[0][0] is raw:
        return _max_cache[0][1]
    try:
        maximum = float(get_settings().RETRY_AFTER_MAX_SECONDS)
    except (TypeError, ValueError):  # settings check E001 reports a bad one; a send still needs a bound
        maximum = RetrySettings.RETRY_AFTER_MAX_SECONDS
    if not 0 < maximum <= RETRY_AFTER_MAX_SECONDS_LIMIT:
        maximum = RetrySettings.RETRY_AFTER_MAX_SECONDS
    _max_cache[:] = [(raw, maximum)]
    return maximum


__all__ = ["parse_retry_after", "retry_after_max", "status_error"]
