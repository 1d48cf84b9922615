"""0008: outbox event ids derived from their outcome; the provider message id index dropped.

New events get ``nr_outbox_event_id(topic, key, generation)`` as their id (notifications_retry.rules.event_ids
computes the same in Python), so the unique ``event_id`` index alone keeps one event per outcome and
the wide unique (topic, key, generation) index goes. Existing events keep their ids — a published id
never changes — and a partial unique index over exactly those rows (whose id is not the derived one)
keeps the rule among them; the insert trigger refuses a new event whose id is not derived, or whose
outcome one of them already announced. No existing row is rewritten.

``nr_provider_message_idx`` is dropped: every Sent row entered it, for the admin's search alone.

The notification table gets ``fillfactor = 70`` unless an operator set one already: an outcome's
row version then often fits on its old page, which spares heap_update its extra lock record and lets
the WAL record carry only the changed middle of the row. Only pages written from now on keep the room.
"""

import pgtrigger.compiler
import pgtrigger.migrations
from django.db import migrations, models

# RFC 4122 version 3 (MD5) of the UTF-8 bytes of topic NUL key NUL generation under the namespace
# notifications_retry.rules.event_ids.NAMESPACE, as uuid.uuid3 computes it. IMMUTABLE although convert_to
# is only STABLE: a database's encoding is fixed when it is created, so the result never changes
# (an index predicate and the insert trigger rely on it).
EVENT_ID_FUNCTION = r"""
CREATE OR REPLACE FUNCTION nr_outbox_event_id(topic text, key text, generation integer) RETURNS uuid
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT encode(set_byte(set_byte(d, 6, (get_byte(d, 6) & 15) | 48), 8, (get_byte(d, 8) & 63) | 128),
                  'hex')::uuid
    FROM decode(md5('\x6f1c1d1e8a435b559d0e3c2b8f6f0a71'::bytea || convert_to(topic, 'UTF8') || '\x00'::bytea
                    || convert_to(key, 'UTF8') || '\x00'::bytea || convert_to(generation::text, 'UTF8')),
                'hex') AS d
$$
"""

# Only when no fillfactor is set: an operator's own choice (docs/operations.md) stays.
FILLFACTOR = """
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_class c, unnest(c.reloptions) AS o
                   WHERE c.oid = 'notifications_retry_notificationentity'::regclass
                     AND o LIKE 'fillfactor=%') THEN
        ALTER TABLE notifications_retry_notificationentity SET (fillfactor = 70);
    END IF;
END
$$
"""


class Migration(migrations.Migration):
    dependencies = [
        ("notifications_retry", "0007_channel_fallback"),
    ]

    operations = [
        migrations.RunSQL(EVENT_ID_FUNCTION, "DROP FUNCTION nr_outbox_event_id(text, text, integer)"),
        migrations.RunSQL(FILLFACTOR, migrations.RunSQL.noop),
        migrations.AddConstraint(
            model_name="outbox",
            constraint=models.UniqueConstraint(
                condition=models.Q(
                    (
                        "event_id",
                        models.Func(
                            models.F("topic"),
                            models.F("key"),
                            models.F("generation"),
                            function="nr_outbox_event_id",
                            output_field=models.UUIDField(),
                        ),
                    ),
                    _negated=True,
                ),
                fields=("topic", "key", "generation"),
                name="nr_outbox_one_legacy_event_per_outcome",
            ),
        ),
        migrations.RemoveConstraint(
            model_name="outbox",
            name="nr_outbox_one_event_per_outcome",
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name="outbox",
            name="nr_outbox_matches_outcome",
        ),
        pgtrigger.migrations.AddTrigger(
            model_name="outbox",
            trigger=pgtrigger.compiler.Trigger(
                name="nr_outbox_matches_outcome",
                sql=pgtrigger.compiler.UpsertTriggerSql(
                    declare="DECLARE bad record;",
                    func="\n        SELECT * INTO bad FROM (\n            SELECT o.event_id, o.topic, o.key, o.generation, o.published_at,\n                   o.payload->>'status' AS event_status, o.payload->>'notification_id' AS notification_id,\n                   n.id IS NOT NULL AS found, n.status AS n_status, n.dead_lettered_at IS NOT NULL AS dead,\n                   n.requeue_count AS n_generation,\n                   (o.topic = 'pin.notifications.dispatched.v1' AND (\n                        o.key !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'\n                        OR o.payload->>'notification_id' IS DISTINCT FROM o.key\n                        OR n.id IS NULL OR n.requeue_count <> o.generation\n                        OR NOT ((n.status = 'sent' AND o.payload->>'status' = 'Sent')\n                                OR (n.status = 'failed' AND n.dead_lettered_at IS NOT NULL\n                                    AND o.payload->>'status' = 'Failed')))) IS TRUE AS mismatch,\n                   o.event_id IS DISTINCT FROM nr_outbox_event_id(o.topic, o.key, o.generation) AS underived,\n                   EXISTS (SELECT 1 FROM notifications_retry_outbox l\n                           WHERE l.topic = o.topic AND l.key = o.key AND l.generation = o.generation\n                             AND NOT (l.event_id = nr_outbox_event_id(l.topic, l.key, l.generation))\n                   ) AS repeated\n            FROM new_events o\n            LEFT JOIN notifications_retry_notificationentity n\n              ON o.key ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'\n             AND n.id = (CASE WHEN o.key ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'\n                              THEN o.key END)::uuid\n        ) checked\n        WHERE published_at IS NOT NULL OR mismatch OR underived OR repeated\n        LIMIT 1;\n        IF NOT FOUND THEN\n            RETURN NULL;\n        END IF;\n        IF bad.published_at IS NOT NULL THEN\n            RAISE EXCEPTION 'outbox event % must be inserted unpublished', bad.event_id\n                USING ERRCODE = 'check_violation';\n        END IF;\n        IF bad.mismatch THEN\n            IF bad.key !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'\n               OR bad.notification_id IS DISTINCT FROM bad.key THEN\n                RAISE EXCEPTION 'outbox event %: key % must be the NotificationId of its payload',\n                    bad.event_id, bad.key USING ERRCODE = 'check_violation';\n            END IF;\n            RAISE EXCEPTION 'dispatched events only on Sent and terminal Failed: event % (% gen %) %',\n                bad.event_id, bad.event_status, bad.generation,\n                format('does not match notification %s (%s, dead letter %s, gen %s)', bad.key,\n                       CASE WHEN bad.found THEN bad.n_status END, bad.dead, bad.n_generation)\n                USING ERRCODE = 'check_violation';\n        END IF;\n        IF bad.underived THEN\n            RAISE EXCEPTION 'outbox event %: its id must be nr_outbox_event_id(topic, key, generation) = %',\n                bad.event_id, nr_outbox_event_id(bad.topic, bad.key, bad.generation)\n                USING ERRCODE = 'check_violation';\n        END IF;\n        RAISE EXCEPTION 'outbox event %: an event for % generation % exists already',\n            bad.event_id, bad.key, bad.generation USING ERRCODE = 'unique_violation';\n",
                    hash="12206da41521ac8defb79a3f04fd6bbe49d7e344",
                    level="STATEMENT",
                    operation="INSERT",
                    pgid="pgtrigger_nr_outbox_matches_outcome_d34ea",
                    referencing="REFERENCING NEW TABLE AS new_events ",
                    table="notifications_retry_outbox",
                    when="AFTER",
                ),
            ),
        ),
        migrations.RemoveIndex(
            model_name="notificationentity",
            name="nr_provider_message_idx",
        ),
    ]
