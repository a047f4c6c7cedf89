"""The generated matmul kernel of a given spec: check operands, compile once, launch.

The layer under `runtime.matmul` (which chooses the spec: stored autotune winner, tuning
on first use, or the heuristics) and `runtime.autotune` (which times candidate specs):
both launch through here, so neither imports the other's layer.

Example:
    >>> spec = MatmulSpec(a_dtype="bf16", b_dtype="bf16", out_dtype="bf16")  # doctest: +SKIP
    >>> c = matmul_with(spec, a, b, layout="TN")                            # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import threading

import numpy as np
import torch

from hostir.options import options
from lowering.kernels.matmul import (MODE_CODE, KernelSource, MatmulSpec, launch_config,
                                     reduce_launch, render, tail_tiles, tiles)
from runtime import jit, tma, workspace

TORCH_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
DTYPE_TORCH = {v: k for k, v in TORCH_DTYPES.items()}


@dataclasses.dataclass(frozen=True, slots=True)
class Problem:
    """The shape and dtypes a spec is chosen for (also the autotuner's key)."""

    M: int
    N: int
    K: int
    a_dtype: str
    out_dtype: str
    layout: str
    bias: bool


@dataclasses.dataclass
class LoadedMatmul:
    source: KernelSource
    main: jit.Kernel
    reduce: jit.Kernel


_LOADED: dict[tuple, LoadedMatmul] = {}
_LOCK = threading.Lock()


def _dtype_name(t: torch.Tensor, what: str, allowed) -> str:
    name = TORCH_DTYPES.get(t.dtype)
    if name not in allowed:
        raise ValueError(f"matmul: {what} has dtype {t.dtype}; expected one of "
                         f"{[str(DTYPE_TORCH[a]) for a in allowed]}")
    return name


def _check_operand(t: torch.Tensor, what: str, rows: int | None, cols: int | None) -> None:
    if t.dim() != 2:
        raise ValueError(f"matmul: {what} must be 2-D, got shape {tuple(t.shape)}")
    if (rows is not None and t.shape[0] != rows) or (cols is not None and t.shape[1] != cols):
        raise ValueError(f"matmul: {what} has shape {tuple(t.shape)}, expected "
                         f"[{rows if rows is not None else '*'}, {cols if cols is not None else '*'}]")
    if t.stride(1) != 1:
        raise ValueError(f"matmul: {what} must be contiguous along its last axis "
                         f"(stride {t.stride()})")
    if not t.is_cuda:
        raise ValueError(f"matmul: {what} must be a CUDA tensor, got {t.device}")


def _check_aligned(t: torch.Tensor, what: str) -> None:
    # cp.async copies 16 bytes: rows must start on 16-byte boundaries.
    if t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
        raise ValueError(f"matmul: {what} rows must be 16-byte aligned (pointer "
                         f"{t.data_ptr():#x}, row stride {t.stride(0)} elements)")


def problem_of(a: torch.Tensor, b: torch.Tensor, layout: str, out_dtype: str,
               bias: torch.Tensor | None) -> Problem:
    if layout not in ("TN", "NN"):
        raise ValueError(f"matmul: layout must be 'TN' or 'NN', got {layout!r}")
    _check_operand(a, "a", None, None)
    M, K = a.shape
    if layout == "TN":
        _check_operand(b, "b (TN: [N, K])", None, K)
        N = b.shape[0]
    else:
        _check_operand(b, "b (NN: [K, N])", K, None)
        N = b.shape[1]
    a_dtype = _dtype_name(a, "a", ("bf16", "fp16"))
    if TORCH_DTYPES.get(b.dtype) != a_dtype:
        raise ValueError(f"matmul: b has dtype {b.dtype}, expected {a.dtype} like a")
    _check_aligned(a, "a")
    _check_aligned(b, "b")
    if bias is not None:
        if bias.shape != (N,) or TORCH_DTYPES.get(bias.dtype) != out_dtype or not bias.is_contiguous():
            raise ValueError(f"matmul: bias must be contiguous [{N}] of {DTYPE_TORCH[out_dtype]}, "
                             f"got {tuple(bias.shape)} {bias.dtype}")
    return Problem(M, N, K, a_dtype, out_dtype, layout, bias is not None)


def sm_count(device: torch.device | int | None = None) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def tuning_arch(device: torch.device | int | None = None) -> str | None:
    """The arch the heuristics and the autotuner choose tiles for: the device's "sm_XY",
    or None (mma.sync tiles only) under HOSTIR_DISABLE=wgmma."""
    return None if options().disable("wgmma") else jit.device_arch(device)


def load(spec: MatmulSpec, device_index: int | None = None) -> LoadedMatmul:
    """Compile (or find in the cache) and load the kernels of `spec` on a device."""
    dev = torch.cuda.current_device() if device_index is None else device_index
    key = (spec.source_key, dev)
    loaded = _LOADED.get(key)
    if loaded is None:
        src = render(spec)
        major, minor = torch.cuda.get_device_capability(dev)
        # mma.sync kernels compile for the plain sm_XY; wgmma ones for sm_90a.
        ck = jit.kernel_cache().get(src.source, src.names, spec.arch(major, minor))
        fns = jit.load(ck, dev)
        loaded = LoadedMatmul(src, fns[src.kernel_name], fns[src.reduce_name])
        loaded.main.cluster = spec.cluster_size  # compiled in: shown by launch_params
        with _LOCK:
            _LOADED[key] = loaded
    return loaded


@dataclasses.dataclass(frozen=True, slots=True)
class _Prepared:
    """What a launch of a spec needs that depends only on the spec, the shape, the row
    strides and the device: found once, then each call only reads the current stream and
    the operands' pointers (the host time of a call is what keeps a GPU waiting on
    short matmuls: benchmarks/matmul_host_probe.py)."""

    main: jit.Kernel
    reduce: jit.Kernel
    grid: tuple
    block: tuple
    smem_bytes: int
    consts: tuple            # int32 M, N, K, lda, ldb, ldc, split_k, mode
    semaphores: int          # serial split-K: one a tile
    partials: int            # fp32 workspace elements (split-K)
    reduce_grid: tuple | None  # parallel split-K's second kernel
    reduce_block: tuple | None
    reduce_consts: tuple


@functools.lru_cache(maxsize=4096)
def _prepare(spec: MatmulSpec, M: int, N: int, K: int, lda: int, ldb: int, ldc: int,
             dev: int) -> _Prepared:
    spec.check_shape(M, N, K)
    loaded = load(spec, dev)
    sms = sm_count(dev)
    cfg = launch_config(spec, M, N, K, sms)  # this spec's split_k
    i32 = np.int32
    consts = (i32(M), i32(N), i32(K), i32(lda), i32(ldb), i32(ldc), i32(spec.split_k),
              i32(MODE_CODE[spec.split_mode]))
    rc = reduce_launch(M, N, sms) if spec.split_mode == "parallel" else None
    return _Prepared(
        loaded.main, loaded.reduce, cfg.grid, cfg.block, cfg.smem_bytes, consts,
        tiles(spec, M, N) if spec.split_mode in ("serial", "tail") else 0,
        {"serial": M * N, "parallel": spec.split_k * M * N,
         "tail": tail_tiles(spec, M, N, cfg.grid[0]) * spec.tile_m * spec.tile_n,
         }.get(spec.split_mode, 0),
        rc.grid if rc else None, rc.block if rc else None,
        (i32(M), i32(N), i32(ldc), i32(spec.split_k)))


def launch(spec: MatmulSpec, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
           bias: torch.Tensor | None, M: int, N: int, K: int) -> None:
    """Launch `spec` on the current stream of `a`'s device (operands already checked)."""
    dev = a.get_device()
    p = _prepare(spec, M, N, K, a.stride(0), b.stride(0), out.stride(0), dev)
    handle = jit.current_stream_handle(dev)
    arena = workspace.arena_for_handle(dev, handle)
    sems = arena.semaphore_ptr(p.semaphores) if p.semaphores else 0
    ws = arena.partials_ptr(p.partials) if p.partials else 0
    u64 = np.uint64
    bias_ptr = u64(0 if bias is None else bias.data_ptr())
    args = (u64(a.data_ptr()), u64(b.data_ptr()), u64(out.data_ptr()), bias_ptr, u64(ws),
            u64(sems)) + p.consts
    if spec.tma:
        c_tma = tma.c_map_ok(spec, out)  # (False unless spec.c_staged)
        args += tma.tensor_maps(spec, a, b, M, N, K, out if c_tma else None)
        if spec.persistent:
            args += (np.int32(c_tma),)
    with jit.on_device(dev):
        # TMA kernels through the driver: their maps go by value
        p.main.launch_raw(p.grid, p.block, args, p.smem_bytes, handle, by_driver=spec.tma)
        if p.reduce_grid is not None:
            p.reduce.launch_raw(p.reduce_grid, p.reduce_block,
                                (u64(ws), u64(out.data_ptr()), bias_ptr) + p.reduce_consts,
                                0, handle)
    if options().enable("check_zeroed"):
        arena.check_zeroed()


def operands(a: torch.Tensor, b: torch.Tensor, layout: str, out: torch.Tensor | None,
             bias: torch.Tensor | None, out_dtype: torch.dtype | None):
    """(the problem, the output tensor) of a call: operands checked, ``out`` allocated
    when not given."""
    if out_dtype is None:
        out_dtype = out.dtype if out is not None else a.dtype
    out_name = TORCH_DTYPES.get(out_dtype)
    if out_name is None:
        raise ValueError(f"matmul: out dtype {out_dtype} not supported")
    p = problem_of(a, b, layout, out_name, bias)
    if out is None:
        out = torch.empty(p.M, p.N, dtype=out_dtype, device=a.device)
    else:
        _check_operand(out, "out", p.M, p.N)
        if out.dtype != out_dtype:
            raise ValueError(f"matmul: out has dtype {out.dtype}, expected {out_dtype}")
    return p, out


def fitted(spec: MatmulSpec, p: Problem) -> MatmulSpec:
    """``spec`` with the dtypes, layout and bias of the call (its tiles kept)."""
    if (spec.a_dtype, spec.out_dtype, spec.layout, spec.bias) == (p.a_dtype, p.out_dtype,
                                                                  p.layout, p.bias):
        return spec
    return dataclasses.replace(spec, a_dtype=p.a_dtype, b_dtype=p.a_dtype,
                               out_dtype=p.out_dtype, layout=p.layout, bias=p.bias)


def matmul_with(spec: MatmulSpec, a: torch.Tensor, b: torch.Tensor, *, layout: str = "TN",
                out: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """`runtime.matmul.matmul` with the kernel's spec given (the autotuner's candidates)."""
    p, out = operands(a, b, layout, out, bias, out_dtype)
    launch(fitted(spec, p), a, b, out, bias, p.M, p.N, p.K)
    return out
