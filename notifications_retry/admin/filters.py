"""The list filters of the triage console: dead-letter state, queue state, error kind, tenant, dates."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, time, timedelta
from typing import Any, cast

from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import CharField, Count, Field, Model, QuerySet
from django.db.models.expressions import RawSQL
from django.http import HttpRequest
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from notifications_retry.models import NotificationEntity, NotificationQuerySet

#: The classes of an attempt's answer the list filters by and the timeline colours.
STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx", "none")


def status_class(code: Any) -> str:
    """``2xx`` … ``5xx`` for an HTTP or SMTP reply code (SMTP's 250/4xx/5xx read alike), else ``none``."""
    if isinstance(code, int) and not isinstance(code, bool) and 200 <= code < 600:
        return f"{code // 100}xx"
    return "none"


# Facet counts scan the whole table per filter: never on a queue table (ShowFacets is Django 5.0+).
NEVER_FACETS: Any = getattr(getattr(admin, "ShowFacets", None), "NEVER", None)


def _single(value: Any) -> str:
    """A filter parameter's value: Django 5 passes lists, 4.2 strings."""
    if isinstance(value, list | tuple):
        return str(value[-1]) if value else ""
    return "" if value is None else str(value)


def _notifications(queryset: QuerySet[Any]) -> NotificationQuerySet:
    """The admin's queryset of notifications, typed as the app's QuerySet (its named states)."""
    return cast(NotificationQuerySet, queryset)


class DeadLetterFilter(admin.SimpleListFilter):
    title = "dead letter"
    parameter_name = "dead_letter"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Yes"), ("unresolved", "Yes, unresolved"), ("no", "No")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value == "yes":
            return _notifications(queryset).dead_letters()
        if value == "unresolved":
            return _notifications(queryset).unresolved_dead_letters()
        if value == "no":
            return queryset.filter(dead_lettered_at__isnull=True)
        return queryset


class ResolutionFilter(admin.SimpleListFilter):
    title = "resolution"
    parameter_name = "resolution"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("unresolved", "Unresolved dead letter"),
            (NotificationEntity.Resolution.DISCARDED, "Discarded"),
            (NotificationEntity.Resolution.UNRESOLVABLE, "Unresolvable (expired)"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value == "unresolved":
            return _notifications(queryset).unresolved_dead_letters()
        if value in NotificationEntity.Resolution.values and value:
            return queryset.filter(resolution=value)
        return queryset


class QueueStateFilter(admin.SimpleListFilter):
    title = "queue state"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("due", "Due now"),
            ("in_flight", "In flight (claimed)"),
            ("waiting", "Waiting (not due yet)"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value, now = self.value(), timezone.now()
        # A leased row has no due_at (triggers.DUE_AT_RULE). A lease past its expiry (its worker died)
        # is due, given back by a claim yet or not, as the backlog counts it
        # (``NotificationEntity.objects.backlog``).
        if value == "due":
            rows = _notifications(queryset)
            return rows.due(now) | rows.lapsed(now)
        if value == "in_flight":
            return queryset.filter(claim_expires_at__gt=now)
        if value == "waiting":
            return queryset.filter(due_at__gt=now)
        return queryset


class ErrorKindFilter(admin.SimpleListFilter):
    title = "error kind"
    parameter_name = "error_kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # Failed rows carry the kinds worth filtering; the (status, created_at) index keeps this cheap.
        kinds = (
            NotificationEntity.objects.filter(status=NotificationEntity.Status.FAILED)
            .exclude(error_kind="")
            .values_list("error_kind", flat=True)
            .distinct()
            .order_by("error_kind")[:50]
        )
        choices = [(kind, kind) for kind in kinds]
        current = self.value()
        if current and current not in {k for k, _ in choices}:
            choices.append((current, current))
        return choices

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(error_kind=value) if value else queryset


class StatusClassFilter(admin.SimpleListFilter):
    """The last attempt's answer by class: what a dead letter's endpoint said (401 or timed out?)."""

    title = "last answer"
    parameter_name = "answer"
    # The last attempt_log entry's status code, as text (NULL: no answer, no provider call, no attempt).
    _LAST_STATUS = RawSQL(
        f"({NotificationEntity._meta.db_table}.attempt_log -> -1 ->> 'status_code')",
        (),
        output_field=CharField(),
    )

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(c, "no answer" if c == "none" else c) for c in STATUS_CLASSES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value not in STATUS_CLASSES:
            return queryset
        rows = queryset.alias(last_status=self._LAST_STATUS)
        if value == "none":
            return cast("QuerySet[Any]", rows.filter(last_status__isnull=True))
        return cast("QuerySet[Any]", rows.filter(last_status__regex=rf"^{value[0]}\d\d$"))


class TenantFilter(admin.SimpleListFilter):
    title = "tenant"
    parameter_name = "tenant"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # The tenants with the most dead letters (a partial index); any tenant is reachable by search.
        top = (
            NotificationEntity.objects.dead_letters()
            .exclude(tenant_id__isnull=True)
            .values("tenant_id")
            .annotate(n=Count("pk"))
            .order_by("-n", "tenant_id")[:10]
        )
        choices = [("none", "Platform (no tenant)")]
        choices += [(str(row["tenant_id"]), f"{str(row['tenant_id'])[:8]}… ({row['n']} dead)") for row in top]
        current = self.value()
        if current and current not in {k for k, _ in choices}:
            choices.append((current, current))
        return choices

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        if value == "none":
            return queryset.filter(tenant_id__isnull=True)
        try:
            return queryset.filter(tenant_id=uuid.UUID(value))
        except ValueError:
            return queryset.none()


class DateRangeFilter(admin.FieldListFilter):
    """Presets (last 24 h / 7 / 30 days) and a from/to form; ``to`` is inclusive for a plain date."""

    template = "notifications_retry/admin/date_range_filter.html"
    presets = (
        ("Last 24 hours", timedelta(hours=24)),
        ("Last 7 days", timedelta(days=7)),
        ("Last 30 days", timedelta(days=30)),
    )

    def __init__(
        self,
        field: Field[Any, Any],
        request: HttpRequest,
        params: dict[str, Any],
        model: type[Model],
        model_admin: Any,
        field_path: str,
    ) -> None:
        self.param_from = f"{field_path}__from"
        self.param_to = f"{field_path}__to"
        super().__init__(field, request, params, model, model_admin, field_path)
        self.value_from = _single(self.used_parameters.get(self.param_from))
        self.value_to = _single(self.used_parameters.get(self.param_to))

    def expected_parameters(self) -> list[str | None]:
        return [self.param_from, self.param_to]

    def has_output(self) -> bool:
        return True

    @staticmethod
    def _plain_date(text: str) -> bool:
        """A date without a time (``parse_datetime`` reads one as its midnight: asked first, this says so)."""
        try:
            return parse_date(text) is not None
        except ValueError:
            return False

    @staticmethod
    def _bound(text: str, *, end: bool) -> datetime:
        day = parse_date(text) if DateRangeFilter._plain_date(text) else None
        if day is not None:
            moment = datetime.combine(day + timedelta(days=1) if end else day, time.min)
        else:
            parsed = parse_datetime(text)
            if parsed is None:
                raise ValidationError(f"not a date: {text!r}")
            moment = parsed
        if timezone.is_naive(moment):
            moment = timezone.make_aware(moment)
        return moment

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        from django.contrib.admin.options import IncorrectLookupParameters

        try:
            if self.value_from:
                queryset = queryset.filter(
                    **{f"{self.field_path}__gte": self._bound(self.value_from, end=False)}
                )
            if self.value_to:
                end = self._bound(self.value_to, end=True)
                lookup = "lt" if self._plain_date(self.value_to) else "lte"
                queryset = queryset.filter(**{f"{self.field_path}__{lookup}": end})
        except (ValidationError, ValueError) as exc:
            raise IncorrectLookupParameters(exc) from exc
        return queryset

    def choices(self, changelist: Any) -> Iterator[Any]:  # adds a "form" item to Django's choice dicts
        mine = {self.param_from, self.param_to}
        yield {
            "selected": not (self.value_from or self.value_to),
            "query_string": changelist.get_query_string(remove=list(mine)),
            "display": "Any time",
        }
        now = timezone.now()
        for label, span in self.presets:
            start = (now - span).replace(second=0, microsecond=0).isoformat()
            yield {
                "selected": False,
                "query_string": changelist.get_query_string({self.param_from: start}, remove=[self.param_to]),
                "display": label,
            }
        hidden = [(k, _single(v)) for k, v in changelist.params.items() if k not in mine and k != "p"]
        yield {
            "form": True,
            "hidden": hidden,
            "param_from": self.param_from,
            "param_to": self.param_to,
            "value_from": self.value_from[:10] if self._plain_date(self.value_from) else "",
            "value_to": self.value_to[:10] if self._plain_date(self.value_to) else "",
            "current": (self.value_from, self.value_to) if (self.value_from or self.value_to) else None,
        }


class PublishedFilter(admin.SimpleListFilter):
    title = "published"
    parameter_name = "published"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Published"), ("no", "Not published yet")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return queryset.filter(published_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(published_at__isnull=True)
        return queryset
