"""Environment and command line of one vLLM node on the lab (what deploy.py starts).

Rails per backend (why):
- r2cc: TP collectives on the lab rails through r2cc; vLLM's own gloo groups (start-up
  barriers, object broadcasts, no per-token traffic) on the management network, like a
  control plane, so a rail fault hits only the data path r2cc protects.
- default, default-rails, default-mptcp: vLLM's own backend, whose TP collectives between
  nodes go over torch.distributed gloo, put on the same shaped rails (never the unshaped
  management network, which would flatter it) in the three ways of lab/baselines.py: rail0
  alone (what a user configures), a gloo device per rail, or rail0 under kernel MPTCP with a
  subflow on every rail (every vLLM process preloads mptcpize's library and our gloo fix).
  On one host (`single`) vLLM's default backend uses shared memory, not the rails, so only
  `default` applies there.
"""

from __future__ import annotations

import os

from r2cc_testbed import child_pythonpath
from r2cc_testbed.lab import baselines


BACKENDS = ("r2cc", *baselines.names("default"))

# Every variable we set or must not inherit from the caller (a stray R2CC_NETNS in the
# caller's shell would put a two-node rank's rails in the wrong namespace).
_CLEARED = ("R2CC_DISTRIBUTED_BACKEND", "R2CC_CONFIG", "R2CC_RAILS", "R2CC_NETNS", "R2CC_FALLBACK_RAILS",
            "R2CC_STEP_SHARE_DIR", "GLOO_SOCKET_IFNAME", "VLLM_HOST_IP", "VLLM_PLUGINS", "PROMETHEUS_MULTIPROC_DIR")

# Offline, quiet, small: what a TP=2 CPU vLLM needs on a 2-core box (docs/vllm.md).
_BASE = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    # One OpenMP thread per worker. Left unbound, torch gives each worker a thread per core: two
    # workers then run four compute threads on two cores, and every parallel region of every op
    # waits for a thread that has no core. Measured (two nodes, 4 streams): a decode step of
    # 240-330 ms became 14-45 ms, for both backends (docs/vllm.md).
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
    "TORCH_CPP_LOG_LEVEL": "ERROR",
}


def check_backend(backend: str, shape: str | None = None) -> str:
    """The backend name, checked (UserError naming the choices); with shape "single", only the
    backends that mean something on one host."""
    from r2cc_serve.errors import UserError

    if backend not in BACKENDS:
        raise UserError(f"backend {backend!r} is not known: use one of {', '.join(BACKENDS)}")
    if shape == "single" and backend not in ("r2cc", "default"):
        raise UserError(f"backend {backend} puts vLLM's gloo on the rails between nodes; on one host vLLM's "
                        "default backend uses shared memory instead: use the two-nodes shape or `default`")
    return backend


def is_default(backend: str) -> bool:
    """vLLM's own backend, in any of its wirings (default, default-rails, default-mptcp)."""
    return baselines.variant_of(backend, "default") is not None


def node_env(*, backend: str, rails: list[str], tmpdir: str, status_dir: str, netns_template: str | None = None,
             host_ip: str | None = None, mgmt_ifname: str = "mgmt0", extra: dict | None = None,
             lab=None, step_share_dir: str | None = None) -> dict:
    """Environment of one vLLM node.

    netns_template: single-instance deployments put rank r's rails in lab host r ("<prefix>-h{rank}");
    None when the node itself runs inside its host (two nodes).
    host_ip: VLLM_HOST_IP, the address other nodes reach this one at (two nodes: its mgmt IP).
    step_share_dir: where every worker writes the time its steps spent in collectives
    (R2CC_STEP_SHARE_DIR, any backend); None: not timed.
    """
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    env.update(_BASE)
    env["PYTHONPATH"] = child_pythonpath(env.get("PYTHONPATH"))
    env["TMPDIR"] = tmpdir  # zmq ipc sockets and the file store land here, removed after the run
    env["R2CC_STATUS_DIR"] = status_dir
    if step_share_dir:
        env["R2CC_STEP_SHARE_DIR"] = step_share_dir
    if host_ip:
        env["VLLM_HOST_IP"] = host_ip
    if backend == "r2cc":
        env["R2CC_RAILS"] = ",".join(rails)
        env["R2CC_FALLBACK_RAILS"] = mgmt_ifname
        if netns_template:
            env["R2CC_NETNS"] = netns_template
        if host_ip:
            env["GLOO_SOCKET_IFNAME"] = mgmt_ifname
    elif host_ip:
        env.update(baselines.gloo_env(baselines.variant_of(backend, "default"), rails, lab, base=env))
    env.update(extra or {})
    return env


def serve_argv(*, model_dir: str, backend: str, host: str, port: int, enforce_eager: bool,
               served_name: str, multi_node: tuple[int, int, str] | None = None,
               extra_args: list[str] | tuple[str, ...] = (), tp: int = 2) -> list[str]:
    """`vllm serve` with TP=tp; multi_node = (node_rank, nnodes, master_addr) for a two-node run."""
    argv = ["vllm", "serve", model_dir, "--tensor-parallel-size", str(tp), "--host", host, "--port", str(port),
            "--served-model-name", served_name, "--seed", "0"]
    if enforce_eager:
        argv.append("--enforce-eager")
    if backend == "r2cc":
        argv += ["--distributed-backend", "r2cc"]
    if multi_node:
        node_rank, nnodes, master = multi_node
        argv += ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--master-addr", master]
        if node_rank > 0:
            argv.append("--headless")  # workers only; node 0 has the API server and the engine
    argv += list(extra_args)
    return argv
