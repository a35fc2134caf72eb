"""r2cc as vLLM's tensor-parallel device communicator.

vLLM builds one instance per group with more than one rank (for a dense model: "tp:0")
in every worker. Rendezvous uses the store of vLLM's default process group (tcp:// on
multi-node, file:// on one node); rails come from the rail map (rail_config.py).
Collectives are out of place: vLLM calls them through custom ops declared as
non-mutating, and an in-place all_reduce gives wrong tokens under torch.compile.
"""

from __future__ import annotations

import logging

import torch

from r2cc_serve.vllm import compat
from r2cc_serve.comm import registry
from r2cc_serve.comm.communicator import Communicator, ControlPlane
from r2cc_serve.comm.rail_config import load_rail_config
from r2cc_serve.health import loglines

log = logging.getLogger("r2cc_serve.vllm")

_Base = compat.device_communicator_base()


def _concat_gathered(gathered: torch.Tensor, like: torch.Tensor, dim: int) -> torch.Tensor:
    """[world, *shape] -> shape with `dim` world times larger (rank-major, like torch.cat).
    A 0-dim tensor gathers like a one-element vector: the result is [world]."""
    if like.dim() == 0:
        return gathered.reshape(gathered.shape[0])
    dim = dim % like.dim()
    shape = list(like.shape)
    shape[dim] *= gathered.shape[0]
    return gathered.movedim(0, dim).reshape(shape)


class R2CCCommunicator(_Base):
    def __init__(self, cpu_group, device=None, device_group=None, unique_name: str = "", **kwargs):
        super().__init__(cpu_group, device, device_group, unique_name, **kwargs)
        cfg = compat.current_vllm_config(required=False)
        node = cfg.parallel_config.node_rank if cfg is not None else 0
        rails = load_rail_config(self.global_rank, node)
        store = compat.group_store(f"r2cc/{unique_name}/")
        # The status file, events and admin API name the global rank and the node.
        self.comm = Communicator(self.rank_in_group, self.world_size, store, rails.rails, netns=rails.netns,
                                 group=unique_name, fallback_rails=rails.fallback_rails,
                                 control=ControlPlane(node, self.global_rank, f"node{node}"))
        self.node = node
        registry.register(unique_name, self.global_rank, node, self.comm)
        log.warning("%s", loglines.group_up_line(unique_name, self.rank_in_group, self.world_size, self.global_rank,
                                                 node, self.comm.rail_ips, rails.netns, rails.fallback_rails))

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(input_, inplace=False)

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return _concat_gathered(self.comm.all_gather(input_), input_, dim)

    def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        dim = dim % input_.dim()
        out = self.comm.reduce_scatter(input_.movedim(dim, 0).contiguous())
        return out.movedim(0, dim).contiguous()

    def gather(self, input_: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        gathered = self.comm.gather(input_, dst=dst)
        return None if gathered is None else _concat_gathered(gathered, input_, dim)

    def broadcast(self, input_: torch.Tensor, src: int = 0) -> torch.Tensor:
        return self.comm.broadcast(input_, src=src)

    def send(self, tensor: torch.Tensor, dst: int | None = None) -> None:
        self.comm.send(tensor, (self.rank_in_group + 1) % self.world_size if dst is None else dst)

    def recv(self, size: torch.Size, dtype: torch.dtype, src: int | None = None) -> torch.Tensor:
        out = torch.empty(size, dtype=dtype)
        return self.comm.recv(out, (self.rank_in_group - 1) % self.world_size if src is None else src)

    def destroy(self) -> None:
        registry.unregister(self.unique_name)
        self.comm.close()
