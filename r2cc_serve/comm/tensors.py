"""Torch tensors as the C++ core takes them: CPU, contiguous, a supported dtype and reduce op."""

from __future__ import annotations

import torch

from r2cc_serve import _C
from r2cc_serve.errors import UserError

_DTYPES = {
    torch.float32: _C.DType.f32,
    torch.float16: _C.DType.f16,
    torch.bfloat16: _C.DType.bf16,
    torch.int32: _C.DType.i32,
    torch.int64: _C.DType.i64,
}
_OPS = {"sum": _C.RedOp.sum, "max": _C.RedOp.max, "min": _C.RedOp.min}


def contiguous(t: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise UserError(f"expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise UserError(f"r2cc works on CPU tensors; got one on {t.device}")
    return t if t.is_contiguous() else t.contiguous()


def dtype_of(t: torch.Tensor):
    try:
        return _DTYPES[t.dtype]
    except KeyError:
        raise UserError(f"dtype {t.dtype} is not supported; use one of "
                        f"{', '.join(str(d) for d in _DTYPES)}") from None


def op_of(op: str):
    try:
        return _OPS[op]
    except KeyError:
        raise UserError(f"reduce op {op!r} is not supported; use one of {', '.join(_OPS)}") from None


def check_out(out: torch.Tensor, numel: int, dtype) -> None:
    if out.numel() != numel or out.dtype != dtype or not out.is_contiguous():
        raise UserError(f"out must be a contiguous {dtype} tensor of {numel} elements")
