"""A throwaway Prometheus server (Debian's `prometheus`) that scrapes one deployment with r2cc's
alert rules, and the few HTTP API calls the tests and the dashboard picture need.

    with PrometheusServer(["10.206.0.1:8000"], interval_s=1) as prom:
        prom.firing()                               # [{"alertname": ..., "host": ..., ...}]
        prom.query_range("r2cc_rail_up", start, end)

Everything lives in a temporary folder (config, TSDB, log) removed on exit; the server runs in
its own session and is killed on exit, also on errors.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import httpx
import yaml

from r2cc_serve.errors import UserError

RULES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                     "configs", "prometheus", "r2cc-alerts.yaml")
READY_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrometheusServer:
    def __init__(self, targets: list[str], interval_s: float = 1.0, rules: str = RULES):
        if shutil.which("prometheus") is None:
            raise UserError("needs Prometheus: apt-get install -y --no-install-recommends prometheus "
                            "(or run scripts/setup.sh)")
        self.targets, self.interval_s, self.rules = targets, interval_s, rules
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = None
        self._proc = None

    def __enter__(self) -> "PrometheusServer":
        self._dir = tempfile.mkdtemp(prefix="r2cc-prometheus-")
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        interval = f"{self.interval_s:g}s"
        config = {"global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
                  "rule_files": [os.path.abspath(self.rules)],
                  "scrape_configs": [{"job_name": "vllm-r2cc", "static_configs": [{"targets": self.targets}]}]}
        path = os.path.join(self._dir, "prometheus.yml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        self.log_path = os.path.join(self._dir, "prometheus.log")
        log = open(self.log_path, "wb")
        self._proc = subprocess.Popen(
            ["prometheus", f"--config.file={path}", f"--storage.tsdb.path={os.path.join(self._dir, 'data')}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1d"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise UserError(f"prometheus exited with code {self._proc.returncode}: {self._log_tail()}")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise UserError(f"prometheus did not become ready within {READY_TIMEOUT_S:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return " | ".join(f.read().splitlines()[-5:])
        except OSError:
            return "(no log)"

    def __exit__(self, *exc) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGTERM)
                self._proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._proc.wait(timeout=10)
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    # --- the HTTP API -----------------------------------------------------------------------

    def _get(self, path: str, **params) -> dict:
        r = httpx.get(f"{self.url}{path}", params=params, timeout=10, trust_env=False)
        doc = r.json()
        if r.status_code != 200 or doc.get("status") != "success":
            raise UserError(f"prometheus {path} {params}: HTTP {r.status_code}: {doc.get('error', r.text[:200])}")
        return doc["data"]

    def firing(self) -> list[dict]:
        """Labels of every alert firing now (pending ones are left out)."""
        return [a["labels"] for a in self._get("/api/v1/alerts")["alerts"] if a["state"] == "firing"]

    def targets_up(self) -> bool:
        active = self._get("/api/v1/targets")["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

    def query(self, expr: str) -> list[dict]:
        return self._get("/api/v1/query", query=expr)["result"]

    def query_range(self, expr: str, start: float, end: float, step_s: float | None = None) -> list[dict]:
        step = step_s or max(self.interval_s, (end - start) / 300)
        return self._get("/api/v1/query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}",
                         step=f"{step:g}")["result"]
