"""The rules of delivery, as pure functions: no database, no clock of their own.

:mod:`.outcomes` decides what happens to a record after an attempt (one ``decide``); :mod:`.backoff`
says when the next attempt comes, and what a channel's configuration decides for its records (their
backoff and lease); :mod:`.endpoint_health` turns a channel's window of attempts into its
next health state; :mod:`.evidence` is what an attempt's answer left; :mod:`.event_ids` derives an
outbox event's id from the outcome it announces.
"""
