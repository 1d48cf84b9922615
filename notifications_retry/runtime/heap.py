"""The worker process's garbage collector, set for a send loop that runs for hours.

``retry_worker`` calls :func:`prepare_for_long_run` once, before its first tick:

- What the process has loaded by then (Django, the app, its libraries) lives as long as the process.
  The collector's full passes walked all of it again each time, stalling the send loop for tens of
  milliseconds; frozen (``gc.freeze``), it is no longer walked.
- The youngest generation is collected whenever 700 more container objects are alive than at the last
  collection (CPython's default). A worker with a hundred calls in flight keeps more than that alive
  at once (each call's request, answer, task and timer), so at the default the collector ran every few
  answers, walking the same live calls, and every tenth run walked the middle generation too. A young
  generation of :data:`YOUNG_THRESHOLD` objects holds the calls in flight of any channel's concurrency
  a worker runs, and costs only the cyclic garbage it lets wait longer (docs/performance.md, "Where the
  loop's time goes at c=128").
"""

from __future__ import annotations

import gc

#: The youngest generation's threshold a worker runs with (unless the project set a larger one, or 0).
YOUNG_THRESHOLD = 20_000


def prepare_for_long_run() -> None:
    """Collect and freeze what is loaded, and raise the youngest generation's threshold (a threshold the
    project set higher, or 0 for no automatic collection, is kept)."""
    gc.collect()
    gc.freeze()
    young, *older = gc.get_threshold()
    if 0 < young < YOUNG_THRESHOLD:
        gc.set_threshold(YOUNG_THRESHOLD, *older)


__all__ = ["YOUNG_THRESHOLD", "prepare_for_long_run"]
