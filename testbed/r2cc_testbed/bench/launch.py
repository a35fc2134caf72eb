"""Starting and stopping the ranks of one launch: one process per lab host.

r2cc and gloo ranks are started directly with `ip netns exec <host> python -m ...worker`.
MPI ranks are started by mpirun in the root namespace through a wrapper that enters the host
of $OMPI_COMM_WORLD_RANK; they reach mpirun's PMIx server over the management bridge
(docs/design.md, "Facts the code relies on"). Every child gets its own session (process group), so a kill reaches
everything it started; worker pids from the results files are killed too, in case mpirun
put its ranks in other groups.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

from r2cc_serve.errors import UserError
from r2cc_testbed import child_pythonpath
from r2cc_testbed.lab import baselines

WORKER_MODULE = "r2cc_testbed.bench.worker"


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def worker_env(backend: str, rails: list[str], spin_us: int | None = None, lab=None) -> dict:
    env = dict(os.environ)
    if backend == "r2cc" and spin_us is not None:
        env["R2CC_SPIN_US"] = str(spin_us)
    env["PYTHONPATH"] = child_pythonpath(env.get("PYTHONPATH"))
    env["OMP_NUM_THREADS"] = "1"  # 2 cores shared by all ranks
    env["TORCH_CPP_LOG_LEVEL"] = "ERROR"  # c10d warns about reverse DNS on every store client
    variant = baselines.variant_of(backend, "gloo")  # gloo: one rail; -rails: a device each; -mptcp
    if variant:
        env.update(baselines.gloo_env(variant, rails, lab, base=env))
    return env


class Launch:
    """The processes of one launch, and where their results land."""

    def __init__(self, name: str, world: int, out_dir: str, procs: list[subprocess.Popen]):
        self.name, self.world, self.out_dir, self.procs = name, world, out_dir, procs

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def results(self) -> list[dict | None]:
        """Each rank's results file (None if the rank never wrote one)."""
        out = []
        for r in range(self.world):
            try:
                with open(os.path.join(self.out_dir, f"{self.name}-rank{r}.json")) as f:
                    out.append(json.load(f))
            except (OSError, ValueError):
                out.append(None)
        return out

    def kill(self) -> None:
        """SIGKILL every process group we started and every worker that reported its pid."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for res in self.results():
            pid = res and res.get("pid")
            if pid and _is_our_worker(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def _is_our_worker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return WORKER_MODULE.encode() in f.read()
    except OSError:
        return False


def start_netns(lab, name: str, cfg_path: str, out_dir: str, backend: str, rails: list[str],
                spin_us: int | None = None) -> Launch:
    env = worker_env(backend, rails, spin_us, lab)
    procs = []
    try:
        for i in range(lab.hosts):
            argv = ["ip", "netns", "exec", lab.host_ns(i), sys.executable, "-m", WORKER_MODULE, cfg_path,
                    "--rank", str(i)]
            procs.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          start_new_session=True))
    except BaseException:
        Launch(name, lab.hosts, out_dir, procs).kill()
        raise
    return Launch(name, lab.hosts, out_dir, procs)


def mpirun_argv(lab, wrapper: str, cfg_path: str, rails: list[str]) -> list[str]:
    return ["mpirun", "-np", str(lab.hosts), "--oversubscribe", "--bind-to", "none", "--allow-run-as-root",
            "--mca", "pml", "ob1",            # not UCX: it would bypass the TCP transport
            "--mca", "btl", "tcp,self",       # no shared memory: every byte crosses the rails
            "--mca", "btl_tcp_if_include", ",".join(rails),
            "--mca", "oob_tcp_if_include", lab.mgmt_bridge,
            "--mca", "btl_base_warn_component_unused", "0",
            wrapper, sys.executable, "-m", WORKER_MODULE, cfg_path]


def start_mpi(lab, name: str, cfg_path: str, out_dir: str, rails: list[str]) -> Launch:
    if shutil.which("mpirun") is None:
        raise UserError("backend mpi needs Open MPI: apt-get install -y openmpi-bin libopenmpi-dev; "
                        "pip install mpi4py")
    wrapper = os.path.join(out_dir, "netns-wrapper.sh")
    with open(wrapper, "w") as f:
        # mpirun starts every rank through this: enter the lab host of that rank.
        f.write(f'#!/bin/sh\nexec ip netns exec "{lab.prefix}-h${{OMPI_COMM_WORLD_RANK}}" "$@"\n')
    os.chmod(wrapper, 0o755)
    env = worker_env("mpi", rails)
    env.update(PMIX_MCA_ptl_tcp_remote_connections="1", PMIX_MCA_ptl_tcp_if_include=lab.mgmt_bridge)
    proc = subprocess.Popen(mpirun_argv(lab, wrapper, cfg_path, rails), env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, start_new_session=True)
    return Launch(name, lab.hosts, out_dir, [proc])


def wait(launch: Launch, deadline: float, poll=None, interval: float = 0.01) -> bool:
    """Wait until every process exits or `deadline` (monotonic); poll() runs in between.

    Returns False on the deadline (the caller kills the launch).
    """
    while launch.running():
        if time.monotonic() > deadline:
            return False
        if poll is not None:
            poll()
        time.sleep(interval)
    if poll is not None:
        poll()
    return True


def start_local(name: str, cfg_path: str, out_dir: str, backend: str, rank: int, world: int,
                gloo_rails: list[str], spin_us: int | None = None) -> Launch:
    """One rank on this host, in this namespace (servers that already exist). gloo_rails: the
    rails as interface names, which is how gloo is put on them."""
    env = worker_env(backend, gloo_rails, spin_us)
    argv = [sys.executable, "-m", WORKER_MODULE, cfg_path, "--rank", str(rank)]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            start_new_session=True)
    return Launch(name, world, out_dir, [proc])
