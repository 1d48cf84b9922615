"""Whether this worker still owns the cycle, known before each new provider call.

The cycle's lock lives on a session of its own (:mod:`notifications_retry.database.locks`); PostgreSQL
ends that session once it idles past ``LOCK_IDLE_SESSION_TIMEOUT_SECONDS``, and a standby then takes the
lock and, once their leases run out, the rows. A process that was frozen (SIGSTOP, a paused VM) past that
timeout must start nothing when it resumes. So a send may start only within :attr:`Ownership.window`
seconds of the last time the lock was seen held: shorter than the idle timeout, a freeze long enough to
lose the lock always outlasts it, and the worker's thread confirms the lock again (or learns it is lost)
before any more calls start.
"""

from __future__ import annotations

from collections.abc import Callable

#: The longest a confirmation lets calls start (the window is also at most half the idle timeout).
WINDOW_SECONDS = 5.0


class Ownership:
    """When the lock was last seen held, and whether a send may start now."""

    def __init__(self, monotonic: Callable[[], float], idle_session_timeout: float) -> None:
        self.monotonic = monotonic
        self.window = min(WINDOW_SECONDS, float(idle_session_timeout) / 2)
        self._confirmed_at: float | None = None
        self.lost = False

    def begin(self, at: float) -> None:
        """A tick took the lock at ``at``: owned, confirmed then."""
        self._confirmed_at, self.lost = at, False

    def confirm(self, held: bool, at: float) -> None:
        """What the lock's session said at ``at``; once lost, the tick never owns the cycle again."""
        if held and not self.lost:
            self._confirmed_at = at
        else:
            self.lost = True

    def may_send(self, at: float | None = None) -> bool:
        """Whether a new provider call may start now: the lock was seen held within the window."""
        if self.lost or self._confirmed_at is None:
            return False
        at = self.monotonic() if at is None else at
        return at - self._confirmed_at < self.window
