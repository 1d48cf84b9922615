"""Suppressed email addresses compare without case: existing entries are rewritten in that form.

Until now an entry kept the local part of an email address as written (``Ann@example.com``); the
lookup now case-folds the address whole (``notifications_retry.inputs.validation.normalize_recipient``), so
each entry is rewritten to that form. Recipients that are not email addresses are left as they are.

Entries of one channel that differ only by case (``Ann@example.com`` and ``ann@example.com`` on
``*``) become one, merged as the list merges two reports of one address: the surviving row is the
earliest (lowest ``first_event_at``, then lowest id), its reason the most severe of the group
(complaint > unsubscribed > hard bounce > invalid recipient > manual), ``first_event_at`` the
earliest, ``last_event_at`` the latest, ``events`` their sum, ``source`` and ``detail`` those of the
latest report, and ``expires_at`` never when any of them never expires, else the latest. Nothing that
suppressed a send before stops suppressing it.

The audit (``SuppressionChange``) keeps each address as it was written then: it records what an
operator did. Reversing the migration changes nothing (the merged rows cannot be told apart again,
and the case-folded form is found by the earlier lookup of an all-lower-case recipient).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

#: The reasons' order of severity, as the list's upsert ranks them when two reports meet on one row
#: (frozen here: this migration must merge as it did when it was written).
STRENGTH = {"manual": 1, "invalid_recipient": 2, "hard_bounce": 3, "unsubscribed": 4, "complaint": 5}
#: Rows read per round trip: the whole list is read once, never held in memory at once.
CHUNK = 5000


def normalize_addresses(apps: Any, schema_editor: Any) -> None:
    from notifications_retry.inputs.validation import normalize_recipient

    Suppression = apps.get_model("notifications_retry", "Suppression")
    table = Suppression._meta.db_table
    with schema_editor.connection.cursor() as cursor:
        # Writers (an ESP's webhook, a gone mailbox) wait until this transaction ends instead of adding
        # an entry in the form this migration rewrites; the claim's reads go on.
        cursor.execute(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")
    # (normalized address, channel) -> ids of the rows whose address changes.
    changed: dict[tuple[str, str], list[int]] = {}
    rows = Suppression.objects.order_by("pk").values_list("pk", "address", "channel")
    for pk, address, channel in rows.iterator(chunk_size=CHUNK):
        normalized = normalize_recipient(address)
        if normalized != address:
            changed.setdefault((normalized, channel), []).append(pk)
    if not changed:
        return
    # The rows already in the normalized form that a changed row joins.
    addresses = sorted({address for address, _ in changed})
    for start in range(0, len(addresses), CHUNK):
        joined = Suppression.objects.filter(address__in=addresses[start : start + CHUNK])
        for pk, address, channel in joined.values_list("pk", "address", "channel"):
            if (address, channel) in changed:
                changed[(address, channel)].append(pk)
    for (address, _channel), pks in changed.items():
        if len(pks) == 1:
            Suppression.objects.filter(pk=pks[0]).update(address=address)
            continue
        group = list(Suppression.objects.filter(pk__in=pks).order_by("first_event_at", "pk"))
        keep, others = group[0], group[1:]
        latest = max(group, key=lambda row: (row.last_event_at, row.pk))
        keep.reason = max((row.reason for row in group), key=lambda reason: STRENGTH.get(reason, 0))
        keep.first_event_at = min(row.first_event_at for row in group)
        keep.last_event_at = latest.last_event_at
        keep.events = sum(row.events for row in group)
        keep.source, keep.detail = latest.source, latest.detail
        expiries = [row.expires_at for row in group]
        keep.expires_at = None if None in expiries else max(expiries)
        # The others go first: the surviving row then takes the address without meeting the unique index.
        Suppression.objects.filter(pk__in=[row.pk for row in others]).delete()
        keep.address = address
        keep.save()


class Migration(migrations.Migration):
    dependencies = [
        ("notifications_retry", "0022_channel_fallback_check_by_id"),
    ]

    operations = [
        migrations.AlterField(
            model_name="suppression",
            name="address",
            field=models.TextField(
                help_text="Normalized: an email address case-folded whole, else verbatim."
            ),
        ),
        migrations.RunPython(normalize_addresses, migrations.RunPython.noop),
    ]
