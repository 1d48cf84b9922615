"""``--profile``: where the worker's time goes on the no-op path, per function, over one big drain.

Seeds due rows on a ``stub`` channel and runs one ``retry_worker --once`` tick under cProfile (or
pyinstrument, when asked for and installed), then prints the top functions by cumulative time.
Only the thread that runs the tick is profiled: inline providers deliver on it.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import re
import time

from bench.db import ROOT, add_rows, channel, reset_rows
from bench.worker_drain import drain_once


def profile_drain(rows: int, profiler: str = "cprofile", top: int = 40, logging: str = "stdlib") -> str:
    """Profile a ``rows``-row no-op drain, log events through ``logging`` (``stdlib`` or ``native``,
    see :func:`bench.settings.configure_logging`); returns the report text."""
    from bench.settings import configure_logging

    configure_logging(logging)
    reset_rows()
    cid = channel("stub", "stub")
    add_rows([cid], rows)
    header = (
        f"## Profile of a {rows:,}-row no-op drain (stub provider, one --once tick), {profiler}, "
        f"{logging} logging"
    )
    if profiler == "pyinstrument":
        from pyinstrument import Profiler

        instrument = Profiler(interval=0.001)
        started = time.perf_counter()
        instrument.start()
        sent = drain_once(rows)
        instrument.stop()
        elapsed = time.perf_counter() - started
        body = instrument.output_text(unicode=False, color=False, show_all=False)
    else:
        profile = cProfile.Profile()
        started = time.perf_counter()
        profile.enable()
        sent = drain_once(rows)
        profile.disable()
        elapsed = time.perf_counter() - started
        out = io.StringIO()
        stats = pstats.Stats(profile, stream=out)
        stats.sort_stats("cumulative").print_stats(top)
        body = out.getvalue()
    # Paths relative to the project and to site-packages: shorter lines, and no machine's layout.
    body = body.replace(ROOT + os.sep, "")
    body = re.sub(r"\S*site-packages/", "", body)
    body = re.sub(r"\S*/lib/python3\.\d+/", "", body)
    summary = f"sent {sent:,} rows in {elapsed:.1f} s under the profiler ({sent / elapsed:,.0f} rows/s)"
    return "\n".join([header, summary, body])
