"""``retry_worker`` (:mod:`.retry_worker`), ``outbox_relay`` (:mod:`.outbox_relay`) and
``notifications_housekeeping`` (:mod:`.notifications_housekeeping`) and ``notifications_recover``
(:mod:`.notifications_recover`)."""
