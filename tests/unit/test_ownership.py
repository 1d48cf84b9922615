"""Sends start only while the cycle's lock was seen held within the ownership window."""

from __future__ import annotations

from notifications_retry.database.locks import WINDOW_SECONDS, Ownership


def test_a_send_may_start_within_the_window_of_the_last_confirmation():
    ownership = Ownership(lambda: 0.0, idle_session_timeout=90)
    assert not ownership.may_send(0.0)  # never confirmed
    ownership.begin(10.0)
    assert ownership.window == WINDOW_SECONDS
    assert ownership.may_send(10.0 + WINDOW_SECONDS - 0.01)
    assert not ownership.may_send(10.0 + WINDOW_SECONDS)
    ownership.confirm(True, 20.0)
    assert ownership.may_send(20.5)


def test_a_freeze_long_enough_to_lose_the_lock_always_outlasts_the_window():
    # The server ends the lock's session after idle_session_timeout: the window is at most half of it.
    ownership = Ownership(lambda: 0.0, idle_session_timeout=2)
    ownership.begin(0.0)
    assert ownership.window == 1.0
    assert not ownership.may_send(2.0)  # resumed after a freeze past the idle timeout


def test_once_lost_the_tick_never_owns_the_cycle_again():
    ownership = Ownership(lambda: 0.0, idle_session_timeout=90)
    ownership.begin(0.0)
    ownership.confirm(False, 1.0)
    assert ownership.lost and not ownership.may_send(1.0)
    ownership.confirm(True, 2.0)
    assert not ownership.may_send(2.0)
