"""control/ attaches the rail monitor and control agent to a communicator; comm/ knows neither."""

import json
import os
import time

import pytest
import torch

from r2cc_serve.comm.communicator import Communicator as Bare
from r2cc_serve.control import attach as control


def _comm(cls, group, **kw):
    from torch.distributed import HashStore

    return cls(0, 1, HashStore(), rails=["127.0.0.1"], group=group, **kw)  # a group of one: no peers


def _status(tmp_path, name):
    path = tmp_path / name
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return json.loads(path.read_text()) if path.exists() else None


def test_attach_names_the_rank_and_close_stops_what_it_started(tmp_path, monkeypatch):
    monkeypatch.setenv("R2CC_STATUS_DIR", str(tmp_path))
    monkeypatch.delenv("R2CC_HOST_LABEL", raising=False)
    comm = _comm(Bare, "attach")
    try:
        assert comm.attached is None and comm.agent is None and comm.monitor is None  # comm alone attaches nothing
        done = control.attach(comm, control.ControlPlane(node=2, global_rank=7, default_host="node2"))
        assert comm.agent is done.agent and comm.monitor is done.monitor
        st = _status(tmp_path, "attach-rank7.json")
        assert st and (st["rank"], st["host"], st["agent_address"]) == (7, "node2", comm.agent.address)
        control.detach(comm)  # the group goes on without it
        assert comm.agent is None and not (tmp_path / "attach-rank7.json").exists()
        assert comm.all_reduce(torch.ones(3)).tolist() == [1.0] * 3
        control.attach(comm)
        assert _status(tmp_path, "attach-rank0.json")
        agent = comm.agent
    finally:
        comm.close()
    assert comm.attached is None and not agent._thread.is_alive()
    assert not (tmp_path / "attach-rank0.json").exists()


@pytest.mark.parametrize("knob", ["0", "1"])
def test_the_public_communicator_attaches_per_knob(tmp_path, monkeypatch, knob):
    from r2cc_serve import Communicator

    monkeypatch.setenv("R2CC_STATUS_DIR", str(tmp_path))
    monkeypatch.setenv("R2CC_CONTROL", knob)
    assert Communicator is control.Communicator and issubclass(Communicator, Bare)
    with _comm(Communicator, f"knob{knob}") as comm:
        assert (comm.agent is not None) == (knob == "1")
        comm.stop_control()
        assert comm.agent is None
        comm.start_control()
        assert comm.agent is not None and _status(tmp_path, f"knob{knob}-rank0.json")


def test_a_group_whose_control_cannot_start_is_closed(monkeypatch, tmp_path):
    monkeypatch.setenv("R2CC_STATUS_DIR", str(tmp_path))

    def no_port(self):
        raise OSError("no free port in the range")
    monkeypatch.setattr(control.ControlAgent, "start", no_port)
    comm = _comm(Bare, "noport")
    with pytest.raises(OSError, match="no free port"):
        control.attach_per_knob(comm)
    assert comm.attached is None and comm.error_kind() == "closed"
    assert os.listdir(tmp_path) == []  # the monitor never wrote, and nothing runs
