"""libpq's TCP settings for the worker's own connections: its Django connections and the lock's.

Its own module so that :mod:`notifications_retry.delivery.session` (which gives them to Django's
connections) and :mod:`notifications_retry.database.locks` (which opens the lock's connection) share one
table without either importing the other.
"""

from __future__ import annotations

#: Keepalive probes find a peer that vanished while a connection idles; the user timeout gives up on
#: one whose data goes unacknowledged (a network partition) after 30 s, where the kernel would
#: retransmit for about 15 minutes; a new connection gives up after 10 s instead of the kernel's two
#: minutes of SYN retries. All are the client's: nothing reaches the server, or a pooler in between.
TCP_SETTINGS: dict[str, int] = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}
