"""Lanes sending on one channel split its limits: the announcement board and the worker's use of it."""

from __future__ import annotations

import bisect
import dataclasses
import os
import random
import threading
import time
from datetime import timedelta

import pytest
import structlog
from django.db import OperationalError, connection, connections
from django.utils import timezone
from structlog.testing import capture_logs

from notifications_retry.engine import lane_shares
from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity, WorkerHeartbeat
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.http_server import Reply, ScriptedServer
from tests.support.processes import WorkerProcess, wait_until, worker_env

Status = NotificationEntity.Status
Priority = NotificationEntity.Priority
LANES = {"urgent": {"priorities": [Priority.HIGH]}, "bulk": {"channels": ["bulk-mail"]}}
OTHER = "another-process"  # the token of an announcement no worker here made


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


def board() -> dict[str, lane_shares.Announcement]:
    return {a.lane: a for a in lane_shares.read_board()[0]}


def in_thread(target):
    """Run ``target`` on its own thread and database connection (committed: as another process)."""

    def run() -> None:
        try:
            target()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def tick(worker, beside=None):
    """One tick of ``worker``, then closed; ``beside`` runs on its own thread meanwhile."""
    thread = in_thread(beside) if beside is not None else None
    try:
        with capture_logs() as logs:
            stats = worker.tick()
    finally:
        if thread is not None:
            thread.join(15)
        worker.close()
    return stats, logs


def orders_channel(url, **kwargs):
    kwargs.setdefault("max_concurrency", 4)
    kwargs.setdefault("rate_limit_per_second", 40)
    return ChannelFactory(key="orders", provider_key="webhook", options={"url": url}, **kwargs)


@pytest.mark.django_db
def test_announce_says_whether_the_lane_is_joining_and_expires_on_database_time():
    assert lane_shares.announce("urgent", "token-a", 0.3) is True
    assert lane_shares.announce("urgent", "token-a", 0.3) is False  # still active: not joining
    assert board() == {"urgent": lane_shares.Announcement("urgent", False, frozenset())}
    assert lane_shares.read_board()[1] == {"token-a"}
    time.sleep(0.4)
    assert board() == {}
    assert lane_shares.announce("urgent", "token-a", 5) is True  # it had lapsed: joining again
    # A settled read is kept until the next read replaces it; an announcement without one keeps it.
    lane_shares.announce("urgent", "token-a", 5, seen={"token-a", "token-x"})
    lane_shares.announce("urgent", "token-a", 5, idle=True)
    assert board()["urgent"] == lane_shares.Announcement("urgent", True, frozenset({"token-a", "token-x"}))
    lane_shares.announce("urgent", "token-a", 5, seen=())  # a read after which its calls did not fit
    assert board()["urgent"].seen == frozenset()
    # Leaving takes only the announcement this process made (another instance of the lane may own it).
    lane_shares.leave("urgent", "token-b")
    assert set(board()) == {"urgent"}
    lane_shares.leave("urgent", "token-a")
    assert board() == {}


@pytest.mark.django_db
def test_a_lane_alone_keeps_the_whole_limits_and_leaves_the_board_after_its_tick(
    clock, webhook_server, settings
):
    settings.NOTIFICATIONS_RETRY = {"LANES": LANES, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
    due(orders_channel(webhook_server.url), 40, now=clock.now(), priority=Priority.HIGH)
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
    assert WorkerHeartbeat.objects.get(lane="urgent").active_until is None  # --once: gave its part back


@pytest.mark.django_db(transaction=True)
def test_a_joining_lane_holds_back_until_the_sending_lane_settles_then_takes_half(clock, settings):
    settings.NOTIFICATIONS_RETRY = {"LANES": LANES, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
    delay = 0.2
    server = ScriptedServer(lambda request: Reply(200, {"id": "ok"}, delay=delay)).start()
    settled: list[float] = []
    try:
        due(orders_channel(server.url), 20, now=clock.now(), priority=Priority.HIGH)
        # The default lane's owner is sending (in another process, as far as this worker knows).
        lane_shares.announce("default", OTHER, 30)

        def settle_later() -> None:
            wait_until(lambda: "urgent" in board(), 10, message="the urgent lane announced itself")
            time.sleep(0.7)
            lane_shares.announce("default", OTHER, 30, seen=lane_shares.read_board()[1])
            settled.append(time.monotonic())

        stats, logs = tick(Worker(clock=clock, rng=random.Random(1), lane="urgent"), settle_later)
        assert stats.sent == 20
    finally:
        server.stop()
    shared = [e for e in logs if e["event"] == "channel-limits-shared"]
    assert (shared[0]["lanes"], shared[0]["held"], shared[0]["max_concurrency"]) == (2, True, 2)
    assert shared[0]["rate_limit_per_second"] == 20
    assert shared[-1]["held"] is False
    arrivals = sorted(r.received_at for r in server.requests)
    assert arrivals[0] >= settled[0]  # nothing sent before the other lane had scaled down
    assert max_overlap(server.requests, delay) <= 2
    assert max_in_window(arrivals) <= 20 * 1.05


@pytest.mark.django_db
def test_a_lane_idle_between_ticks_is_counted_but_not_waited_for(clock, webhook_server, settings):
    settings.NOTIFICATIONS_RETRY = {"LANES": LANES, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
    due(orders_channel(webhook_server.url), 10, now=clock.now(), priority=Priority.HIGH)
    lane_shares.announce("default", OTHER, 30, idle=True)  # reads the board before it sends again
    worker = Worker(clock=clock, rng=random.Random(1), lane="urgent")
    try:
        with capture_logs() as logs:
            started = time.monotonic()
            assert worker.tick().sent == 10
    finally:
        worker.close()
    first = min(r.received_at for r in webhook_server.requests)
    assert first - started < 0.5
    shared = [e for e in logs if e["event"] == "channel-limits-shared"]
    assert [(e["lanes"], e["held"]) for e in shared] == [(2, False)]


@pytest.mark.django_db
def test_a_joining_lane_with_nothing_due_on_its_held_channels_ends_its_tick(clock, webhook_server, settings):
    settings.NOTIFICATIONS_RETRY = {"LANES": LANES, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
    orders_channel(webhook_server.url)
    lane_shares.announce("default", OTHER, 30)  # sending, never settles
    worker = Worker(clock=clock, rng=random.Random(1), lane="urgent")
    try:
        started = time.monotonic()
        stats = worker.tick()
    finally:
        worker.close()
    assert stats.processed == 0 and time.monotonic() - started < 1.0


@pytest.mark.django_db
def test_lanes_on_disjoint_channels_do_not_share(clock, webhook_server, settings):
    settings.NOTIFICATIONS_RETRY = {"LANES": LANES, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
    channel = ChannelFactory(
        key="bulk-mail",
        provider_key="webhook",
        options={"url": webhook_server.url},
        max_concurrency=4,
        rate_limit_per_second=40,
    )
    due(channel, 10, now=clock.now())
    lane_shares.announce("urgent", OTHER, 30, idle=True)  # priority-only: it may send on bulk-mail
    WorkerHeartbeat.objects.create(lane="other-bulk", active_until=None)  # not on the board
    stats, logs = tick(Worker(clock=clock, rng=random.Random(1), lane="bulk"))
    assert stats.sent == 10
    assert [e["lanes"] for e in logs if e["event"] == "channel-limits-shared"] == [2]

    # A lane selected by channels does not share a channel outside them.
    lane_shares.leave("urgent", OTHER)
    lane_shares.announce("bulk", OTHER, 30)
    due(orders_channel(webhook_server.url), 3, now=clock.now(), priority=Priority.HIGH)
    stats, logs = tick(Worker(clock=clock, rng=random.Random(1), lane="urgent"))
    assert stats.sent == 3
    assert not [e for e in logs if e["event"] == "channel-limits-shared" and e["channel"] == "orders"]


@pytest.mark.django_db
def test_more_lanes_than_calls_allowed_is_logged_as_over_the_limit(clock, webhook_server, settings):
    settings.NOTIFICATIONS_RETRY = {"LANES": LANES, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
    due(orders_channel(webhook_server.url, max_concurrency=1, rate_limit_per_second=None), 2, now=clock.now())
    lane_shares.announce("urgent", OTHER, 30, idle=True)
    stats, logs = tick(Worker(clock=clock, rng=random.Random(1)))
    assert stats.sent == 2
    (event,) = [e for e in logs if e["event"] == "channel-limits-shared"]
    assert event["log_level"] == "warning" and event["over_limit"] is True and event["max_concurrency"] == 1


@pytest.mark.django_db(transaction=True)
def test_a_ticking_lane_scales_down_and_settles_when_another_joins(clock, settings):
    settings.NOTIFICATIONS_RETRY = {"LANES": LANES, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
    server = ScriptedServer(lambda request: Reply(200, {"id": "ok"})).start()
    joined: list[float] = []
    seen: list[float] = []
    try:
        due(orders_channel(server.url), 100, now=clock.now())

        def join_later() -> None:
            time.sleep(0.8)
            joined.append(time.monotonic())
            lane_shares.announce("urgent", OTHER, 30)
            # The way a joining owner waits: until the sending lane has settled with it.
            wait_until(lambda: OTHER in board()["default"].seen, 10, message="default settled")
            seen.append(time.monotonic())

        stats, logs = tick(Worker(clock=clock, rng=random.Random(1)), join_later)
        assert stats.sent == 100
    finally:
        server.stop()
    assert [e["lanes"] for e in logs if e["event"] == "channel-limits-shared"] == [2]
    arrivals = sorted(r.received_at for r in server.requests)
    assert max_in_window([t for t in arrivals if t < joined[0]], 0.5) >= 15  # about 40/s before
    assert max_in_window([t for t in arrivals if t >= seen[0]]) <= 20 * 1.05  # half, once settled


@pytest.mark.django_db(transaction=True)
def test_an_owner_does_not_settle_while_its_calls_in_flight_exceed_its_new_part(clock, settings):
    settings.NOTIFICATIONS_RETRY = {"LANES": LANES, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
    delay = 1.5
    server = ScriptedServer(lambda request: Reply(200, {"id": "ok"}, delay=delay)).start()
    seen: list[float] = []
    try:
        due(orders_channel(server.url, rate_limit_per_second=None), 8, now=clock.now())

        def join_when_four_in_flight() -> None:
            wait_until(lambda: len(server.requests) >= 4, 10, message="four calls in flight")
            lane_shares.announce("urgent", OTHER, 30)
            wait_until(lambda: OTHER in board()["default"].seen, 10, message="default settled")
            seen.append(time.monotonic())

        stats, _ = tick(Worker(clock=clock, rng=random.Random(1)), join_when_four_in_flight)
        assert stats.sent == 8
    finally:
        server.stop()
    first_answers = min(r.received_at for r in server.requests) + delay
    # Four calls ran against a new part of two: settled only once some of them had ended.
    assert seen[0] >= first_answers - 0.05
    assert max_overlap(server.requests[4:], delay) <= 2


@pytest.mark.django_db
def test_a_failed_board_read_keeps_the_parts_and_the_tick_goes_on(
    clock, webhook_server, settings, monkeypatch
):
    settings.NOTIFICATIONS_RETRY = {"LANES": LANES, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
    due(orders_channel(webhook_server.url), 60, now=clock.now())
    lane_shares.announce("urgent", OTHER, 30, idle=True)
    reads = 0
    real_read = lane_shares.read_board

    def failing_after_the_first():
        nonlocal reads
        reads += 1
        if reads > 1:
            raise OperationalError("the board is unreachable")
        return real_read()

    monkeypatch.setattr(lane_shares, "read_board", failing_after_the_first)
    stats, logs = tick(Worker(clock=clock, rng=random.Random(1)))
    assert stats.sent == 60
    assert reads >= 2
    assert any(e["event"] == "lane-shares-refresh-failed" for e in logs)
    arrivals = sorted(r.received_at for r in webhook_server.requests)
    assert max_in_window(arrivals) <= 20 * 1.05  # still half


@pytest.mark.django_db(transaction=True)
def test_two_lane_processes_on_one_channel_keep_to_its_rate_together(tmp_path):
    rate = 40
    server = ScriptedServer(lambda request: Reply(200, {"id": "ok"})).start()
    try:
        channel = orders_channel(server.url, rate_limit_per_second=rate)
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
def test_a_looping_owner_stays_on_the_board_idle_between_ticks_and_leaves_when_it_stops():
    interval = 5.0
    worker = Worker(interval=interval)
    thread = in_thread(worker.run)
    try:

        def on_board_after_a_tick() -> bool:
            beat = WorkerHeartbeat.objects.filter(lane="default").first()
            return bool(beat and beat.last_tick_completed_at and beat.idle)

        wait_until(on_board_after_a_tick, 10, message="first tick completed")
        beat = WorkerHeartbeat.objects.get(lane="default")
        # Between ticks the owner keeps its part: its next tick starts within the interval.
        held = (beat.active_until - beat.last_tick_completed_at).total_seconds()
        grace = lane_shares.ACTIVE_GRACE_SECONDS
        assert interval + grace - 1 <= held <= interval + grace + 1
        assert set(board()) == {"default"}
    finally:
        worker.stop()
        thread.join(15)
    assert not thread.is_alive()
    assert board() == {}


# -- the board's protocol, owner by owner (each LaneBoard is one process's side of it) --------------


@dataclasses.dataclass
class Channel:
    """A channel's state as the board sees it in a worker: limits 4 calls, split among lanes."""

    key: str = "orders"
    inflight: int = 0
    held: bool = False
    share: int = 1
    rate_limit: float | None = None
    limits_shared: bool = True

    @property
    def max_concurrency(self) -> int:
        return max(1, 4 // self.share)

    @property
    def over_limit(self) -> bool:
        return self.share > 4

    def set_share(self, share: int) -> bool:
        changed, self.share = share != self.share, share
        return changed


LOG = structlog.get_logger("test")


def owner(lane: str) -> tuple[lane_shares.LaneBoard, Channel]:
    board_, channel = lane_shares.LaneBoard(lane, LANES), Channel()
    board_.begin_tick([channel], time.monotonic(), LOG)
    return board_, channel


def read_now(board_: lane_shares.LaneBoard, channel: Channel) -> None:
    board_.next_read = 0.0
    board_.refresh([channel], time.monotonic(), LOG)


@pytest.mark.django_db
def test_a_joiner_is_released_only_once_the_sender_has_read_the_board_since():
    sender, sending = owner("default")
    assert (sending.share, sending.held) == (1, False)
    joiner, joining = owner("urgent")
    assert (joining.share, joining.held) == (2, True)
    read_now(joiner, joining)
    assert joining.held  # the sender has not read the board since
    read_now(sender, sending)
    assert sending.share == 2
    read_now(joiner, joining)
    assert not joining.held and not joiner.joining


@pytest.mark.django_db
def test_a_sender_with_calls_beyond_its_new_part_does_not_release_the_joiner():
    sender, sending = owner("default")
    sending.inflight = 4
    joiner, joining = owner("urgent")
    read_now(sender, sending)
    read_now(joiner, joining)
    assert sending.share == 2 and joining.held  # four calls still run against a part of two
    sending.inflight = 2
    read_now(sender, sending)
    read_now(joiner, joining)
    assert not joining.held


@pytest.mark.django_db
def test_a_rejoin_does_not_count_an_acknowledgement_of_the_earlier_join():
    sender, sending = owner("default")
    joiner, joining = owner("urgent")
    read_now(sender, sending)
    read_now(joiner, joining)
    assert not joining.held
    first_token = joiner.token
    joiner.end_tick(looping=False, interval=60, calls_running=False, bound=LOG)  # a --once tick ends
    assert set(board()) == {"default"}
    assert first_token in board()["default"].seen  # the sender has not read the board since
    joiner.begin_tick([joining], time.monotonic(), LOG)
    assert joiner.token != first_token and joining.held


@pytest.mark.django_db
def test_an_owner_that_dropped_off_the_board_holds_back_until_acknowledged_again():
    sender, sending = owner("default")
    joiner, joining = owner("urgent")
    read_now(sender, sending)
    read_now(joiner, joining)
    assert not joining.held
    # Stalled past its grace: locally, it stops starting calls on shared channels at once...
    joiner.valid_until = time.monotonic() - 1
    joiner.refresh([joining], time.monotonic(), LOG)  # not yet time to read: the hold is local
    assert joining.held
    # ...and the others may have taken its part meanwhile.
    WorkerHeartbeat.objects.filter(lane="urgent").update(active_until=timezone.now() - timedelta(seconds=1))
    read_now(sender, sending)
    assert sending.share == 1
    read_now(joiner, joining)  # back on the board: a join, under a new token
    assert joiner.joining and joining.held
    read_now(sender, sending)
    read_now(joiner, joining)
    assert sending.share == 2 and not joining.held


@pytest.mark.django_db
def test_a_standby_taking_over_a_lane_joins_anew_and_the_old_owner_stops_writing():
    sender, sending = owner("default")
    first, first_channel = owner("urgent")
    read_now(sender, sending)
    read_now(first, first_channel)
    assert not first_channel.held
    first.lock_lost()  # another instance of "urgent" owns the lock now
    second, second_channel = owner("urgent")
    assert second.token != first.token and second_channel.held  # not covered by the first's join
    read_now(first, first_channel)
    first.end_tick(looping=True, interval=60, calls_running=False, bound=LOG)
    first.leave()
    row = WorkerHeartbeat.objects.get(lane="urgent")
    assert (row.share_token, row.idle, row.active_until is not None) == (second.token, False, True)


@pytest.mark.django_db
def test_a_looping_owner_is_idle_between_ticks_only_when_no_call_still_runs():
    looping, _ = owner("default")
    looping.end_tick(looping=True, interval=60, calls_running=True, bound=LOG)
    assert board()["default"].idle is False
    looping.end_tick(looping=True, interval=60, calls_running=False, bound=LOG)
    assert board()["default"].idle is True
