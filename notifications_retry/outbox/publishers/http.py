"""The ``http`` publisher: POST each event as JSON, its key in a header, retrying with backoff."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx

from notifications_retry.outbox.publishers.base import Publisher, PublishError
from notifications_retry.rules.backoff import exponential_delay, retry_after_seconds

#: Headers of every request: consumers partition by the key and drop duplicates by the event id.
KEY_HEADER = "X-Event-Key"
EVENT_ID_HEADER = "X-Event-Id"
TOPIC_HEADER = "X-Event-Topic"
IDEMPOTENCY_HEADER = "Idempotency-Key"

#: Answers worth repeating: the endpoint may come back. Anything else non-2xx is a refusal.
RETRIABLE_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})

DEFAULTS: dict[str, Any] = {
    "timeout_seconds": 10.0,
    "retries": 3,
    "backoff_seconds": 0.5,
    "backoff_cap_seconds": 10.0,
    "headers": {},
}


class HttpPublisher(Publisher):
    """POST ``options["url"]``; 2xx accepts the event. Options: see ``DEFAULTS`` and docs/events.md."""

    name: ClassVar[str] = "http"

    def __init__(
        self, options: Mapping[str, Any] | None = None, *, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        super().__init__({**DEFAULTS, **dict(options or {})})
        problems = self.options_problems(self.options)
        if problems:
            raise ValueError("http publisher: " + "; ".join(problems))
        self.url: str = self.options["url"]
        self.retries = int(self.options["retries"])
        self.backoff = float(self.options["backoff_seconds"])
        self.backoff_cap = float(self.options["backoff_cap_seconds"])
        self.sleep = sleep
        self.client = httpx.Client(
            timeout=float(self.options["timeout_seconds"]),
            headers={"Content-Type": "application/json", **dict(self.options["headers"])},
            follow_redirects=False,
        )

    @classmethod
    def options_problems(cls, options: Mapping[str, Any]) -> list[str]:
        """Require an http(s) URL; numbers in range."""
        problems = []
        url = options.get("url")
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            problems.append(f"'url' must be an http(s) URL, got {url!r}")
        values = {**DEFAULTS, **dict(options)}
        retries = values["retries"]
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            problems.append(f"'retries' must be an integer >= 0, got {retries!r}")
        for name in ("timeout_seconds", "backoff_seconds", "backoff_cap_seconds"):
            value = values[name]
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                problems.append(f"{name!r} must be a number > 0, got {value!r}")
        if not isinstance(values["headers"], Mapping):
            problems.append("'headers' must be a mapping of header names to values")
        unknown = sorted(set(options) - set(DEFAULTS) - {"url"})
        if unknown:
            problems.append(f"unknown option(s) {', '.join(unknown)}")
        return problems

    def publish(self, event: Mapping[str, Any]) -> None:
        """POST the event; retry transport errors and retriable statuses with capped exponential backoff."""
        body = json.dumps(event, separators=(",", ":"), sort_keys=True).encode()
        headers = {
            KEY_HEADER: str(event["key"]),
            EVENT_ID_HEADER: str(event["event_id"]),
            IDEMPOTENCY_HEADER: str(event["event_id"]),
            TOPIC_HEADER: str(event["topic"]),
        }
        last = ""
        retry_after: float | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                self.sleep(self._delay(attempt, retry_after))
            retry_after = None
            try:
                response = self.client.post(self.url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if 200 <= response.status_code < 300:
                return
            last = f"HTTP {response.status_code}"
            if response.status_code not in RETRIABLE_STATUSES:
                # The endpoint answered and refused this event: other keys may still go through.
                raise PublishError(f"{self.url} refused event {event['event_id']}: {last}")
            retry_after = retry_after_seconds(
                response.headers.get("retry-after"), now=datetime.now(UTC), maximum=self.backoff_cap
            )
        raise PublishError(
            f"{self.url} unavailable after {self.retries + 1} attempt(s): {last}", endpoint_down=True
        )

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        delay = exponential_delay(attempt, self.backoff, self.backoff_cap)
        if retry_after is not None:
            delay = min(self.backoff_cap, max(delay, retry_after))
        return delay

    def close(self) -> None:
        """Close the HTTP client."""
        self.client.close()
