"""Shift this process's wall clock by ``NR_TEST_CLOCK_SKEW`` seconds (faketime is not available here).

Put this directory first on PYTHONPATH: ``time.time`` and ``datetime.now``/``utcnow`` then lie, while
the monotonic clock and PostgreSQL's clock stay true.
"""

from __future__ import annotations

import datetime as _datetime
import os
import time as _time

_SKEW = float(os.environ.get("NR_TEST_CLOCK_SKEW", "0") or 0)

if _SKEW:
    _real_time = _time.time
    _real_time_ns = _time.time_ns
    _time.time = lambda: _real_time() + _SKEW
    _time.time_ns = lambda: _real_time_ns() + int(_SKEW * 1e9)
    _delta = _datetime.timedelta(seconds=_SKEW)
    _Real = _datetime.datetime

    class _SkewedDatetime(_Real):
        @classmethod
        def now(cls, tz=None):  # type: ignore[no-untyped-def, override]
            return _Real.now(tz) + _delta

        @classmethod
        def utcnow(cls):  # type: ignore[no-untyped-def, override]
            return _Real.now(_datetime.UTC).replace(tzinfo=None) + _delta

    _datetime.datetime = _SkewedDatetime  # type: ignore[misc]
