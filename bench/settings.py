"""Settings for ``make bench``: the local server from DATABASE_URL, a dedicated benchmark database.

Logging is configured as a production deployment would (structlog JSON, INFO for the app) but
written to /dev/null, so the per-record log events cost what they cost in production.
"""

from __future__ import annotations

import os

import dj_database_url
import structlog

SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]

BENCH_DATABASE_NAME = os.environ.get("NR_BENCH_DATABASE_NAME", "nr_bench")
_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
DATABASES = {"default": dj_database_url.parse(_url, conn_max_age=None)}
DATABASES["default"]["NAME"] = BENCH_DATABASE_NAME

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "pgtrigger",
    "notifications_retry",
]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
NOTIFICATIONS_RETRY: dict[str, object] = {
    "CLOCK": "system",
    "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"],
    "WORKER_THREADS": 64,
}

_shared = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]
structlog.configure(
    processors=[*_shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
    logger_factory=structlog.stdlib.LoggerFactory(),
    wrapper_class=structlog.stdlib.BoundLogger,
    cache_logger_on_first_use=True,
)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {
            "()": structlog.stdlib.ProcessorFormatter,
            "processors": [
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.JSONRenderer(),
            ],
            "foreign_pre_chain": _shared,
        },
    },
    "handlers": {"null": {"class": "logging.FileHandler", "filename": os.devnull, "formatter": "json"}},
    "root": {"handlers": ["null"], "level": "WARNING"},
    "loggers": {
        "notifications_retry": {"level": os.environ.get("NR_BENCH_LOG_LEVEL", "INFO"), "propagate": True},
    },
}
