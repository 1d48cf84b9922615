"""Two per-row costs of a drain's server time, with the same rules and the same results.

* The due-time trigger runs only when a write leaves ``due_at`` off the rule (the worker's claim and
  finalize set it themselves); before, every insert and update called it.
* ``nr_outbox_event_id`` in PL/pgSQL instead of SQL: a SQL function with a FROM clause cannot be
  inlined, and each call set up an executor (about twice the time). It is called three times per new
  event (the insert, the trigger's check, the predicate of the older events' unique index). It returns
  the same ids (``tests/integration/test_event_ids.py`` compares it with Python's), so that index's
  predicate needs no rebuild.
"""

import pgtrigger.compiler
import pgtrigger.migrations
from django.db import migrations


EVENT_ID_PLPGSQL = r"""
CREATE OR REPLACE FUNCTION nr_outbox_event_id(topic text, key text, generation integer) RETURNS uuid
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    d bytea := decode(md5('\x6f1c1d1e8a435b559d0e3c2b8f6f0a71'::bytea || convert_to(topic, 'UTF8')
                          || '\x00'::bytea || convert_to(key, 'UTF8') || '\x00'::bytea
                          || convert_to(generation::text, 'UTF8')), 'hex');
BEGIN
    RETURN encode(set_byte(set_byte(d, 6, (get_byte(d, 6) & 15) | 48), 8, (get_byte(d, 8) & 63) | 128),
                  'hex')::uuid;
END
$$
"""

EVENT_ID_SQL = r"""
CREATE OR REPLACE FUNCTION nr_outbox_event_id(topic text, key text, generation integer) RETURNS uuid
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT encode(set_byte(set_byte(d, 6, (get_byte(d, 6) & 15) | 48), 8, (get_byte(d, 8) & 63) | 128),
                  'hex')::uuid
    FROM decode(md5('\x6f1c1d1e8a435b559d0e3c2b8f6f0a71'::bytea || convert_to(topic, 'UTF8') || '\x00'::bytea
                    || convert_to(key, 'UTF8') || '\x00'::bytea || convert_to(generation::text, 'UTF8')),
                'hex') AS d
$$
"""


class Migration(migrations.Migration):
    dependencies = [
        ("notifications_retry", "0009_outbox_legacy_check_by_row"),
    ]

    operations = [
        migrations.RunSQL(EVENT_ID_PLPGSQL, EVENT_ID_SQL),
        pgtrigger.migrations.RemoveTrigger(
            model_name="notificationentity",
            name="nr_maintain_due_at",
        ),
        pgtrigger.migrations.AddTrigger(
            model_name="notificationentity",
            trigger=pgtrigger.compiler.Trigger(
                name="nr_maintain_due_at",
                sql=pgtrigger.compiler.UpsertTriggerSql(
                    condition="WHEN (NEW.due_at IS DISTINCT FROM (CASE\n        WHEN NEW.claim_token IS NOT NULL THEN NEW.claim_expires_at\n        WHEN NEW.status = 'failed' AND NEW.dead_lettered_at IS NULL\n            THEN COALESCE(NEW.next_attempt_at, NEW.created_at)\n        WHEN NEW.status = 'pending' THEN NEW.scheduled_at\n        ELSE NULL\n    END))",
                    func="\n    NEW.due_at := CASE\n        WHEN NEW.claim_token IS NOT NULL THEN NEW.claim_expires_at\n        WHEN NEW.status = 'failed' AND NEW.dead_lettered_at IS NULL\n            THEN COALESCE(NEW.next_attempt_at, NEW.created_at)\n        WHEN NEW.status = 'pending' THEN NEW.scheduled_at\n        ELSE NULL\n    END;\n    RETURN NEW;\n",
                    hash="a1727e8adaabda90697db493722dc44a1b886cf7",
                    operation="INSERT OR UPDATE",
                    pgid="pgtrigger_nr_maintain_due_at_08103",
                    table="notifications_retry_notificationentity",
                    when="BEFORE",
                ),
            ),
        ),
    ]
