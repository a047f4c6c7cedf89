"""The pointwise seams of a transformer block: residual add + norm, SwiGLU, GELU.

Each op has an explicit forward and backward, so an autograd node or a host program can
save exactly what the backward needs (rstd and mean, not the normalized activations).

    >>> y, h, mean, rstd = add_norm_forward(x, residual, weight, None, 1e-6, "rms_norm")
    >>> dx, dw, db = add_norm_backward(dy, h, weight, mean, rstd, "rms_norm")
    >>> a = swiglu_forward(gate, up); dgate, dup = swiglu_backward(da, gate, up)

The contract, for every implementation of these functions:
- ``add_norm_forward(x, residual, weight, bias, eps, kind)``: ``h = x + residual`` (``h = x``
  when ``residual`` is None), ``y = norm(h) * weight (+ bias)``. Returns ``(y, h, mean,
  rstd)``; ``mean`` is None for ``rms_norm``; ``mean`` and ``rstd`` are float32 ``[rows]``.
  ``h`` is the new residual stream, in the input dtype.
- ``add_norm_backward(dy, h, weight, mean, rstd, kind, dh=None)``: the gradient with respect
  to ``h`` (so to both ``x`` and ``residual``), plus ``dh`` when the residual stream itself
  receives a gradient from later; and the weight (and bias) gradients reduced over rows,
  in float32 accumulations returned in the weight's dtype. Returns ``(dx, dweight, dbias)``;
  ``dbias`` is None for ``rms_norm``.
- ``swiglu_forward(gate, up) = silu(gate) * up``; ``swiglu_backward(da, gate, up) -> (dgate, dup)``.
- ``gelu_forward(x)`` is the tanh approximation; ``gelu_backward(dy, x) -> dx``.

This module is the reference path (plain torch, any device and dtype, float32 math); on
CUDA with fp16/bf16 the generated fused kernels take over where they exist.
"""

from __future__ import annotations

import torch

NORM_KINDS = ("rms_norm", "layer_norm")


def _check_kind(kind: str) -> None:
    if kind not in NORM_KINDS:
        raise ValueError(f"norm kind {kind!r}: expected one of {', '.join(NORM_KINDS)}")


def add_norm_forward(x, residual, weight, bias, eps: float, kind: str):
    _check_kind(kind)
    h = x if residual is None else x + residual
    hf = h.float()
    if kind == "rms_norm":
        mean = None
        rstd = torch.rsqrt(hf.pow(2).mean(-1) + eps)
        normed = hf * rstd.unsqueeze(-1)
    else:
        mean = hf.mean(-1)
        centered = hf - mean.unsqueeze(-1)
        rstd = torch.rsqrt(centered.pow(2).mean(-1) + eps)
        normed = centered * rstd.unsqueeze(-1)
    y = normed * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype), h, mean, rstd


def add_norm_backward(dy, h, weight, mean, rstd, kind: str, dh=None):
    _check_kind(kind)
    hf, dyf, w = h.float(), dy.float(), weight.float()
    r = rstd.unsqueeze(-1)
    centered = hf if kind == "rms_norm" else hf - mean.unsqueeze(-1)
    normed = centered * r
    g = dyf * w
    width = h.shape[-1]
    if kind == "rms_norm":
        dx = r * (g - normed * (g * normed).sum(-1, keepdim=True) / width)
        dbias = None
    else:
        dx = r * (g - g.mean(-1, keepdim=True) - normed * (g * normed).mean(-1, keepdim=True))
        dbias = dyf.reshape(-1, width).sum(0).to(weight.dtype)
    if dh is not None:
        dx = dx + dh.float()
    dweight = (dyf * normed).reshape(-1, width).sum(0).to(weight.dtype)
    return dx.to(h.dtype), dweight, dbias


def swiglu_forward(gate, up):
    return (torch.nn.functional.silu(gate.float()) * up.float()).to(gate.dtype)


def swiglu_backward(da, gate, up):
    g, u, d = gate.float(), up.float(), da.float()
    sig = torch.sigmoid(g)
    silu = g * sig
    dgate = d * u * sig * (1 + g * (1 - sig))
    dup = d * silu
    return dgate.to(gate.dtype), dup.to(up.dtype)


def gelu_forward(x):
    return torch.nn.functional.gelu(x.float(), approximate="tanh").to(x.dtype)


def gelu_backward(dy, x):
    return torch.ops.aten.gelu_backward(dy.float(), x.float(), approximate="tanh").to(x.dtype)
