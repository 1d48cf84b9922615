"""``create_notification``'s ``tenant_id`` is a UUID: anything else is refused by name, nothing stored."""

from __future__ import annotations

import uuid

import pytest

from notifications_retry import api
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("tenant_id", "error", "message"),
    [
        (5, TypeError, "tenant_id: must be a UUID (or its string form), got int 5"),
        (True, TypeError, "tenant_id: must be a UUID (or its string form), got bool True"),
        ("acme", ValueError, "tenant_id: must be a UUID, got 'acme'"),
        ("5", ValueError, "tenant_id: must be a UUID, got '5'"),
    ],
)
def test_a_tenant_id_that_is_no_uuid_is_refused_by_name(tenant_id, error, message):
    ChannelFactory(key="in_app")
    with pytest.raises(error) as excinfo:
        api.create_notification(channel="in_app", recipient="u1", tenant_id=tenant_id)
    assert str(excinfo.value) == message
    assert not NotificationEntity.objects.exists()


@pytest.mark.parametrize("form", [str, lambda value: value])
def test_a_uuid_or_its_string_form_is_stored(form):
    ChannelFactory(key="in_app")
    tenant = uuid.uuid4()
    row = api.create_notification(channel="in_app", recipient="u1", tenant_id=form(tenant))
    row.refresh_from_db()
    assert row.tenant_id == tenant
    assert api.create_notification(channel="in_app", recipient="u2").tenant_id is None
