"""OpenTelemetry spans when ``opentelemetry-api`` is installed; no-ops otherwise.

The library never configures a tracer provider: the project does (SDK, exporter, sampling). Without
one, the API's default provider makes every span a cheap non-recording one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

try:  # pragma: no cover - exercised in both configurations by the test matrix
    from opentelemetry import context as _otel_context
    from opentelemetry import trace as _otel_trace
except ImportError:  # pragma: no cover
    _otel_trace = None  # type: ignore[assignment]
    _otel_context = None  # type: ignore[assignment]

__all__ = ["NO_SPAN", "TRACER_NAME", "current_context", "enabled", "set_attributes", "span"]

TRACER_NAME = "notifications_retry"


def _clean(attributes: dict[str, Any]) -> dict[str, Any]:
    # OTel attribute values must be str/bool/int/float: ids (UUIDs) become text, None is dropped.
    return {
        k: v if isinstance(v, str | bool | int | float) else str(v)
        for k, v in attributes.items()
        if v is not None
    }


#: What :func:`span` yields when tracing is off, for callers that skip building a span's attributes.
NO_SPAN: contextlib.nullcontext[None] = contextlib.nullcontext()


def enabled() -> bool:
    """Whether spans are recorded: OpenTelemetry is installed and the project has set a provider.

    Until then every span is a non-recording one, and building two per send (attributes, context
    switches) cost 14 % of a latency-bound drain's CPU for nothing.
    """
    if _otel_trace is None:
        return False
    provider = _otel_trace.get_tracer_provider()
    return not isinstance(provider, _otel_trace.ProxyTracerProvider | _otel_trace.NoOpTracerProvider)


def current_context() -> Any:
    """The active trace context (to parent spans started in another thread), or None without OTel."""
    if _otel_context is None:
        return None
    return _otel_context.get_current()


@contextlib.contextmanager
def span(name: str, *, parent: Any = None, **attributes: Any) -> Iterator[Any]:
    """A span named ``name`` with ``attributes`` (None values dropped); yields it, or None.

    ``parent`` is a context from :func:`current_context`: worker threads do not inherit the tick's
    context, so the per-record span is parented explicitly.
    """
    if not enabled():
        yield None
        return
    assert _otel_trace is not None
    tracer = _otel_trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(name, context=parent, attributes=_clean(attributes)) as current:
        yield current


def set_attributes(current: Any, **attributes: Any) -> None:
    """Add attributes (None values dropped) to a span from :func:`span`; a no-op for None."""
    if current is None:
        return
    current.set_attributes(_clean(attributes))
