"""Generated matmul on the current torch stream: pick a spec, compile once, launch.

The spec comes from the tuners' store (`runtime.autotune.stored_winner`), from tuning on
first use (HOSTIR_ENABLE=autotune), or from the heuristics; compiling and launching a
given spec is `runtime.matmul_kernel`, the layer the tuner times candidates through.

Example:
    >>> a = torch.randn(1024, 50304, device="cuda", dtype=torch.bfloat16)   # doctest: +SKIP
    >>> b = torch.randn(2048, 50304, device="cuda", dtype=torch.bfloat16)   # doctest: +SKIP
    >>> c = matmul(a, b, layout="TN")     # == a @ b.T, one launch (serial split-K)  # doctest: +SKIP
"""

from __future__ import annotations

import torch

from hostir.options import options
from lowering.kernels import heuristics
from lowering.kernels.matmul import MatmulSpec
from runtime import autotune
# the kernel layer's names, importable from here as before
from runtime.matmul_kernel import (DTYPE_TORCH, TORCH_DTYPES, LoadedMatmul, Problem,  # noqa: F401
                                   fitted, launch, load, matmul_with, operands, problem_of,
                                   sm_count, tuning_arch)

# The default path (mode "auto", no stored winner) runs cuBLAS instead of the heuristics'
# pick where the cost model predicts the pick under this fraction of cuBLAS's throughput
# (`heuristics.predicted_ratio`).
CUBLAS_BELOW = 0.9

_SPECS: dict[tuple, MatmulSpec] = {}
# (problem, mode, device) -> the predicted ratio, for the problems the default path hands
# to cuBLAS.
_CUBLAS: dict[tuple, float] = {}


def cublas_fallback(p: Problem, spec: MatmulSpec, sms: int) -> float | None:
    """The model's predicted ratio (cuBLAS time over `spec`'s) if the default path should
    run problem `p` through cuBLAS instead of `spec`, else None.

    Only where cuBLAS keeps its fast path and does what the kernel would: N a multiple of
    8 (its output rows 16-byte aligned; K always is) and the output in the operands' dtype
    (`torch.mm` writes that; an fp32 output from bf16 operands it does not); and only for
    a wgmma pick: the model's cuBLAS figures are Hopper's, and a caller who turned wgmma
    off (HOSTIR_DISABLE=wgmma) asked for the mma.sync kernels.
    """
    if p.N % 8 or p.out_dtype != p.a_dtype or spec.instr != "wgmma":
        return None
    ratio = heuristics.predicted_ratio(spec, p.M, p.N, p.K, sms)
    return ratio if ratio < CUBLAS_BELOW else None


def choose_spec(p: Problem, mode: str = "auto", device=None) -> MatmulSpec:
    """Autotuned winner if one is stored (and mode allows), else the heuristics' choice.

    In mode "auto" the heuristics' choice may come with a cuBLAS fallback
    (`cublas_fallback`, looked up by `uses_cublas`): `matmul` then runs cuBLAS.
    """
    key = (p, mode, device)
    spec = _SPECS.get(key)
    if spec is None:
        _CUBLAS.pop(key, None)
        spec = autotune.stored_winner(p, device) if mode == "auto" else None
        if spec is None and mode == "auto" and options().enable("autotune"):
            spec = autotune.tune(p, device=device)
        if spec is None:
            sms = sm_count(device)
            spec = heuristics.choose(p.M, p.N, p.K, a_dtype=p.a_dtype, out_dtype=p.out_dtype,
                                     layout=p.layout, bias=p.bias, sm_count=sms,
                                     mode=mode, arch=tuning_arch(device))
            ratio = cublas_fallback(p, spec, sms) if mode == "auto" else None
            if ratio is not None:
                _CUBLAS[key] = ratio
        _SPECS[key] = spec
    return spec


def uses_cublas(p: Problem, mode: str = "auto", device=None) -> float | None:
    """The predicted ratio if `matmul` (no spec given) runs problem `p` through cuBLAS,
    else None (it runs `choose_spec`'s kernel)."""
    choose_spec(p, mode, device)
    return _CUBLAS.get((p, mode, device))


def prepare(M: int, N: int, K: int, *, dtype=torch.bfloat16, out_dtype=None, layout="TN",
            bias: bool = False, mode: str = "auto", spec: MatmulSpec | None = None,
            device=None) -> MatmulSpec:
    """Choose, compile and load ahead of time, so that the first `matmul` only launches."""
    out_name = TORCH_DTYPES[out_dtype or dtype]
    p = Problem(M, N, K, TORCH_DTYPES[dtype], out_name, layout, bias)
    spec = spec or choose_spec(p, mode, device)
    load(spec, None if device is None else torch.device(device).index)
    return spec


def matmul(a: torch.Tensor, b: torch.Tensor, *, layout: str = "TN",
           out: torch.Tensor | None = None, bias: torch.Tensor | None = None,
           spec: MatmulSpec | None = None, mode: str = "auto",
           out_dtype: torch.dtype | None = None, cublas: bool = True) -> torch.Tensor:
    """C = A @ B^T (layout "TN", B is [N, K]) or A @ B ("NN", B is [K, N]) plus bias.

    mode: "auto" (stored autotune winner or heuristics; cuBLAS where the model predicts
    the heuristics' pick loses, `uses_cublas`), "none", "serial", "parallel", "cluster"
    (Hopper: a tile's K-slices summed in a thread-block cluster), "tail" (Hopper: the
    persistent grid's last round split, see docs/KERNELS.md). A given `spec`, or
    ``cublas=False``, always runs the generated kernel.
    Launches on the current torch stream; serial split-K is one launch and takes its
    semaphores from the zeroed arena of (device, current stream); cluster split-K is one
    launch and takes nothing from the arena.
    """
    p, out = operands(a, b, layout, out, bias, out_dtype)
    if spec is None:
        spec = choose_spec(p, mode, a.device.index)
        if cublas and (p, mode, a.device.index) in _CUBLAS:
            bt = b.t() if layout == "TN" else b
            if bias is None:
                return torch.mm(a, bt, out=out)
            return torch.addmm(bias, a, bt, out=out)
    else:
        spec = fitted(spec, p)
    launch(spec, a, b, out, bias, p.M, p.N, p.K)
    return out
