"""Reading an exception: the errors it wraps, and what it says in one line.

Django wraps the driver's error, aiohttp keeps the OS error it met, urllib3 the reason of a failed
retry: whoever looks for one kind of error in there (a refused address, a SQLSTATE, a connect that
failed) walks them all with :func:`causes`. Log lines and check messages quote an error by
:func:`first_line` (or :func:`message_line`), never with its traceback.
"""

from __future__ import annotations

from collections.abc import Iterator


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every error it wraps, each once, outermost first.

    Followed: ``__cause__``, ``__context__``, an ``os_error`` or ``reason`` attribute holding an
    exception, and exceptions among its ``args``.
    """
    seen: set[int] = set()
    stack: list[object] = [exc]
    while stack:
        current = stack.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        linked = [
            current.__cause__,
            current.__context__,
            getattr(current, "os_error", None),
            getattr(current, "reason", None),
            *current.args,
        ]
        stack.extend(reversed(linked))


def message_line(exc: BaseException) -> str:
    """The first line of the error's message (its type's name when the message is empty)."""
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def first_line(exc: BaseException) -> str:
    """The error in one line: its type and the first line of its message."""
    if not str(exc).strip():
        return type(exc).__name__
    return f"{type(exc).__name__}: {message_line(exc)}"
