"""The control plane, attached to a communicator: its rail monitor (events, status file) and its
control agent (what the admin API calls to drain, fail over and restore rails).

comm/ moves tensors and imports neither: the caller decides whether to attach. vLLM's glue
attaches when R2CC_CONTROL is on (``attach_per_knob``); so does ``Communicator`` here, which is
``r2cc_serve.Communicator``, the class users construct.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from r2cc_serve import envs
from r2cc_serve.comm import communicator as comm_
from r2cc_serve.control.agent import ControlAgent
from r2cc_serve.health.monitor import RailMonitor


@dataclass(frozen=True)
class ControlPlane:
    """How a rank's rail monitor and control agent name it (status file, events, admin API)."""

    node: int = 0
    global_rank: int | None = None   # None: the rank in this group
    default_host: str | None = None  # host label when neither R2CC_HOST_LABEL nor a netns names it


class Attached:
    """What ``attach`` started on a communicator: its ``close()`` stops it first (``stop``), as
    the monitor's thread waits inside the transport."""

    def __init__(self, monitor: RailMonitor, agent: ControlAgent):
        self.monitor, self.agent = monitor, agent

    def stop(self) -> None:
        self.agent.stop()
        self.monitor.stop()


def attach(comm: comm_.Communicator, plane: ControlPlane = ControlPlane()) -> Attached:
    """Starts (or restarts) comm's rail monitor and control agent; ``comm.close()`` stops them."""
    detach(comm)
    host = envs.get("R2CC_CONTROL_HOST") or os.environ.get("VLLM_HOST_IP") or "127.0.0.1"
    rank = comm.rank if plane.global_rank is None else plane.global_rank
    label = envs.get("R2CC_HOST_LABEL") or comm.netns or plane.default_host or f"rank{rank}"
    monitor = RailMonitor(comm, comm.group, rank, plane.node, envs.get("R2CC_STATUS_DIR") or None,
                          envs.get("R2CC_MONITOR_INTERVAL_MS") / 1000.0, host=label)
    try:
        agent = ControlAgent(comm, monitor, host, comm.port_range).start()  # listens among the rails' ports
    except BaseException:
        monitor.stop()  # e.g. no free port: nothing is left running
        raise
    monitor.extra.update(agent_address=agent.address, agent_token=agent.token)
    monitor.start()
    comm.attached = Attached(monitor, agent)
    return comm.attached


def detach(comm: comm_.Communicator) -> None:
    """Stops comm's rail monitor and control agent, if attached (the group goes on)."""
    attached, comm.attached = comm.attached, None
    if attached is not None:
        attached.stop()


def attach_per_knob(comm: comm_.Communicator, plane: ControlPlane = ControlPlane()) -> Attached | None:
    """``attach`` when R2CC_CONTROL is on (the default). If that fails, comm is closed (its ports
    given back) and the error raised: a group without the control it was asked for is not used."""
    if not envs.get("R2CC_CONTROL"):
        return None
    try:
        return attach(comm, plane)
    except BaseException:
        comm.close()
        raise


class Communicator(comm_.Communicator):
    """``r2cc_serve.Communicator``: the group (comm.communicator.Communicator) with its control
    plane attached when R2CC_CONTROL is on. ``control``: how the control plane names this rank;
    ``start_control``/``stop_control`` switch it later."""

    def __init__(self, rank: int, world_size: int, store, rails: list[str], netns: str | None = None,
                 group: str = "default", fallback_rails: list[str] | None = None,
                 control: ControlPlane = ControlPlane(), **options):
        super().__init__(rank, world_size, store, rails, netns=netns, group=group, fallback_rails=fallback_rails,
                         **options)
        self.control = control
        attach_per_knob(self, control)

    def start_control(self) -> None:
        attach(self, self.control)

    def stop_control(self) -> None:
        detach(self)
