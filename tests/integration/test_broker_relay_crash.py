"""A real ``manage.py outbox_relay`` killed with SIGKILL mid-batch, publishing to the real brokers.

On restart no event is lost; what was marked is not published again; what reached the broker but was
not marked is published again — with the same ``message_id`` on RabbitMQ, dropped by the stream's
duplicate window on NATS.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.integration.test_broker_publishers import (
    all_event_ids,
    assert_every_event_once_in_key_order,
    marked_event_ids,
)
from tests.support.brokers import NATS_PORT, RABBITMQ_PORT
from tests.support.outbox_events import assert_order_per_key, make_events
from tests.support.processes import REPO_ROOT, wait_until, worker_env
from tests.support.tcp_proxy import TcpProxy


def relay_process(
    log_path: Path, publisher: str, options: dict[str, Any], *args: str
) -> subprocess.Popen[bytes]:
    settings = {"OUTBOX_PUBLISHER": publisher, "OUTBOX_PUBLISHER_OPTIONS": options}
    env = worker_env(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        connection.settings_dict["NAME"],
        settings,
    )
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "django", "outbox_relay", *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def kill_once_stalled(process: subprocess.Popen[bytes], proxy: TcpProxy, stored: Any, log_path: Path) -> None:
    """Once 7 events are in the broker, its answers stop reaching the relay; then kill -9 the relay.

    The relay publishes batches of 5 and marks a batch only once all of it is confirmed. The proxy
    holds each answer of the broker back for a while, so the second batch is in the broker and its
    confirms still on their way when they are cut off: it is never marked.
    """
    try:
        wait_until(lambda: stored() >= 7 or process.poll() is not None, 30, 0.01, "7 events in the broker")
        assert process.poll() is None, log_path.read_text()
        proxy.swallow(True)
        time.sleep(0.3)  # the relay now waits for an answer that will not come
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert process.returncode == -signal.SIGKILL


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_rabbitmq_relay_killed_mid_batch_republishes_with_the_same_message_id(clock, rabbitmq, tmp_path):
    make_events(clock, keys=6, generations=2)
    log_path = tmp_path / "relay.log"
    proxy = TcpProxy(RABBITMQ_PORT, server_delay=0.2).start()
    try:
        process = relay_process(
            log_path, "rabbitmq", rabbitmq.options(proxy.port), "--batch-size", "5", "--interval", "0.05"
        )
        kill_once_stalled(process, proxy, rabbitmq.count, log_path)
    finally:
        proxy.stop()
    marked = marked_event_ids()
    before = rabbitmq.drain()
    sent_before = {m["message_id"] for m in before}
    assert marked <= sent_before, "an event was marked published without being in the broker"
    unmarked_but_sent = sent_before - marked
    assert unmarked_but_sent, log_path.read_text()

    restarted = relay_process(log_path, "rabbitmq", rabbitmq.options(), "--batch-size", "5", "--once")
    assert restarted.wait(60) == 0, log_path.read_text()
    after = rabbitmq.drain()
    sent_after = {m["message_id"] for m in after}
    assert sent_before | sent_after == all_event_ids() == marked_event_ids()  # nothing lost
    assert unmarked_but_sent <= sent_after and not marked & sent_after
    for message in before + after:
        assert message["message_id"] == message["body"]["event_id"]  # a re-publish is recognisable
    assert_order_per_key([m["body"] for m in before + after])


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_nats_relay_killed_mid_batch_republish_is_dropped_by_the_duplicate_window(clock, jetstream, tmp_path):
    make_events(clock, keys=6, generations=2)
    log_path = tmp_path / "relay.log"
    proxy = TcpProxy(NATS_PORT, server_delay=0.2).start()
    try:
        process = relay_process(
            log_path, "nats", jetstream.options(proxy.port), "--batch-size", "5", "--interval", "0.05"
        )
        kill_once_stalled(process, proxy, jetstream.count, log_path)
    finally:
        proxy.stop()
    marked = marked_event_ids()
    stored_before = {m["body"]["event_id"] for m in jetstream.messages()}
    assert marked <= stored_before, "an event was marked published without being in the stream"
    assert stored_before - marked, log_path.read_text()

    restarted = relay_process(log_path, "nats", jetstream.options(), "--batch-size", "5", "--once")
    assert restarted.wait(60) == 0, log_path.read_text()
    stored = jetstream.messages()
    # Every event exactly once: what went out before the kill was published again and dropped.
    assert_every_event_once_in_key_order([m["body"] for m in stored])
