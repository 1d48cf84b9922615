"""The process the app runs in.

:mod:`.clock` is the one clock due and lease decisions use; :mod:`.asyncio_bridge` runs the one event
loop on a thread and a coroutine from synchronous code, and bounds an awaited call without mistaking
a paused process for a slow answer (``deadline``).
"""
