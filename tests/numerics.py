"""Shared numerics of the tests: the relative error against a reference."""

import torch


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error of ``got`` against ``ref``, both taken in float64."""
    got, ref = got.detach().double(), ref.detach().double()
    return float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref))
