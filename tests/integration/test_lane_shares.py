"""Lanes sending on one channel split its limits: the announcement board and the worker's use of it."""

from __future__ import annotations

import bisect
import os
import random
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from structlog.testing import capture_logs

from notifications_retry import lane_shares
from notifications_retry.models import NotificationEntity, WorkerHeartbeat
from notifications_retry.worker import Worker
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.http_server import Reply, ScriptedServer
from tests.support.processes import WorkerProcess, wait_until, worker_env

Status = NotificationEntity.Status
Priority = NotificationEntity.Priority
LANES = {"urgent": {"priorities": [Priority.HIGH]}, "bulk": {"channels": ["bulk-mail"]}}
OTHER_PID = 1  # an announcement this test process did not make


def due(channel, count, *, now=None, **kwargs):
    past = (now or timezone.now()) - timedelta(minutes=1)
    return [
        NotificationFactory(channel=channel, status=Status.FAILED, attempts=1, next_attempt_at=past, **kwargs)
        for _ in range(count)
    ]


def max_in_window(times, window=1.0):
    times = sorted(times)
    return max(bisect.bisect_left(times, t + window, lo=i) - i for i, t in enumerate(times))


def max_overlap(requests, reply_delay):
    """Most requests the server was answering at once (each held ``reply_delay`` seconds)."""
    edges = sorted(
        [(r.received_at, 1) for r in requests] + [(r.received_at + reply_delay, -1) for r in requests]
    )
    best = current = 0
    for _, step in edges:
        current += step
        best = max(best, current)
    return best


def test_which_lanes_share_a_channel():
    active = {"default", "urgent", "bulk"}
    # The default lane and a priority-only lane can send on every channel; "bulk" only on bulk-mail.
    assert lane_shares.sharers(LANES, active, "orders") == 2
    assert lane_shares.sharers(LANES, active, "bulk-mail") == 3
    assert lane_shares.sharers(LANES, {"bulk"}, "orders") == 1  # never less than the caller itself
    # A lane these settings do not know (another release's) is counted on the safe side.
    assert lane_shares.sharers(LANES, {"bulk", "renamed"}, "bulk-mail") == 2
    assert lane_shares.lane_channels(LANES, "default") is None
    assert lane_shares.lane_channels(LANES, "bulk") == frozenset({"bulk-mail"})


@pytest.mark.django_db
def test_announce_says_whether_the_lane_is_joining_and_expires_on_database_time():
    assert lane_shares.announce("urgent", 0.3, "host-a", 10) is True
    assert lane_shares.announce("urgent", 0.3, "host-a", 10) is False  # still active: not joining
    assert lane_shares.active_lanes() == {"urgent"}
    time.sleep(0.4)
    assert lane_shares.active_lanes() == set()
    assert lane_shares.announce("urgent", 5, "host-a", 10) is True  # it had lapsed: joining again
    # Leaving takes only the announcement this process made.
    lane_shares.leave("urgent", "host-b", 11)
    assert lane_shares.active_lanes() == {"urgent"}
    lane_shares.leave("urgent", "host-a", 10)
    assert lane_shares.active_lanes() == set()


@pytest.mark.django_db
def test_a_lane_alone_keeps_the_whole_limits_and_leaves_the_board_after_its_tick(
    clock, webhook_server, settings
):
    settings.NOTIFICATIONS_RETRY = {"LANES": LANES}
    channel = ChannelFactory(
        key="orders",
        provider_key="webhook",
        options={"url": webhook_server.url},
        max_concurrency=4,
        rate_limit_per_second=40,
    )
    due(channel, 40, now=clock.now(), priority=Priority.HIGH)
    worker = Worker(clock=clock, rng=random.Random(1), lane="urgent")
    try:
        with capture_logs() as logs:
            started = time.monotonic()
            assert worker.tick().sent == 40
            elapsed = time.monotonic() - started
    finally:
        worker.close()
    assert not [e for e in logs if e["event"] == "channel-limits-shared"]
    assert elapsed < 39 / 20  # at 40/s, not halved
    beat = WorkerHeartbeat.objects.get(lane="urgent")
    assert beat.active_until is None  # a tick not followed by another gives its share back


@pytest.mark.django_db
def test_a_joining_lane_waits_then_uses_half_the_rate_and_half_the_concurrency(clock, settings):
    settings.NOTIFICATIONS_RETRY = {"LANES": LANES}
    delay = 0.2
    server = ScriptedServer(lambda request: Reply(200, {"id": "ok"}, delay=delay)).start()
    try:
        channel = ChannelFactory(
            key="orders",
            provider_key="webhook",
            options={"url": server.url},
            max_concurrency=4,
            rate_limit_per_second=40,
        )
        due(channel, 20, now=clock.now(), priority=Priority.HIGH)
        # The default lane's owner is sending (in another process, as far as this worker knows).
        lane_shares.announce("default", 30, "elsewhere", OTHER_PID)
        worker = Worker(clock=clock, rng=random.Random(1), lane="urgent")
        try:
            with capture_logs() as logs:
                started = time.monotonic()
                assert worker.tick().sent == 20
        finally:
            worker.close()
    finally:
        server.stop()
    shared = [e for e in logs if e["event"] == "channel-limits-shared"]
    assert shared[0]["lanes"] == 2 and shared[0]["max_concurrency"] == 2
    assert (
        shared[0]["rate_limit_per_second"] == 20 and shared[0]["join_wait_s"] == lane_shares.JOIN_WAIT_SECONDS
    )
    arrivals = sorted(r.received_at for r in server.requests)
    # Held back while the other owner scales down; then never more than its half.
    assert arrivals[0] - started >= lane_shares.JOIN_WAIT_SECONDS - 0.05
    assert max_overlap(server.requests, delay) <= 2
    assert max_in_window(arrivals) <= 20 * 1.05


@pytest.mark.django_db
def test_lanes_on_disjoint_channels_do_not_share(clock, webhook_server, settings):
    settings.NOTIFICATIONS_RETRY = {"LANES": LANES}
    channel = ChannelFactory(
        key="bulk-mail",
        provider_key="webhook",
        options={"url": webhook_server.url},
        max_concurrency=4,
        rate_limit_per_second=40,
    )
    due(channel, 10, now=clock.now())
    lane_shares.announce("urgent", 30, "elsewhere", OTHER_PID)  # priority-only: it may send on bulk-mail
    WorkerHeartbeat.objects.create(lane="other-bulk", active_until=None)  # not active: not counted
    worker = Worker(clock=clock, rng=random.Random(1), lane="bulk")
    try:
        with capture_logs() as logs:
            assert worker.tick().sent == 10
    finally:
        worker.close()
    assert [e["lanes"] for e in logs if e["event"] == "channel-limits-shared"] == [2]

    # A lane selected by channels does not share a channel outside them.
    lane_shares.leave("urgent", "elsewhere", OTHER_PID)
    lane_shares.announce("bulk", 30, "elsewhere", OTHER_PID)
    orders = ChannelFactory(key="orders", provider_key="webhook", options={"url": webhook_server.url})
    due(orders, 3, now=clock.now())
    worker = Worker(clock=clock, rng=random.Random(1), lane="urgent")
    try:
        with capture_logs() as logs:
            worker.tick()
    finally:
        worker.close()
    assert not [e for e in logs if e["event"] == "channel-limits-shared" and e["channel"] == "orders"]


# Committed for real: the joiner announces on its own connection, as another process would.
@pytest.mark.django_db(transaction=True)
def test_a_ticking_lane_scales_down_within_a_refresh_when_another_joins(clock, settings):
    settings.NOTIFICATIONS_RETRY = {"LANES": LANES}
    server = ScriptedServer(lambda request: Reply(200, {"id": "ok"})).start()
    try:
        channel = ChannelFactory(
            key="orders",
            provider_key="webhook",
            options={"url": server.url},
            max_concurrency=4,
            rate_limit_per_second=40,
        )
        due(channel, 100, now=clock.now())
        joined: list[float] = []

        def join_later() -> None:
            time.sleep(0.8)
            from django.db import connections

            try:
                lane_shares.announce("urgent", 30, "elsewhere", OTHER_PID)
                joined.append(time.monotonic())
            finally:
                connections.close_all()

        worker = Worker(clock=clock, rng=random.Random(1))
        joiner = threading.Thread(target=join_later)
        with capture_logs() as logs:
            joiner.start()
            try:
                assert worker.tick().sent == 100
            finally:
                joiner.join()
                worker.close()
    finally:
        server.stop()
    assert [e["lanes"] for e in logs if e["event"] == "channel-limits-shared"] == [2]
    arrivals = sorted(r.received_at for r in server.requests)
    before = [t for t in arrivals if t < joined[0]]
    after = [t for t in arrivals if t >= joined[0] + lane_shares.REFRESH_SECONDS + 0.1]
    assert max_in_window(before, 0.5) >= 18  # about 40/s before the other lane joined
    assert max_in_window(after) <= 20 * 1.05  # half of it once this owner re-read the board


@pytest.mark.django_db(transaction=True)
def test_two_lane_processes_on_one_channel_keep_to_its_rate_together(tmp_path):
    rate = 40
    server = ScriptedServer(lambda request: Reply(200, {"id": "ok"})).start()
    try:
        channel = ChannelFactory(
            key="orders",
            provider_key="webhook",
            options={"url": server.url},
            max_concurrency=4,
            rate_limit_per_second=rate,
        )
        due(channel, 80, priority=Priority.HIGH)
        due(channel, 80, priority=Priority.NORMAL)
        url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
        settings = {"LANES": LANES, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
        env = worker_env(url, connection.settings_dict["NAME"], settings)
        procs = [
            WorkerProcess(["--once", *lane, "--max-duration", "60"], env, tmp_path, name).start()
            for name, lane in (("default", []), ("urgent", ["--lane", "urgent"]))
        ]
        for proc in procs:
            assert proc.wait(90) == 0, proc.output()
    finally:
        server.stop()
    assert NotificationEntity.objects.filter(status=Status.SENT).count() == 160
    assert len(server.requests) == 160
    # Both lanes sent, and at least one saw the other: the scenario ran, not one lane after the other.
    assert all("item-sent" in proc.output() for proc in procs)
    assert any("channel-limits-shared" in proc.output() for proc in procs)
    arrivals = sorted(r.received_at for r in server.requests)
    # Each lane alone would send at 40/s: together, without the split, 80/s.
    assert max_in_window(arrivals) <= rate * 1.05


@pytest.mark.django_db(transaction=True)
def test_a_looping_owner_stays_announced_between_ticks_and_leaves_when_it_stops():
    interval = 5.0
    worker = Worker(interval=interval)

    def run() -> None:
        from django.db import connections

        try:
            worker.run()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    try:

        def announced_after_tick() -> bool:
            beat = WorkerHeartbeat.objects.filter(lane="default").first()
            return bool(beat and beat.last_tick_completed_at and beat.active_until)

        wait_until(announced_after_tick, 10, message="first tick completed")
        beat = WorkerHeartbeat.objects.get(lane="default")
        # Between ticks the owner keeps its part: its next tick starts within the interval.
        held = (beat.active_until - beat.last_tick_completed_at).total_seconds()
        assert (
            interval + lane_shares.ACTIVE_GRACE_SECONDS - 1
            <= held
            <= interval + lane_shares.ACTIVE_GRACE_SECONDS + 1
        )
        assert lane_shares.active_lanes() == {"default"}
    finally:
        worker.stop()
        thread.join(15)
    assert not thread.is_alive()
    assert lane_shares.active_lanes() == set()
