"""Start a TP=2 vLLM deployment on the fault lab, and always clean it up.

    with single_instance(lab, model_dir, backend="r2cc", port=8123) as dep:   # (a)
        ... dep.url ...
    with two_nodes(lab, model_dir, backend="r2cc", port=8000) as dep:         # (b)
        ...

(a) one vLLM in the root namespace; rank r's rails are in lab host r (R2CC_NETNS template).
(b) one vLLM node per lab host (`ip netns exec <host> vllm serve ... --nnodes 2`), node 1
    headless; the client in the root namespace reaches node 0 over the management bridge.

On exit (normal, exception or Ctrl-C) every process of the run is stopped (SIGTERM, grace,
SIGKILL by session), its TMPDIRs are removed, and nothing stays in /dev/shm: each node gets a
private tmpfs there (procs.PRIVATE_SHM), and any vllm_dist_<id> segment of the run that
reached the real /dev/shm anyway is removed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Iterator

import httpx

from r2cc_serve.errors import UserError
from r2cc_testbed.serving import vllm_env
from r2cc_testbed.serving.procs import PRIVATE_SHM, Proc, log_tail, stop_all

SERVED_NAME = "tiny"
STARTUP_TIMEOUT_S = 600.0  # 60-160 s is normal on a loaded 2-core box; compile mode is slower
WARMUP_TIMEOUT_S = 300.0   # eager mode skips vLLM's warm-up: the first request can take ~50 s


class DeployError(UserError):
    """A deployment did not come up; the message carries the log tail of the failed node."""


@dataclass
class Deployment:
    shape: str            # "single" | "two_nodes"
    backend: str
    url: str              # base URL of the OpenAI API, reachable from the root namespace
    model: str            # served model name for requests
    procs: list[Proc]
    run_dir: str
    status_dir: str       # R2CC_STATUS_DIR of every worker
    lab: object
    step_share_dir: str | None = None  # R2CC_STEP_SHARE_DIR of every worker (step_share=True), else None
    startup_s: float = 0.0
    warmup_s: float = 0.0
    leftovers: list[str] = field(default_factory=list)  # filled in at exit: processes still alive
    dist_ids: set[str] = field(default_factory=set)      # vllm_dist_<id> of the run (its shm names)

    @property
    def logs(self) -> list[str]:
        return [p.log_path for p in self.procs]

    def check_alive(self) -> None:
        """DeployError naming the node that died, with its log tail."""
        for p in self.procs:
            if not p.alive():
                raise DeployError(f"vLLM node {p.name} exited with code {p.returncode}; "
                                  f"last lines of {p.log_path}:\n{p.tail()}")


def _say(msg: str) -> None:
    print(f"[deploy] {msg}", file=sys.stderr, flush=True)


def check_port_free(host: str, port: int) -> None:
    """DeployError if something listens on host:port already: vLLM would fail to bind, and our
    health checks would talk to that other server instead (another run's vLLM, say)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise DeployError(f"port {port} on {host} is taken ({exc.strerror}): another vLLM or test run "
                              "is probably using it; stop it or pick another port") from None


def single_instance(lab, model_dir: str, backend: str = "r2cc", port: int = 8123, *, enforce_eager: bool = True,
                    extra_env: dict | None = None, extra_args=(), log_dir: str | None = None,
                    startup_timeout_s: float = STARTUP_TIMEOUT_S, warmup: bool = True, tp: int = 2,
                    step_share: bool = False):
    """(a): one vLLM with TP=tp (2, or 4 with the tiny model's 4 heads) in the root namespace,
    rank r's rails in lab host r. step_share: every worker times its steps and the collectives
    inside them into dep.step_share_dir (r2cc_serve/vllm/step_share.py)."""
    vllm_env.check_backend(backend, "single")
    if tp not in (2, 4) or tp > lab.hosts:
        raise UserError(f"TP={tp} needs tp in (2, 4) (the tiny model has 4 heads) and as many lab hosts "
                        f"(the lab has {lab.hosts})")
    rails = [lab.rail_ifname(k) for k in range(lab.rails)]

    def start(run_dir: str, status_dir: str, step_share_dir: str | None) -> tuple[list[Proc], str]:
        check_port_free("127.0.0.1", port)
        tmp = _mkdir(run_dir, "tmp-node0")
        env = vllm_env.node_env(backend=backend, rails=rails, tmpdir=tmp, status_dir=status_dir,
                                netns_template=f"{lab.prefix}-h{{rank}}", mgmt_ifname=lab.mgmt_ifname,
                                extra=extra_env, step_share_dir=step_share_dir)
        argv = vllm_env.serve_argv(model_dir=model_dir, backend=backend, host="127.0.0.1", port=port,
                                   enforce_eager=enforce_eager, served_name=SERVED_NAME, extra_args=extra_args,
                                   tp=tp)
        proc = Proc("node0", PRIVATE_SHM + argv, env, os.path.join(log_dir or run_dir, "vllm-node0.log"))
        return [proc], f"http://127.0.0.1:{port}"

    return _deployment("single", lab, backend, start, log_dir, startup_timeout_s, warmup, step_share)


def two_nodes(lab, model_dir: str, backend: str = "r2cc", port: int = 8000, *, enforce_eager: bool = True,
              extra_env: dict | None = None, extra_args=(), log_dir: str | None = None,
              startup_timeout_s: float = STARTUP_TIMEOUT_S, warmup: bool = True, step_share: bool = False):
    """(b): one vLLM node per lab host (hosts 0 and 1), TP=2 across them; step_share as in (a)."""
    vllm_env.check_backend(backend)
    rails = [lab.rail_ifname(k) for k in range(lab.rails)]
    master = lab.mgmt_ip(0)

    def start(run_dir: str, status_dir: str, step_share_dir: str | None) -> tuple[list[Proc], str]:
        procs = []
        for node in (0, 1):
            tmp = _mkdir(run_dir, f"tmp-node{node}")
            env = vllm_env.node_env(backend=backend, rails=rails, tmpdir=tmp, status_dir=status_dir,
                                    host_ip=lab.mgmt_ip(node), mgmt_ifname=lab.mgmt_ifname, extra=extra_env,
                                    lab=lab, step_share_dir=step_share_dir)
            argv = vllm_env.serve_argv(model_dir=model_dir, backend=backend, host="0.0.0.0", port=port,
                                       enforce_eager=enforce_eager, served_name=SERVED_NAME,
                                       multi_node=(node, 2, master), extra_args=extra_args)
            argv = ["ip", "netns", "exec", lab.host_ns(node)] + PRIVATE_SHM + argv
            procs.append(Proc(f"node{node}", argv, env, os.path.join(log_dir or run_dir, f"vllm-node{node}.log")))
        return procs, f"http://{master}:{port}"

    return _deployment("two_nodes", lab, backend, start, log_dir, startup_timeout_s, warmup, step_share)


@contextlib.contextmanager
def _deployment(shape, lab, backend, start, log_dir, startup_timeout_s, warmup,
                step_share=False) -> Iterator[Deployment]:
    if shutil.which("vllm") is None:
        raise DeployError("the `vllm` command is not on PATH; run scripts/install_vllm.sh")
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    run_dir = tempfile.mkdtemp(prefix=f"r2cc-serve-{shape}-{backend}-", dir=_short_tmp())
    status_dir = _mkdir(run_dir, "status")
    step_share_dir = _mkdir(run_dir, "step-share") if step_share else None
    procs: list[Proc] = []
    dep = None
    try:
        started = time.monotonic()
        _say(f"starting {shape} backend={backend} (logs in {log_dir or run_dir})")
        procs, url = start(run_dir, status_dir, step_share_dir)
        dep = Deployment(shape, backend, url, SERVED_NAME, procs, run_dir, status_dir, lab, step_share_dir)
        wait_healthy(dep, startup_timeout_s)
        dep.startup_s = time.monotonic() - started
        _say(f"{url} healthy after {dep.startup_s:.0f} s")
        if warmup:
            t0 = time.monotonic()
            _warm_up(dep)
            dep.warmup_s = time.monotonic() - t0
            _say(f"warm-up request done in {dep.warmup_s:.0f} s")
        yield dep
    finally:
        left = stop_all(procs)
        shm_ids = _dist_ids([p.log_path for p in procs])
        for path in (p for i in shm_ids for p in glob.glob(f"/dev/shm/vllm_dist_{i}*")):
            with contextlib.suppress(OSError):
                os.remove(path)
        if left:
            _say("WARNING: still running after SIGKILL: " + "; ".join(left))
        if dep is not None:
            dep.leftovers, dep.dist_ids = left, shm_ids
        if log_dir is None and _keep_run_dir_on_error(sys.exc_info()[1]):
            # The logs explain the failure; everything else (TMPDIRs, status) goes.
            for name in os.listdir(run_dir):
                if not name.endswith(".log"):
                    shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)
            _say(f"logs kept in {run_dir}")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)


def wait_healthy(dep: Deployment, timeout_s: float) -> None:
    """Poll GET /health until 200; DeployError if a node dies or timeout_s passes."""
    deadline = time.monotonic() + timeout_s
    started = time.monotonic()
    next_note = started + 15
    with httpx.Client(timeout=3.0, trust_env=False) as client:
        while True:
            dep.check_alive()
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{dep.url}/health").status_code == 200:
                    return
            now = time.monotonic()
            if now > deadline:
                tails = "\n".join(f"--- {p.name} ({p.log_path}):\n{p.tail(15)}" for p in dep.procs)
                raise DeployError(f"{dep.url}/health did not answer 200 within {timeout_s:.0f} s; "
                                  f"the box may be overloaded (see `uptime`) or a node is stuck:\n{tails}")
            if now > next_note:
                last = log_tail(dep.procs[0].log_path, 1).strip()[-100:]
                _say(f"waiting for {dep.url}/health: {now - started:.0f} s ({last})")
                next_note = now + 15
            time.sleep(1.0)


def _warm_up(dep: Deployment) -> None:
    """One short greedy request: eager mode compiles nothing up front, so the first is slow."""
    body = {"model": dep.model, "prompt": "warm up", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    try:
        with httpx.Client(timeout=WARMUP_TIMEOUT_S, trust_env=False) as client:
            r = client.post(f"{dep.url}/v1/completions", json=body)
    except httpx.HTTPError as exc:
        dep.check_alive()
        raise DeployError(f"warm-up request to {dep.url} failed: {exc}") from exc
    if r.status_code != 200:
        raise DeployError(f"warm-up request to {dep.url} answered HTTP {r.status_code}: {r.text[:300]}")


def _dist_ids(log_paths: list[str]) -> set[str]:
    """vllm_dist_<id> names of the file stores of this run (their shm segments share the id)."""
    ids = set()
    for path in log_paths:
        with contextlib.suppress(OSError), open(path, errors="replace") as f:
            ids.update(re.findall(r"vllm_dist_([0-9a-f]+)", f.read()))
    return ids


def _keep_run_dir_on_error(exc) -> bool:
    return exc is not None and not isinstance(exc, KeyboardInterrupt)


def _short_tmp() -> str:
    """Where run directories go: TMPDIR unless it is long. vLLM's processes put ZeroMQ sockets
    (a 36-character name) in each node's TMPDIR, under the run directory, and a socket's path
    has at most 107 bytes: under pytest's tmp_path the demo's nodes failed to start."""
    base = tempfile.gettempdir()
    return base if len(base) <= 24 else "/tmp"


def _mkdir(parent: str, name: str) -> str:
    path = os.path.join(parent, name)
    os.makedirs(path, exist_ok=True)
    return path
