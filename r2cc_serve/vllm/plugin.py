"""vLLM general plugin: `vllm serve ... --distributed-backend r2cc`.

Loaded by vLLM in the API server, the engine core and every worker. It adds the flag
(whose value travels to the spawned processes as R2CC_DISTRIBUTED_BACKEND) and, when
the backend is r2cc, makes the platform build R2CCCommunicator for tensor-parallel
groups with collectives routed through vLLM's custom ops (safe under torch.compile).
With `--enable-fault-tolerance` too, a group that gives up leaves the engine unhealthy, not
dead, and r2cc resumes it through vLLM's retry once a rail is back (fault_tolerance.py).
Without the flag vLLM is untouched.
"""

from __future__ import annotations

import argparse
import os

from r2cc_serve import envs
from r2cc_serve.vllm import compat
from r2cc_serve.errors import UserError

BACKENDS = ("default", "r2cc")
COMMUNICATOR = "r2cc_serve.vllm.communicator.R2CCCommunicator"


def backend() -> str:
    return envs.get("R2CC_DISTRIBUTED_BACKEND")


class _SelectBackend(argparse.Action):
    """Records the choice in the environment, which engine and workers inherit."""

    def __call__(self, parser, namespace, value, option_string=None):
        if value == "r2cc":
            from r2cc_serve.comm.rail_config import load_rail_config

            try:
                load_rail_config(rank=0)  # a missing rail map fails here, not in a worker
            except UserError as exc:
                parser.error(str(exc))
        os.environ["R2CC_DISTRIBUTED_BACKEND"] = value
        if value == "r2cc":
            _enable_admin_endpoint()
        setattr(namespace, self.dest, value)


def _enable_admin_endpoint() -> None:
    """vLLM loads endpoint plugins only when VLLM_PLUGINS names them, and that list then
    also filters general plugins: name every general plugin too, so nothing else changes."""
    from importlib.metadata import entry_points

    current = os.environ.get("VLLM_PLUGINS")
    names = [n for n in (current.split(",") if current is not None else
                         [e.name for e in entry_points(group=compat.GENERAL_PLUGINS_GROUP)]) if n]
    if "r2cc_admin" not in names:
        os.environ["VLLM_PLUGINS"] = ",".join(names + ["r2cc_admin"])


def _add_flag(parser) -> None:
    if any("--distributed-backend" in a.option_strings for a in parser._actions):
        return
    parser.add_argument(
        "--distributed-backend", choices=BACKENDS, action=_SelectBackend, default=backend(),
        help="Tensor-parallel collectives: 'default' (vLLM's own) or 'r2cc' (striped over several NICs, "
             "lossless failover when one dies). Rails come from R2CC_RAILS/R2CC_NETNS or R2CC_CONFIG (YAML).")


def _uses_ray(executor) -> bool:
    """`--distributed-executor-backend` as given or resolved: "ray", or an executor class of Ray's."""
    return executor == "ray" or (isinstance(executor, type) and bool(getattr(executor, "uses_ray", False)))


def executor_refusal(engine_args, parallel_config) -> str | None:
    """Why r2cc refuses this deployment's executor (None: it does not). vLLM's Ray executor is
    refused: on the CPU platform vLLM cannot place workers with Ray at all, and even where it can,
    every Ray worker gets node_rank 0 (ParallelConfig.node_rank belongs to the mp executor's
    --nnodes/--node-rank), so r2cc could not tell the nodes' ranks apart in the admin API, the
    status files and R2CC_NETNS's {node}. Each node's own R2CC_RAILS would reach its workers
    (Ray workers inherit the environment `ray start` ran in; vLLM copies only VLLM_*, HF_*, ...)."""
    if backend() != "r2cc":
        return None
    executor = (engine_args.distributed_executor_backend if parallel_config is None
                else parallel_config.distributed_executor_backend)
    if not _uses_ray(executor):
        return None
    why = ["vLLM gives every Ray worker node rank 0, and r2cc names each rank's node by it "
           "(admin API, status files, R2CC_NETNS's {node})"]
    if not compat.platform_runs_ray():
        why.insert(0, f"vLLM's {compat.current_platform().device_name} platform cannot run its Ray executor at all "
                      "(no Ray device key: vLLM stops with 'current platform ... does not support ray', "
                      "with or without r2cc)")
    return ("--distributed-backend r2cc does not run under vLLM's Ray executor (--distributed-executor-backend ray): "
            + "; and ".join(why) + ". Serve across servers with vLLM's own multi-node executor instead: on each node "
            "`vllm serve ... --distributed-backend r2cc --nnodes N --node-rank R --master-addr <node 0's address>` "
            "(--headless on nodes other than 0; docs/deploy.md), with that node's R2CC_RAILS.")


def register() -> None:
    if backend() not in BACKENDS:
        raise UserError(f"R2CC_DISTRIBUTED_BACKEND={backend()!r}; use one of {', '.join(BACKENDS)}")
    compat.check_vllm_version()
    if envs.get("R2CC_STEP_SHARE_DIR"):  # serve-bench's clocks, the same for every backend
        from r2cc_serve.vllm import step_share

        step_share.install(envs.get("R2CC_STEP_SHARE_DIR"))
    compat.add_engine_cli_args(_add_flag)
    compat.update_additional_config(
        lambda: {"r2cc_distributed_backend": "r2cc"} if backend() == "r2cc" else {})
    compat.route_platform_communicator(lambda: COMMUNICATOR if backend() == "r2cc" else None)
    # The API server loads plugins before it parses --distributed-backend: decide at call time.
    compat.allow_fault_tolerance_without_data_parallel(lambda: backend() == "r2cc")
    if backend() == "r2cc":  # the engine core and the workers inherit the choice
        from r2cc_serve.vllm import fault_tolerance

        compat.recover_groups_on_retry(fault_tolerance.recover_groups)
        compat.explain_faults_and_retry(fault_tolerance.fault_reason)
    from r2cc_serve.vllm.agents import METHOD, worker_agents

    compat.add_worker_method(METHOD, worker_agents)
    compat.refuse_engine_config(executor_refusal)  # last: it keeps the other wrappers' flags
