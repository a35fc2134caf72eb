"""r2cc refuses vLLM's Ray executor at start, saying why (plugin.executor_refusal) and before any
engine or worker starts (compat.refuse_engine_config). No vLLM import: fakes stand in for
EngineArgs, ParallelConfig and the platform; tests/e2e/test_k_ray.py runs the real `vllm serve`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from r2cc_serve.errors import UserError
from r2cc_serve.vllm import compat, plugin


@pytest.fixture
def cpu(monkeypatch):
    """The CPU platform of the pinned vLLM: no Ray device key."""
    monkeypatch.setattr(compat, "current_platform", lambda: SimpleNamespace(device_name="cpu", ray_device_key=""))


def _args(executor):
    return SimpleNamespace(distributed_executor_backend=executor)


class _RayExecutorClass:
    uses_ray = True


@pytest.mark.parametrize("executor", ["ray", _RayExecutorClass])
def test_r2cc_under_ray_is_refused_naming_why_and_what_to_do(monkeypatch, cpu, executor):
    monkeypatch.setenv("R2CC_DISTRIBUTED_BACKEND", "r2cc")
    why = plugin.executor_refusal(_args(executor), None)
    assert why is not None
    assert "Ray executor" in why and "--distributed-executor-backend ray" in why
    assert "cpu platform cannot run its Ray executor at all" in why  # the first reason, on CPU
    assert "node rank 0" in why                                      # the reason that holds anywhere
    assert "--nnodes N --node-rank R --master-addr" in why and "docs/deploy.md" in why


def test_where_vllm_can_run_ray_only_the_node_rank_reason_is_given(monkeypatch):
    monkeypatch.setenv("R2CC_DISTRIBUTED_BACKEND", "r2cc")
    monkeypatch.setattr(compat, "current_platform", lambda: SimpleNamespace(device_name="cuda", ray_device_key="GPU"))
    why = plugin.executor_refusal(_args("ray"), None)
    assert "node rank 0" in why and "cannot run its Ray executor" not in why


@pytest.mark.parametrize("executor", [None, "mp", "uni", "external_launcher", object])
def test_other_executors_pass(monkeypatch, cpu, executor):
    monkeypatch.setenv("R2CC_DISTRIBUTED_BACKEND", "r2cc")
    assert plugin.executor_refusal(_args(executor), None) is None
    assert plugin.executor_refusal(_args(None), SimpleNamespace(distributed_executor_backend=executor)) is None


def test_without_r2cc_ray_is_vllm_s_business(monkeypatch, cpu):
    monkeypatch.delenv("R2CC_DISTRIBUTED_BACKEND", raising=False)
    assert plugin.executor_refusal(_args("ray"), None) is None


def test_ray_that_vllm_chose_itself_is_refused_too(monkeypatch, cpu):
    """No flag, but vLLM resolves Ray (e.g. started inside a Ray placement group)."""
    monkeypatch.setenv("R2CC_DISTRIBUTED_BACKEND", "r2cc")
    assert plugin.executor_refusal(_args(None), SimpleNamespace(distributed_executor_backend="ray"))


class _FakeEngineArgs:
    built = 0

    def __init__(self, executor, resolved):
        self.distributed_executor_backend, self.resolved = executor, resolved

    def create_engine_config(self):
        type(self).built += 1
        return SimpleNamespace(parallel_config=SimpleNamespace(distributed_executor_backend=self.resolved))


@pytest.fixture
def fake_engine_args(monkeypatch, cpu):
    cls = type("EngineArgs", (_FakeEngineArgs,), {"built": 0})
    monkeypatch.setattr(compat, "engine_args_cls", lambda: cls)
    monkeypatch.setenv("R2CC_DISTRIBUTED_BACKEND", "r2cc")
    compat.refuse_engine_config(plugin.executor_refusal)
    return cls


def test_the_flag_is_refused_before_vllm_builds_anything(fake_engine_args):
    with pytest.raises(UserError, match="does not run under vLLM's Ray executor"):
        fake_engine_args("ray", "ray").create_engine_config()
    assert fake_engine_args.built == 0  # vLLM's own checks (e.g. "Failed to import Ray") never ran


def test_a_resolved_ray_executor_is_refused_after_the_build(fake_engine_args):
    with pytest.raises(UserError, match="Ray executor"):
        fake_engine_args(None, "ray").create_engine_config()
    assert fake_engine_args.built == 1


def test_mp_passes_and_wrapping_twice_wraps_once_keeping_other_flags(fake_engine_args):
    fake_engine_args.create_engine_config._r2cc_wrapped = True  # as update_additional_config leaves it
    once = fake_engine_args.create_engine_config
    assert getattr(once, "_r2cc_refuse_wrapped", False)
    compat.refuse_engine_config(plugin.executor_refusal)
    assert fake_engine_args.create_engine_config is once
    config = fake_engine_args("mp", "mp").create_engine_config()
    assert config.parallel_config.distributed_executor_backend == "mp"


def test_the_refusal_keeps_the_flags_of_wrappers_inside_it(monkeypatch, cpu):
    def original(self):
        return None

    original._r2cc_wrapped = original._r2cc_ft_wrapped = True
    cls = type("EngineArgs", (), {"create_engine_config": original})
    monkeypatch.setattr(compat, "engine_args_cls", lambda: cls)
    compat.refuse_engine_config(plugin.executor_refusal)
    outer = cls.create_engine_config
    assert outer is not original
    assert outer._r2cc_wrapped and outer._r2cc_ft_wrapped and outer._r2cc_refuse_wrapped
