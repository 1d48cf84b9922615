"""notifications_retry.exceptions: the one walk over an error's causes, and the one line it is quoted by."""

from __future__ import annotations

from notifications_retry.exceptions import causes, first_line, message_line


class Wrapper(Exception):
    def __init__(self, message: str, *, os_error: BaseException | None = None) -> None:
        super().__init__(message)
        self.os_error = os_error


def raised(exc: BaseException, cause: BaseException) -> BaseException:
    try:
        raise exc from cause
    except BaseException as caught:
        return caught


def test_causes_follow_cause_context_os_error_reason_and_args_each_once():
    refused = ConnectionRefusedError("refused")
    reason = TimeoutError("reason")
    inner = OSError("inner")
    inner.reason = reason  # type: ignore[attr-defined]
    in_args = ValueError("in args")
    outer = raised(Wrapper("outer", os_error=refused), inner)
    outer.args = (*outer.args, in_args)
    found = list(causes(outer))
    assert found[0] is outer and found[1] is inner  # outermost first, the cause before the rest
    assert {id(e) for e in found} == {id(outer), id(inner), id(reason), id(refused), id(in_args)}
    assert len(found) == 5


def test_causes_end_on_a_cycle():
    a, b = ValueError("a"), ValueError("b")
    a.__cause__, b.__cause__ = b, a
    assert list(causes(a)) == [a, b]


def test_an_error_in_one_line():
    error = RuntimeError("connection failed: no route\nDETAIL: more")
    assert first_line(error) == "RuntimeError: connection failed: no route"
    assert message_line(error) == "connection failed: no route"
    assert first_line(RuntimeError()) == message_line(RuntimeError()) == "RuntimeError"
