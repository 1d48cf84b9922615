"""The claim thread runs a callable on its own thread and hands back its result or its exception."""

from __future__ import annotations

import threading

import pytest

from notifications_retry.engine.claim_thread import ClaimThread

NAME = "notifications-retry-claimer"


def live_claimers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(NAME)]


def test_a_claim_runs_on_the_claim_thread_and_its_result_comes_back():
    claimer = ClaimThread()
    assert not claimer.started and not live_claimers(), "no thread before the first claim"
    try:
        name = claimer.submit(lambda: threading.current_thread().name).result(5)
        assert name.startswith(NAME) and name != threading.current_thread().name
    finally:
        claimer.close()
    assert not claimer.started and not live_claimers(), "close() ends the thread"


def test_what_a_claim_raised_is_raised_where_its_result_is_taken_and_the_thread_goes_on():
    claimer = ClaimThread()
    try:
        with pytest.raises(ZeroDivisionError):
            claimer.submit(lambda: 1 / 0).result(5)
        assert claimer.submit(lambda: 42).result(5) == 42
    finally:
        claimer.close()


def test_a_closed_claim_thread_starts_again_on_the_next_claim():
    claimer = ClaimThread()
    claimer.submit(lambda: None).result(5)
    claimer.close()
    try:
        assert claimer.submit(lambda: "again").result(5) == "again"
        assert claimer.started
    finally:
        claimer.close()
