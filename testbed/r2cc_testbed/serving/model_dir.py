"""The tiny test model in a temporary folder, removed afterwards (demo, serve-bench)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
from typing import Iterator

from r2cc_serve.errors import UserError

MAKE_TIMEOUT_S = 300.0


@contextlib.contextmanager
def temp_model(dtype: str = "float32", seed: int = 0) -> Iterator[str]:
    """`r2cc model make` into a fresh temp dir (a child process: torch/transformers stay out of ours)."""
    parent = tempfile.mkdtemp(prefix="r2cc-serve-model-")
    out = f"{parent}/tiny-{dtype}"
    try:
        print(f"[model] making the tiny {dtype} model in {out}", file=sys.stderr, flush=True)
        try:
            proc = subprocess.run([sys.executable, "-m", "r2cc_serve.cli", "model", "make", out, "--dtype", dtype,
                                   "--seed", str(seed)], capture_output=True, text=True, timeout=MAKE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise UserError(f"`r2cc model make` did not finish within {MAKE_TIMEOUT_S:.0f} s") from None
        if proc.returncode != 0:
            raise UserError(f"`r2cc model make {out}` failed: {(proc.stderr or proc.stdout).strip()[-500:]}")
        yield out
    finally:
        shutil.rmtree(parent, ignore_errors=True)
