"""Debian's Prometheus scrapes a real worker and the shipped rules fire for the incidents they missed.

A hanging webhook (its circuit alternates open / half open for each probe) must fire
NotificationsProviderDown; a first batch of dead letters (a counter first scraped at 30) must fire
NotificationsTerminalFailuresSpike. The rules are the shipped ones with a short ``for:``.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.factories import ChannelFactory
from tests.process.conftest import StartWorker, seed_due
from tests.process.helpers import webhook_channel
from tests.support.http_server import Reply, ScriptedServer
from tests.support.processes import free_port
from tests.support.prometheus import PrometheusServer

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"


def rules_with_short_for(for_: str = "4s") -> str:
    """The shipped rules with every ``for:`` shortened (the expressions are untouched)."""
    text, count = re.subn(r"(?m)^(\s+for: )\S+$", rf"\g<1>{for_}", RULES.read_text())
    assert count >= 1
    return text


@pytest.fixture
def hanging_server() -> Iterator[ScriptedServer]:
    server = ScriptedServer(lambda request: Reply(hang=True)).start()
    yield server
    server.stop()


def firing(prometheus: PrometheusServer) -> dict[str, list[dict[str, str]]]:
    found: dict[str, list[dict[str, str]]] = {}
    for alert in prometheus.alerts():
        if alert["state"] == "firing":
            found.setdefault(alert["labels"]["alertname"], []).append(alert["labels"])
    return found


def test_prometheus_fires_provider_down_and_terminal_spike_for_a_real_worker(
    start_worker: StartWorker, hanging_server: ScriptedServer
) -> None:
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus is missing: run `bash scripts/ensure-prometheus` (make test does)")
    seed_due(ChannelFactory(key="email", provider_key="stub", options={"fail": "permanent"}), 30)
    hook = webhook_channel(
        hanging_server.url, key="hook", timeout_seconds=1.5, max_attempts=100, max_concurrency=2
    )
    seed_due(hook, 20)
    port = free_port()
    worker = start_worker(
        ["--interval", "0.3", "--metrics-port", str(port)],
        settings={
            "CIRCUIT_BREAKER": {"failure_threshold": 2, "cooldown_seconds": 0.5},
            "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"],
        },
    )
    prometheus = PrometheusServer(rules_with_short_for(), [f"127.0.0.1:{port}"]).start()
    try:
        deadline = time.monotonic() + 60
        seen: dict[str, list[dict[str, str]]] = {}
        probes: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            assert worker.alive(), worker.output()
            seen = firing(prometheus)
            # The incident as described: the hook's circuit seen half open as well as open. Its circuit
            # cycles (open, half open for a probe's timeout), so a scrape that missed one meets the next.
            probes = prometheus.query(
                'count_over_time((notifications_retry_circuit_state{channel="hook"} == 1)[5m:])'
            )
            half_open_seen = bool(probes) and float(probes[0]["value"][1]) >= 1
            if (
                "NotificationsProviderDown" in seen
                and "NotificationsTerminalFailuresSpike" in seen
                and half_open_seen
            ):
                break
            time.sleep(0.5)
        else:
            states = prometheus.query("notifications_retry_circuit_state")
            pytest.fail(f"alerts firing: {seen}; half open: {probes}; circuit: {states}\n{prometheus.log()}")
        assert [a["channel"] for a in seen["NotificationsProviderDown"]] == ["hook"]
        assert [a["channel"] for a in seen["NotificationsTerminalFailuresSpike"]] == ["email"]
    finally:
        prometheus.stop()
