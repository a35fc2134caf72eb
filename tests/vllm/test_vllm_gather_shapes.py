"""Shapes of the vLLM communicator's gathered results (pure tensor logic, no vLLM needed)."""

import pytest
import torch

vc = pytest.importorskip("r2cc_serve.vllm.communicator")


def test_zero_dim_gathers_to_a_vector():
    got = vc._concat_gathered(torch.tensor([1.0, 2.0]).reshape(2), torch.tensor(5.0), -1)
    assert got.shape == (2,) and got.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather_matches_torch_cat(dim):
    parts = [torch.arange(6.0).reshape(2, 3) + 10 * r for r in range(3)]
    got = vc._concat_gathered(torch.stack(parts), parts[0], dim)
    assert torch.equal(got, torch.cat(parts, dim=dim))
