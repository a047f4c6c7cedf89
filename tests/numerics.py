"""Shared numerics of the tests: the relative error against a reference, and the reference
Llama block the transformer tests compare with."""

import torch


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error of ``got`` against ``ref``, both taken in float64."""
    got, ref = got.detach().double(), ref.detach().double()
    return float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref))


def reference_block(hidden: int, heads: int, kv_heads: int, ffn: int, style: str = "llama",
                    seed: int = 0, dtype: torch.dtype = torch.float32):
    """A plain `LlamaBlock` from ``seed``, its norms' weights and its biases drawn from
    [0.5, 1.5) (away from their initial ones and zeros, so a dropped one shows), in
    ``dtype``."""
    from hostir.nn import LlamaBlock

    torch.manual_seed(seed)
    block = LlamaBlock(hidden, heads, kv_heads, ffn, style=style)
    with torch.no_grad():
        for name, p in block.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.uniform_(0.5, 1.5)
    return block.to(dtype)
