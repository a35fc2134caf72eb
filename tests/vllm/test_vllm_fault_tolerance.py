"""r2cc's side of vLLM's --enable-fault-tolerance (r2cc_serve/vllm/fault_tolerance.py and
R2CCCommunicator.recover_from_fault): the words of a group that gave up, how the engine tells an
r2cc fault from another, the automatic retry loop, and re-forming a real group on loopback.

The end-to-end path (real vLLM, a real lab outage) is tests/e2e/test_h_fault_tolerance.py.
"""

from __future__ import annotations

import asyncio
import datetime
import threading
from types import SimpleNamespace

import pytest
import torch

from r2cc_serve.errors import RailsDownError
from r2cc_serve.vllm import fault_tolerance as ft
from tests.comm.harness import run_in_threads
from tests.conftest import why_missing

STATS = [
    {"peer": 1, "rail": 1, "state": "down", "last_error": "connect 10.0.1.2:5: Network is unreachable",
     "address": "10.0.1.1", "interface": "rail1"},
    {"peer": 1, "rail": 0, "state": "down", "last_error": "", "address": "10.0.0.1", "interface": "rail0"},
]


def _explain(ft_enabled: bool, auto: bool = True) -> str:
    err = RailsDownError("r2cc: every rail between two ranks stayed down for more than 600 ms\nDetails: rank 0")
    return ft.explain(err, group="tp:0", rank=0, global_rank=0, rail_stats=STATS, peers=[1],
                      ft_enabled=ft_enabled, auto_retry=auto)


def test_the_error_names_the_rails_and_says_the_flag_exists_without_it():
    msg = _explain(ft_enabled=False)
    assert "\n" not in msg and msg.startswith(ft.GAVE_UP)
    assert "rail0 10.0.0.1 (down)" in msg and "rail1 10.0.1.1 (down: connect 10.0.1.2:5: Network is unreachable)" in msg
    assert msg.index("rail0") < msg.index("rail1"), "rails in order"
    assert "kind rails_down" in msg and "stayed down for more than 600 ms" in msg
    assert "--enable-fault-tolerance" in msg and "must be restarted" in msg


def test_with_the_flag_the_error_says_how_the_engine_resumes():
    auto, operator = _explain(ft_enabled=True, auto=True), _explain(ft_enabled=True, auto=False)
    assert "engine stays up (unhealthy)" in auto and "R2CC_FT_AUTO_RETRY=1" in auto
    assert "POST /fault_tolerance/apply" in operator and "R2CC_FT_AUTO_RETRY=0" in operator


def test_the_engine_finds_r2cc_s_reason_inside_vllm_s_wrapper():
    inner = _explain(ft_enabled=True)
    wrapped = RuntimeError(f"Worker failed with error '{inner}', please check the stack trace above for the root cause")
    assert ft.fault_reason(wrapped) == inner
    assert ft.fault_reason(RuntimeError("CUDA error: an illegal memory access")) is None


def test_automatic_retry_only_for_an_r2cc_fault_and_only_when_on(monkeypatch):
    reason = _explain(ft_enabled=True)
    assert ft.auto_retry_wanted(reason)
    assert not ft.auto_retry_wanted("RuntimeError") and not ft.auto_retry_wanted(None)
    monkeypatch.setenv("R2CC_FT_AUTO_RETRY", "0")
    assert not ft.auto_retry_wanted(reason)


class _Engine:
    """Stands in for vLLM's EngineClient: the status cache and handle_fault, nothing else."""

    def __init__(self, fault_info: str, fail_first: int):
        self.status, self.fault_info, self.fail_first = "unhealthy", fault_info, fail_first
        self.calls: list[str] = []

    async def get_status(self):
        return {"engines": [{"id": 0, "status": self.status, "fault_info": self.fault_info}]}

    async def handle_fault(self, request):
        self.calls.append(request)
        await asyncio.sleep(0.01)
        if len(self.calls) <= self.fail_first:
            return SimpleNamespace(success=False, reason="workers did not recover: no rail came up")
        self.status = "healthy"
        return SimpleNamespace(success=True, reason=None)


def _run_loop(engine, seconds: float, monkeypatch, auto: bool = True, resumed: list | None = None) -> list[str]:
    monkeypatch.setenv("R2CC_FT_RETRY_INTERVAL_S", "0.05")
    said = []

    async def main():
        task = asyncio.create_task(ft.watch_engine(
            engine, lambda rid: rid, auto_retry=auto, poll_s=0.01, say=lambda *a: said.append(a[0] % a[1:]),
            on_resumed=None if resumed is None else lambda: resumed.append(engine.status)))
        await asyncio.sleep(seconds)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(main(), timeout=10))
    return said


def test_automatic_retry_repeats_until_the_engine_is_healthy_then_stops(monkeypatch):
    engine, resumed = _Engine(_explain(ft_enabled=True), fail_first=3), []
    said = _run_loop(engine, 0.6, monkeypatch, resumed=resumed)
    assert len(engine.calls) == 4, engine.calls  # three failures, one success, then nothing
    assert all(c.startswith("r2cc-auto-") for c in engine.calls) and len(set(engine.calls)) == 4
    assert any("still unhealthy" in s for s in said) and any("healthy again" in s for s in said)
    assert resumed == ["healthy"], "the admin view is told once that the groups were re-formed"


def test_without_automatic_retry_an_operator_s_retry_is_still_noticed(monkeypatch):
    engine, resumed = _Engine(_explain(ft_enabled=True), fail_first=0), []

    async def operator():
        await asyncio.sleep(0.1)
        engine.status = "healthy"  # POST /fault_tolerance/apply went through vLLM's own route

    async def main():
        task = asyncio.create_task(ft.watch_engine(engine, lambda rid: rid, auto_retry=False, poll_s=0.01,
                                                   say=lambda *a: None, on_resumed=lambda: resumed.append(1)))
        await operator()
        await asyncio.sleep(0.1)
        task.cancel()

    asyncio.run(asyncio.wait_for(main(), timeout=10))
    assert engine.calls == [] and resumed == [1]


def test_automatic_retry_leaves_other_faults_to_the_operator(monkeypatch):
    engine = _Engine("RuntimeError: something else broke", fail_first=0)
    _run_loop(engine, 0.3, monkeypatch)
    assert engine.calls == [] and engine.status == "unhealthy"


def test_recover_groups_reports_each_group_without_raising():
    class Comm:
        def __init__(self, name, error=None):
            self.unique_name, self.error, self.tags = name, error, []

        def recover_from_fault(self, tag, timeout_s):
            self.tags.append((tag, timeout_s))
            if self.error:
                raise TimeoutError(self.error)

    good, bad = Comm("tp:0"), Comm("pp:0", "no rail to rank 1 came up within 3 s\nmore")
    out = ft.recover_groups([good, bad], "req-1")
    assert out == {"ok": False, "groups": ["tp:0"], "error": "pp:0: TimeoutError: no rail to rank 1 came up within 3 s"}
    assert good.tags == [("req-1", 3.0)]
    assert ft.recover_groups([good], "req-2") == {"ok": True, "groups": ["tp:0"], "error": ""}


# --- a real group re-formed on loopback (R2CCCommunicator's method; vLLM's base class imported) --------

needs_vllm = pytest.mark.skipif(why_missing("vllm") is not None, reason=why_missing("vllm") or "")


def _half(rank: int, store):
    """An R2CCCommunicator as vLLM would have built it, minus vLLM's groups: the attributes
    recover_from_fault and _build use, and a real group over two loopback rails."""
    from r2cc_serve.comm.rail_config import RailConfig
    from r2cc_serve.vllm.communicator import R2CCCommunicator

    c = object.__new__(R2CCCommunicator)
    c.unique_name, c.rank_in_group, c.world_size, c.global_rank, c.node = "tp:0", rank, 2, rank, 0
    c.rails, c.ft_enabled = RailConfig(rails=["127.0.0.1", "127.0.0.2"]), True
    c.comm = c._build(store)
    return c


def _store_per_thread(monkeypatch):
    """compat.group_store over one TCPStore master, with a client per thread (a TCPStore client
    blocked in get() holds its socket: two ranks must not share one)."""
    from torch.distributed import PrefixStore, TCPStore

    from r2cc_serve.vllm import compat

    master = TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
    local = threading.local()

    def group_store(prefix):
        if not hasattr(local, "client"):
            local.client = TCPStore("127.0.0.1", master.port, 1, False, timeout=datetime.timedelta(seconds=30))
        return PrefixStore(prefix, local.client)

    monkeypatch.setattr(compat, "group_store", group_store)
    return master, group_store


@needs_vllm
def test_a_group_that_gave_up_is_re_formed_under_the_same_name(monkeypatch):
    monkeypatch.setenv("R2CC_CONTROL", "0")
    _master, group_store = _store_per_thread(monkeypatch)
    comms = run_in_threads(lambda r: _half(r, group_store("r2cc/tp:0/")))
    x = [torch.arange(8, dtype=torch.float32) * (r + 1) for r in (0, 1)]
    assert all(torch.equal(y, x[0] + x[1]) for y in run_in_threads(lambda r: comms[r].all_reduce(x[r])))

    for c in comms:  # as when every rail to the peer stayed down: each call now raises, explained
        c.comm.abort("r2cc: every rail between two ranks stayed down (test)")
    with pytest.raises(Exception, match="r2cc"):
        comms[0].all_reduce(x[0])

    run_in_threads(lambda r: comms[r].recover_from_fault("retry-1", 10.0))
    assert all(torch.equal(y, x[0] + x[1]) for y in run_in_threads(lambda r: comms[r].all_reduce(x[r])))
    run_in_threads(lambda r: comms[r].destroy())


@needs_vllm
def test_a_retry_the_peer_does_not_join_fails_within_its_bound(monkeypatch):
    import time

    monkeypatch.setenv("R2CC_CONTROL", "0")
    _master, group_store = _store_per_thread(monkeypatch)
    comms = run_in_threads(lambda r: _half(r, group_store("r2cc/tp:0/")))
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="did not arrive for retry lonely within 1 s"):
        comms[0].recover_from_fault("lonely", 1.0)
    assert time.monotonic() - t0 < 5
    with pytest.raises(Exception):  # the group stays closed: no call goes through a half-formed group
        comms[0].all_reduce(torch.ones(4))
    # Both ranks at the next retry: the group is back.
    run_in_threads(lambda r: comms[r].recover_from_fault("retry-2", 10.0))
    assert all(torch.equal(y, torch.full((4,), 2.0)) for y in run_in_threads(lambda r: comms[r].all_reduce(torch.ones(4))))
    run_in_threads(lambda r: comms[r].destroy())
