"""Generated normalization kernels, callable on CUDA torch tensors.

Each call builds a `NormalizationSpec` from the tensors, compiles its kernel once through
the shared `runtime.jit` cache (memory, then disk), and launches it on the current torch
stream. Inputs are checked first; a bad one raises `InputMismatchError` naming the tensor.

Example (the fusion of the nvFuser report, fp16):
    >>> x = torch.randn(8192, 5140, device="cuda", dtype=torch.float16)
    >>> b0, b1, w, b2 = (torch.randn(5140, device="cuda", dtype=torch.float16) for _ in range(4))
    >>> y = layer_norm_fused(x, b0, b1, w, b2, eps=1e-5)   # half(layer_norm(half(x+b0)+b1)*w+b2)
    >>> y = rms_norm(x, w, eps=1e-6)

`reference(spec, tensors)` is the same math in plain torch (any device, float64 by default):
the tests and the benchmark compare against it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping, Sequence

import torch

from hostir.errors import InputMismatchError
from lowering.kernels.normalization import (
    AddBroadcast,
    Cast,
    LayerNorm,
    NormalizationSpec,
    render_normalization,
)

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


_MAKE = {"fused": NormalizationSpec.reference_fusion, "layer_norm": NormalizationSpec.layer_norm,
         "rms_norm": NormalizationSpec.rms_norm}


@functools.lru_cache(maxsize=4096)
def _spec(kind: str, rows: int, hidden: int, eps: float, dtype: str, alignment: int):
    """The spec of a call, built once per (kind, rows, hidden, eps, dtype, alignment):
    building and validating one takes tens of microseconds, several times a short
    kernel's host budget."""
    return _MAKE[kind](rows, hidden, eps, dtype, alignment=alignment)


def layer_norm_fused(x, b0, b1, w, b2, eps: float = 1e-5, out=None):
    """``half(layer_norm(float(half(float(x) + float(b0))) + float(b1)) * w + b2)`` over rows.

    x: [..., hidden] fp16/bf16, contiguous; b0, b1, w, b2: [hidden], same dtype.
    Returns a tensor shaped like x, in x's dtype.
    """
    dtype = _dtype_name(x, "x")
    spec = _spec("fused", _rows(x), x.shape[-1], eps, dtype, _alignment(x, b0, b1, w, b2, out))
    return normalize(spec, {"x": x, "b0": b0, "b1": b1, "weight": w, "bias": b2}, out)


def layer_norm(x, w, b, eps: float = 1e-5, out=None):
    """``layer_norm(x) * w + b`` over the last axis, fp32 math, output in x's dtype."""
    dtype = _dtype_name(x, "x")
    spec = _spec("layer_norm", _rows(x), x.shape[-1], eps, dtype, _alignment(x, w, b, out))
    return normalize(spec, {"x": x, "weight": w, "bias": b}, out)


def rms_norm(x, w, eps: float = 1e-6, out=None):
    """``x / sqrt(mean(x^2) + eps) * w`` over the last axis, fp32 math, output in x's dtype."""
    dtype = _dtype_name(x, "x")
    spec = _spec("rms_norm", _rows(x), x.shape[-1], eps, dtype, _alignment(x, w, out))
    return normalize(spec, {"x": x, "weight": w}, out)


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """What a launch of a spec on a device needs beyond the tensors: found once."""

    kernel: object
    grid: tuple
    block: tuple
    smem: int
    rows: object  # numpy int32


def clear_caches() -> None:
    """Forget loaded kernels and prepared launches (a probe that switches a generator
    flag of lowering.kernels.normalization: the sources and grids change with it)."""
    _KERNELS.clear()
    _prepare.cache_clear()


@functools.lru_cache(maxsize=4096)
def _prepare(spec: NormalizationSpec, device_index: int) -> _Prepared:
    import numpy as np

    kernel = _kernel(spec, device_index)
    plan = spec.plan
    grid = launch_grid(spec, kernel, torch.device("cuda", device_index))
    return _Prepared(kernel, (grid, 1, 1), (plan.block_threads, 1, 1),
                     plan.dynamic_shared_bytes, np.int32(spec.rows))


def normalize(spec: NormalizationSpec, tensors: Mapping[str, torch.Tensor], out=None):
    """Run ``spec``'s kernel; ``tensors`` maps `spec.parameter_names()` (but ``y``) to tensors.

    ``out`` (optional) receives the result and is returned; else a new tensor is.
    """
    x = tensors.get("x")
    if x is None:
        raise InputMismatchError("normalization: tensor 'x' is missing")
    names, dtypes = spec.parameter_names(), spec.parameter_dtypes()
    _check(spec, tensors, names, dtypes)
    if out is None:
        out = torch.empty(x.shape, dtype=TORCH_DTYPES[spec.output_dtype], device=x.device)
    _check_tensor("y", out, x.device, spec.output_dtype, tuple(x.shape))
    if x.numel() == 0:
        return out
    import numpy as np

    from runtime import jit

    dev = x.get_device()
    p = _prepare(spec, dev)
    args = tuple(np.uint64(tensors[n].data_ptr()) for n in names[:-1]) + (
        np.uint64(out.data_ptr()), p.rows)
    handle = jit.current_stream_handle(dev)
    with jit.on_device(dev):
        p.kernel.launch_raw(p.grid, p.block, args, p.smem, handle)
    return out


def launch_grid(spec: NormalizationSpec, kernel, device, rows: int | None = None) -> int:
    """Blocks to launch: the row-wise kernel's one per group of rows; the persistent
    kernel's, the SMs of ``device`` x the blocks of this compiled kernel resident on
    each (asked of the driver: ptxas may use fewer registers than the plan promised,
    and then more blocks fit), never more than there are groups of rows."""
    plan, rows = spec.plan, spec.rows if rows is None else rows
    if not plan.persistent:
        return plan.grid(rows)
    return plan.grid(rows, sm_count(device), resident_blocks(kernel, plan))


_RESIDENT: dict[tuple[int, int, int], int] = {}


def resident_blocks(kernel, plan) -> int:
    """Blocks of ``kernel`` (a loaded `runtime.jit.Kernel`) one SM holds at once with
    ``plan``'s block and dynamic shared memory; the plan's own count if the driver
    cannot say."""
    key = (kernel.function.ptr, plan.block_threads, plan.dynamic_shared_bytes)
    n = _RESIDENT.get(key)
    if n is None:
        try:
            from cupy.cuda import driver

            kernel.ensure_smem(plan.dynamic_shared_bytes)  # over 48 KiB is an opt-in
            n = driver.occupancyMaxActiveBlocksPerMultiprocessor(
                kernel.function.ptr, plan.block_threads, plan.dynamic_shared_bytes)
        except Exception:  # noqa: BLE001 -- an older driver binding: the plan's count
            n = 0
        n = _RESIDENT[key] = n if n and n > 0 else plan.min_blocks_per_sm
    return n


_SM_COUNTS: dict[int, int] = {}


def sm_count(device) -> int:
    """Multiprocessors of ``device`` (asked once per device)."""
    index = torch.device(device).index or 0
    n = _SM_COUNTS.get(index)
    if n is None:
        n = _SM_COUNTS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return n


_KERNELS: dict[tuple[NormalizationSpec, int], object] = {}


def _kernel(spec: NormalizationSpec, device_index: int):
    """The loaded kernel; rows are a launch argument, so specs differing in rows share it."""
    key = (dataclasses.replace(spec, rows=1), device_index)
    kernel = _KERNELS.get(key)
    if kernel is None:
        from runtime import jit

        compiled = jit.kernel_cache().get(render_normalization(spec), [spec.kernel_name],
                                          jit.device_arch(device_index))
        kernel = _KERNELS[key] = jit.load(compiled, device_index)[spec.kernel_name]
    return kernel


def compiled_kernel(spec: NormalizationSpec, arch: str = "sm_90"):
    """The `runtime.jit.CompiledKernel` (cubin, registers, spills) of ``spec`` for ``arch``."""
    from runtime import jit

    return jit.kernel_cache().get(render_normalization(spec), [spec.kernel_name], arch)


# --------------------------------------------------------------------------- checks


def _dtype_name(t, what: str) -> str:
    if not isinstance(t, torch.Tensor):
        raise InputMismatchError(f"normalization: {what}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.float16, torch.bfloat16):
        raise InputMismatchError(
            f"normalization: {what}: expected dtype float16 or bfloat16, got {t.dtype}"
        )
    return _NAMES[t.dtype]


def _rows(x: torch.Tensor) -> int:
    if x.dim() < 1 or x.shape[-1] == 0:
        raise InputMismatchError(f"normalization: x: expected shape [..., hidden>0], got {tuple(x.shape)}")
    return max(1, x.numel() // x.shape[-1])


def _alignment(*tensors) -> int:
    """Largest power of two up to 16 dividing every base address (picks the vector width)."""
    align = 16
    for t in tensors:
        if isinstance(t, torch.Tensor):
            ptr = t.data_ptr()
            while align > 1 and ptr % align:
                align //= 2
    return align


def _check(spec, tensors, names, dtypes) -> None:
    x = tensors["x"]
    extra = set(tensors) - set(names)
    if extra:
        raise InputMismatchError(f"normalization: unexpected tensor(s) {sorted(extra)}; expected {list(names[:-1])}")
    if not x.is_cuda:
        raise InputMismatchError(f"normalization: x: expected a CUDA tensor, got device {x.device}")
    if x.numel() and x.numel() != spec.rows * spec.hidden:
        raise InputMismatchError(
            f"normalization: x: expected {spec.rows} rows x {spec.hidden}, got shape {tuple(x.shape)}"
        )
    _check_tensor("x", x, x.device, dtypes[0], tuple(x.shape))
    for name, dtype in zip(names[1:-1], dtypes[1:-1]):
        if name not in tensors:
            raise InputMismatchError(f"normalization: tensor {name!r} is missing; expected {list(names[:-1])}")
        _check_tensor(name, tensors[name], x.device, dtype, (spec.hidden,))


def _check_tensor(name: str, t, device, dtype: str, shape: tuple) -> None:
    if not isinstance(t, torch.Tensor):
        raise InputMismatchError(f"normalization: {name}: expected a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise InputMismatchError(f"normalization: {name}: expected shape {shape}, got {tuple(t.shape)}")
    if t.dtype != TORCH_DTYPES[dtype]:
        raise InputMismatchError(f"normalization: {name}: expected dtype {dtype}, got {t.dtype}")
    if t.device != device:
        raise InputMismatchError(f"normalization: {name}: expected device {device} (x's), got {t.device}")
    if not t.is_contiguous():
        raise InputMismatchError(f"normalization: {name}: expected a contiguous tensor, got strides {t.stride()}")


# --------------------------------------------------------------------------- reference


def reference(spec: NormalizationSpec, tensors: Mapping[str, torch.Tensor],
              dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The spec's math in plain torch, computed in ``dtype``, result in ``dtype``.

    Casts of the prologue and epilogue round through their dtype as the kernel does;
    only the final cast to the output dtype is left out, so the error of the kernel's
    output can be measured against this.
    """
    def apply(v, ops: Sequence):
        for op in ops:
            if isinstance(op, AddBroadcast):
                v = v + tensors[op.name].to(dtype)
            elif isinstance(op, Cast):
                v = v.to(TORCH_DTYPES[op.dtype]).to(dtype)
        return v

    v = apply(tensors["x"].reshape(-1, spec.hidden).to(dtype), spec.prologue)
    norm = spec.norm
    if isinstance(norm, LayerNorm):
        mean = v.mean(dim=-1, keepdim=True)
        var = ((v - mean) ** 2).mean(dim=-1, keepdim=True)
        v = (v - mean) * torch.rsqrt(var + norm.eps)
    else:
        v = v * torch.rsqrt((v * v).mean(dim=-1, keepdim=True) + norm.eps)
    if norm.weight:
        v = v * tensors["weight"].to(dtype)
    if isinstance(norm, LayerNorm) and norm.bias:
        v = v + tensors["bias"].to(dtype)
    return apply(v, spec.epilogue).reshape(tensors["x"].shape)
