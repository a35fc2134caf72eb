"""Tiny test model for serving: `make_model(dir, seed)` (torch/transformers load on first call)."""

from __future__ import annotations


def make_model(dir, seed: int = 0, **kwargs):
    from r2cc_testbed.model.tiny_llama import make_model as _make

    return _make(dir, seed=seed, **kwargs)


__all__ = ["make_model"]
