"""What the deployment does over time, sampled every 0.5 s during a round.

- vLLM's /metrics: r2cc_rail_sent_bytes_total per rail (summed over hosts: the r2cc backend's
  per-rail throughput), vllm:generation_tokens_total (a stall is a stretch with requests
  running and no new token) and the running/waiting request counts; a scrape that fails, or
  a vLLM node that exited, is recorded with its time (when the default backend's engine died).
- The rails' interface counters in lab host 0 (tx + rx bytes): the same picture for any
  backend, gloo included, read from /proc/thread-self/net/dev by a thread inside that namespace.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Callable

import httpx

from r2cc_testbed.lab.netns import NETNS_DIR
from r2cc_serve.util.priority import raise_thread_priority

INTERVAL_S = 0.5
SAMPLER_NICE = -5  # scrapes must keep their pace while the workers keep every core busy
_LINE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)')
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_RAIL_DEV = re.compile(r"^rail(\d+)$")


def parse_metrics(text: str) -> dict:
    """The few numbers a round needs from a Prometheus text page."""
    out = {"rail_sent": {}, "tokens": None, "running": None, "waiting": None}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        name, value = m["name"], float(m["value"])
        if name == "r2cc_rail_sent_bytes_total":
            rail = int(dict(_LABEL.findall(m["labels"] or "")).get("rail", -1))
            out["rail_sent"][rail] = out["rail_sent"].get(rail, 0.0) + value
        elif name == "vllm:generation_tokens_total":
            out["tokens"] = (out["tokens"] or 0.0) + value
        elif name == "vllm:num_requests_running":
            out["running"] = (out["running"] or 0.0) + value
        elif name == "vllm:num_requests_waiting":
            out["waiting"] = (out["waiting"] or 0.0) + value
    return out


def parse_net_dev(text: str) -> dict[int, int]:
    """{rail index: rx + tx bytes} from /proc/net/dev."""
    out = {}
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        m = _RAIL_DEV.match(name.strip())
        if m:
            fields = rest.split()
            out[int(m.group(1))] = int(fields[0]) + int(fields[8])
    return out


class Sampler:
    """Two threads sampling until stop(); `metrics` and `nics` hold (monotonic time, dict) samples."""

    def __init__(self, url: str, host_ns: str | None, dead_nodes: Callable[[], list[str]] = lambda: []):
        self.url, self.host_ns, self._dead_nodes = url, host_ns, dead_nodes
        self.metrics: list[dict] = []
        self.nics: list[dict] = []
        self.failures: list[dict] = []   # first scrape failure and first dead node, with times
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._scrape_loop, name="r2cc-loadtest-scrape", daemon=True)]
        if host_ns:
            self._threads.append(threading.Thread(target=self._nic_loop, name="r2cc-loadtest-nics", daemon=True))

    def __enter__(self) -> "Sampler":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)

    def last(self) -> dict | None:
        return self.metrics[-1] if self.metrics else None

    def _note(self, kind: str, what: str) -> None:
        if not any(f["kind"] == kind for f in self.failures):
            self.failures.append({"kind": kind, "t": time.monotonic(), "what": what})

    def _scrape_loop(self) -> None:
        raise_thread_priority(SAMPLER_NICE)
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            next_at = time.monotonic()
            while not self._stop.is_set():
                t = time.monotonic()
                try:
                    r = client.get(f"{self.url}/metrics")
                    r.raise_for_status()
                    self.metrics.append({"t": t, **parse_metrics(r.text)})
                except httpx.HTTPError as exc:
                    self._note("metrics", f"/metrics did not answer: {type(exc).__name__}: {exc}"[:200])
                dead = self._dead_nodes()
                if dead:
                    self._note("node", "vLLM node(s) exited: " + "; ".join(dead))
                next_at += INTERVAL_S
                self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _nic_loop(self) -> None:
        """Runs inside host_ns for good: /proc/thread-self/net/dev then lists that namespace's devices."""
        from r2cc_testbed.faults.inprocess_executor import enter_netns

        raise_thread_priority(SAMPLER_NICE)
        fd = os.open(os.path.join(NETNS_DIR, self.host_ns), os.O_RDONLY)
        try:
            enter_netns(fd, self.host_ns)
        finally:
            os.close(fd)
        next_at = time.monotonic()
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                with open("/proc/thread-self/net/dev") as f:
                    self.nics.append({"t": t, "rails": parse_net_dev(f.read())})
            except OSError:
                pass  # the lab went away; the round reports that elsewhere
            next_at += INTERVAL_S
            self._stop.wait(max(0.0, next_at - time.monotonic()))
