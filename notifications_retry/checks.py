"""System checks ``notifications_retry.E00x`` / ``W00x`` (the table is in docs/settings.md).

Two checks open a connection. ``check_channels`` reads the channels on plain ``check`` too (and on every
command that runs checks), says so when the database cannot be read (W006) and stays silent until the
table exists (``migrate`` runs checks before creating it). ``check_lock_session`` runs only when asked
for databases (``check --database``, ``migrate``): it opens the lock's own connection and proves it
direct. The other checks read settings only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils.module_loading import import_string

from notifications_retry.exceptions import first_line

from .conf import RetrySettings, get_settings, settings_problems
from .exceptions import ChannelConfigurationError

#: Default ports of transaction poolers: 6432 PgBouncer (also Odyssey's and PgCat's), 6543 Supavisor's
#: transaction mode. Strong evidence, not proof, that an alias goes through a pooler.
POOLER_PORTS = {"6432": "PgBouncer's default port", "6543": "Supavisor's transaction-pooling port"}

#: Parts of host names that name a pooler: a service called ``pgbouncer``, Supabase's and Neon's
#: ``…pooler…`` endpoints, ``supavisor``, ``pgcat``, ``odyssey``, and AWS RDS Proxy's ``….proxy-…``.
#: Weaker evidence than a port (a name is only a name): a warning, W007.
POOLER_HOST_MARKS = ("pgbouncer", "pooler", "supavisor", "pgcat", "odyssey", ".proxy-")


def _settings() -> tuple[RetrySettings | None, list[CheckMessage]]:
    try:
        conf = get_settings()
    except (ImproperlyConfigured, TypeError) as exc:
        return None, [Error(str(exc), id="notifications_retry.E001")]
    problems = settings_problems(conf)
    return conf, [Error(f"NOTIFICATIONS_RETRY: {p}", id="notifications_retry.E001") for p in problems]


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E001 settings of the wrong type or range; W003 values that work against each other."""
    conf, messages = _settings()
    if conf is None or messages:
        return messages
    if conf.MAX_DURATION_SECONDS >= conf.INTERVAL_SECONDS:
        messages.append(
            Warning(
                f"NOTIFICATIONS_RETRY: MAX_DURATION_SECONDS ({conf.MAX_DURATION_SECONDS:g}) is not below "
                f"INTERVAL_SECONDS ({conf.INTERVAL_SECONDS:g}): a long tick runs into the next one.",
                hint="Keep MAX_DURATION_SECONDS well below INTERVAL_SECONDS (defaults: 45 and 60).",
                id="notifications_retry.W003",
            )
        )
    return messages


@register()
def check_database(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E002 PostgreSQL is required; E005 the lock alias must exist; E004/E006 the lock must bypass poolers."""
    conf, problems = _settings()
    alias = conf.LOCK_DATABASE_ALIAS if conf is not None and not problems else "default"
    messages: list[CheckMessage] = []
    for name in dict.fromkeys(["default", alias]):
        if name not in connections.settings:
            messages.append(
                Error(
                    f"NOTIFICATIONS_RETRY: LOCK_DATABASE_ALIAS {name!r} is not in DATABASES",
                    hint=f"Known aliases: {', '.join(sorted(connections.settings))}.",
                    id="notifications_retry.E005",
                )
            )
            continue
        vendor = connections[name].vendor  # the wrapper is built lazily: no connection is opened
        if vendor != "postgresql":
            messages.append(
                Error(
                    "notifications_retry requires PostgreSQL (advisory locks, SKIP LOCKED, triggers); "
                    f"database {name!r} is {vendor}",
                    id="notifications_retry.E002",
                )
            )
    if conf is not None and not problems and alias in connections.settings:
        messages.extend(_lock_alias_messages(conf, alias, connections.settings[alias]))
    return messages


def _lock_alias_messages(conf: RetrySettings, alias: str, db: Mapping[str, Any]) -> list[CheckMessage]:
    # A session advisory lock lives on one server connection. Behind a transaction pooler (or in a
    # client-side pool that hands connections back without closing them) the "owner" changes under
    # the worker, two workers can both think they own the cycle, and the lock need not die with its owner.
    reasons: list[str] = []
    if conf.LOCK_DATABASE_POOLED:
        reasons.append("NOTIFICATIONS_RETRY['LOCK_DATABASE_POOLED'] is True")
    if db.get("DISABLE_SERVER_SIDE_CURSORS"):
        reasons.append(f"DATABASES[{alias!r}]['DISABLE_SERVER_SIDE_CURSORS'] is set (transaction pooling)")
    options = db.get("OPTIONS") or {}
    if isinstance(options, Mapping) and options.get("pool"):
        reasons.append(f"DATABASES[{alias!r}]['OPTIONS']['pool'] is enabled (psycopg connection pool)")
    if reasons:
        return [
            Error(
                f"NOTIFICATIONS_RETRY: the cycle's advisory lock alias {alias!r} goes through a connection "
                f"pool ({'; '.join(reasons)}); a session lock does not survive transaction pooling.",
                hint="Add a DATABASES entry that connects to PostgreSQL directly (past PgBouncer, without "
                "OPTIONS['pool']) and name it in NOTIFICATIONS_RETRY['LOCK_DATABASE_ALIAS'].",
                id="notifications_retry.E004",
            )
        ]
    port = str(db.get("PORT") or "")
    if port in POOLER_PORTS:
        return [
            Error(
                f"NOTIFICATIONS_RETRY: the cycle's advisory lock alias {alias!r} uses port {port}, "
                f"{POOLER_PORTS[port]}; a session advisory lock does not survive transaction pooling, and "
                "the worker refuses a lock session it cannot prove direct.",
                hint="Point NOTIFICATIONS_RETRY['LOCK_DATABASE_ALIAS'] at a DATABASES entry that connects to "
                "PostgreSQL directly. If this port is PostgreSQL itself, silence notifications_retry.E006 "
                "(SILENCED_SYSTEM_CHECKS): the worker still proves its lock session direct at start.",
                id="notifications_retry.E006",
            )
        ]
    host = str(db.get("HOST") or "").lower()
    mark = next((mark for mark in POOLER_HOST_MARKS if mark in host), None)
    if mark is not None:
        return [
            Warning(
                f"NOTIFICATIONS_RETRY: the cycle's advisory lock alias {alias!r} connects to host {host!r}, "
                f"whose name ({mark!r}) says it is a connection pooler; a session advisory lock does not "
                "survive transaction pooling.",
                hint="Point NOTIFICATIONS_RETRY['LOCK_DATABASE_ALIAS'] at a DATABASES entry that connects to "
                "PostgreSQL directly. Plain check reads settings only: `manage.py check --database "
                f"{alias}` opens the lock's connection and proves it direct or not (E004), as the worker "
                "and the relay do at start.",
                id="notifications_retry.W007",
            )
        ]
    return []


@register(Tags.database)
def check_lock_session(
    app_configs: Any = None, databases: Iterable[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """E004 where it can be known for sure: the lock alias's session, opened now, is not direct.

    Only with ``check --database <lock alias>`` (and ``migrate`` of it): it opens the lock's own
    connection, proves it direct as the worker does at start, takes no lock and closes it.
    """
    from notifications_retry.database.locks import AdvisoryLock, LockNotDirect

    conf, problems = _settings()
    if conf is None or problems or not databases:
        return []
    alias = conf.LOCK_DATABASE_ALIAS
    if (
        alias not in databases
        or alias not in connections.settings
        or connections[alias].vendor != "postgresql"
    ):
        return []  # E005/E002 speak for these
    lock = AdvisoryLock(conf.LOCK_KEY, using=alias)
    try:
        lock.prove_direct()  # False when unreachable: not a configuration problem of this app
    except LockNotDirect as exc:
        return [
            Error(
                f"NOTIFICATIONS_RETRY: {exc}",
                hint="The retry worker stops at start with this error until the alias is fixed.",
                id="notifications_retry.E004",
            )
        ]
    finally:
        lock.close()
    return []


@register()
def check_providers(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E003: every entry of ``PROVIDERS`` imports and is a Provider subclass."""
    from .providers import BUILTIN_PROVIDERS, Provider

    conf, problems = _settings()
    if conf is None or problems:
        return []
    messages: list[CheckMessage] = []
    for key, path in conf.PROVIDERS.items():
        try:
            cls = import_string(path)
        except ImportError as exc:
            messages.append(
                Error(
                    f"NOTIFICATIONS_RETRY['PROVIDERS'][{key!r}]: cannot import {path!r}: {exc}",
                    id="notifications_retry.E003",
                )
            )
            continue
        if not (isinstance(cls, type) and issubclass(cls, Provider)):
            messages.append(
                Error(
                    f"NOTIFICATIONS_RETRY['PROVIDERS'][{key!r}]: {path!r} is not a "
                    "notifications_retry.providers.Provider subclass",
                    id="notifications_retry.E003",
                )
            )
        elif key in BUILTIN_PROVIDERS and cls is not BUILTIN_PROVIDERS[key]:
            messages.append(
                Warning(
                    f"NOTIFICATIONS_RETRY['PROVIDERS'][{key!r}] replaces the built-in {key!r} provider.",
                    hint="Intended when swapping an adapter; otherwise choose another key.",
                    id="notifications_retry.W005",
                )
            )
    return messages


def _channels_table_exists(alias: str) -> bool:
    from .models import ChannelConfig

    with connections[alias].cursor() as cursor:
        return ChannelConfig._meta.db_table in connections[alias].introspection.table_names(cursor)


# Not tagged ``database``: from Django 6.1 plain ``check`` runs no database-tagged check, and this one
# must name refused channels there too. It honours ``check --database`` all the same (below).
@register()
def check_channels(
    app_configs: Any = None, databases: Iterable[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """W002: channels whose configuration cannot send, or whose webhook URL the policy refuses.

    Runs on plain ``check`` too (``databases`` None before Django 6.1, every alias from 6.1): it
    reads the ``default`` database when it can and says so (W006) when it cannot; silent until the
    tables exist (``migrate`` checks first).

    E007: channels with a number outside its documented range.
    E008: channels whose fallback is itself, disabled, or part of a cycle.
    W008: channels that can send as configured, but whose backend's settings outside the channel are
    missing (a django_email channel on an anymail ESP without its credentials).
    """
    from .models import ChannelConfig

    if databases is not None and "default" not in databases:
        return []
    try:
        if connections["default"].vendor != "postgresql" or not _channels_table_exists("default"):
            return []  # E002 already speaks for another backend; migrate runs checks before tables exist
        channels = list(ChannelConfig.objects.using("default").filter(is_enabled=True).order_by("key"))
    except Exception as exc:  # a check never breaks the command it runs before
        return [
            Warning(
                "NOTIFICATIONS_RETRY: channels were not checked: cannot read them from the database "
                f"'default' ({first_line(exc)}).",
                hint="Run `manage.py check` again when the database is reachable: it then names every "
                "channel that cannot send, including webhook URLs the URL policy refuses.",
                id="notifications_retry.W006",
            )
        ]
    return [message for channel in channels for message in _guarded_channel_messages(channel)]


def _guarded_channel_messages(channel: Any) -> list[CheckMessage]:
    """One channel's messages; whatever its rows make a check raise is that channel's W002, not a crash."""
    try:
        return _channel_messages(channel)
    except Exception as exc:
        return [
            Warning(
                f"channel {channel.key!r} cannot send: its configuration cannot be checked "
                f"({first_line(exc)})",
                hint="Its notifications wait untouched (counted as channel-disabled) until the channel "
                "is fixed in the admin or disabled.",
                obj=channel,
                id="notifications_retry.W002",
            )
        ]


def _channel_messages(channel: Any) -> list[CheckMessage]:
    from notifications_retry.inputs.url_policy import resolution_problems

    from .providers import channel_warnings

    messages: list[CheckMessage] = []
    out_of_range = channel.bounds_problems()
    if out_of_range:
        # Only possible past the CHECK constraints (dropped, or a restore without them).
        messages.append(
            Error(
                f"channel {channel.key!r} has settings outside their range: {'; '.join(out_of_range)}",
                hint="The worker sets it aside as misconfigured; fix it in the admin (the ranges are in "
                "docs/settings.md#channel-fields).",
                obj=channel,
                id="notifications_retry.E007",
            )
        )
    fallback_problems = channel.fallback_problems()
    if fallback_problems:
        # Only possible past the admin's validation (a hand-written UPDATE, a fallback disabled later).
        messages.append(
            Error(
                f"channel {channel.key!r} has an unusable fallback: {'; '.join(fallback_problems)}",
                hint="The worker does not fail over to a disabled or unusable channel; fix the "
                "fallback in the admin (docs/providers.md#failover).",
                obj=channel,
                id="notifications_retry.E008",
            )
        )
    try:
        problems = channel.provider_problems()
    except ChannelConfigurationError as exc:
        problems = [str(exc)]
    if problems:
        return [
            *messages,
            Warning(
                f"channel {channel.key!r} cannot send: {'; '.join(problems)}",
                hint="Its notifications wait untouched (counted as channel-disabled) until the channel "
                "is fixed in the admin or disabled.",
                obj=channel,
                id="notifications_retry.W002",
            ),
        ]
    for warning in channel_warnings(channel.provider_key, channel.options):
        messages.append(
            Warning(
                f"channel {channel.key!r} will fail every send: {warning}",
                hint="Set what the message names: the ESP's credentials in settings.ANYMAIL, or in the "
                "backend's own options (the channel's 'backend_options' before Django 6.1, its MAILERS "
                "entry's OPTIONS from 6.1). Until then each notification is attempted and ends a dead "
                "letter of error kind backend_config.",
                obj=channel,
                id="notifications_retry.W008",
            )
        )
    options = channel.options if isinstance(channel.options, Mapping) else {}
    if channel.provider_key != "webhook" or "url" not in options:
        return messages
    refused = resolution_problems(options["url"])
    if not refused:
        return messages
    return [
        *messages,
        Warning(
            f"channel {channel.key!r} cannot send: {'; '.join(refused)}",
            hint="Every connection to an internal address is refused when it is made (error kind "
            "url_refused, not retried): point the channel elsewhere or allowlist the host.",
            obj=channel,
            id="notifications_retry.W002",
        ),
    ]
