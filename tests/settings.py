"""Settings for the test suite: a real PostgreSQL from DATABASE_URL (never SQLite)."""

from __future__ import annotations

import json
import os

import dj_database_url
import django

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]

_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
DATABASES = {"default": dj_database_url.parse(_url, conn_max_age=0)}
# A per-run test database, so concurrent runs on one server do not collide; subprocess workers
# started by tests receive the concrete name through NR_TEST_DATABASE_NAME.
# NR_TEST_DATABASE_PREFIX prefixes every database the suite creates (tests.support.databases).
_prefix = os.environ.get("NR_TEST_DATABASE_PREFIX", "")
DATABASES["default"]["TEST"] = {
    "NAME": os.environ.get("NR_TEST_DATABASE_NAME", f"{_prefix}test_nr_{os.getpid()}")
}
if os.environ.get("NR_TEST_DATABASE_NAME"):
    DATABASES["default"]["NAME"] = os.environ["NR_TEST_DATABASE_NAME"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "pgtrigger",
    "django_prometheus",
    "notifications_retry",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
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
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
NOTIFICATIONS_RETRY: dict[str, object] = {}
# Worker subprocesses started by the process tests get their settings as JSON (small leases, test providers).
if os.environ.get("NR_TEST_SETTINGS_JSON"):
    NOTIFICATIONS_RETRY = json.loads(os.environ["NR_TEST_SETTINGS_JSON"])
# Django 6.1 deprecates EMAIL_BACKEND for MAILERS: a project on 6.1 defines its mailers (the test
# runner swaps each for the memory backend).
if django.VERSION[:2] >= (6, 1):
    MAILERS = {"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast hashing: tests only
# The process test of a frozen worker: it stops itself inside its first finalize transaction.
if os.environ.get("NR_TEST_FREEZE_IN_FINALIZE"):
    INSTALLED_APPS.append("tests.support.freeze_in_finalize.FreezeInFinalizeConfig")
# A worker subprocess of a scenario written around a shorter internal bound sets that constant.
if os.environ.get("NR_TEST_CONSTANTS_JSON"):
    INSTALLED_APPS.append("tests.support.patched_constants.PatchedConstantsConfig")
