"""How the app is seen from outside.

:mod:`.logging` (structlog events) with :mod:`.masking` (addresses and bodies masked), :mod:`.metrics`
(Prometheus), :mod:`.tracing` (OpenTelemetry spans), :mod:`.liveness` (the heartbeat checks: the
lane's row, or a process's own file written by :mod:`.heartbeat_file`); :mod:`.queue_health` reads the
queue's counts (``NotificationEntity.objects.backlog()``) at scrape time on a web process's
``/metrics``; :mod:`.excerpts` masks an attempt's answer for ``attempt_log``.
"""
