"""Constraint helpers shared by the tables (and by migrations, which import them from the package)."""

from __future__ import annotations

import django
from django.db import models
from django.db.models import Q

from notifications_retry.conf import bounds


def check_constraint(condition: Q, name: str) -> models.CheckConstraint:
    """A CheckConstraint on every supported Django (``check=`` became ``condition=`` in 5.1)."""
    if django.VERSION >= (5, 1):
        return models.CheckConstraint(condition=condition, name=name)
    return models.CheckConstraint(check=condition, name=name)  # type: ignore[call-arg]


def range_constraint(field: str, bound: bounds.Bound, *, nullable: bool = False) -> models.CheckConstraint:
    """CHECK low <= field <= high (PostgreSQL sorts NaN above every number, so it fails the upper end)."""
    condition = Q(**{f"{field}__gte": bound.low}) & Q(**{f"{field}__lte": bound.high})
    if nullable:
        condition = Q(**{f"{field}__isnull": True}) | condition
    return check_constraint(condition, f"nr_channel_{field}_range")
