"""The tiny serving model: deterministic bytes per seed, and loadable offline by transformers."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a hub, even by accident
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

try:  # transformers can fail with non-ImportErrors (e.g. a broken torchvision it imports)
    import torch
    import transformers
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"transformers/torch import failed: {exc!r}", allow_module_level=True)

from r2cc_serve.errors import UserError
from r2cc_testbed.model import make_model
from r2cc_testbed.model import cli as model_cli
from r2cc_testbed.model.tiny_llama import VOCAB


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("m") / "seed0", seed=0, log=lambda _: None)


def test_same_seed_gives_identical_bytes(model_dir, tmp_path):
    again = make_model(tmp_path / "again", seed=0, log=lambda _: None)
    a, b = _files(model_dir), _files(again)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(a)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name] == b[name], f"{name} differs between two runs with the same seed"


def test_other_seed_changes_weights_only(model_dir, tmp_path):
    other = _files(make_model(tmp_path / "seed1", seed=1, log=lambda _: None))
    base = _files(model_dir)
    assert other["model.safetensors"] != base["model.safetensors"]
    assert other["tokenizer.json"] == base["tokenizer.json"]  # tokenizer does not depend on the seed


def test_loads_offline_and_generates(model_dir):
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    assert len(tok) == VOCAB == model.config.vocab_size
    text = "The quick brown fox jumps over the lazy dog."
    ids = tok(text, return_tensors="pt").input_ids
    assert tok.decode(ids[0]) == text  # byte-level BPE round-trips exactly
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert ids.shape[1] < out.shape[1] <= ids.shape[1] + 5  # eos may stop it early
    with torch.no_grad():
        again = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert torch.equal(out, again)  # greedy is deterministic


def _run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="r2cc")
    model_cli.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_make_and_user_errors(tmp_path, capsys):
    assert _run_cli(["model", "make", str(tmp_path / "m"), "--seed", "3"]) == 0
    assert "wrote" in capsys.readouterr().out  # progress is printed
    assert _run_cli(["model", "make", str(tmp_path / "m"), "--seed", "3"]) == 0  # remaking our own folder is fine
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match="not empty"):
        _run_cli(["model", "make", str(foreign)])
    with pytest.raises(UserError, match="seed"):
        _run_cli(["model", "make", str(tmp_path / "n"), "--seed", "-1"])
