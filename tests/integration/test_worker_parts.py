"""The worker's parts are built from the settings and its options in one place (engine.worker.build_parts):
the claims and the commits on the send loop's one connection, the injected clock, monotonic clock and
randomness where they are used, and none of the loop's connections inside a test's transaction."""

from __future__ import annotations

import contextlib
import random

import pytest

from notifications_retry.conf import get_settings
from notifications_retry.engine.completer import Completer, LoopCompleter
from notifications_retry.engine.worker import WorkerOptions, WorkerParts, build_parts


def fake_monotonic() -> float:
    return 100.0


@contextlib.contextmanager
def built(clock, **options):
    conf = get_settings()
    parts = build_parts(
        conf,
        WorkerOptions.of(conf, **options),
        clock=clock,
        rng=random.Random(7),
        monotonic=fake_monotonic,
        stopping=lambda: False,
        pause=lambda seconds: None,
    )
    try:
        yield parts
    finally:
        close(parts)


def close(parts: WorkerParts) -> None:
    parts.lock.close()
    parts.completer.close()
    parts.send_loop.close()
    parts.executor.close()


@pytest.mark.django_db(transaction=True)
def test_the_claims_and_the_commits_share_the_send_loops_connection(clock):
    with built(clock, batch_size=7) as parts:
        assert isinstance(parts.completer, LoopCompleter)
        assert parts.completer._connection is parts.claim_connection is not None
        assert parts.dispatcher.claims.claim_connection is parts.claim_connection
        assert parts.dispatcher.claims.beside_connection is parts.beside_connection is not None
        assert parts.beside_connection is not parts.claim_connection
        assert parts.claim_connection.loop is parts.send_loop
        assert parts.dispatcher.send_loop() is parts.send_loop
        assert parts.completer._completer.max_batch == 7, "a commit takes no more than the tick's batch"


@pytest.mark.django_db(transaction=True)
def test_the_injected_clocks_are_the_parts_clocks(clock):
    with built(clock) as parts:
        assert parts.executor.clock is clock and parts.waiter.clock is clock
        assert parts.executor.monotonic is fake_monotonic and parts.dispatcher.monotonic is fake_monotonic
        assert parts.waiter.monotonic is fake_monotonic and parts.tasks.monotonic is fake_monotonic
        assert parts.reporter is parts.dispatcher.reporter and parts.reporter.channel_keys is parts.keys


@pytest.mark.django_db
def test_inside_a_transaction_every_statement_is_djangos(clock):
    with built(clock) as parts:
        assert type(parts.completer) is Completer
        assert parts.claim_connection is None and parts.beside_connection is None


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"batch_size": 0}, "batch size must be >= 1"),
        ({"max_duration": 0}, "max duration must be > 0"),
        ({"interval": -1}, "interval must be >= 0"),
        ({"max_in_flight": 0}, "max in flight must be >= 1"),
        ({"lane": "nope"}, "unknown lane 'nope'"),
    ],
)
def test_bad_options_are_refused_before_anything_is_built(options, error):
    with pytest.raises(ValueError, match=error):
        WorkerOptions.of(get_settings(), **options)


def test_options_not_given_are_the_settings(settings):
    settings.NOTIFICATIONS_RETRY = {
        **settings.NOTIFICATIONS_RETRY,
        "BATCH_SIZE": 33,
        "LANES": {"urgent": {"channels": ["sms"], "priorities": [0]}},
    }
    options = WorkerOptions.of(get_settings(), lane="urgent")
    assert (options.batch_size, options.lane, options.priorities) == (33, "urgent", [0])
    assert WorkerOptions.of(get_settings(), batch_size=5).batch_size == 5
