"""The Kubernetes manifests in deploy/kubernetes validate against the Kubernetes schemas, and the commands
they run are ones the management commands accept."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from django.core.management import load_command_class
from django.core.management.base import CommandError

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
#: The oldest Kubernetes release the manifests promise to work on (CronJob timeZone is GA from 1.27).
KUBERNETES_VERSION = "1.27"


def _documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return docs


DOCUMENTS = _documents()


def _by_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in DOCUMENTS if doc["kind"] == kind]


def _pod_specs() -> list[dict[str, Any]]:
    specs = [d["spec"]["template"]["spec"] for d in _by_kind("Deployment")]
    specs += [c["spec"]["jobTemplate"]["spec"]["template"]["spec"] for c in _by_kind("CronJob")]
    return specs


def _parse(argv: list[str]) -> dict[str, Any]:
    """Parse ``python manage.py NAME OPTIONS`` with the command's own parser (CommandError when refused)."""
    assert argv[:2] == ["python", "manage.py"], argv
    command = load_command_class("notifications_retry", argv[2])
    return vars(command.create_parser("manage.py", argv[2]).parse_args(argv[3:]))


def test_every_kind_the_issue_names_is_shipped() -> None:
    kinds = sorted({doc["kind"] for _, doc in DOCUMENTS})
    assert kinds == ["CronJob", "Deployment", "PodDisruptionBudget", "Service"]


@pytest.mark.parametrize(("name", "doc"), DOCUMENTS, ids=[name for name, _ in DOCUMENTS])
def test_manifest_validates_against_the_kubernetes_schema(name: str, doc: dict[str, Any]) -> None:
    # strict: a field the schema does not know (a typo such as "livenesProbe") is an error too.
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_validator_refuses_a_misspelt_field() -> None:
    # The test above must bite: a Deployment with one misspelt key fails.
    doc = yaml.safe_load(yaml.safe_dump(_by_kind("Deployment")[0]))
    container = doc["spec"]["template"]["spec"]["containers"][0]
    container["comand"] = container.pop("command")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize(
    "argv", [c["command"] for s in _pod_specs() for c in s["containers"]], ids=shlex.join
)
def test_containers_run_options_the_commands_accept(argv: list[str]) -> None:
    _parse(argv)


def test_an_option_the_command_does_not_have_is_refused() -> None:
    with pytest.raises(CommandError):
        _parse(["python", "manage.py", "retry_worker", "--replicas", "4"])


def test_worker_deployment_probes_the_heartbeat_and_serves_metrics() -> None:
    (worker,) = [d for d in _by_kind("Deployment") if "retry_worker" in _containers(d)[0]["command"]]
    container = _containers(worker)[0]
    options = _parse(container["command"])
    assert not options["once"]
    probe = container["livenessProbe"]["exec"]["command"]
    assert _parse(probe)["check"], "the liveness probe must be retry_worker --check (the heartbeat)"
    port = next(p for p in container["ports"] if p["name"] == "metrics")
    assert port["containerPort"] == options["metrics_port"]
    assert options["metrics_addr"] == "0.0.0.0"
    # Kubernetes must wait longer than a graceful stop takes (the largest channel timeout + 2 s).
    assert worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 30


def test_the_relay_runs_beside_the_worker() -> None:
    relays = [d for d in _by_kind("Deployment") if "outbox_relay" in _containers(d)[0]["command"]]
    assert len(relays) == 1
    assert not _parse(_containers(relays[0])[0]["command"])["once"]


def test_cronjob_runs_one_tick_and_never_overlaps() -> None:
    (cron,) = _by_kind("CronJob")
    spec = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert _parse(spec["containers"][0]["command"])["once"]
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    assert spec["restartPolicy"] == "Never"


def test_every_disruption_budget_and_service_selects_a_deployments_pods() -> None:
    pod_labels = [d["spec"]["template"]["metadata"]["labels"] for d in _by_kind("Deployment")]
    selectors = [p["spec"]["selector"]["matchLabels"] for p in _by_kind("PodDisruptionBudget")]
    selectors += [s["spec"]["selector"] for s in _by_kind("Service")]
    for selector in selectors:
        assert any(selector.items() <= labels.items() for labels in pod_labels), selector
    for deployment in _by_kind("Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert any(
            p["spec"]["selector"]["matchLabels"].items() <= labels.items()
            for p in _by_kind("PodDisruptionBudget")
        ), f"no PodDisruptionBudget for {deployment['metadata']['name']}"


def _containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    return containers
