"""r2cc as vLLM's tensor-parallel device communicator.

vLLM builds one instance per group with more than one rank (for a dense model: "tp:0")
in every worker. Rendezvous uses the store of vLLM's default process group (tcp:// on
multi-node, file:// on one node); rails come from the rail map (rail_config.py).
Collectives are out of place: vLLM calls them through custom ops declared as
non-mutating, and an in-place all_reduce gives wrong tokens under torch.compile.

A group that gives up (fault_tolerance.py) raises its error with the rails named and what
vLLM does next; on vLLM's fault-tolerance `retry`, recover_from_fault re-forms the group.
"""

from __future__ import annotations

import contextlib
import datetime
import logging

import torch

from r2cc_serve import envs
from r2cc_serve.errors import GroupAbortedError
from r2cc_serve.vllm import compat, fault_tolerance
from r2cc_serve.comm import registry
from r2cc_serve.comm.communicator import Communicator
from r2cc_serve.comm.rail_config import load_rail_config
from r2cc_serve.control.attach import ControlPlane, attach_per_knob
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
        self.ft_enabled = bool(cfg is not None and getattr(cfg.parallel_config, "enable_fault_tolerance", False))
        self.rails = load_rail_config(self.global_rank, node)
        self.node = node
        self.comm = self._build(compat.group_store(f"r2cc/{unique_name}/"))

    def _build(self, store, **options) -> Communicator:
        """A Communicator for this group over `store`, with its control plane (R2CC_CONTROL),
        registered for health and admin."""
        rails, node = self.rails, self.node
        comm = Communicator(self.rank_in_group, self.world_size, store, rails.rails, netns=rails.netns,
                            group=self.unique_name, fallback_rails=rails.fallback_rails, **options)
        # The status file, events and admin API name the global rank and the node.
        attach_per_knob(comm, ControlPlane(node, self.global_rank, f"node{node}"))
        registry.register(self.unique_name, self.global_rank, node, comm)
        log.warning("%s", loglines.group_up_line(self.unique_name, self.rank_in_group, self.world_size,
                                                 self.global_rank, node, comm.rail_ips, rails.netns,
                                                 rails.fallback_rails))
        return comm

    @contextlib.contextmanager
    def _explained(self):
        """A group that gave up raises the same error class, its message naming this rank's rails
        and saying what vLLM does next (with or without --enable-fault-tolerance)."""
        try:
            yield
        except GroupAbortedError as exc:
            if fault_tolerance.GAVE_UP in str(exc):
                raise
            try:
                stats = self.comm.rail_stats()
            except Exception:  # noqa: BLE001 - the words must not hide the error
                stats = []
            msg = fault_tolerance.explain(
                exc, group=self.unique_name, rank=self.rank_in_group, global_rank=self.global_rank,
                rail_stats=stats, peers=[p for p in range(self.world_size) if p != self.rank_in_group],
                ft_enabled=self.ft_enabled, auto_retry=envs.get("R2CC_FT_AUTO_RETRY"))
            raise type(exc)(msg) from exc

    def recover_from_fault(self, tag: str, timeout_s: float) -> None:
        """vLLM's fault-tolerance retry (in every worker at once): close this group and form a new one
        of the same name. The ranks meet under r2cc/<group>/ft/<tag>/ (tag: the retry's request id,
        equal on every rank), so nothing of an earlier attempt is read. Raises, leaving the group
        closed, if the other ranks do not arrive within timeout_s or no rail to a peer connects."""
        registry.unregister(self.unique_name)
        with contextlib.suppress(Exception):
            self.comm.close()  # kept until a new group is up: calls raise the closed group's error
        store = compat.group_store(f"r2cc/{self.unique_name}/ft/{tag}/")
        store.set(f"arrive/{self.rank_in_group}", b"1")
        try:
            store.wait([f"arrive/{r}" for r in range(self.world_size)], datetime.timedelta(seconds=timeout_s))
        except Exception as exc:  # noqa: BLE001 - torch raises DistStoreError/RuntimeError by version
            raise TimeoutError(f"r2cc: the other ranks of {self.unique_name} did not arrive for retry {tag} "
                               f"within {timeout_s:g} s ({type(exc).__name__})") from None
        # A rank that fails here tells the others (the Communicator gives up under its keys), so
        # they fail at once too rather than at the store's timeout.
        self.comm = self._build(store, connect_timeout_s=float(timeout_s))

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        with self._explained():
            return self.comm.all_reduce(input_, inplace=False)

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        with self._explained():
            return _concat_gathered(self.comm.all_gather(input_), input_, dim)

    def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        dim = dim % input_.dim()
        with self._explained():
            out = self.comm.reduce_scatter(input_.movedim(dim, 0).contiguous())
        return out.movedim(0, dim).contiguous()

    def gather(self, input_: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        with self._explained():
            gathered = self.comm.gather(input_, dst=dst)
        return None if gathered is None else _concat_gathered(gathered, input_, dim)

    def broadcast(self, input_: torch.Tensor, src: int = 0) -> torch.Tensor:
        with self._explained():
            return self.comm.broadcast(input_, src=src)

    def send(self, tensor: torch.Tensor, dst: int | None = None) -> None:
        with self._explained():
            self.comm.send(tensor, (self.rank_in_group + 1) % self.world_size if dst is None else dst)

    def recv(self, size: torch.Size, dtype: torch.dtype, src: int | None = None) -> torch.Tensor:
        out = torch.empty(size, dtype=dtype)
        with self._explained():
            return self.comm.recv(out, (self.rank_in_group - 1) % self.world_size if src is None else src)

    def destroy(self) -> None:
        registry.unregister(self.unique_name)
        self.comm.close()
