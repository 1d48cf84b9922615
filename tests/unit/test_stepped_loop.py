"""The send loop its owner runs in steps: a task started there runs only while the owner runs the loop,
and the owner takes its result (or what it raised) when it chooses; close cancels what still runs."""

from __future__ import annotations

import asyncio

import pytest

from notifications_retry.runtime.asyncio_bridge import SteppedLoop


def test_a_started_task_runs_only_while_the_owner_runs_the_loop_and_its_result_is_taken_later():
    loop = SteppedLoop()
    steps: list[str] = []
    answer = asyncio.Event()

    async def claim() -> int:
        steps.append("sent")
        await answer.wait()  # the server's answer
        steps.append("answered")
        return 42

    try:
        task = loop.start(claim())
        assert steps == [], "nothing runs between the owner's steps"
        loop.pause(0.0)
        assert steps == ["sent"] and not task.done()
        answer.set()
        assert steps == ["sent"], "the answer is read at the owner's next step"
        assert loop.run(task) == 42
        assert steps == ["sent", "answered"]
    finally:
        loop.close()


def test_what_a_started_task_raised_is_raised_where_the_owner_takes_it():
    loop = SteppedLoop()

    async def failing() -> None:
        raise ZeroDivisionError

    try:
        task = loop.start(failing())
        with pytest.raises(ZeroDivisionError):
            loop.run(task)
    finally:
        loop.close()


def test_close_cancels_a_started_task_still_under_way():
    loop = SteppedLoop()
    ended: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("cleaned up")

    task = loop.start(forever())
    loop.pause(0.0)
    loop.close()
    assert task.cancelled() and ended == ["cleaned up"]
