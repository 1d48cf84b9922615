"""URLs of the example project: the admin (dead-letter triage) and Prometheus metrics."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from notifications_retry.observability import queue_health

queue_health.register()  # the queue-health gauges on /metrics, read from the database at each scrape

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("django_prometheus.urls")),  # /metrics
]
