"""The queue-health gauges on a web process's ``/metrics``, read from the database when scraped.

The worker sets its backlog gauges at the end of each tick, on its own port: when every worker is down
the very gauge that says so stops. :class:`QueueHealthCollector`, registered in the web process
(:func:`register`, README step 5), reads the same figures (``NotificationEntity.objects.backlog()``,
the statement the worker runs with its heartbeat, on the same partial indexes) at scrape time, so
django-prometheus's ``/metrics`` carries them whatever the workers do.

Cheap and bounded: one reading serves every scrape for ``max_age_seconds`` (10 s: a Prometheus and a
second one, or several dashboards, cost one reading), and it runs under a ``statement_timeout`` of its
own (2 s). A reading that fails or times out yields ``notifications_retry_queue_health_up 0`` and no
figures, never an error page: the rest of ``/metrics`` still serves.

In a process that has the worker's metric objects (``retry_worker``), the collector yields nothing:
those gauges, set each tick, are that process's figures under the same names, and a name must appear
once in an exposition.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.utils import timezone
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["GAUGES", "UP", "QueueHealthCollector", "register"]

logger = logging.getLogger(__name__)

#: (metric name, help, the :class:`~notifications_retry.models.Backlog` field it reads).
#: The first three are the worker's gauges of the same names (observability/metrics.py).
GAUGES = (
    ("notifications_failed_backlog_gauge", "Failed records waiting for a retry.", "failed_backlog"),
    ("notifications_retry_due_backlog", "Records due now.", "due"),
    (
        "notifications_retry_oldest_due_age_seconds",
        "Age of the oldest due record (lag).",
        "oldest_due_age_seconds",
    ),
    (
        "notifications_retry_dead_letters_unresolved",
        "Dead letters not triaged yet (neither requeued nor discarded).",
        "dead_letters_unresolved",
    ),
)
UP = "notifications_retry_queue_health_up"
_WORKER_METRICS = "notifications_retry.observability.metrics"


@dataclasses.dataclass(frozen=True)
class _Reading:
    taken: float  # monotonic
    values: dict[str, float] | None  # None: the database could not be read


class QueueHealthCollector(Collector):
    """A prometheus_client collector of the queue-health gauges (see the module's docstring)."""

    def __init__(
        self,
        *,
        max_age_seconds: float = 10.0,
        statement_timeout_ms: int = 2000,
        monotonic: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = timezone.now,
        worker_metrics_loaded: Callable[[], bool] = lambda: _WORKER_METRICS in sys.modules,
    ) -> None:
        self.max_age_seconds = max_age_seconds
        self.statement_timeout_ms = int(statement_timeout_ms)
        self._monotonic = monotonic
        self._now = now
        self._worker_metrics_loaded = worker_metrics_loaded
        self._reading: _Reading | None = None
        self._lock = threading.Lock()  # threaded servers: one reading at a time, shared

    def describe(self) -> list[Any]:
        # No names claimed at registration: in a process that also loads the worker's metric objects
        # (same names), claiming them would make that registration fail; collect() yields nothing there.
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The gauges from a reading at most ``max_age_seconds`` old, and whether it succeeded."""
        if self._worker_metrics_loaded():
            return
        values = self._current()
        yield GaugeMetricFamily(
            UP,
            "1 when the queue-health gauges could be read at this scrape.",
            value=1 if values is not None else 0,
        )
        if values is None:
            return
        for name, documentation, field in GAUGES:
            yield GaugeMetricFamily(name, documentation, value=values[field])

    def _current(self) -> dict[str, float] | None:
        with self._lock:
            reading = self._reading
            if reading is None or self._monotonic() - reading.taken >= self.max_age_seconds:
                reading = _Reading(self._monotonic(), self._read())
                self._reading = reading
            return reading.values

    def _read(self) -> dict[str, float] | None:
        from notifications_retry.models import NotificationEntity

        try:
            with transaction.atomic(), connection.cursor() as cursor:
                # Bounded: a slow count must not hold a web worker (or pile up behind scrapes).
                cursor.execute(f"SET LOCAL statement_timeout = {self.statement_timeout_ms}")
                figures = NotificationEntity.objects.backlog(self._now())
        except DatabaseError as exc:
            logger.warning("queue-health-unreadable: %s", exc)
            return None
        return {field: float(getattr(figures, field)) for _, _, field in GAUGES}


_registered: dict[int, QueueHealthCollector] = {}
_registered_lock = threading.Lock()


def register(registry: CollectorRegistry = REGISTRY, **options: Any) -> QueueHealthCollector:
    """Register a :class:`QueueHealthCollector` in ``registry`` once (later calls return the same one)."""
    with _registered_lock:
        collector = _registered.get(id(registry))
        if collector is None:
            collector = QueueHealthCollector(**options)
            registry.register(collector)
            _registered[id(registry)] = collector
        return collector
