"""The rules of delivery, as pure functions: no database, no clock of their own.

:mod:`.outcomes` decides what happens to a record after an attempt (one ``decide``), with the evidence
the attempt's answer left; :mod:`.backoff` says when the next attempt comes, and by how many rounds a
lease and a claim are sized; :mod:`.endpoint_health` turns a channel's window of attempts into its
next health state; :mod:`.event_ids` derives an outbox event's id from the outcome it announces.
"""
