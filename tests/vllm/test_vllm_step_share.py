"""step_share: the accounting of steps and the collectives inside them, on fake collectives, fake
workers and fake clocks (no vLLM), wrapped through the same compat functions as vLLM's classes;
and a check, read from the installed vLLM's source, that those classes still have the methods."""

from __future__ import annotations

import ast
import importlib.util
import os
import threading
from types import SimpleNamespace

import pytest

from r2cc_serve.vllm import compat, step_share
from r2cc_serve.vllm.step_share import StepClock, per_step, read_dir, window


class Clocks:
    """Wall, thread CPU and process CPU that move only when a fake says so."""

    def __init__(self):
        self.now = [0.0, 0.0, 0.0]

    def spend(self, wall: float, cpu: float = 0.0, proc: float | None = None) -> None:
        for i, dt in enumerate((wall, cpu, cpu if proc is None else proc)):
            self.now[i] += dt

    def fns(self):
        return tuple((lambda i=i: self.now[i]) for i in range(3))


def _fakes(clocks: Clocks):
    """A GroupCoordinator and a WorkerWrapperBase of our own, each call costing fixed clock time."""

    class Group:
        def all_reduce(self, x):
            clocks.spend(0.002, cpu=0.0005, proc=0.001)  # 2 ms waiting, 0.5 ms of it on this thread
            return x

        def broadcast(self, x, src=0):
            clocks.spend(0.001, cpu=0.001)
            return x

        def broadcast_tensor_dict(self, d):  # a collective made of collectives: counts once
            clocks.spend(0.001, cpu=0.001)
            return {k: self.broadcast(v) for k, v in d.items()}

        def all_gather(self, x, dim=-1):
            clocks.spend(0.003, cpu=0.001)
            return x

    class Worker:
        def __init__(self, group):
            self.group = group

        def sample_tokens(self, grammar_output):
            clocks.spend(0.001, cpu=0.001)  # the sampler's own work
            self.group.all_gather(1)
            return "tokens"

    class Wrapper:
        def __init__(self, group, rank=0):
            self.global_rank = rank
            self.worker = Worker(group)
            self.raise_next = False
            self.tensor_dict = False

        def execute_model(self, scheduler_output):
            clocks.spend(0.010, cpu=0.009)  # the forward pass's own compute
            for _ in range(3):
                self.worker.group.all_reduce(1)
            if self.tensor_dict:
                self.worker.group.broadcast_tensor_dict({"a": 1, "b": 2})
            if self.raise_next:
                raise RuntimeError("the step failed")
            return None if scheduler_output.total_num_scheduled_tokens else "empty output"

        def __getattr__(self, name):  # as vLLM's: sample_tokens is the worker's
            return getattr(self.worker, name)

    return Group, Wrapper


def _scheduled(*tokens_per_request: int):
    return SimpleNamespace(num_scheduled_tokens={f"r{i}": n for i, n in enumerate(tokens_per_request)},
                           total_num_scheduled_tokens=sum(tokens_per_request))


@pytest.fixture
def rig(tmp_path):
    """A StepClock on fake clocks installed on fresh fake classes as install() does on vLLM's."""
    clocks = Clocks()
    Group, Wrapper = _fakes(clocks)
    clock = StepClock(clocks=clocks.fns())

    def kind_of(worker, scheduler_output):
        if clock.path is None:
            clock.rank = compat.worker_rank(worker)
            clock.path = str(tmp_path / f"rank{clock.rank}.json")
        return step_share.step_kind(*compat.step_tokens(scheduler_output))

    compat.time_group_collectives(clock.collective, cls=Group)
    compat.time_worker_steps(lambda fn: clock.step_start(fn, kind_of), clock.step_end, cls=Wrapper)
    group = Group()
    return SimpleNamespace(clocks=clocks, clock=clock, group=group, worker=Wrapper(group), dir=tmp_path)


def _step(rig, *tokens_per_request: int):
    out = rig.worker.execute_model(_scheduled(*tokens_per_request))
    return rig.worker.sample_tokens(None) if out is None else out


def test_a_decode_step_is_execute_model_and_sample_tokens_with_the_collectives_inside(rig):
    for _ in range(4):
        assert _step(rig, 1, 1, 1) == "tokens"
    t = rig.clock.totals["decode"]
    assert t["steps"] == 4 and t["calls"] == 4 * 4
    assert t["ops"] == {"all_reduce": 12, "all_gather": 4}
    # per step: 3 x 2 ms all_reduce + 3 ms all_gather inside 10 + 6 + 1 + 3 = 20 ms
    s = per_step(t)
    assert s["coll_s_per_step"] == pytest.approx(0.009) and s["step_s"] == pytest.approx(0.020)
    assert s["wall_share"] == pytest.approx(0.45) and s["calls_per_step"] == 4
    # thread CPU: 3 x 0.5 + 1 inside collectives, of 9 + 1.5 + 1 + 1 in the step
    assert s["cpu_share"] == pytest.approx(2.5 / 12.5, abs=1e-4)  # shares are rounded to 4 digits
    # process CPU (helper threads too): 3 x 1 + 1 of 9 + 3 + 1 + 1
    assert s["proc_cpu_share"] == pytest.approx(4 / 14, abs=1e-4)
    assert s["coll_proc_cpu_s_per_step"] == pytest.approx(0.004) and s["step_proc_cpu_s"] == pytest.approx(0.014)
    assert s["ops_per_step"] == {"all_gather": 1.0, "all_reduce": 3.0}
    assert rig.clock.totals["prefill"]["steps"] == 0


def test_steps_with_a_prompt_chunk_are_kept_apart(rig):
    _step(rig, 1, 1)
    _step(rig, 17, 1)  # a new request's prompt beside a decode
    _step(rig, 5)
    assert rig.clock.totals["decode"]["steps"] == 1 and rig.clock.totals["prefill"]["steps"] == 2


def test_only_collectives_inside_a_step_on_its_thread_count_and_nested_ones_once(rig):
    rig.group.all_reduce(1)  # start-up, profiling, an admin RPC: outside any step
    rig.worker.tensor_dict = True
    _step(rig, 1)
    t = rig.clock.totals["decode"]
    assert t["ops"] == {"all_reduce": 3, "broadcast_tensor_dict": 1, "all_gather": 1}  # not its 2 broadcasts
    assert t["coll_wall_s"] == pytest.approx(3 * 0.002 + 0.003 + 0.003)

    def from_another_thread():
        rig.group.all_reduce(1)

    original = rig.worker.worker.sample_tokens

    def sample_with_a_thread(grammar_output):
        th = threading.Thread(target=from_another_thread)
        th.start()
        th.join()
        return original(grammar_output)

    rig.worker.tensor_dict = False
    rig.worker.worker.sample_tokens = sample_with_a_thread
    _step(rig, 1)
    assert rig.clock.totals["decode"]["calls"] == 5 + 4  # the other thread's all_reduce is not the step's


def test_a_step_without_sample_tokens_ends_at_execute_model_or_at_the_next_step(rig):
    assert rig.worker.execute_model(_scheduled()) == "empty output"  # nothing scheduled: not a step
    assert rig.clock.totals["decode"]["steps"] == 0 and rig.clock.totals["decode"]["calls"] == 0
    rig.worker.execute_model(_scheduled(1))  # returned None; its sample_tokens never came
    _step(rig, 1)
    t = rig.clock.totals["decode"]
    assert t["steps"] == 2 and t["ops"] == {"all_reduce": 6, "all_gather": 1}


def test_a_step_that_raises_is_not_counted(rig):
    rig.worker.raise_next = True
    with pytest.raises(RuntimeError):
        rig.worker.execute_model(_scheduled(1))
    rig.worker.raise_next = False
    assert rig.worker.sample_tokens(None) == "tokens"  # untimed: no step is open
    _step(rig, 1)
    assert rig.clock.totals["decode"]["steps"] == 1 and rig.clock.totals["decode"]["calls"] == 4


def test_workers_write_their_totals_and_a_window_is_the_steps_between_two_reads(rig):
    _step(rig, 1)  # the first step writes (nothing written yet)
    before = read_dir(str(rig.dir))
    assert list(before) == [0] and before[0]["kinds"]["decode"]["steps"] == 1
    assert before[0]["overhead_per_call_s"] >= 0
    for _ in range(5):
        _step(rig, 1)
    _step(rig, 9)
    rig.clocks.spend(step_share.WRITE_INTERVAL_S)
    _step(rig, 1)  # written: WRITE_INTERVAL_S passed
    after = read_dir(str(rig.dir))
    w = window(before, after)["0"]
    assert w["decode"]["steps"] == 6 and w["all"]["steps"] == 7
    assert w["decode"]["calls_per_step"] == 4 and w["decode"]["ops_per_step"] == {"all_gather": 1.0, "all_reduce": 3.0}
    assert 0 < w["decode"]["wall_share"] < 1 and w["overhead_us_per_call"] is not None
    # a restarted worker (another pid) is read from zero, not against the old process's totals
    assert window({0: {**before[0], "pid": -1}}, after)["0"]["decode"]["steps"] == 7
    assert window({}, {}) == {} and read_dir(None) == {} and read_dir(str(rig.dir / "none")) == {}


def test_no_steps_give_no_figures():
    s = per_step(step_share._zero())
    assert s["steps"] == 0 and s["wall_share"] is None and s["coll_s_per_step"] is None


def test_wrapping_is_done_once_and_keeps_names():
    clocks = Clocks()
    Group, Wrapper = _fakes(clocks)
    clock = StepClock(clocks=clocks.fns())
    compat.time_group_collectives(clock.collective, cls=Group)
    wrapped = Group.all_reduce
    compat.time_group_collectives(clock.collective, cls=Group)
    assert Group.all_reduce is wrapped and Group.all_reduce.__name__ == "all_reduce"


def test_the_clocks_cost_microseconds_per_call():
    """The overhead the worker reports: two reads of each of three clocks and the book-keeping
    (about 5 us here; bounded loosely, the box is shared)."""
    assert 0 <= StepClock().measure_overhead(calls=500) < 100e-6


# --- the pinned vLLM still has what compat wraps (read from its source; vLLM is not imported) -------


def _vllm_class(module: str, cls: str) -> ast.ClassDef:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed; run scripts/install_vllm.sh")
    path = os.path.join(list(spec.submodule_search_locations)[0], *module.split(".")[1:]) + ".py"
    tree = ast.parse(open(path).read(), path)
    found = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls]
    assert found, f"{cls} is not in {path}"
    return found[0]


def _members(node: ast.ClassDef) -> set[str]:
    names = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return names | {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def test_the_pinned_vllm_has_the_methods_that_are_timed():
    group = _members(_vllm_class("vllm.distributed.parallel_state", "GroupCoordinator"))
    assert set(compat.GROUP_COLLECTIVES) <= group, set(compat.GROUP_COLLECTIVES) - group
    wrapper = _members(_vllm_class("vllm.v1.worker.worker_base", "WorkerWrapperBase"))
    assert {"execute_model", "__getattr__"} <= wrapper and "sample_tokens" not in wrapper
    assert {"execute_model", "sample_tokens"} <= _members(_vllm_class("vllm.v1.worker.worker_base", "WorkerBase"))
    out = _members(_vllm_class("vllm.v1.core.sched.output", "SchedulerOutput"))
    assert {"num_scheduled_tokens", "total_num_scheduled_tokens"} <= out
