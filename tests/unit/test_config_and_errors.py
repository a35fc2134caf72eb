"""Knob registry, rail resolution and user-facing errors (no network needed)."""

import subprocess
import sys

import pytest
import torch

from r2cc_serve import envs
from r2cc_serve.errors import UserError
from r2cc_serve.comm.rail_names import resolve_rails


def test_knobs_have_defaults_and_parse(monkeypatch):
    assert envs.get("R2CC_CHUNK_BYTES") == 1024 * 1024
    monkeypatch.setenv("R2CC_RAIL_TIMEOUT_MS", "75")
    assert envs.get("R2CC_RAIL_TIMEOUT_MS") == 75
    monkeypatch.setenv("R2CC_RAIL_TIMEOUT_MS", "fast")
    with pytest.raises(ValueError, match="R2CC_RAIL_TIMEOUT_MS"):
        envs.get("R2CC_RAIL_TIMEOUT_MS")
    with pytest.raises(KeyError, match="declare it"):
        envs.get("R2CC_NO_SUCH_THING")


def test_rails_resolve_addresses_and_interfaces():
    assert resolve_rails(["127.0.0.1", "127.0.0.2"], None) == ["127.0.0.1", "127.0.0.2"]
    assert resolve_rails(["lo"], None) == ["127.0.0.1"]
    with pytest.raises(UserError, match="no interface"):
        resolve_rails(["nosuchif0"], None)
    with pytest.raises(UserError, match="distinct"):
        resolve_rails(["127.0.0.1", "lo"], None)


def test_bad_communicator_arguments_are_user_errors():
    from r2cc_serve import Communicator

    with pytest.raises(UserError, match="outside world size"):
        Communicator(3, 2, store=None, rails=["127.0.0.1"])
    with pytest.raises(UserError, match="at least one rail"):
        Communicator(0, 2, store=None, rails=[])


def test_unsupported_tensor_is_a_user_error():
    from r2cc_serve.comm.tensors import contiguous as _contiguous, dtype_of as _dtype, op_of as _op

    with pytest.raises(UserError, match="not supported"):
        _dtype(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(UserError, match="reduce op"):
        _op("avg")
    with pytest.raises(UserError, match="torch.Tensor"):
        _contiguous([1, 2])


def test_cli_knobs_lists_every_setting_and_unknown_command_fails_cleanly():
    out = subprocess.run([sys.executable, "-m", "r2cc_serve.cli", "knobs"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert all(k.name in out.stdout for k in envs.all_knobs())
    assert f" {envs.get('R2CC_STATUS_DIR')} " in out.stdout  # a default worked out, shown as a value
    bad = subprocess.run([sys.executable, "-m", "r2cc_serve.cli", "nonsense"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_transport_options_have_one_source():
    """csrc/transport.h's option list, the knob registry and the stub cannot drift apart: every
    field but fallback_rails (set from the rail config) has one knob with the same default."""
    import ast
    import pathlib

    from r2cc_serve import _C, envs

    fields = list(_C.TransportOptions.FIELDS)
    by_field = {k.transport: k for k in envs.transport_knobs()}
    assert sorted(by_field) == sorted(f for f in fields if f != "fallback_rails")
    defaults = _C.TransportOptions()
    for field, knob in by_field.items():
        assert getattr(defaults, field) == knob.default, (field, knob.name)
    stub = ast.parse(pathlib.Path(_C.__file__).with_name("_C.pyi").read_text())
    cls = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "TransportOptions")
    assert [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and n.target.id != "FIELDS"] == fields


def test_cli_version_names_the_package_the_core_and_the_pinned_vllm():
    from importlib import metadata

    import r2cc_serve
    from r2cc_serve import _C, pins

    out = subprocess.run([sys.executable, "-m", "r2cc_serve.cli", "--version"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and not out.stderr, out.stderr
    try:
        version = metadata.version("r2cc-serve")
    except metadata.PackageNotFoundError:
        version = r2cc_serve.__version__
    lines = out.stdout.splitlines()
    assert lines[0] == f"r2cc-serve {version}"
    assert lines[1].startswith(f"C++ core: wire protocol {_C.PROTOCOL_VERSION}, built for ")
    assert lines[2].startswith(f"vLLM: integrates with {pins.VLLM_VERSION} (")


def test_version_without_installed_metadata_falls_back_to_the_package(monkeypatch):
    from importlib import metadata

    import r2cc_serve
    from r2cc_serve.cli import version_text

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    text = version_text()
    assert text.startswith(f"r2cc-serve {r2cc_serve.__version__}\n") and text.endswith("(not installed)")
