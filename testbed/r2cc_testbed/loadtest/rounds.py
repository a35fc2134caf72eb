"""One round: `vllm bench serve` against a deployment, the fault schedule played beside it, samples.

Time zero of a round is when `vllm bench serve` says it starts its main run (right before the
first request); request send times, fault steps, samples and r2cc events are all stored
relative to it. Every round ends: normally, at its deadline, or when requests wait with no
new token for `stall_abort_s` (then `vllm bench serve` is killed and the round says so).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

import httpx

from r2cc_serve.errors import UserError
from r2cc_testbed.faults.model import FaultSchedule
from r2cc_testbed.loadtest import bench_serve as bench
from r2cc_testbed.loadtest.sampler import Sampler
from r2cc_testbed.serving.procs import log_tail, session_pids

BENCH_START_TIMEOUT_S = 300.0  # importing vLLM and building prompts, on a busy 2-core box
SCHEDULE_GRACE_S = 15.0        # after the load, how long the rest of a schedule may still take
EVENTS_TIMEOUT_S = 10.0


@dataclass
class RoundPlan:
    kind: str                 # "free", "fault", "serial-free", "serial-fault", "saturation"
    pair: int                 # 1-based; 0 for rounds outside the pairs
    num_prompts: int
    request_rate: float | None
    concurrency: int | None
    deadline_s: float         # from t0
    schedule: FaultSchedule = field(default_factory=FaultSchedule)

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.pair}" if self.pair else self.kind


@dataclass
class Round:
    backend: str
    plan: dict
    ended: str = ""                     # completed | deadline | stalled | bench failed: ...
    duration_s: float | None = None     # t0 to the end of the last request
    requests: list[bench.Request] = field(default_factory=list)
    summary: dict = field(default_factory=dict)  # `vllm bench serve`'s own numbers
    steps: list[dict] = field(default_factory=list)
    schedule_outcome: str = ""
    metrics: list[dict] = field(default_factory=list)
    nics: list[dict] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    wall_t0: float = 0.0
    loadavg: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before and after
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "requests"}
        d["requests"] = [r.to_dict() for r in self.requests]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Round":
        d = dict(d)
        d["requests"] = [bench.Request.from_dict(r) for r in d.get("requests", [])]
        d["loadavg"] = tuple(d.get("loadavg", (0.0, 0.0)))
        return cls(**d)


@dataclass
class Target:
    """What a round runs against."""
    dep: object               # serving.deploy.Deployment
    lab: object
    model_dir: str
    backend: str
    load: object              # scenario.Load
    client_nice: int
    stall_abort_s: float
    out_dir: str              # raw bench results and logs go here
    controller: object | None = None


def run_round(target: Target, plan: RoundPlan, say) -> Round:
    rnd = Round(backend=target.backend, plan={**plan.__dict__, "schedule": plan.schedule.to_list()})
    rnd.loadavg = (os.getloadavg()[0], 0.0)
    result_file = f"{target.backend}-{plan.name}.json"
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(target.out_dir, result_file))
    log_path = os.path.join(target.out_dir, f"{target.backend}-{plan.name}.log")
    argv = bench.bench_argv(url=target.dep.url, model_dir=target.model_dir, served_name=target.dep.model,
                            load=target.load, num_prompts=plan.num_prompts, request_rate=plan.request_rate,
                            concurrency=plan.concurrency, result_dir=target.out_dir, result_file=result_file)
    host_ns = target.lab.host_ns(0)
    with Sampler(target.dep.url, host_ns, _dead_nodes(target.dep)) as sampler:
        client = _BenchProcess(argv, log_path, target.client_nice)
        try:
            t0 = client.wait_started(BENCH_START_TIMEOUT_S)
            rnd.wall_t0 = time.time() - (time.monotonic() - t0)
            if plan.schedule.entries:
                target.controller.play(t0, plan.schedule)
            rnd.ended = _watch(client, sampler, t0, plan.deadline_s, target.stall_abort_s)
        finally:
            client.stop()
        if plan.schedule.entries:
            rnd.steps, rnd.schedule_outcome = _finish_schedule(target.controller, plan, t0)
    rnd.metrics = [{**m, "t": m["t"] - t0} for m in sampler.metrics]
    rnd.nics = [{**n, "t": n["t"] - t0} for n in sampler.nics]
    rnd.failures = [{**f, "t": f["t"] - t0} for f in sampler.failures]
    rnd.steps = [_relative(s, t0) for s in rnd.steps]
    if target.backend == "r2cc":
        rnd.events = _events(target.dep.url, rnd.wall_t0)
    path = os.path.join(target.out_dir, result_file)
    if os.path.exists(path):
        rnd.requests, rnd.summary = bench.read_result(path, t0)
        ends = [r.sent_s + r.e2el_s for r in rnd.requests if r.ok and r.e2el_s is not None]
        rnd.duration_s = max(ends) if ends else None
    elif rnd.ended == "completed":
        rnd.ended = f"bench failed: no result file; last lines of {log_path}: {log_tail(log_path, 5).strip()[-400:]}"
    rnd.loadavg = (rnd.loadavg[0], os.getloadavg()[0])
    return rnd


class _BenchProcess:
    """`vllm bench serve` in its own session; its output goes to a log, the start mark is caught."""

    def __init__(self, argv: list[str], log_path: str, nice: int):
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1",
                   VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", no_proxy="*", NO_PROXY="*")
        for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
            env.pop(k, None)  # it uses trust_env: a proxy would sit between it and the lab
        self.log_path = log_path
        self._started = threading.Event()
        self.t0: float | None = None
        self._log = open(log_path, "w")
        try:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=lambda: _set_nice(nice))
        except FileNotFoundError:
            self._log.close()
            raise UserError("the `vllm` command is not on PATH; run scripts/install_vllm.sh") from None
        self._reader = threading.Thread(target=self._read, name="r2cc-loadtest-bench-out", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if self.t0 is None and bench.MAIN_RUN_MARK in line:
                self.t0 = time.monotonic()
                self._started.set()
            self._log.write(line)
            self._log.flush()

    def wait_started(self, timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while not self._started.wait(0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._reader.join(timeout=2)
                why = (f"exited with code {self.proc.returncode}" if self.proc.poll() is not None
                       else f"did not start its run within {timeout_s:.0f} s")
                raise UserError(f"`vllm bench serve` {why}; last lines of {self.log_path}:\n"
                                f"{log_tail(self.log_path, 12)}")
        return self.t0

    def stop(self) -> None:
        """Kill the whole session if it is still running; idempotent."""
        for pid in session_pids(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        self._log.close()


def _set_nice(nice: int) -> None:
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, nice)


def _watch(client: _BenchProcess, sampler: Sampler, t0: float, deadline_s: float, stall_abort_s: float) -> str:
    """Wait for the load to end; "completed", "deadline" or "stalled"."""
    last_tokens, last_progress = None, time.monotonic()
    while client.proc.poll() is None:
        now = time.monotonic()
        if now - t0 > deadline_s:
            return "deadline"
        m = sampler.last()
        if m and m.get("tokens") is not None:
            busy = (m.get("running") or 0) + (m.get("waiting") or 0) > 0
            if last_tokens is None or m["tokens"] > last_tokens or not busy:
                last_tokens, last_progress = m["tokens"], now
        if now - last_progress > stall_abort_s:
            return "stalled"
        time.sleep(0.5)
    return "completed" if client.proc.returncode == 0 else f"bench failed: exit code {client.proc.returncode}"


def _finish_schedule(controller, plan: RoundPlan, t0: float) -> tuple[list[dict], str]:
    """Let the schedule play out (it restores what it broke), bounded; abort it if it overruns."""
    end = max(s.after_s + s.duration_s for s in plan.schedule.entries)
    left = max(0.0, t0 + end - time.monotonic()) + SCHEDULE_GRACE_S
    steps, outcome = controller.wait(left)
    if outcome == "timeout":
        controller.abort()
        more, outcome = controller.wait(10.0)
        steps += more
        outcome = f"cut short ({outcome})"
    return steps, outcome


def _relative(step: dict, t0: float) -> dict:
    out = dict(step)
    for k in ("due", "started", "done", "observed"):
        if out.get(k) is not None:
            out[k] = out[k] - t0
    return out


def _events(url: str, wall_t0: float) -> list[dict]:
    """r2cc rail and peer events of this round (from the admin API; not the audit trail of admin
    calls, which the fault daemon's drains would add), with t relative to the round's t0."""
    try:
        r = httpx.get(f"{url}/r2cc/v1/events", params={"limit": 1000, "kind": ["rail", "peer"]},
                      timeout=EVENTS_TIMEOUT_S, trust_env=False)
        r.raise_for_status()
        events = r.json().get("events", [])
    except (httpx.HTTPError, ValueError):
        return []
    return [{**e, "t": e["time"] - wall_t0} for e in events if e.get("time", 0) >= wall_t0 - 1.0]


def _dead_nodes(dep):
    def dead() -> list[str]:
        return [f"{p.name} exited with code {p.returncode}" for p in dep.procs if not p.alive()]

    return dead
