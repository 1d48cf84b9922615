"""OpenTelemetry spans when ``opentelemetry-api`` is installed; no-ops otherwise."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

try:  # pragma: no cover - exercised in both configurations by the test matrix
    from opentelemetry import trace as _otel_trace
except ImportError:  # pragma: no cover
    _otel_trace = None  # type: ignore[assignment]

TRACER_NAME = "notifications_retry"


@contextlib.contextmanager
def span(name: str, **attributes: Any) -> Iterator[Any]:
    """A span named ``name`` with ``attributes`` (None values dropped); yields it, or None."""
    if _otel_trace is None:
        yield None
        return
    tracer = _otel_trace.get_tracer(TRACER_NAME)
    clean = {k: v for k, v in attributes.items() if v is not None}
    with tracer.start_as_current_span(name, attributes=clean) as current:
        yield current
