"""A queued record starts only while its lease can still cover its call: two rounds are queued behind a
channel's calls, but a lease covers one round of waiting (``rules.backoff``). The real
dispatcher on a real send loop (``SteppedLoop``), on the fake clock and fake database port of
:mod:`tests.support.fake_tick`: calls that each take nearly their whole timeout leave the queue's tail
waiting past its ``start_by``, and it is given back unsent, then claimed again with a fresh lease."""

from __future__ import annotations

from notifications_retry.engine.channels import ChannelRuntime
from notifications_retry.models import ChannelConfig
from notifications_retry.providers.webhook import WebhookProvider
from notifications_retry.rules.outcomes import ClaimedRecord, Outcome
from tests.support.fake_tick import CONF, AnswersAtOnce, FakeDatabase, FakeTime, run_loop_tick

TIMEOUT = 5.0


class SlowAnswers(AnswersAtOnce):
    """Calls that each take ``cost`` fake seconds; notes when each started against its ``start_by``."""

    def __init__(self, time: FakeTime, cost: float) -> None:
        super().__init__(time)
        self.time, self.cost = time, cost
        self.starts: list[tuple[float, float]] = []

    async def send_async(self, rt: ChannelRuntime, record: ClaimedRecord) -> Outcome:
        self.starts.append((self.time.t, record.start_by))
        self.time.advance(self.cost)
        return await super().send_async(rt, record)


def run(time: FakeTime, db: FakeDatabase, executor: SlowAnswers, *, max_duration: float) -> ChannelRuntime:
    config = ChannelConfig(
        id=1, key="hooks", provider_key="webhook", max_concurrency=2, timeout_seconds=TIMEOUT,
        options={"url": "https://hooks.example.com/in"},
    )  # fmt: skip
    rt = ChannelRuntime(config, WebhookProvider(config.settings()), CONF, max_concurrency=2, rate_limit=None)
    # Fake time stands still between calls: outcomes are committed at once, not after a batch delay.
    run_loop_tick(time, db, executor, rt, max_duration=max_duration, commit_delay=0.0, finish_within=60.0)
    return rt


def test_the_queue_tail_left_waiting_past_its_lease_allowance_goes_back_unsent_and_is_sent_later():
    time = FakeTime()
    db = FakeDatabase(time)
    rows = db.add(1, 6)
    allowance = ChannelConfig(timeout_seconds=TIMEOUT).start_allowance_seconds(CONF.LEASE_GRACE_SECONDS)
    # Each call takes almost half the allowance: the first claim's six rows cannot all start within it.
    executor = SlowAnswers(time, cost=allowance / 2.5)
    run(time, db, executor, max_duration=60.0)
    assert all(started <= start_by for started, start_by in executor.starts), "no call began too late"
    sent, back = set(executor.sent), {r.id for r in db.due[1]}
    assert db.released and set(db.released) == back, "the queue's tail went back unsent"
    assert len(sent) == len(executor.sent) == 3 and sent | back == {r.id for r in rows} and not sent & back
    assert all(r.attempts == 0 for r in db.due[1]), "an attempt never made is not spent"
    assert sorted(o.record.id for o in db.committed) == sorted(executor.sent) and not db.leased
    # The next tick claims them again, with fresh leases, and sends them.
    rt = run(time, db, executor, max_duration=60.0)
    assert sorted(executor.sent) == sorted(r.id for r in rows), "each row sent once"
    assert all(started <= start_by for started, start_by in executor.starts)
    assert not db.leased and not db.due[1] and not rt.queue and not rt.lapsed


def test_calls_as_fast_as_usual_never_reach_the_allowance_and_nothing_is_given_back():
    time = FakeTime()
    db = FakeDatabase(time)
    rows = db.add(1, 40)
    executor = SlowAnswers(time, cost=0.02)
    run(time, db, executor, max_duration=30.0)
    assert not db.released and sorted(executor.sent) == sorted(r.id for r in rows)
