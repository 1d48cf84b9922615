"""What every admin page shows the same way: ages, a notification's state label, template fragments."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.template.loader import render_to_string
from django.utils import dateformat, timezone
from django.utils.safestring import SafeString, mark_safe

from notifications_retry.models import NotificationEntity

FRAGMENTS = "notifications_retry/admin/fragments/"


def fragment(name: str, **context: Any) -> SafeString:
    """Render ``fragments/<name>.html``; the template autoescapes every value, so its output is safe."""
    return mark_safe(render_to_string(f"{FRAGMENTS}{name}.html", context))


#: The one format of every time the admin shows, with its time zone: 2026-12-04 09:00:00 UTC (the
#: templates' ``|date`` filters use the same string).
TIMESTAMP_FORMAT = "Y-m-d H:i:s e"


def timestamp(value: datetime | str | None) -> str:
    """``value`` (a datetime, or the ISO string an attempt log holds) in :data:`TIMESTAMP_FORMAT`."""
    if value is None or value == "":
        return "—"
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return value
    else:
        moment = value
    if timezone.is_aware(moment):
        moment = timezone.localtime(moment)
    return dateformat.format(moment, TIMESTAMP_FORMAT)


def timestamp_display(field: str, description: str | None = None) -> Any:
    """A read-only admin column showing the datetime ``field`` in :data:`TIMESTAMP_FORMAT`.

    Every admin list and page shows its times through this (or :func:`timestamp`): Django's own
    rendering of a DateTimeField follows the project's ``DATETIME_FORMAT`` ("March 1, 2026, 10 a.m."),
    with no zone. ``description`` defaults to the field's name in words, as Django's own header.
    """

    def show(admin: Any, obj: Any) -> str:
        return timestamp(getattr(obj, field))

    show.short_description = description or field.replace("_", " ")  # type: ignore[attr-defined]
    show.admin_order_field = field  # type: ignore[attr-defined]
    return show


def format_age(seconds: float) -> str:
    """A short human duration: 42s, 5m, 3h 10m, 2d 4h."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, _ = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h" if hours else f"{days}d"


def state_label(obj: NotificationEntity) -> tuple[str, str]:
    """What the row is, in the operator's words, and its badge colour: a dead letter before its status.

    The list's badge, the detail page's badge and the detail page's title all say this, so they agree.
    """
    if obj.dead_lettered_at is not None:
        if not obj.resolution:
            return "dead letter", "dead"
        return obj.get_resolution_display().split(" (")[0].lower(), "resolved"
    return obj.get_status_display().lower(), obj.status


def status_badge(obj: NotificationEntity) -> SafeString:
    """The coloured state badge; its tooltip says when the row was dead-lettered."""
    label, css = state_label(obj)
    return fragment("status_badge", label=label, css=css, dead_lettered_at=obj.dead_lettered_at)


#: Characters of a payload the detail page shows at most (the API accepts 256 KiB).
PAYLOAD_SHOWN_CHARS = 256 * 1024


def payload_text(shown: str | None, size: int | None) -> SafeString:
    """A payload read as text: indented when Python can decode it, else as stored, clipped, with why."""
    if shown is None:
        return fragment("pre", css="nr-json", text="null")
    if size is not None and size > len(shown):
        note = f"(first {len(shown):,} of {size:,} characters: too large to show whole)\n"
        return fragment("pre", css="nr-json", text=note + shown)
    try:
        return pretty_json(json.loads(shown))
    except (ValueError, RecursionError) as exc:
        note = f"(shown as stored: Python cannot decode it: {type(exc).__name__})\n"
        return fragment("pre", css="nr-json", text=note + shown[:4096])


def pretty_json(value: Any) -> SafeString:
    """Indented JSON in a <pre>, escaped (payloads are untrusted)."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return fragment("pre", css="nr-json", text=text)
