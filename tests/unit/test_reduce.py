"""The C++ reduction kernels against torch, element by element, bit for bit."""

import pytest
import torch

from r2cc_serve import _C
from tests.comm.workers import bits_equal, make_input, reference_reduce

DT = {torch.float32: _C.DType.f32, torch.float16: _C.DType.f16, torch.bfloat16: _C.DType.bf16,
      torch.int32: _C.DType.i32, torch.int64: _C.DType.i64}


@pytest.mark.parametrize("dtype", list(DT))
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("n_inputs", [1, 2, 3, 4, 5, 8, 9, 17])  # one-pass kernels up to 8, tiles above
def test_reduce_matches_rank_order_reference(dtype, op, n_inputs):
    for n in (0, 1, 2047, 2048, 2049, 100003):
        inputs = [make_input(r, n, dtype) for r in range(n_inputs)]
        out = torch.empty(n, dtype=dtype)
        _C.reduce_in_order(DT[dtype], getattr(_C.RedOp, op), out.data_ptr(), [t.data_ptr() for t in inputs], n)
        assert bits_equal(out, reference_reduce(inputs, op)), (dtype, op, n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_inputs", [2, 4, 9])
def test_reduce_may_write_over_any_input(dtype, n_inputs):
    for into in sorted({0, n_inputs // 2, n_inputs - 1}):  # in place: out is the input of rank `into`
        inputs = [make_input(r, 5000, dtype) for r in range(n_inputs)]
        want = reference_reduce(inputs, "sum")
        _C.reduce_in_order(DT[dtype], _C.RedOp.sum, inputs[into].data_ptr(), [t.data_ptr() for t in inputs], 5000)
        assert bits_equal(inputs[into], want), (n_inputs, into)


def test_bf16_rounds_to_nearest_even_like_torch():
    # Values whose fp32 sum sits exactly between two bf16 numbers.
    a = torch.tensor([1.0, 1.0, -3.0, 65504.0], dtype=torch.bfloat16)
    b = torch.tensor([2 ** -8, 3 * 2 ** -8, 2 ** -7, 8.0], dtype=torch.bfloat16)
    out = torch.empty_like(a)
    _C.reduce_in_order(_C.DType.bf16, _C.RedOp.sum, out.data_ptr(), [a.data_ptr(), b.data_ptr()], 4)
    assert bits_equal(out, (a.float() + b.float()).to(torch.bfloat16))
