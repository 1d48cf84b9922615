"""Debian's Prometheus server on a free loopback port; its config, rules and storage in a temp dir."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.processes import free_port


class PrometheusServer:
    """``prometheus`` scraping ``targets`` (host:port) every ``interval`` and evaluating ``rules``."""

    def __init__(self, rules: str, targets: list[str], *, interval: str = "1s") -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise FileNotFoundError("prometheus is not installed (bash scripts/ensure-prometheus)")
        self.binary = binary
        self.dir = Path(tempfile.mkdtemp(prefix="nr-prometheus-"))
        self.port = free_port()
        self.rules = rules
        self.targets = targets
        self.interval = interval
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.dir / "prometheus.log"

    def start(self) -> PrometheusServer:
        (self.dir / "alerts.yml").write_text(self.rules)
        config = self.dir / "prometheus.yml"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {self.interval}\n"
            f"  scrape_timeout: {self.interval}\n"
            f"  evaluation_interval: {self.interval}\n"
            f"rule_files: [{json.dumps(str(self.dir / 'alerts.yml'))}]\n"
            "scrape_configs:\n"
            "  - job_name: notifications-retry-worker\n"
            f"    static_configs: [{{targets: {json.dumps(self.targets)}}}]\n"
        )
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                cwd=self.dir,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited at start:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus not ready on port {self.port}:\n{self.log()}")
            time.sleep(0.1)

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/{path}", timeout=5) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts Prometheus holds now (``state``: pending or firing), from ``/api/v1/alerts``."""
        return list(self.api("alerts")["alerts"])

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query?" + urllib.parse.urlencode({"query": expr}))["result"])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
