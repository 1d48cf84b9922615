"""A deadline over an awaited call that does not mistake a paused process for a slow answer.

``asyncio.timeout`` fires as soon as the loop runs again after its time has passed. When the process
did not run meanwhile (SIGSTOP, a paused VM, a starved machine), an answer that arrived during the pause
is already waiting in the socket, but the timer runs first and the call counts as a timeout. Here a
deadline whose timer fires more than :data:`LATE_SECONDS` late is given :data:`GRACE_SECONDS` more, once,
so what already came back is read; a call that never answers still ends, that much later.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

#: A timer this late means the process (or its loop) did not run around the deadline.
LATE_SECONDS = 0.5
#: Time given, once, to read what arrived while the process did not run.
GRACE_SECONDS = 0.25


@contextlib.asynccontextmanager
async def deadline(seconds: float) -> AsyncIterator[asyncio.Timeout]:
    """Like ``asyncio.timeout(seconds)`` (raises ``TimeoutError``), but late timers give a grace once."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(None) as scope:
        state: dict[str, Any] = {"due": loop.time() + seconds, "extended": False}

        def fire() -> None:
            now = loop.time()
            if not state["extended"] and now - state["due"] > LATE_SECONDS:
                state["extended"], state["due"] = True, now + GRACE_SECONDS
                state["handle"] = loop.call_at(state["due"], fire)
                return
            scope.reschedule(now)  # expire: the awaited call is cancelled, TimeoutError on exit

        state["handle"] = loop.call_at(state["due"], fire)
        try:
            yield scope
        finally:
            state["handle"].cancel()
