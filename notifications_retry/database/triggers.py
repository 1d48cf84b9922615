"""The database's own rules for the app's tables: django-pgtrigger triggers and their SQL.

Kept apart from the models so that each table's columns read in one screen; the models attach these
lists in their ``Meta.triggers``. Every rule is tested by trying to break it with raw SQL.
"""

from __future__ import annotations

import pgtrigger

# Kept in one place: the due-time rule the claim index and the trigger agree on.
# A leased row has no due time: the lease's row version then enters none of the due indexes (the
# lease is the one write the leased path adds), and its expiry is found on nr_lease_expiry_idx. A
# lease that lapsed (its worker died) is given back by the next claim (delivery.claim_statements), which
# clears the expiry and keeps the token: due since then, and known to the claim as recovered.
DUE_AT_RULE = """CASE
        WHEN NEW.claim_expires_at IS NOT NULL THEN NULL
        WHEN NEW.claim_token IS NOT NULL THEN NEW.updated_at
        WHEN NEW.status = 'failed' AND NEW.dead_lettered_at IS NULL
            THEN COALESCE(NEW.next_attempt_at, NEW.created_at)
        WHEN NEW.status = 'pending' THEN NEW.scheduled_at
        ELSE NULL
    END"""
DUE_AT_SQL = f"""
    NEW.due_at := {DUE_AT_RULE};
    RETURN NEW;
"""
# The trigger runs only when a write left due_at off the rule: the worker's claim and finalize set it
# themselves, and a PL/pgSQL call per row (with django-pgtrigger's ignore check, a subtransaction
# each) was a measurable share of a drain's server time (docs/performance.md).
DUE_AT_OFF_RULE = f"NEW.due_at IS DISTINCT FROM ({DUE_AT_RULE})"


# The refund of an unstarted claim (delivery.release): one attempt given back, the lease cleared, the
# status untouched. The only way attempts go down besides an audited requeue.
REFUND_OF_UNSTARTED_CLAIM_SQL = (
    "NEW.attempts = OLD.attempts - 1 AND OLD.claim_token IS NOT NULL AND NEW.claim_token IS NULL "
    "AND NEW.claim_expires_at IS NULL AND NEW.status = OLD.status"
)


# A requeue is one step up, of a dead letter, with its DeadLetterAction row written first.
REQUEUE_AUDITED_SQL = """
    IF NEW.requeue_count <> OLD.requeue_count + 1 THEN
        RAISE EXCEPTION 'requeue must be audited: requeue_count moves by one (notification %: % -> %)',
            OLD.id, OLD.requeue_count, NEW.requeue_count USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.dead_lettered_at IS NULL THEN
        RAISE EXCEPTION 'requeue must be audited: notification % is not a dead letter', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF (SELECT count(*) FROM notifications_retry_deadletteraction a
        WHERE a.notification_id = NEW.id AND a.action = 'requeue') < NEW.requeue_count THEN
        RAISE EXCEPTION 'requeue must be audited: no DeadLetterAction row for requeue % of notification %',
            NEW.requeue_count, OLD.id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
"""

# An event exists only for an outcome the notification row holds now: Sent, or terminal Failed
# (dead-lettered), of the current generation; and it starts unpublished so the relay sees it.
# Its id is the one derived from its outcome (event_ids), so the unique event_id index keeps out a
# second event for the same outcome; events from before migration 0008 kept their random ids, and
# a new event must not repeat the outcome of one of those (their partial unique index serves the
# lookup, and no new row can enter it).
# One check per INSERT statement over its transition table (a join of the new events to their
# notifications, each event's key read as an id once), not a lookup per row: the worker inserts its
# events a batch at a time.
# Both lookups run with sequential scans off. PL/pgSQL keeps a statement's plan for the session, and
# a plan made while a table was small (a fresh install, the first commits after a purge) scanned the
# whole outbox once per new event until the next ANALYZE: at 2,000 events a 16-event commit spent
# 3 ms in the lookup instead of a few index probes. The setting is the transaction's own and put back
# before the trigger returns (an error rolls it back with the statement).

#: The first new event (the transition table ``new_events``) whose outcome an event from before
#: migration 0008 announced already. LATERAL with LIMIT keeps it a nested loop over the new events,
#: each step a probe of the partial index of those older events: as a semi-join, a cached plan could
#: hash the whole outbox for every insert (tests/integration/test_event_ids.py reads the plan).
LEGACY_EVENT_OF_NEW_EVENTS_SQL = """
                SELECT o.event_id, o.key, o.generation
                FROM new_events o
                CROSS JOIN LATERAL (
                    SELECT 1 FROM notifications_retry_outbox l
                    WHERE l.topic = o.topic AND l.key = o.key AND l.generation = o.generation
                      AND NOT (l.event_id = nr_outbox_event_id(l.topic, l.key, l.generation))
                    LIMIT 1
                ) older
                LIMIT 1"""

OUTBOX_MATCHES_OUTCOME_SQL = (
    """
        seqscan := current_setting('enable_seqscan');
        PERFORM set_config('enable_seqscan', 'off', true);
        SELECT * INTO bad FROM (
            SELECT o.event_id, o.topic, o.key, o.generation, o.published_at,
                   o.payload->>'status' AS event_status, o.payload->>'notification_id' AS notification_id,
                   n.id IS NOT NULL AS found, n.status AS n_status, n.dead_lettered_at IS NOT NULL AS dead,
                   n.requeue_count AS n_generation,
                   (o.topic = 'pin.notifications.dispatched.v1' AND (
                        o.key_id IS NULL
                        OR o.payload->>'notification_id' IS DISTINCT FROM o.key
                        OR n.id IS NULL OR n.requeue_count <> o.generation
                        OR NOT ((n.status = 'sent' AND o.payload->>'status' = 'Sent')
                                OR (n.status = 'failed' AND n.dead_lettered_at IS NOT NULL
                                    AND o.payload->>'status' = 'Failed')))) IS TRUE AS mismatch,
                   o.event_id IS DISTINCT FROM nr_outbox_event_id(o.topic, o.key, o.generation) AS underived
            -- The key read as a notification id once per event (OFFSET 0 keeps the subquery whole, so
            -- the pattern is not matched again for the join and for the mismatch).
            FROM (SELECT e.*,
                         CASE WHEN e.key ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                              THEN e.key::uuid END AS key_id
                  FROM new_events e OFFSET 0) o
            LEFT JOIN notifications_retry_notificationentity n ON n.id = o.key_id
        ) checked
        WHERE published_at IS NOT NULL OR mismatch OR underived
        LIMIT 1;
        IF NOT FOUND THEN
            -- A new event repeating the outcome of an event from before migration 0008.
            SELECT * INTO one FROM (
"""
    + LEGACY_EVENT_OF_NEW_EVENTS_SQL
    + """
            ) legacy;
            IF FOUND THEN
                RAISE EXCEPTION 'outbox event %: an event for % generation % exists already',
                    one.event_id, one.key, one.generation USING ERRCODE = 'unique_violation';
            END IF;
            PERFORM set_config('enable_seqscan', seqscan, true);
            RETURN NULL;
        END IF;
        IF bad.published_at IS NOT NULL THEN
            RAISE EXCEPTION 'outbox event % must be inserted unpublished', bad.event_id
                USING ERRCODE = 'check_violation';
        END IF;
        IF bad.mismatch THEN
            IF bad.key !~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
               OR bad.notification_id IS DISTINCT FROM bad.key THEN
                RAISE EXCEPTION 'outbox event %: key % must be the NotificationId of its payload',
                    bad.event_id, bad.key USING ERRCODE = 'check_violation';
            END IF;
            RAISE EXCEPTION 'dispatched events only on Sent and terminal Failed: event % (% gen %) %',
                bad.event_id, bad.event_status, bad.generation,
                format('does not match notification %s (%s, dead letter %s, gen %s)', bad.key,
                       CASE WHEN bad.found THEN bad.n_status END, bad.dead, bad.n_generation)
                USING ERRCODE = 'check_violation';
        END IF;
        RAISE EXCEPTION 'outbox event %: its id must be nr_outbox_event_id(topic, key, generation) = %',
            bad.event_id, nr_outbox_event_id(bad.topic, bad.key, bad.generation)
            USING ERRCODE = 'check_violation';
"""
)


#: The channel a looping worker LISTENs on (engine.wakeup): a row became due sooner, or a channel changed.
WAKEUP_CHANNEL = "notifications_retry_wakeup"

# One empty payload: PostgreSQL folds identical notifications of one transaction into one, so a bulk
# write wakes each worker once, and the worker asks for the earliest due time itself.
NOTIFY_WAKEUP_SQL = f"PERFORM pg_notify('{WAKEUP_CHANNEL}', ''); RETURN NULL;"


def wakeup_triggers() -> list[pgtrigger.Trigger]:
    """NOTIFY a waiting worker when a row becomes due sooner than before (a new scheduled or hand-off
    row, a retry, a requeue, "retry now", a given-back lease).

    In the writer's own transaction, so it works through any pooler (PgBouncer in transaction mode
    too): only the worker LISTENs, on its direct connection. A write that clears ``due_at`` (a claim,
    an outcome) or sets it later than before wakes no one, and the condition is checked before any call.
    """
    return [
        # Once per statement, over the statement's new rows: with a row-level trigger a bulk INSERT's
        # time grew faster than its rows (docs/performance.md, "Wake-ups"), and a monolith
        # bulk-schedules in one statement.
        pgtrigger.Trigger(
            name="nr_wakeup_on_insert",
            level=pgtrigger.Statement,
            when=pgtrigger.After,
            operation=pgtrigger.Insert,
            referencing=pgtrigger.Referencing(new="nr_new_rows"),  # type: ignore[no-untyped-call]
            func=(
                "IF EXISTS (SELECT 1 FROM nr_new_rows WHERE due_at IS NOT NULL) THEN "
                f"PERFORM pg_notify('{WAKEUP_CHANNEL}', ''); END IF; RETURN NULL;"
            ),
        ),
        pgtrigger.Trigger(
            name="nr_wakeup_on_update",
            when=pgtrigger.After,
            operation=pgtrigger.Update,
            # "Before" is the row's due time, or its lease's expiry when it was leased (a leased row
            # has no due_at, and the worker wakes at the expiry anyway): an outcome that retries
            # later than the lease's end, or a lapsed lease given back, notifies no one.
            condition=pgtrigger.Condition(
                "NEW.due_at IS NOT NULL AND (COALESCE(OLD.due_at, OLD.claim_expires_at) IS NULL "
                "OR NEW.due_at < COALESCE(OLD.due_at, OLD.claim_expires_at))"
            ),
            func=NOTIFY_WAKEUP_SQL,
        ),
    ]


def channel_triggers() -> list[pgtrigger.Trigger]:
    """NOTIFY a waiting worker when a channel is added or changed (re-enabled, fixed): its due rows
    may be sendable now. Once per statement: channels change rarely, one by one."""
    return [
        pgtrigger.Trigger(
            name="nr_wakeup_on_channel_change",
            level=pgtrigger.Statement,
            when=pgtrigger.After,
            operation=pgtrigger.Insert | pgtrigger.Update,
            func=NOTIFY_WAKEUP_SQL,
        ),
    ]


def notification_triggers() -> list[pgtrigger.Trigger]:
    """The rules of ``NotificationEntity``: due time, transitions, attempts, leases, dead letters."""
    return [
        *wakeup_triggers(),
        pgtrigger.Trigger(
            name="nr_maintain_due_at",
            when=pgtrigger.Before,
            operation=pgtrigger.Insert | pgtrigger.Update,
            condition=pgtrigger.Condition(DUE_AT_OFF_RULE),
            func=DUE_AT_SQL,
        ),
        pgtrigger.Trigger(
            name="nr_status_transitions",
            when=pgtrigger.Before,
            operation=pgtrigger.Update,
            condition=pgtrigger.Condition(
                "OLD.status IS DISTINCT FROM NEW.status AND (OLD.status, NEW.status) NOT IN "
                "(('failed', 'sent'), ('pending', 'sent'), ('pending', 'failed'))"
            ),
            func=(
                "RAISE EXCEPTION 'INV-NTF-5 forbids the status transition % -> % (notification %)', "
                "OLD.status, NEW.status, OLD.id USING ERRCODE = 'check_violation'; RETURN NULL;"
            ),
        ),
        pgtrigger.Trigger(
            name="nr_attempts_monotonic",
            when=pgtrigger.Before,
            operation=pgtrigger.Update,
            # The one other decrease: the refund of a claimed attempt that never started
            # (delivery.release), by exactly one, in the UPDATE that gives the lease back.
            condition=pgtrigger.Condition(
                "NEW.requeue_count < OLD.requeue_count OR "
                "(NEW.attempts < OLD.attempts AND NEW.requeue_count = OLD.requeue_count AND NOT ("
                + REFUND_OF_UNSTARTED_CLAIM_SQL
                + "))"
            ),
            func=(
                "RAISE EXCEPTION 'attempts may only decrease through an audited requeue "
                "(notification %: attempts % -> %, requeue_count % -> %)', OLD.id, OLD.attempts, "
                "NEW.attempts, OLD.requeue_count, NEW.requeue_count USING ERRCODE = 'check_violation'; "
                "RETURN NULL;"
            ),
        ),
        pgtrigger.Trigger(
            name="nr_lease_cleared_with_status",
            when=pgtrigger.Before,
            operation=pgtrigger.Update,
            # A writer that does not hold the claim (the monolith marking a leased row Sent) would
            # leave a final row with a live lease, which the worker's finalize then fails on.
            condition=pgtrigger.Condition(
                "OLD.claim_token IS NOT NULL AND NEW.status IS DISTINCT FROM OLD.status AND "
                "(NEW.claim_token IS NOT NULL OR NEW.claim_expires_at IS NOT NULL)"
            ),
            func=(
                "RAISE EXCEPTION 'INV-LEASE: notification % is leased (claim %): its status changes only "
                "in the UPDATE that clears the lease (claim_token and claim_expires_at set to NULL)', "
                "OLD.id, OLD.claim_token USING ERRCODE = 'check_violation'; RETURN NULL;"
            ),
        ),
        pgtrigger.Trigger(
            name="nr_sent_is_final",
            when=pgtrigger.Before,
            operation=pgtrigger.Update,
            # Recipient and payload stay editable (redaction); the delivery outcome does not.
            condition=pgtrigger.Condition(
                "OLD.status = 'sent' AND "
                "(OLD.attempts, OLD.requeue_count, OLD.provider_message_id, OLD.next_attempt_at, "
                "OLD.claim_token, OLD.claim_expires_at, OLD.dead_lettered_at, OLD.resolution, "
                "OLD.error_kind) "
                "IS DISTINCT FROM "
                "(NEW.attempts, NEW.requeue_count, NEW.provider_message_id, NEW.next_attempt_at, "
                "NEW.claim_token, NEW.claim_expires_at, NEW.dead_lettered_at, NEW.resolution, "
                "NEW.error_kind)"
            ),
            func=(
                "RAISE EXCEPTION 'INV-NTF-5: notification % is Sent, which is final: its delivery state "
                "cannot change', OLD.id USING ERRCODE = 'check_violation'; RETURN NULL;"
            ),
        ),
        pgtrigger.Trigger(
            name="nr_dead_letter_terminal",
            when=pgtrigger.Before,
            operation=pgtrigger.Update,
            condition=pgtrigger.Condition(
                "OLD.dead_lettered_at IS NOT NULL AND "
                "NEW.dead_lettered_at IS DISTINCT FROM OLD.dead_lettered_at AND "
                "NEW.requeue_count = OLD.requeue_count"
            ),
            func=(
                "RAISE EXCEPTION 'notification % is a dead letter: it leaves the dead-letter state only "
                "through an audited requeue', OLD.id USING ERRCODE = 'check_violation'; RETURN NULL;"
            ),
        ),
        pgtrigger.Trigger(
            name="nr_requeue_audited",
            when=pgtrigger.Before,
            operation=pgtrigger.Update,
            condition=pgtrigger.Condition("NEW.requeue_count IS DISTINCT FROM OLD.requeue_count"),
            func=REQUEUE_AUDITED_SQL,
        ),
    ]


def outbox_triggers() -> list[pgtrigger.Trigger]:
    """The rules of ``Outbox``: events match their outcome, are immutable, outlive their publishing."""
    return [
        pgtrigger.Trigger(
            name="nr_outbox_matches_outcome",
            level=pgtrigger.Statement,
            when=pgtrigger.After,
            operation=pgtrigger.Insert,
            referencing=pgtrigger.Referencing(new="new_events"),  # type: ignore[no-untyped-call]
            declare=[("bad", "record"), ("one", "record"), ("seqscan", "text")],
            func=OUTBOX_MATCHES_OUTCOME_SQL,
        ),
        pgtrigger.Trigger(
            name="nr_outbox_immutable",
            when=pgtrigger.Before,
            operation=pgtrigger.Update,
            condition=pgtrigger.Condition(
                "OLD.published_at IS NOT NULL OR "
                "(OLD.id, OLD.event_id, OLD.topic, OLD.key, OLD.contract_version, OLD.generation, "
                "OLD.payload::text, OLD.created_at) IS DISTINCT FROM "
                "(NEW.id, NEW.event_id, NEW.topic, NEW.key, NEW.contract_version, NEW.generation, "
                "NEW.payload::text, NEW.created_at)"
            ),
            func=(
                "RAISE EXCEPTION 'outbox event % is immutable: only marking it published is allowed', "
                "OLD.event_id USING ERRCODE = 'check_violation'; RETURN NULL;"
            ),
        ),
        pgtrigger.Trigger(
            name="nr_outbox_keep_unpublished",
            when=pgtrigger.Before,
            operation=pgtrigger.Delete,
            condition=pgtrigger.Condition("OLD.published_at IS NULL"),
            func=(
                "RAISE EXCEPTION 'outbox event % is not published yet and cannot be deleted', "
                "OLD.event_id USING ERRCODE = 'check_violation'; RETURN NULL;"
            ),
        ),
    ]
