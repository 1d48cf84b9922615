"""The worker's loop tasks (engine.loop_tasks): timers, the share of the loop, failures that never stop it."""

from __future__ import annotations

from datetime import datetime

import pytest
from structlog.testing import capture_logs

from notifications_retry.database.locks import LockNotDirect
from notifications_retry.engine.loop_tasks import LoopTasks, TasksWhileWaiting
from notifications_retry.observability import metrics


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Task:
    """A task whose turns take ``takes`` seconds of the fake clock and return ``delay``, or raise."""

    first_in = 0.0
    budget_seconds = 0.5
    share = 0.5
    retry_seconds = 1.0
    retry_cap_seconds = 8.0

    def __init__(self, name: str, time: FakeTime, *, delay: float = 10.0, takes: float = 0.0) -> None:
        self.name = name
        self.time = time
        self.delay = delay
        self.takes = takes
        self.raises: BaseException | None = None
        self.turns: list[float] = []
        self.closed = False

    def run(self, budget: float) -> float:
        self.turns.append(self.time.now)
        self.time.now += self.takes
        if self.raises is not None:
            raise self.raises
        return self.delay

    def close(self) -> None:
        self.closed = True


def test_a_task_runs_when_due_then_after_the_delay_it_returns():
    time = FakeTime()
    tasks = LoopTasks(monotonic=time, stopping=lambda: False)
    task = Task("t", time, delay=10.0)
    task.first_in = 5.0
    tasks.add(task)
    tasks.run_due()
    assert task.turns == []  # not due before first_in
    time.now = 105.0
    tasks.run_due()
    assert task.turns == [105.0] and tasks.next_at() == 115.0
    time.now = 114.9
    tasks.run_due()
    assert task.turns == [105.0]


def test_a_task_with_more_to_do_takes_at_most_its_share_of_the_loop():
    time = FakeTime()
    tasks = LoopTasks(monotonic=time, stopping=lambda: False)
    task = Task("busy", time, delay=0.0, takes=0.3)
    task.share = 0.25
    tasks.add(task)
    tasks.run_due()
    # 0.3 s of work at a quarter of the loop: the next turn 0.9 s later, not at once.
    assert tasks.next_at() == pytest.approx(100.3 + 0.9)


def test_a_failing_task_is_logged_counted_and_backed_off_and_the_others_still_run():
    time = FakeTime()
    tasks = LoopTasks(monotonic=time, stopping=lambda: False)
    failing, other = Task("failing-task", time), Task("other-task", time, delay=1000.0)
    failing.raises = RuntimeError("the publisher is gone")
    tasks.add(failing)
    tasks.add(other)
    before = metrics.TASK_FAILURES.labels("failing-task")._value.get()
    delays = []
    with capture_logs() as logs:
        for _ in range(5):
            time.now = tasks.next_at()
            due_at = time.now
            tasks.run_due()
            delays.append(min(e.due for e in tasks._entries if e.task is failing) - due_at)
    assert delays[:4] == [1.0, 2.0, 4.0, 8.0] and delays[4] == 8.0  # doubling, capped
    assert metrics.TASK_FAILURES.labels("failing-task")._value.get() - before == 5
    failed = [e for e in logs if e["event"] == "worker-task-failed"]
    assert failed[0]["task"] == "failing-task" and "the publisher is gone" in failed[0]["error"]
    assert other.turns  # a failing task holds no other up
    failing.raises = None
    time.now = tasks.next_at() + 100
    tasks.run_due()
    assert [e.failures for e in tasks._entries] == [0, 0]  # a turn that succeeds resets the backoff


def test_a_lock_that_is_not_direct_stops_the_worker_as_at_a_tick():
    time = FakeTime()
    tasks = LoopTasks(monotonic=time, stopping=lambda: False)
    task = Task("relay", time)
    task.raises = LockNotDirect("default", "a pooler")
    tasks.add(task)
    with pytest.raises(LockNotDirect):
        tasks.run_due()


def test_no_task_runs_once_the_worker_stops_and_close_closes_each():
    time = FakeTime()
    stopped = [True]
    tasks = LoopTasks(monotonic=time, stopping=lambda: stopped[0])
    task = Task("t", time)
    tasks.add(task)
    tasks.run_due()
    assert task.turns == []
    tasks.close()
    assert task.closed and tasks.next_at() == float("inf")


class Port:
    def __init__(self) -> None:
        self.waits: list[float] = []

    def earliest_due(self, after: datetime | None) -> datetime | None:
        return None

    def notified(self, seconds: float) -> bool:
        self.waits.append(seconds)
        return False


def test_the_wait_is_cut_at_the_next_turn_and_the_due_task_runs_in_it():
    time = FakeTime()
    tasks = LoopTasks(monotonic=time, stopping=lambda: False)
    task = Task("relay", time, delay=1.0)
    task.first_in = 0.05
    tasks.add(task)
    port = Port()
    waiting = TasksWhileWaiting(port, tasks)
    assert waiting.notified(0.2) is False
    assert port.waits == [pytest.approx(0.05)]  # not past the task's turn
    time.now += 0.05
    assert waiting.notified(0.2) is False  # the task's turn, instead of a wait
    assert task.turns == [100.05] and port.waits == [pytest.approx(0.05)]
    waiting.notified(0.2)
    assert port.waits[-1] == pytest.approx(0.2)


def test_without_tasks_the_wait_is_the_port_s_own():
    time = FakeTime()
    port = Port()
    waiting = LoopTasks(monotonic=time, stopping=lambda: False).around(port)
    waiting.notified(1.5)
    assert port.waits == [1.5]


def test_the_relay_looks_at_a_slow_batch_less_and_less_often():
    import threading
    from types import SimpleNamespace

    from notifications_retry.outbox.relay import PUBLISH_POLL_MAX_SECONDS, PUBLISH_POLL_SECONDS, RelayTask

    task = RelayTask(SimpleNamespace(interval=1.0, max_backoff=60.0))  # type: ignore[arg-type]
    task._pending = SimpleNamespace(done=threading.Event(), polls=0)  # type: ignore[assignment]
    delays = [task.run(0.5) for _ in range(10)]
    assert delays[0] == pytest.approx(2 * PUBLISH_POLL_SECONDS)
    assert delays == sorted(delays) and delays[-1] == PUBLISH_POLL_MAX_SECONDS


def test_a_nudge_makes_a_task_due_now_unless_it_is_backing_off_a_failure():
    time = FakeTime()
    tasks = LoopTasks(monotonic=time, stopping=lambda: False)
    relay, other, failing = Task("relay", time, delay=5.0), Task("other", time), Task("failing", time)
    failing.raises = RuntimeError("down")
    for task in (relay, other, failing):
        tasks.add(task)
    tasks.run_due()
    time.now = 100.5  # the failing task's retry is at 101
    tasks.nudge("relay")
    tasks.nudge("failing")
    tasks.run_due()
    assert relay.turns == [100.0, 100.5] and other.turns == [100.0]
    assert failing.turns == [100.0]  # its backoff holds: a nudge does not hammer a failing task


class DrainedRelay:
    """A relay whose outbox is drained until ``events`` is set: counts full takes and probes."""

    interval = 1.0
    max_backoff = 60.0
    batch_size = 100

    def __init__(self) -> None:
        self.events = False
        self.takes = 0
        self.probes = 0

    def waiting(self) -> bool:
        self.probes += 1
        return self.events

    def take(self, report: object) -> list[object]:
        self.takes += 1
        return []

    def settle(self, published: list[int], report: object) -> None:
        pass


def test_a_drained_outbox_is_looked_at_less_and_less_often_with_a_probe_a_look():
    from notifications_retry.outbox.relay import IDLE_LOOK_MAX_SECONDS, RelayTask

    relay = DrainedRelay()
    task = RelayTask(relay)  # type: ignore[arg-type]
    delays = [task.run(0.5) for _ in range(6)]
    assert delays == [1.0, 2.0, 4.0, IDLE_LOOK_MAX_SECONDS, IDLE_LOOK_MAX_SECONDS, IDLE_LOOK_MAX_SECONDS]
    assert relay.takes == 1 and relay.probes == 5  # one transaction, then one index probe a look
    relay.events = True  # an event was written elsewhere: the next look takes it
    assert task.run(0.5) == 1.0 and relay.takes == 2  # (the fake takes nothing: drained again)


def test_while_the_worker_waits_its_poll_looks_at_the_outbox_for_the_relay():
    from notifications_retry.outbox.relay import IDLE_LOOK_MAX_SECONDS, RelayTask

    relay = DrainedRelay()
    task = RelayTask(relay)  # type: ignore[arg-type]
    assert task.outbox_seen(False) is None  # never drained yet: its own first turn takes
    assert task.run(0.5) == 1.0 and relay.takes == 1
    # A drained outbox seen by the poll counts as the relay's own look: it postpones it, growing.
    assert [task.outbox_seen(False) for _ in range(4)] == [
        2.0,
        4.0,
        IDLE_LOOK_MAX_SECONDS,
        IDLE_LOOK_MAX_SECONDS,
    ]
    assert relay.probes == 0, "the relay made no look of its own"
    # An event waits: the relay is due now, and its turn takes at once, with no probe of its own.
    relay.events = True
    assert task.outbox_seen(True) == 0.0
    task.run(0.5)
    assert relay.takes == 2 and relay.probes == 0


def test_a_relay_publishing_or_backing_off_keeps_its_own_schedule():
    import threading
    from types import SimpleNamespace

    from notifications_retry.outbox.relay import RelayTask

    task = RelayTask(DrainedRelay())  # type: ignore[arg-type]
    task._drained_in_a_row = 3
    task._pending = SimpleNamespace(done=threading.Event(), polls=0)  # type: ignore[assignment]
    assert task.outbox_seen(True) is None and task.outbox_seen(False) is None
    task._pending, task._down_in_a_row = None, 2
    assert task.outbox_seen(True) is None


class WatchingTask(Task):
    """A task that looks at the outbox too: says ``delay`` when the wait's poll did."""

    def __init__(self, name: str, time: FakeTime, seen_delay: float | None) -> None:
        super().__init__(name, time)
        self.seen_delay = seen_delay
        self.seen: list[bool] = []

    def outbox_seen(self, waiting: bool) -> float | None:
        self.seen.append(waiting)
        return self.seen_delay


def test_the_poll_s_look_at_the_outbox_reschedules_the_tasks_that_watch_it():
    time = FakeTime()
    tasks = LoopTasks(monotonic=time, stopping=lambda: False)
    plain = Task("other", time)
    tasks.add(plain)
    assert not tasks.watch_outbox
    relay, unchanged = WatchingTask("relay", time, 0.0), WatchingTask("quiet", time, None)
    tasks.add(relay)
    tasks.add(unchanged)
    assert tasks.watch_outbox
    tasks.run_due()
    before = tasks._entries[2].due
    time.now = 100.5
    tasks.outbox_seen(True)
    assert relay.seen == [True] and unchanged.seen == [True]
    assert tasks._entries[1].due == 100.5 and tasks._entries[2].due == before
    relay.raises = RuntimeError("down")
    time.now = 101.0
    tasks.run_due()
    backing_off = tasks._entries[1].due
    tasks.outbox_seen(True)
    assert tasks._entries[1].due == backing_off, "a failing task keeps its backoff"
