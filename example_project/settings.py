"""Settings of the example project: a small monolith with notifications_retry installed.

The database is ``DATABASE_URL`` when set; otherwise an embedded PostgreSQL (the ``pgserver``
package) is started in ``./.pgdata`` so a newcomer needs no server to try the app.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import django
import structlog

import notifications_retry.observability.logging

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-project-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1").split(",")
USE_TZ = True
TIME_ZONE = "UTC"


def _database() -> dict[str, Any]:
    import dj_database_url

    url = os.environ.get("DATABASE_URL")
    if url:
        return dict(dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True))
    # Imported here so that a deployment with DATABASE_URL never needs pgserver installed.
    from example_project import embedded_postgres

    # The last process using the embedded server stops it at exit; `make demo-stop` stops a leftover.
    return dict(dj_database_url.parse(embedded_postgres.database_url(embedded_postgres.data_dir())))


DATABASES = {"default": _database()}
# A direct connection for the advisory locks when "default" goes through a pooler (docs/operations.md,
# PgBouncer): NOTIFICATIONS_RETRY_LOCK_DATABASE_URL names it, and the locks use it.
_LOCK_DATABASE_URL = os.environ.get("NOTIFICATIONS_RETRY_LOCK_DATABASE_URL")
if _LOCK_DATABASE_URL:
    import dj_database_url

    DATABASES["lock"] = dict(dj_database_url.parse(_LOCK_DATABASE_URL))

# Django's mail backend, which the django_email provider uses when a channel names none: e.g.
# DJANGO_EMAIL_BACKEND=django.core.mail.backends.smtp.EmailBackend with DJANGO_EMAIL_HOST/_PORT.
_SMTP_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
_EMAIL_BACKEND = os.environ.get("DJANGO_EMAIL_BACKEND", _SMTP_BACKEND)
_EMAIL_HOST = os.environ.get("DJANGO_EMAIL_HOST", "localhost")
_EMAIL_PORT = int(os.environ.get("DJANGO_EMAIL_PORT", "25"))
if django.VERSION[:2] >= (6, 1):
    # Django 6.1 replaces EMAIL_BACKEND and EMAIL_HOST/_PORT by the default entry of MAILERS.
    MAILERS = {
        "default": {
            "BACKEND": _EMAIL_BACKEND,
            "OPTIONS": {"host": _EMAIL_HOST, "port": _EMAIL_PORT} if _EMAIL_BACKEND == _SMTP_BACKEND else {},
        }
    }
else:
    EMAIL_BACKEND = _EMAIL_BACKEND
    EMAIL_HOST = _EMAIL_HOST
    EMAIL_PORT = _EMAIL_PORT

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_prometheus",
    "pgtrigger",
    "notifications_retry",
    "example_project.demo",
]
MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]
ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The app's settings: every key and its default is in docs/settings.md.
NOTIFICATIONS_RETRY: dict[str, Any] = {
    "BATCH_SIZE": int(os.environ.get("NR_BATCH_SIZE", "200")),
    # Workers share a lane's backlog by partition (docs/operations.md, "Scaling out"): at least the
    # number of worker replicas; 1 (the default) is one owner for the whole lane.
    "PARTITIONS": int(os.environ.get("NOTIFICATIONS_RETRY_PARTITIONS", "1")),
    "ATTEMPTS_BY_TYPE": {"transactional": 8, "marketing": 3},
    # The webhook allowlist: comma-separated hosts, IPs or CIDRs, e.g. "127.0.0.1" for a local
    # receiver in a demo. Unset or empty: no internal address is allowed (docs/providers.md).
    "WEBHOOK_ALLOWED_HOSTS": [
        host.strip()
        for host in os.environ.get("NOTIFICATIONS_RETRY_WEBHOOK_ALLOWED_HOSTS", "").split(",")
        if host.strip()
    ],
    # The outbox relay's publisher (log, http, rabbitmq, nats or a dotted path) and its options as a
    # JSON object, e.g. '{"url": "amqp://guest:guest@127.0.0.1:5672/", "exchange": "events"}'.
    "OUTBOX_PUBLISHER": os.environ.get("NOTIFICATIONS_RETRY_OUTBOX_PUBLISHER", "log"),
    "OUTBOX_PUBLISHER_OPTIONS": json.loads(
        os.environ.get("NOTIFICATIONS_RETRY_OUTBOX_PUBLISHER_OPTIONS") or "{}"
    ),
}
if _LOCK_DATABASE_URL:
    NOTIFICATIONS_RETRY["LOCK_DATABASE_ALIAS"] = "lock"

# Logging: the library only emits events; the project decides how they look. Unless LOG_FORMAT says
# otherwise, key=value lines for a person at a terminal and JSON lines for anything else (a pipe, a file,
# a container's log collector), as structlog's "Logging Best Practices" suggest: a worker's stderr is
# read by a machine, and rendering one JSON line costs a fraction of a console line.
LOG_FORMAT = os.environ.get("LOG_FORMAT") or ("console" if sys.stderr.isatty() else "json")
_shared_processors: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    # Recipients, tokens and bodies are masked before any renderer sees them.
    *notifications_retry.observability.logging.processors(),
]
_LOG_LEVEL = os.environ.get("NR_LOG_LEVEL", "INFO")
_renderer: Any = (
    structlog.processors.JSONRenderer()
    if LOG_FORMAT == "json"
    else structlog.dev.ConsoleRenderer(colors=False)
)
if "retry_worker" in sys.argv:
    # A worker logs one event per record: structlog writes its lines itself (same masking, same
    # stream as the handler below) instead of routing each through the stdlib logging module
    # (docs/observability.md, "Logging in retry_worker processes"). JSON lines are serialized by orjson
    # and written as bytes, structlog's fast route. Django's and psycopg's own records still go through
    # LOGGING.
    _worker_renderer: Any = _renderer
    _worker_logger_factory: Any = structlog.WriteLoggerFactory(sys.stderr)
    if LOG_FORMAT == "json":
        import orjson  # installed with the app

        _worker_renderer = structlog.processors.JSONRenderer(serializer=orjson.dumps)
        _worker_logger_factory = structlog.BytesLoggerFactory(sys.stderr.buffer)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *notifications_retry.observability.logging.processors(),
            _worker_renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(_LOG_LEVEL)),
        logger_factory=_worker_logger_factory,
        cache_logger_on_first_use=True,
    )
else:
    structlog.configure(
        processors=[
            *_shared_processors,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "structured": {
            "()": structlog.stdlib.ProcessorFormatter,
            "processors": [
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                _renderer,
            ],
            "foreign_pre_chain": _shared_processors,
        },
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "structured"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "WARNING")},
    "loggers": {
        "notifications_retry": {"level": _LOG_LEVEL, "propagate": True},
    },
}
