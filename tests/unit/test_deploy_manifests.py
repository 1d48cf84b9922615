"""The Kubernetes manifests in deploy/kubernetes: valid for the Kubernetes releases they promise, passing
checkov, hardened, configured as the README configures the project, and running commands that exist.

checkov runs from a virtualenv of its own (``scripts/ensure-checkov``, which ``make test`` calls first);
its test skips only when the package index could not be reached to install it.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from django.core.management import get_commands, load_command_class
from django.core.management.base import CommandError
from kubernetes_validate.utils import latest_version

from notifications_retry.conf import bounds
from notifications_retry.engine.worker import stop_budget_seconds

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
#: The oldest Kubernetes release the manifests promise to work on (CronJob timeZone is GA from 1.27),
#: and the newest whose schemas kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.27", latest_version())
#: The worker's metrics port, the same in the README, the docs and the manifests.
METRICS_PORT = 9464
#: What a stopped worker's interpreter may take to exit after the stop budget (2 s measured with two
#: CPU hogs on two cores): the manifests' grace period adds it.
EXIT_MARGIN_SECONDS = 5
#: The checks the manifests skip, each with its reason in an annotation: the image and how the
#: settings read the database URL are the project's.
SKIPPED_CHECKS = {"CKV_K8S_43", "CKV_K8S_35"}
#: What the pods write: a worker's or a relay's heartbeat file. It must lie on a writable volume.
WRITTEN_OPTIONS = ("--heartbeat-file",)


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


def _pod_templates() -> list[tuple[str, dict[str, Any]]]:
    """(name, pod template) of every workload."""
    found = []
    for name, doc in DOCUMENTS:
        if doc["kind"] in ("Deployment", "Job"):
            found.append((name, doc["spec"]["template"]))
        elif doc["kind"] == "CronJob":
            found.append((name, doc["spec"]["jobTemplate"]["spec"]["template"]))
    return found


PODS = _pod_templates()
CONTAINERS = [
    (f"{name}/{c['name']}", c, pod["spec"]) for name, pod in PODS for c in pod["spec"]["containers"]
]


def _parse(argv: list[str]) -> dict[str, Any]:
    """Parse ``python manage.py NAME OPTIONS`` with the command's own parser (CommandError when refused)."""
    assert argv[:2] == ["python", "manage.py"], argv
    command = load_command_class(get_commands()[argv[2]], argv[2])
    return vars(command.create_parser("manage.py", argv[2]).parse_args(argv[3:]))


def _commands() -> list[list[str]]:
    """Every command line a container or an exec probe runs."""
    found = []
    for _, container, _ in CONTAINERS:
        found.append(container["command"])
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if "exec" in container.get(probe, {}):
                found.append(container[probe]["exec"]["command"])
    return found


def _deployment_running(command: str) -> list[dict[str, Any]]:
    return [d for d in _by_kind("Deployment") if command in _containers(d)[0]["command"]]


def _containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = workload["spec"]["template"]["spec"]["containers"]
    return containers


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_the_shipped_kinds() -> None:
    kinds = sorted({doc["kind"] for _, doc in DOCUMENTS})
    assert kinds == [
        "CronJob",
        "Deployment",
        "Job",
        "Namespace",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Service",
    ]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("name", "doc"), DOCUMENTS, ids=[name for name, _ in DOCUMENTS])
def test_manifest_validates_against_the_kubernetes_schema(
    name: str, doc: dict[str, Any], version: str
) -> None:
    # strict: a field the schema does not know (a typo such as "livenesProbe") is an error too.
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_refuses_a_misspelt_field() -> None:
    # The test above must bite: a Deployment with one misspelt key fails.
    doc = yaml.safe_load(yaml.safe_dump(_by_kind("Deployment")[0]))
    container = doc["spec"]["template"]["spec"]["containers"][0]
    container["comand"] = container.pop("command")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("argv", _commands(), ids=shlex.join)
def test_containers_and_probes_run_options_the_commands_accept(argv: list[str]) -> None:
    _parse(argv)


def test_an_option_the_command_does_not_have_is_refused() -> None:
    with pytest.raises(CommandError):
        _parse(["python", "manage.py", "retry_worker", "--replicas", "4"])


def test_the_install_is_one_worker_deployment_and_a_migration_job() -> None:
    # The worker sends, relays the outbox and runs housekeeping: the one Deployment of an install.
    (worker,) = _deployment_running("retry_worker")
    assert not _parse(_containers(worker)[0]["command"])["once"]
    (job,) = _by_kind("Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][:3] == [
        "python",
        "manage.py",
        "migrate",
    ]
    # The separate relay stays an option (its worker then runs with --no-relay).
    (relay,) = _deployment_running("outbox_relay")
    assert not _parse(_containers(relay)[0]["command"])["once"]


def test_worker_deployment_probes_its_heartbeat_and_serves_metrics_on_the_documented_port() -> None:
    (worker,) = _deployment_running("retry_worker")
    container = _containers(worker)[0]
    options = _parse(container["command"])
    probe = _parse(container["livenessProbe"]["exec"]["command"])
    assert probe["check"], "the liveness probe must be retry_worker --check (the heartbeat)"
    assert probe["heartbeat_file"] == options["heartbeat_file"] is not None
    port = next(p for p in container["ports"] if p["name"] == "metrics")
    assert port["containerPort"] == options["metrics_port"] == METRICS_PORT
    assert options["metrics_addr"] == "0.0.0.0"
    (service,) = _by_kind("Service")
    assert [p["port"] for p in service["spec"]["ports"]] == [METRICS_PORT]


def test_the_metrics_port_is_the_same_in_the_readme_docs_and_manifests() -> None:
    texts = {p: p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]}
    texts.update({p: p.read_text() for p in sorted(MANIFESTS.glob("*.yaml"))})
    ports = {p.name: set(re.findall(r"--metrics-port[ \"\n-]+\"?(\d+)", t)) for p, t in texts.items()}
    assert {n for n, found in ports.items() if found}, "no --metrics-port found anywhere"
    assert {n: found for n, found in ports.items() if found - {str(METRICS_PORT), "0"}} == {}


def test_every_container_gets_the_database_url_the_readme_settings_read() -> None:
    # One configuration story: the README's settings and the example project read DATABASE_URL, and
    # every container is given it from the same secret.
    readme = (ROOT / "README.md").read_text()
    assert 'os.environ["DATABASE_URL"]' in readme
    assert 'os.environ.get("DATABASE_URL")' in (ROOT / "example_project" / "settings.py").read_text()
    assert "POSTGRES_HOST" not in readme
    for name, container, _ in CONTAINERS:
        env = {e["name"]: e for e in container["env"]}
        assert env["DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
            "name": "notifications-retry-db",
            "key": "url",
        }
        assert "DJANGO_SETTINGS_MODULE" in env, name


@pytest.mark.parametrize(("name", "pod"), PODS, ids=[name for name, _ in PODS])
def test_every_pod_runs_as_non_root_with_the_runtime_seccomp_profile(name: str, pod: dict[str, Any]) -> None:
    spec = pod["spec"]
    context = spec["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] > 0
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False


@pytest.mark.parametrize(("name", "container", "spec"), CONTAINERS, ids=[name for name, _, _ in CONTAINERS])
def test_every_container_is_locked_down_and_writes_only_to_an_empty_dir(
    name: str, container: dict[str, Any], spec: dict[str, Any]
) -> None:
    context = container["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "cpu" in container["resources"]["limits"] and "memory" in container["resources"]["limits"]
    empty_dirs = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
    writable = [m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] in empty_dirs]
    argv = container["command"]
    for option in WRITTEN_OPTIONS:
        if option in argv:
            path = argv[argv.index(option) + 1]
            assert any(path.startswith(mount.rstrip("/") + "/") for mount in writable), (name, path, writable)


@pytest.mark.parametrize("deployment", _by_kind("Deployment"), ids=lambda d: d["metadata"]["name"])
def test_every_long_running_container_has_probes_and_spreads_over_nodes(deployment: dict[str, Any]) -> None:
    for container in _containers(deployment):
        assert "livenessProbe" in container and "readinessProbe" in container, container["name"]
    spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in spread} >= {"kubernetes.io/hostname"}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(_matches(c["labelSelector"]["matchLabels"], labels) for c in spread)


def test_the_grace_period_covers_the_stop_budget_at_the_largest_channel_timeout() -> None:
    # The stop budget (docs/operations.md, "Stopping"; the worker logs it as stop-budget) at the largest
    # timeout a channel may have, and the interpreter's exit after it.
    needed = stop_budget_seconds(bounds.TIMEOUT_SECONDS.high) + EXIT_MARGIN_SECONDS
    assert needed == 307.5
    senders = _deployment_running("retry_worker") + _by_kind("CronJob")
    senders = [w for w in senders if "retry_worker" in json.dumps(w)]
    assert len(senders) == 2
    for workload in senders:
        spec = json.dumps(workload)
        grace = int(re.search(r'"terminationGracePeriodSeconds": (\d+)', spec)[1])  # type: ignore[index]
        assert needed <= grace < needed + 10, workload["metadata"]["name"]
    # The arithmetic is shown beside the value.
    assert "300 + 0.5 + 2 = 302.5 s, + 5 s" in (MANIFESTS / "worker.yaml").read_text()


def test_disruption_budgets_exactly_where_replicas_exceed_one() -> None:
    budgets = [p["spec"]["selector"]["matchLabels"] for p in _by_kind("PodDisruptionBudget")]
    for deployment in _by_kind("Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert _matches(deployment["spec"]["selector"]["matchLabels"], labels)
        covered = [b for b in budgets if _matches(b, labels)]
        assert len(covered) == (1 if deployment["spec"]["replicas"] > 1 else 0), deployment["metadata"][
            "name"
        ]
    for budget in budgets:
        assert any(
            _matches(budget, d["spec"]["template"]["metadata"]["labels"]) for d in _by_kind("Deployment")
        )


def test_only_the_scraper_reaches_the_metrics_port() -> None:
    (policy,) = _by_kind("NetworkPolicy")
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    for _, pod in PODS:
        assert _matches(spec["podSelector"]["matchLabels"], pod["metadata"]["labels"])
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    (peer,) = rule["from"]
    assert peer["namespaceSelector"]["matchLabels"] and peer["podSelector"]["matchLabels"]
    (service,) = _by_kind("Service")
    assert all(
        _matches(service["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
        for d in _deployment_running("retry_worker")
    )


def test_everything_lives_in_the_restricted_namespace() -> None:
    (namespace,) = _by_kind("Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for name, doc in DOCUMENTS:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == namespace["metadata"]["name"], name


def _checkov() -> str:
    """The checkov executable, installed by scripts/ensure-checkov (a no-op once it is there)."""
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ensure-checkov")], capture_output=True, text=True, timeout=900
    )
    if result.returncode == 75:
        pytest.skip(f"checkov could not be installed: {result.stderr.strip().splitlines()[-1]}")
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def _run_checkov(checkov: str, *target: str) -> dict[str, Any]:
    # --skip-download: no call to the vendor's API for guideline links; the checks are all local.
    result = subprocess.run(
        [checkov, *target, "--framework", "kubernetes", "--skip-download", "--output", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode in (0, 1), result.stderr[-3000:]
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def test_checkov_reports_no_failed_check() -> None:
    checkov = _checkov()
    report = _run_checkov(checkov, "-d", "deploy/kubernetes")
    failed = [(c["check_id"], c["resource"]) for c in report["results"]["failed_checks"]]
    assert failed == []
    assert report["summary"]["passed"] > 0
    skipped = report["results"]["skipped_checks"]
    assert {c["check_id"] for c in skipped} == SKIPPED_CHECKS
    # Each skip says why.
    assert all(c["check_result"].get("suppress_comment") for c in skipped)


def test_checkov_fails_a_container_that_may_escalate(tmp_path: Path) -> None:
    # The test above must bite: the worker with its container's securityContext taken out fails.
    checkov = _checkov()
    worker = list(yaml.safe_load_all((MANIFESTS / "worker.yaml").read_text()))
    del worker[0]["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    (tmp_path / "worker.yaml").write_text(yaml.safe_dump_all(worker))
    report = _run_checkov(checkov, "-f", str(tmp_path / "worker.yaml"))
    assert "CKV_K8S_20" in {c["check_id"] for c in report["results"]["failed_checks"]}


def test_every_way_of_running_the_worker_runs_housekeeping() -> None:
    # The Deployment's looping worker runs it (hourly, in one elected worker); a --once run does not, so
    # the file with the --once CronJob schedules notifications_housekeeping beside it.
    for deployment in _deployment_running("retry_worker"):
        assert "--no-housekeeping" not in json.dumps(deployment), deployment["metadata"]["name"]
    by_file: dict[str, list[str]] = {}
    for name, doc in DOCUMENTS:
        if doc["kind"] == "CronJob":
            by_file.setdefault(name.split(":")[0], []).append(json.dumps(doc))
    once_files = [
        f for f, docs in by_file.items() if any('"--once"' in d and "retry_worker" in d for d in docs)
    ]
    assert once_files == ["worker-cronjob.yaml"]
    assert any('"notifications_housekeeping"' in d for d in by_file["worker-cronjob.yaml"])
