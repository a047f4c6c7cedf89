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

Each function runs one generated fused kernel (`lowering.kernels.seams`; the norm
backward adds a small column reduce of per-CTA weight-gradient partials) when its tensors
are CUDA fp16/bf16, contiguous, of one dtype and device, and no autograd graph is being
recorded through them; otherwise the ``*_reference`` function of the same name does it in
plain torch (any device and dtype, float32 math, float64 for float64 inputs).
`kernel_path` says which a call takes.
"""

from __future__ import annotations

import dataclasses
import functools
import operator

import numpy as np
import torch

from hostir.errors import LoweringError
from hostir.options import options
from lowering.kernels import seams
from runtime import jit
from runtime.device import empty

NORM_KINDS = seams.NORM_KINDS


def _check_kind(kind: str) -> None:
    if kind not in NORM_KINDS:
        raise ValueError(f"norm kind {kind!r}: expected one of {', '.join(NORM_KINDS)}")


def _wide(t):
    """``t`` for the math: float32, or float64 where it already is (the reference of a
    float64 input is then exact up to the float32 mean / rstd it saves)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def add_norm_forward_reference(x, residual, weight, bias, eps: float, kind: str):
    _check_kind(kind)
    h = x if residual is None else x + residual
    hf = _wide(h)
    if kind == "rms_norm":
        mean = None
        rstd = torch.rsqrt(hf.pow(2).mean(-1) + eps)
        normed = hf * rstd.unsqueeze(-1)
    else:
        mean = hf.mean(-1)
        centered = hf - mean.unsqueeze(-1)
        rstd = torch.rsqrt(centered.pow(2).mean(-1) + eps)
        normed = centered * rstd.unsqueeze(-1)
    y = normed * _wide(weight)
    if bias is not None:
        y = y + _wide(bias)
    return y.to(x.dtype), h, None if mean is None else mean.float(), rstd.float()


def add_norm_backward_reference(dy, h, weight, mean, rstd, kind: str, dh=None):
    _check_kind(kind)
    hf, dyf, w = _wide(h), _wide(dy), _wide(weight)
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
        dx = dx + _wide(dh)
    dweight = (dyf * normed).reshape(-1, width).sum(0).to(weight.dtype)
    return dx.to(h.dtype), dweight, dbias


def swiglu_forward_reference(gate, up):
    return (torch.nn.functional.silu(_wide(gate)) * _wide(up)).to(gate.dtype)


def swiglu_backward_reference(da, gate, up):
    g, u, d = _wide(gate), _wide(up), _wide(da)
    sig = torch.sigmoid(g)
    silu = g * sig
    dgate = d * u * sig * (1 + g * (1 - sig))
    dup = d * silu
    return dgate.to(gate.dtype), dup.to(up.dtype)


def gelu_forward_reference(x):
    return torch.nn.functional.gelu(_wide(x), approximate="tanh").to(x.dtype)


def gelu_backward_reference(dy, x):
    return torch.ops.aten.gelu_backward(_wide(dy), _wide(x), approximate="tanh").to(x.dtype)


# ---------------------------------------------------------------------------------------
# The fused path: which calls take it, and the launches.

_KERNEL_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
# Threads of a persistent row kernel per SM at most, by default (the driver's occupancy
# may allow fewer blocks). The forward takes what fits. The backward runs one CTA an SM:
# its bytes in flight are its shared-memory stages, and its workspace has a row per CTA
# (written and read once more), so more CTAs would only grow that. The bench's --sweep
# times others (the ``threads_per_sm`` argument of the ``*_fused`` functions).
FORWARD_THREADS_PER_SM = seams.FORWARD_THREADS_PER_SM
BACKWARD_THREADS_PER_SM = 512
ELEMENTWISE_BLOCKS_PER_SM = 8
MAX_ROWS = 2**31 - 64  # row indices (and a row group's last) stay in an int
MAX_HIDDEN = 2**27 - 1  # `lowering.kernels.seams` specs' limit


def _usable(*tensors) -> bool:
    """Whether the fused kernels can take these tensors (None entries are absent)."""
    first = tensors[0]
    if not (isinstance(first, torch.Tensor) and first.is_cuda and first.dtype in _KERNEL_DTYPES):
        return False
    dtype, index = first.dtype, first.get_device()
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is None:
            continue
        if (not isinstance(t, torch.Tensor) or not t.is_cuda or t.get_device() != index
                or t.dtype != dtype or not t.is_contiguous() or (grad and t.requires_grad)):
            return False
    return _jit_available()


_JIT: list[bool] = []


def _jit_available() -> bool:
    if not _JIT:
        try:
            import cupy  # noqa: F401
            _JIT.append(True)
        except ImportError:
            _JIT.append(False)
    return _JIT[0]


def _float_vector(t, rows: int, index: int) -> bool:
    """A contiguous float32 ``[rows]`` tensor on CUDA device ``index``."""
    return (isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.is_cuda
            and t.get_device() == index and t.is_contiguous() and t.numel() == rows)


def _alignment_of(addresses: int) -> int:
    """Largest power of two up to 16 dividing ``addresses`` (the bitwise or of base
    addresses, and of any byte extents that must keep the alignment), in bytes."""
    low = addresses & -addresses
    return 16 if low == 0 or low > 16 else low


def _alignment(*tensors) -> int:
    """Largest power of two up to 16 dividing every base address (in bytes)."""
    addresses = 0
    for t in tensors:
        if t is not None:
            addresses |= t.data_ptr()
    return _alignment_of(addresses)


def _norm_forward_path(x, residual, weight, bias, kind, out=None) -> bool:
    y, h, mean, rstd = out if out is not None else (None,) * 4
    if not _usable(x, residual, weight, bias, y, h) or x.dim() < 1 or x.numel() == 0:
        return False
    hidden = x.shape[-1]
    rows = x.numel() // hidden
    index = x.get_device()
    return (1 <= hidden <= MAX_HIDDEN and rows <= MAX_ROWS
            and (residual is None or residual.shape == x.shape)
            and weight.shape == (hidden,) and (bias is None or bias.shape == (hidden,))
            and (bias is None or kind == "layer_norm")
            and (out is None or (y.shape == x.shape and _float_vector(rstd, rows, index)
                                 and (residual is None or h.shape == x.shape)
                                 and (kind == "rms_norm" or _float_vector(mean, rows, index)))))


def _norm_backward_path(dy, h, weight, mean, rstd, kind, dh) -> bool:
    if not _usable(dy, h, weight, dh) or h.dim() < 1 or h.numel() == 0:
        return False
    hidden = h.shape[-1]
    rows = h.numel() // hidden
    index = h.get_device()
    return (rows <= MAX_ROWS and hidden <= MAX_HIDDEN and dy.shape == h.shape
            and (dh is None or dh.shape == h.shape)
            and weight.shape == (hidden,) and _float_vector(rstd, rows, index)
            and (kind == "rms_norm" or _float_vector(mean, rows, index))
            and not (torch.is_grad_enabled() and (rstd.requires_grad or (
                mean is not None and mean.requires_grad)))
            and _backward_plannable(kind, h.dtype, hidden, dh is not None,
                                    _alignment(dy, h, dh, weight), index))


@functools.lru_cache(maxsize=1024)
def _backward_plannable(kind, dtype, hidden: int, dh: bool, alignment: int, index: int) -> bool:
    """Whether the device's shared memory holds a plan of this width (every width to
    131072 on sm_90; the widest need clusters, so older GPUs take the torch path there)."""
    try:
        _backward_spec(kind, dtype, hidden, dh, alignment, index).plan
    except LoweringError:
        return False
    return True


def _elementwise_path(*tensors) -> bool:
    """Contiguous tensors of one shape the elementwise kernels take."""
    if not _usable(*tensors):
        return False
    shape = tensors[0].shape
    return all(t.shape == shape for t in tensors)


def kernel_path(op: str, *args) -> bool:
    """Whether ``op`` ("add_norm_forward", ...) called with ``args`` runs the generated
    kernel (True) or the torch reference (False)."""
    if op == "add_norm_forward":
        x, residual, weight, bias, _eps, kind = args
        return _norm_forward_path(x, residual, weight, bias, kind)
    if op == "add_norm_backward":
        dy, h, weight, mean, rstd, kind, *dh = args
        return _norm_backward_path(dy, h, weight, mean, rstd, kind, dh[0] if dh else None)
    if op in ("swiglu_forward", "swiglu_backward", "gelu_backward"):
        return _elementwise_path(*args)
    if op == "gelu_forward":
        return _usable(*args)
    raise ValueError(f"op {op!r}: expected one of add_norm_forward, add_norm_backward, "
                     f"swiglu_forward, swiglu_backward, gelu_forward, gelu_backward")


def add_norm_forward(x, residual, weight, bias, eps: float, kind: str, out=None):
    """See the module docstring. ``out``: ``(y, h, mean, rstd)`` to write into instead of
    new tensors (``h`` is read only with a residual, ``mean`` only for layer_norm; pass
    None for those that are not written); a host program's stage slices take it."""
    _check_kind(kind)
    if _norm_forward_path(x, residual, weight, bias, kind, out):
        return add_norm_forward_fused(x, residual, weight, bias, eps, kind, out=out)
    result = add_norm_forward_reference(x, residual, weight, bias, eps, kind)
    if out is None:
        return result
    for dst, src in zip(out, result):
        if dst is not None and src is not None and dst is not src:
            dst.copy_(src)
    return out


def add_norm_backward(dy, h, weight, mean, rstd, kind: str, dh=None):
    _check_kind(kind)
    if not _norm_backward_path(dy, h, weight, mean, rstd, kind, dh):
        return add_norm_backward_reference(dy, h, weight, mean, rstd, kind, dh)
    return add_norm_backward_fused(dy, h, weight, mean, rstd, kind, dh)


# ---------------------------------------------------------------------------------------
# Launch records: a call looks its launch up once, by a key of plain values (the op's
# flags, dtype, widths, alignment class, device index), and then only allocates, packs
# its pointers and launches. The record holds what the spec, plan, kernel cache, driver
# occupancy and device queries gave when the key was first met.


@dataclasses.dataclass(frozen=True, slots=True)
class _Launch:
    """One kernel's launch but for a call's pointers and sizes. Its grid for a call of
    ``units`` units of work (rows, vectors, rotary items): ``cluster`` x one CTA per
    ``per_cta`` units, ``cap`` at most (what the device holds at once, for a persistent
    kernel), one at least."""

    spec: object
    index: int  # the CUDA device
    kernel: object
    block: tuple[int, int, int]
    smem: int
    dependent: bool  # a programmatic dependent launch (`_dependent_launch`)
    per_cta: int
    cap: int
    cluster: int = 1
    vector: int = 1  # values a vector access moves, where the units count vectors

    def grid(self, units: int) -> tuple[int, int, int]:
        return (self.cluster * max(1, min(-(-units // self.per_cta), self.cap)), 1, 1)


_RECORDS: dict[tuple, object] = {}


def _record(key: tuple):
    """The launch record of ``key``: ``key[0](*key[1:])``, built on the key's first call
    (its builder is part of the key, so each op's keys are its own)."""
    record = _RECORDS.get(key)
    if record is None:
        record = _RECORDS[key] = key[0](*key[1:])
    return record


def _launch(*launches) -> None:
    """Launch each ``(record, grid, args)`` in turn on the current stream of the first
    record's device (every record of one call has the same device)."""
    index = launches[0][0].index
    handle = jit.current_stream_handle(index)
    with jit.on_device(index):
        for record, grid, args in launches:
            record.kernel.launch_raw(grid, record.block, args, record.smem, handle,
                                     record.dependent)


def _forward_record(kind, dtype, hidden: int, residual: bool, bias: bool, alignment: int,
                    index: int, threads_per_sm: int) -> _Launch:
    """The persistent row kernel's launch: as many CTAs as the SMs hold at once (driver
    occupancy), ``threads_per_sm`` threads an SM at most, never more than there are row
    groups."""
    spec = seams.AddNormForwardSpec(kind, _KERNEL_DTYPES[dtype], hidden, residual, bias, alignment)
    plan = spec.plan
    kernel = _kernel(spec, index)
    per_sm = min(max(1, threads_per_sm // plan.block_threads),
                 _resident_blocks(kernel, plan.block_threads))
    return _Launch(spec, index, kernel, plan.block, 0, _dependent_launch(index),
                   plan.rows_per_block, _sm_count(index) * per_sm)


def _backward_record(kind, dtype, hidden: int, dh: bool, alignment: int, index: int,
                     threads_per_sm: int, rule: str = seams.DEFAULT_BACKWARD_RULE,
                     phased: bool = False) -> tuple[_Launch, _Launch]:
    """The staged row kernel's launch and its column reduce's. The row kernel's CTAs: as
    many as the SMs hold at once (the driver's occupancy with the plan's shared memory;
    for a cluster, the clusters the GPCs hold at once, since a cluster that waits for a
    second wave doubles the time), never more teams than tiles of rows. A cluster kernel
    launches plainly: its rows are long, the launch overlap small. ``phased``: dy, h, dh
    and dx share each row's 16-byte phase (`add_norm_backward_fused`); a phased plan's
    teams are a multiple of its classes of rows (`seams.phase_period`), else the
    narrower plan is taken."""
    spec = _backward_spec(kind, dtype, hidden, dh, alignment, index, rule, phased)
    plan = spec.plan
    kernel = _kernel(spec, index)
    kernel.ensure_smem(plan.smem_bytes)
    per_sm = min(max(1, threads_per_sm // plan.block_threads),
                 _resident_blocks(kernel, plan.block_threads, plan.smem_bytes))
    cap = _sm_count(index) * per_sm
    if plan.cluster > 1:
        cap = jit.cluster_cap(_active_clusters(kernel, plan.cluster, plan.block_threads,
                                               plan.smem_bytes), cap, plan.cluster)
    if plan.phased:
        # as many teams in every class of rows (a class of fewer teams would hold the
        # others up: four or five teams a class, 25%), at most 1/16 of them left idle
        period = seams.phase_period(hidden)
        if cap % period * 16 > cap:
            return _backward_record(kind, dtype, hidden, dh, alignment, index,
                                    threads_per_sm, rule, False)
        cap -= cap % period
    rows = _Launch(spec, index, kernel, plan.block, plan.smem_bytes,
                   plan.cluster == 1 and _dependent_launch(index), plan.rows_per_block, cap,
                   plan.cluster)
    reduce = seams.ColumnReduceSpec(_KERNEL_DTYPES[dtype], spec.sets)
    # its grid is `ColumnReduceSpec.grid` (a CTA per REDUCE_BLOCK[0] columns, every set),
    # not this record's per-unit one
    return rows, _Launch(reduce, index, _kernel(reduce, index), seams.REDUCE_BLOCK, 0,
                         _dependent_launch(index), seams.REDUCE_BLOCK[0], 2**31 - 1)


def _elementwise_record(op: str, dtype, alignment: int, index: int, rows: bool) -> _Launch:
    spec = seams.ElementwiseSpec(op, _KERNEL_DTYPES[dtype], alignment, rows=rows)
    return _Launch(spec, index, _kernel(spec, index), (seams.ELEMENTWISE_THREADS, 1, 1), 0,
                   _dependent_launch(index), seams.ELEMENTWISE_THREADS,
                   _sm_count(index) * ELEMENTWISE_BLOCKS_PER_SM, vector=spec.vector)


def add_norm_forward_fused(x, residual, weight, bias, eps: float, kind: str,
                           threads_per_sm: int = FORWARD_THREADS_PER_SM, out=None):
    """`add_norm_forward` through the generated kernel, for tensors `kernel_path`
    accepts; ``threads_per_sm`` sizes the persistent grid (the bench's --sweep); ``out``
    as `add_norm_forward`'s."""
    hidden = x.shape[-1]
    rows = x.numel() // hidden
    if out is not None:
        y, h, mean, rstd = out
        h = x if residual is None else h
        mean = mean if kind == "layer_norm" else None
    else:
        y = torch.empty_like(x)
        h = x if residual is None else torch.empty_like(x)
        stats = x.shape[:-1]
        rstd = empty(stats, torch.float32, x.device)
        mean = empty(stats, torch.float32, x.device) if kind == "layer_norm" else None
    p = [0 if t is None else t.data_ptr()
         for t in (x, residual, weight, bias, None if residual is None else h, y, mean, rstd)]
    record = _record((_forward_record, kind, x.dtype, hidden, residual is not None,
                      bias is not None, _alignment_of(p[0] | p[1] | p[2] | p[3] | p[4] | p[5]),
                      x.get_device(), threads_per_sm))
    _launch((record, record.grid(rows),
             (*map(np.uint64, p), np.float32(eps), np.int32(rows))))
    return y, h, mean, rstd


def add_norm_backward_fused(dy, h, weight, mean, rstd, kind: str, dh=None,
                            threads_per_sm: int = BACKWARD_THREADS_PER_SM,
                            rule: str = seams.DEFAULT_BACKWARD_RULE):
    """`add_norm_backward` through the generated kernels (the staged row kernel, then the
    column reduce of its per-team weight-gradient rows), for tensors `kernel_path`
    accepts; ``threads_per_sm`` caps the persistent grid's CTAs an SM and ``rule`` picks
    the plan (`lowering.kernels.seams.BACKWARD_RULES`): the bench's --sweep times both."""
    hidden = h.shape[-1]
    rows = h.numel() // hidden
    p = [0 if t is None else t.data_ptr() for t in (dy, h, weight, mean, rstd, dh)]
    index = h.get_device()
    # where dy, h (and dh) share each row's 16-byte phase, rows off 16 bytes may take
    # 16-byte accesses at that phase (`seams.plan_backward`); dx is then allocated at
    # dy's phase, else 16-byte aligned (what a consumer of dx may need). Either way dx
    # lowers no alignment the others keep, so the key need not wait for it.
    phased = ((p[0] ^ p[1]) | (0 if dh is None else p[0] ^ p[5])) & 15 == 0
    row_kernel, reduce = _record((_backward_record, kind, h.dtype, hidden, dh is not None,
                                  _alignment_of(p[0] | p[1] | p[2] | p[5]), index,
                                  threads_per_sm, rule, phased))
    shift = (p[0] & 15) // dy.element_size() if row_kernel.spec.plan.phased else 0
    dx = torch.empty(h.numel() + shift, dtype=h.dtype, device=h.device)[shift:].view(h.shape)
    p.append(dx.data_ptr())
    grid = row_kernel.grid(rows)
    teams = grid[0] // row_kernel.cluster
    # every team writes its whole workspace row (zeros where it met no row): no memset
    ws = torch.empty(row_kernel.spec.sets * teams * hidden, dtype=torch.float32,
                     device=h.device)
    dweight = torch.empty_like(weight)
    dbias = torch.empty_like(weight) if kind == "layer_norm" else None
    ws_ptr = np.uint64(ws.data_ptr())
    sums = (ws_ptr, np.uint64(dweight.data_ptr()),
            np.uint64(0 if dbias is None else dbias.data_ptr()), np.int32(teams), np.int32(hidden))
    _launch((row_kernel, grid, (*map(np.uint64, p), ws_ptr, np.int32(rows))),
            (reduce, reduce.spec.grid(hidden), sums))
    return dx, dweight, dbias


def _backward_spec(kind, dtype, hidden: int, dh: bool, alignment: int, index: int,
                   rule: str = seams.DEFAULT_BACKWARD_RULE, phased: bool = False):
    """The backward's spec; ``phased`` only where its plan takes the rows' phase (one spec,
    one kernel, for the rows that do not)."""
    spec = seams.AddNormBackwardSpec(kind, _KERNEL_DTYPES[dtype], hidden, dh, alignment,
                                     device_hardware(index), rule, phased)
    return dataclasses.replace(spec, phased=False) if phased and not spec.plan.phased else spec


@functools.lru_cache(maxsize=16)
def device_hardware(index: int):
    """`lowering.kernels.seams.Hardware` of a device, from the driver's attributes (the
    DRAM bandwidth from the memory clock and bus width where the driver reports them):
    what its seam kernels' plans follow (`hostir.jobs.warmup` compiles them so)."""
    from cupy.cuda import runtime

    def attr(name: str, default):
        try:
            return runtime.deviceGetAttribute(getattr(runtime, name), index)
        except Exception:  # noqa: BLE001 -- an attribute this CUDA lacks: the model's
            return default

    bandwidth = seams.SM90.dram_bytes_per_s
    clock_khz = attr("cudaDevAttrMemoryClockRate", 0)
    bus_bits = attr("cudaDevAttrGlobalMemoryBusWidth", 0)
    if clock_khz and bus_bits:
        bandwidth = 2.0 * clock_khz * 1e3 * bus_bits / 8
    major = torch.cuda.get_device_capability(index)[0]
    return seams.Hardware(
        sm_count=_sm_count(index),
        smem_per_block=attr("cudaDevAttrMaxSharedMemoryPerBlockOptin", 48 * 1024),
        smem_per_sm=attr("cudaDevAttrMaxSharedMemoryPerMultiprocessor", 64 * 1024),
        regs_per_sm=attr("cudaDevAttrMaxRegistersPerMultiprocessor", 65536),
        threads_per_sm=attr("cudaDevAttrMaxThreadsPerMultiProcessor", 2048),
        clusters=major >= 9, dram_bytes_per_s=bandwidth)


_active_clusters = jit.active_clusters  # tests stub it here


def swiglu_forward(gate, up, out=None):
    """``silu(gate) * up``; ``gate`` and ``up`` may be column blocks of one tensor (rows
    with a pitch, e.g. the halves of a fused gate-up GEMM's output). ``out``: where to
    write (a new contiguous tensor by default)."""
    out = empty(gate.shape, gate.dtype, gate.device) if out is None else out
    if _elementwise_path(gate, up, out):
        _elementwise("swiglu_forward", (gate, up), (out,))
    elif _rows_usable(gate, up, out):
        _elementwise_rows("swiglu_forward", (gate, up), (out,))
    else:
        out.copy_(swiglu_forward_reference(gate, up))
    return out


def swiglu_backward(da, gate, up, out=None):
    """``(dgate, dup)``; ``out``: a pair of tensors to write them into (e.g. the two
    column halves of the fused gate-up output's gradient), else new ones."""
    if out is None:
        out = empty(gate.shape, gate.dtype, gate.device), empty(up.shape, up.dtype, up.device)
    if _elementwise_path(da, gate, up, *out):
        _elementwise("swiglu_backward", (da, gate, up), out)
    elif _rows_usable(da, gate, up, *out):
        _elementwise_rows("swiglu_backward", (da, gate, up), out)
    else:
        for o, r in zip(out, swiglu_backward_reference(da, gate, up)):
            o.copy_(r)
    return out


def _rows_usable(*tensors) -> bool:
    """2-D tensors of one shape, dtype and CUDA device, each with unit column stride and
    a row pitch of its own: what the rows variant of the elementwise kernels takes."""
    first = tensors[0]
    if not (isinstance(first, torch.Tensor) and first.is_cuda and first.dtype in _KERNEL_DTYPES
            and first.dim() == 2 and first.numel() > 0):
        return False
    shape, dtype, index = first.shape, first.dtype, first.get_device()
    width = shape[1]
    grad = torch.is_grad_enabled()
    for t in tensors:
        if not (isinstance(t, torch.Tensor) and t.dtype == dtype and t.is_cuda
                and t.get_device() == index and t.shape == shape
                and not (grad and t.requires_grad)):
            return False
        pitch, step = t.stride()
        if step != 1 or pitch < width:
            return False
    return _jit_available()


def gelu_forward(x):
    if not _usable(x):
        return gelu_forward_reference(x)
    y = torch.empty_like(x)
    _elementwise("gelu_forward", (x,), (y,))
    return y


def gelu_backward(dy, x):
    if not _elementwise_path(dy, x):
        return gelu_backward_reference(dy, x)
    dx = torch.empty_like(x)
    _elementwise("gelu_backward", (dy, x), (dx,))
    return dx


def _elementwise(op: str, ins, outs) -> None:
    n = ins[0].numel()
    if n == 0:
        return
    p = [t.data_ptr() for t in (*ins, *outs)]
    record = _record((_elementwise_record, op, ins[0].dtype,
                      _alignment_of(functools.reduce(operator.or_, p)), ins[0].get_device(),
                      False))
    _launch((record, record.grid(n // record.vector), (*map(np.uint64, p), np.int64(n))))


def _elementwise_rows(op: str, ins, outs) -> None:
    """The rows variant: the alignment also divides the width and every pitch (bytes)."""
    tensors = (*ins, *outs)
    rows, width = ins[0].shape
    p = [t.data_ptr() for t in tensors]
    pitches = [t.stride(0) for t in tensors]
    extents = 2 * width
    for pitch in pitches:
        extents |= 2 * pitch
    record = _record((_elementwise_record, op, ins[0].dtype,
                      _alignment_of(functools.reduce(operator.or_, p, extents)),
                      ins[0].get_device(), True))
    _launch((record, record.grid(rows * max(1, width // record.vector)),
             (*map(np.uint64, p), np.int64(rows), np.int64(width), *map(np.int64, pitches))))


def _dependent_launch(index: int) -> bool:
    """Whether seam kernels launch as programmatic dependent launches on this device:
    sm_90 and later, unless HOSTIR_DISABLE=dependent_launch or the driver lacks
    cuLaunchKernelEx. Each kernel waits (``griddepcontrol.wait``) before it touches
    global memory, so this is as safe as a plain launch; back to back, the next kernel's
    launch overlaps this one's tail (the norm backward's column reduce follows its row
    kernel so)."""
    on = (torch.cuda.get_device_capability(index)[0] >= 9
          and not options().disable("dependent_launch"))
    if on:
        try:
            jit.launch_ex_available()
        except (OSError, AttributeError):
            on = False
    return on


_KERNELS: dict = {}


def _kernel(spec, index: int, render=None):
    """The loaded kernel of ``spec`` on device ``index`` (compiled once through the jit
    cache), its source from ``render`` (default: `lowering.kernels.seams.render`)."""
    key = (spec, index)
    kernel = _KERNELS.get(key)
    if kernel is None:
        compiled = jit.kernel_cache().get((render or seams.render)(spec), [spec.kernel_name],
                                          jit.device_arch(index))
        kernel = _KERNELS[key] = jit.load(compiled, index)[spec.kernel_name]
        # its compiled-in cluster, shown by the launch_params dump
        kernel.cluster = getattr(getattr(spec, "plan", None), "cluster", 1)
    return kernel


_RESIDENT: dict = {}


def _resident_blocks(kernel, threads: int, smem: int = 0) -> int:
    n = _RESIDENT.get((kernel.function.ptr, threads, smem))
    if n is None:
        try:
            from cupy.cuda import driver

            n = driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.function.ptr, threads,
                                                                 smem)
        except Exception:  # noqa: BLE001 -- a binding without the call: assume two
            n = 0                  # (one where the plan's shared memory is its own)
        n = _RESIDENT[(kernel.function.ptr, threads, smem)] = (
            n if n and n > 0 else (1 if smem else 2))
    return n


_SM_COUNTS: dict[int, int] = {}


def _sm_count(index: int) -> int:
    n = _SM_COUNTS.get(index)
    if n is None:
        n = _SM_COUNTS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return n
