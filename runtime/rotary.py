"""Rotary position embedding of a fused QKV output: one generated kernel each way on CUDA
(bf16/fp16), torch otherwise (fp32, CPU, or CuPy missing).

    >>> q, k, v = rotary_forward(qkv, cos, sin, hq, hkv)           # doctest: +SKIP
    >>> d_qkv = rotary_backward(dq, dk, dv, cos, sin, hq, hkv)     # doctest: +SKIP

``qkv [T, (hq + 2 hkv) d]``; ``cos, sin [T, d]`` (or ``[T, 1, d]``); ``q [T, hq, d]``,
``k, v [T, hkv, d]``, new contiguous tensors. See `lowering.kernels.rotary`.
"""

from __future__ import annotations

import numpy as np
import torch

from lowering.kernels.rotary import THREADS, RotarySpec, render, vector_width
from runtime import fused


def _rotate_half(t):
    half = t.shape[-1] // 2
    return torch.cat((-t[..., half:], t[..., :half]), -1)


def _unrotate_half(t):  # the transpose of _rotate_half
    half = t.shape[-1] // 2
    return torch.cat((t[..., half:], -t[..., :half]), -1)


def rotary_forward_reference(qkv, cos, sin, hq: int, hkv: int):
    t = qkv.shape[0]
    d = qkv.shape[1] // (hq + 2 * hkv)
    cos, sin = cos.reshape(t, 1, d), sin.reshape(t, 1, d)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=1)
    q, k, v = q.reshape(t, hq, d), k.reshape(t, hkv, d), v.reshape(t, hkv, d)
    return (q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin,
            v.contiguous())


def rotary_backward_reference(dq, dk, dv, cos, sin, hq: int, hkv: int):
    t, _, d = dq.shape
    cos, sin = cos.reshape(t, 1, d), sin.reshape(t, 1, d)
    back = [g * cos + _unrotate_half(g * sin) for g in (dq, dk)]
    return torch.cat([back[0].reshape(t, -1), back[1].reshape(t, -1), dv.reshape(t, -1)], 1)


def _kernel_path(*tensors) -> bool:
    first = tensors[0]
    if not (first.is_cuda and first.dtype in fused._KERNEL_DTYPES):
        return False
    dtype, index = first.dtype, first.get_device()
    for t in tensors:
        if t.dtype != dtype or not t.is_cuda or t.get_device() != index:
            return False
    return fused._jit_available()


def _record(dtype, head_dim: int, alignment: int, index: int, backward: bool):
    """The launch record of one rotary kernel (`runtime.fused._record`): one thread an item
    (``vector`` values of a rotated pair's halves, or of v), up to 2048 threads an SM."""
    spec = RotarySpec(fused._KERNEL_DTYPES[dtype], head_dim, vector_width(head_dim, alignment),
                      backward)
    return fused._Launch(spec, index, fused._kernel(spec, index, render), (THREADS, 1, 1), 0,
                         False, THREADS, fused._sm_count(index) * (2048 // THREADS),
                         vector=spec.vector)


def _launch(backward: bool, fused_t, split, cos, sin, hq: int, hkv: int) -> None:
    """One rotary kernel through the seam kernels' launch records and launcher
    (`runtime.fused`); the alignment also divides the fused tensor's row pitch."""
    t = fused_t.shape[0]
    heads = hq + 2 * hkv
    d = fused_t.shape[1] // heads
    pitch = fused_t.stride(0)
    p = [x.data_ptr() for x in (fused_t, *split, cos, sin)]
    align = fused._alignment_of(p[0] | p[1] | p[2] | p[3] | p[4] | p[5] | 2 * pitch)
    record = fused._record((_record, fused_t.dtype, d, align, fused_t.get_device(), backward))
    args = (*map(np.uint64, p), np.int64(t), np.int32(hq), np.int32(hkv), np.int64(pitch))
    fused._launch((record, record.grid(t * heads * (d // 2 // record.vector)), args))


def _tables(cos, sin, t: int, d: int):
    """``cos, sin`` as contiguous ``[t, d]`` tables (themselves where they already are)."""
    if cos.shape == (t, d) and sin.shape == (t, d) and cos.is_contiguous() and sin.is_contiguous():
        return cos, sin
    return cos.reshape(t, d).contiguous(), sin.reshape(t, d).contiguous()


def rotary_forward(qkv, cos, sin, hq: int, hkv: int):
    """``(q, k, v)`` of ``qkv``: q and k rotated by position, v copied."""
    t = qkv.shape[0]
    d = qkv.shape[1] // (hq + 2 * hkv)
    if not (_kernel_path(qkv, cos, sin) and qkv.stride(1) == 1 and t > 0):
        return rotary_forward_reference(qkv, cos, sin, hq, hkv)
    cos, sin = _tables(cos, sin, t, d)
    out = tuple(torch.empty(t, h, d, dtype=qkv.dtype, device=qkv.device) for h in (hq, hkv, hkv))
    _launch(False, qkv, out, cos, sin, hq, hkv)
    return out


def rotary_backward(dq, dk, dv, cos, sin, hq: int, hkv: int):
    """``d_qkv [T, (hq + 2 hkv) d]`` from the gradients of ``rotary_forward``'s outputs."""
    t, _, d = dq.shape
    if not (_kernel_path(dq, dk, dv, cos, sin) and t > 0):
        return rotary_backward_reference(dq, dk, dv, cos, sin, hq, hkv)
    cos, sin = _tables(cos, sin, t, d)
    grads = tuple(g.contiguous() for g in (dq, dk, dv))
    d_qkv = torch.empty(t, (hq + 2 * hkv) * d, dtype=dq.dtype, device=dq.device)
    _launch(True, d_qkv, grads, cos, sin, hq, hkv)
    return d_qkv
