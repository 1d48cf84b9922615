"""Settings for ``make bench``: the local server from DATABASE_URL, a dedicated benchmark database.

Logging is configured as a production deployment would (structlog JSON, INFO for the app) but
written to /dev/null, so the per-record log events cost what they cost in production: through the
stdlib ``logging`` module, or written by structlog itself (:func:`configure_logging`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import sys
from typing import Any

import dj_database_url
import orjson
import structlog

from notifications_retry.observability import logging as nr_logging

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
if importlib.util.find_spec("post_office") is not None:
    # django-post_office (the ``bench`` extra) is measured beside the worker; its mails go nowhere.
    INSTALLED_APPS.append("post_office")
    EMAIL_BACKEND = "django.core.mail.backends.dummy.EmailBackend"
    POST_OFFICE = {
        "BACKENDS": {"default": "django.core.mail.backends.dummy.EmailBackend"},
        "BATCH_SIZE": 200,
        "LOG_LEVEL": 0,
        "MESSAGE_ID_ENABLED": False,
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
NOTIFICATIONS_RETRY: dict[str, object] = {
    "CLOCK": "system",
    "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"],
    # The engine without HTTP (bench.engine_alone): an asynchronous provider that only waits.
    "PROVIDERS": {"bench_sleep": "bench.engine_alone.SleepProvider"},
}
# Worker subprocesses of the crash benchmark get a few settings more (a short lease grace) as JSON.
NOTIFICATIONS_RETRY.update(json.loads(os.environ.get("NR_BENCH_SETTINGS_JSON") or "{}"))


def _known_keys_only(values: dict[str, object]) -> dict[str, object]:
    """The app refuses unknown keys; the benchmark must keep running while settings come and go."""
    from notifications_retry.conf import RetrySettings

    known = {f.name for f in dataclasses.fields(RetrySettings)}
    return {key: value for key, value in values.items() if key in known}


NOTIFICATIONS_RETRY = _known_keys_only(NOTIFICATIONS_RETRY)

_shared: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    *nr_logging.processors(),  # the masking chain, as in the example project and the docs
]
LOG_LEVEL = os.environ.get("NR_BENCH_LOG_LEVEL", "INFO")


def configure_logging(pipeline: str) -> None:
    """Route structlog events through the stdlib ``logging`` module, or write them directly.

    ``stdlib``: the example project's route for processes other than workers (ProcessorFormatter, JSON).
    ``native``: what docs/observability.md recommends for ``retry_worker`` processes: structlog's
    filtering bound logger writing JSON lines itself, serialized by orjson. Loggers are not cached, so the
    benchmark can switch between drains (the worker binds its logger once a tick).
    """
    if pipeline == "stdlib":
        structlog.configure(
            processors=[*_shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
            logger_factory=structlog.stdlib.LoggerFactory(),
            wrapper_class=structlog.stdlib.BoundLogger,
            cache_logger_on_first_use=False,
        )
    elif pipeline == "native":
        structlog.configure(
            processors=[
                structlog.contextvars.merge_contextvars,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                *nr_logging.processors(),
                structlog.processors.JSONRenderer(serializer=orjson.dumps),
            ],
            wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, LOG_LEVEL)),
            logger_factory=structlog.BytesLoggerFactory(file=open(os.devnull, "wb")),  # noqa: SIM115
            cache_logger_on_first_use=False,
        )
    else:
        raise ValueError(f"unknown logging pipeline {pipeline!r} (stdlib or native)")


# A worker process the benchmarks start (``python -m django retry_worker``) logs as the example
# project's workers do and as docs/observability.md recommends for them; every other process, the
# benchmark's own included, starts on the stdlib route (in-process drains choose per drain).
configure_logging("native" if "retry_worker" in sys.argv else "stdlib")
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
        "notifications_retry": {"level": LOG_LEVEL, "propagate": True},
    },
}
