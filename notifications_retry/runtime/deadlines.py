"""A deadline over an awaited call that does not mistake a paused process for a slow answer.

``asyncio.timeout`` fires as soon as the loop runs again after its time has passed. When the process
did not run meanwhile (SIGSTOP, a paused VM, a starved machine), an answer that arrived during the pause
is already waiting in the socket, but the timer runs first and the call counts as a timeout. Here a
deadline whose timer fires more than :data:`LATE_SECONDS` late is given :data:`GRACE_SECONDS` more, once,
so what already came back is read; a call that never answers still ends, that much later.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

#: A timer this late means the process (or its loop) did not run around the deadline.
LATE_SECONDS = 0.5
#: Time given, once, to read what arrived while the process did not run.
GRACE_SECONDS = 0.25


class Deadline:
    """``async with``: like ``asyncio.timeout(seconds)`` (raises ``TimeoutError``), but a late timer gives
    a grace once. A class rather than a generator-based context manager: one is entered per send."""

    __slots__ = ("_due", "_extended", "_handle", "_loop", "_scope", "_seconds")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds

    async def __aenter__(self) -> asyncio.Timeout:
        loop = self._loop = asyncio.get_running_loop()
        scope = self._scope = asyncio.timeout(None)
        await scope.__aenter__()
        self._due = loop.time() + self._seconds
        self._extended = False
        self._handle = loop.call_at(self._due, self._fire)
        return scope

    def _fire(self) -> None:
        now = self._loop.time()
        if not self._extended and now - self._due > LATE_SECONDS:
            self._extended, self._due = True, now + GRACE_SECONDS
            self._handle = self._loop.call_at(self._due, self._fire)
            return
        self._scope.reschedule(now)  # expire: the awaited call is cancelled, TimeoutError on exit

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._handle.cancel()
        await self._scope.__aexit__(exc_type, exc, tb)


def deadline(seconds: float) -> Deadline:
    """A deadline of ``seconds`` from when it is entered (see :class:`Deadline`)."""
    return Deadline(seconds)
