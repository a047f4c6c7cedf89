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
from hostir.errors import LoweringError
from hostir.options import dump, options
from lowering.kernels.normalization import (
    PLAN_FIELDS,
    SM90,
    Hardware,
    AddBroadcast,
    Cast,
    LayerNorm,
    NormalizationSpec,
    render_normalization,
    spec_params,
    spec_with_plan,
    tune_plans,
)

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


_MAKE = {"fused": NormalizationSpec.reference_fusion, "layer_norm": NormalizationSpec.layer_norm,
         "rms_norm": NormalizationSpec.rms_norm}


@functools.lru_cache(maxsize=4096)
def _spec(kind: str, rows: int, hidden: int, eps: float, dtype: str, alignment: int,
          device_index: int):
    """The spec of a call, built once per (kind, rows, hidden, eps, dtype, alignment,
    device): building and validating one takes tens of microseconds, several times a
    short kernel's host budget. The autotuner's stored winner where there is one
    (`choose`)."""
    return choose(_MAKE[kind](rows, hidden, eps, dtype, alignment=alignment,
                              hardware=device_hardware(device_index)), device_index)


def call_spec(kind: str, rows: int, hidden: int, eps: float, dtype: str, alignment: int,
              device_index: int):
    """The spec a call of ``kind`` ("layer_norm", "rms_norm", "fused") runs with these
    values on device ``device_index`` (-1: none, the SM90 model): what `layer_norm`,
    `rms_norm` and `layer_norm_fused` launch (the warmup job compiles it ahead)."""
    return _spec(kind, rows, hidden, eps, dtype, alignment, device_index)


def layer_norm_fused(x, b0, b1, w, b2, eps: float = 1e-5, out=None):
    """``half(layer_norm(float(half(float(x) + float(b0))) + float(b1)) * w + b2)`` over rows.

    x: [..., hidden] fp16/bf16, contiguous; b0, b1, w, b2: [hidden], same dtype.
    Returns a tensor shaped like x, in x's dtype.
    """
    dtype = _dtype_name(x, "x")
    spec = _spec("fused", _rows(x), x.shape[-1], eps, dtype, _alignment(x, b0, b1, w, b2, out),
                 _index(x))
    return normalize(spec, {"x": x, "b0": b0, "b1": b1, "weight": w, "bias": b2}, out)


def layer_norm(x, w, b, eps: float = 1e-5, out=None):
    """``layer_norm(x) * w + b`` over the last axis, fp32 math, output in x's dtype."""
    dtype = _dtype_name(x, "x")
    spec = _spec("layer_norm", _rows(x), x.shape[-1], eps, dtype, _alignment(x, w, b, out),
                 _index(x))
    return normalize(spec, {"x": x, "weight": w, "bias": b}, out)


def rms_norm(x, w, eps: float = 1e-6, out=None):
    """``x / sqrt(mean(x^2) + eps) * w`` over the last axis, fp32 math, output in x's dtype."""
    dtype = _dtype_name(x, "x")
    spec = _spec("rms_norm", _rows(x), x.shape[-1], eps, dtype, _alignment(x, w, out), _index(x))
    return normalize(spec, {"x": x, "weight": w}, out)


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """What a launch of a spec on a device needs beyond the tensors: found once."""

    kernel: object
    grid: tuple
    block: tuple
    smem: int
    rows: object  # numpy int32
    dependent: bool  # a programmatic dependent launch (`dependent_launch`)


def clear_caches() -> None:
    """Forget loaded kernels, prepared launches and the specs of calls (a probe that
    switches a generator flag of lowering.kernels.normalization: the sources and grids
    change with it; a new autotuning winner changes the spec of a call)."""
    _KERNELS.clear()
    _DEPENDENT.clear()
    _prepare.cache_clear()
    _spec.cache_clear()


_HARDWARE: dict[int, Hardware] = {}


def device_hardware(device_index: int) -> Hardware:
    """The planner's model of device ``device_index`` (`Hardware`), from its properties:
    SMs, registers, threads and shared memory an SM and a block, and DRAM bandwidth
    (memory clock x bus width x 2, double data rate). `SM90` for what a device does not
    say, and without a device (``device_index`` < 0)."""
    hw = _HARDWARE.get(device_index)
    if hw is not None:
        return hw
    hw = SM90
    if device_index >= 0:
        fields = {}
        try:
            props = torch.cuda.get_device_properties(device_index)
            fields["sm_count"] = props.multi_processor_count
            fields["clusters"] = props.major >= 9
            for name, attr in (("registers_per_sm", "regs_per_multiprocessor"),
                               ("threads_per_sm", "max_threads_per_multi_processor"),
                               ("shared_per_sm", "shared_memory_per_multiprocessor"),
                               ("shared_per_block", "shared_memory_per_block_optin")):
                value = getattr(props, attr, None)
                if isinstance(value, int) and value > 0:
                    fields[name] = value
        except (RuntimeError, AssertionError):
            fields = {}
        try:
            from cupy.cuda import runtime as cuda_runtime

            khz = cuda_runtime.deviceGetAttribute(cuda_runtime.cudaDevAttrMemoryClockRate,
                                                  device_index)
            bits = cuda_runtime.deviceGetAttribute(
                cuda_runtime.cudaDevAttrGlobalMemoryBusWidth, device_index)
            if khz > 0 and bits > 0:
                fields["bandwidth"] = 2.0 * khz * 1e3 * bits / 8
        except Exception:  # noqa: BLE001 -- no attribute in this CUDA: the default's
            pass
        hw = dataclasses.replace(SM90, **fields)
    _HARDWARE[device_index] = hw
    return hw


def _index(x) -> int:
    """The CUDA device index of ``x`` (-1 on the CPU: `_check` then refuses it)."""
    return x.get_device() if x.is_cuda else -1


# ----------------------------------------------------------------------------- autotuning
#
# The heuristic plan (`lowering.kernels.normalization.choose_persistent`) was fitted to
# plan sweeps timed one plan after another; timed side by side, its twins beat it by
# 1-3% at several sizes (benchmarks/results/norm_plan_probe_nvidia-h200.json). The
# autotuner times `tune_plans` side by side on the device and stores the fastest plan
# in the matmul tuner's file (`runtime.autotune`), keyed by device and problem (the spec
# but its rows: the plan does not depend on them; the tuner times at the spec's rows).


def _tune_key(spec: NormalizationSpec, device=None) -> str:
    # alignments of 16 bytes and more allow the same plans (16-byte vectors at most)
    problem = dataclasses.replace(spec, rows=1, alignment=min(spec.alignment, 16),
                                  **{f: None for f in PLAN_FIELDS})
    what = ",".join(f"{k}={v}" for k, v in spec_params(problem) if k != "rows")
    return f"normalization|{torch.cuda.get_device_name(device)}|{what}"


def stored_winner(spec: NormalizationSpec, device=None) -> NormalizationSpec | None:
    """``spec`` with the plan the autotuner stored for its problem on this device, if
    any (None too if the stored plan no longer validates: tune again)."""
    from runtime import autotune

    entry = autotune.stored_entry(_tune_key(spec, device))
    if entry is None:
        return None
    try:
        return dataclasses.replace(spec, **{f: entry["plan"].get(f) for f in PLAN_FIELDS})
    except (LoweringError, TypeError, KeyError, AttributeError):
        return None


def choose(spec: NormalizationSpec, device_index: int) -> NormalizationSpec:
    """The spec a call runs: the stored winner for ``spec``'s problem (only when no plan
    field is pinned), else, under HOSTIR_ENABLE=autotune, one tuned now, else ``spec``
    (the heuristic plan)."""
    if device_index < 0 or any(getattr(spec, f) is not None for f in PLAN_FIELDS):
        return spec
    tuned = stored_winner(spec, device_index)
    if tuned is None and options().enable("autotune"):
        tuned = tune(spec, device=device_index)
    return tuned or spec


def tune_inputs(spec: NormalizationSpec, device, sets: int = 1, generator=None):
    """``sets`` fresh random input sets for ``spec`` (name -> tensor, ``y`` left out): x
    with every 7th row shifted by a large mean, the 1-D tensors random (weights near 1)."""
    names, dtypes = spec.parameter_names(), spec.parameter_dtypes()
    out = []
    for _ in range(sets):
        x = torch.randn(spec.rows, spec.hidden, device=device, generator=generator)
        x[::7] += 100.0
        t = {"x": x.to(TORCH_DTYPES[dtypes[0]])}
        for n, d in zip(names[1:-1], dtypes[1:-1]):
            v = torch.randn(spec.hidden, device=device, generator=generator)
            t[n] = (v * 0.5 + 1.0 if n == "weight" else v).to(TORCH_DTYPES[d])
        out.append(t)
    return out


def precompile(specs, arch: str) -> list:
    """Compile ``specs``' kernels for ``arch`` up front, in parallel (one thread a
    core, `jit.precompile`), into the disk kernel cache (a few hundred kernels take ~0.3 s
    each one after another: the bench's sweep; the tuner's 15-30 candidates). Kernels already
    on disk are skipped, and no pool starts when none is missing. Returns the error texts
    (None for a kernel that compiled or was there); with no disk cache to fill, or if
    the pool cannot start, nothing is compiled here and each kernel compiles on first use."""
    import os
    import sys

    from runtime import jit

    if options().disable("kernel_cache") or not specs:
        return []  # nowhere to leave them for this process
    units = [(render_normalization(s), [s.kernel_name], arch) for s in specs]
    try:
        return jit.precompile(units, workers=max(1, min(16, (os.cpu_count() or 2) - 1)))
    except Exception as e:  # noqa: BLE001
        print(f"precompile failed ({e}); compiling one by one", file=sys.stderr)
        return []


ROTATE_BYTES = 256 << 20  # input sets a timing cycles through: > 4x the 60 MB L2 of an H200


# How much faster than the heuristic's plan, in the tuner's side-by-side round, another
# plan must be to replace it. Between two runs the same pair of plans moved by up to
# 2.6% (5140: the evict-first twin 1.1% faster in the tuner's round, 1.5% slower in the
# bench's, benchmarks/results/raw/layer_norm_tune_1a2ff58.log); a win under this is
# noise that would only churn the stored plans.
TUNE_MARGIN = 0.005


def tune(spec: NormalizationSpec, *, device=None, first_reps: int = 3, finalists: int = 4,
         final_reps: int = 12, store: bool = True,
         margin: float = TUNE_MARGIN) -> NormalizationSpec:
    """Time `tune_plans` for ``spec`` on the device and return (and store) ``spec`` with
    the fastest plan. Each candidate is checked first against the float64 reference
    (relative error < 1e-2; a wrong or failing kernel never wins). A quick round (the
    median of ``first_reps`` replays of a graph of back-to-back calls, input sets
    rotated past the L2) ranks them; the ``finalists`` fastest and the heuristic's
    pick are timed again side by side in carryover-balanced rounds
    (`runtime.autotune.graph_side_by_side`), and the fastest median there wins, so the
    winner is never slower than the heuristic in the same round; it must beat the
    heuristic there by ``margin`` (`TUNE_MARGIN`), else the heuristic's plan stays. A
    candidate whose kernel spills (`spill_report`) is never run.
    HOSTIR_DUMP=autotune prints the table."""
    import statistics

    from runtime import autotune

    index = torch.cuda.current_device() if device is None else torch.device("cuda", device).index
    dev = torch.device("cuda", index)
    specs = [spec_with_plan(spec, p) for p in tune_plans(spec)]
    heuristic = specs[0]
    from runtime import jit

    arch = jit.device_arch(index)
    precompile(specs, arch)  # in parallel; each is checked below anyway
    sets = tune_inputs(spec, dev, max(2, -(-ROTATE_BYTES // spec.bytes_moved())))
    outs = [torch.empty(spec.rows, spec.hidden, device=dev,
                        dtype=TORCH_DTYPES[spec.output_dtype]) for _ in sets]
    ref = reference(spec, sets[0])
    ref_norm = torch.linalg.vector_norm(ref)
    rows, calls = [], {}
    with torch.cuda.device(index):
        for s in specs:
            try:
                spills = spill_report(s, arch)
                if spills:  # no spills, at any size: a candidate that spills never runs
                    rows.append((s, float("inf"), f"spills ({spills})"))
                    continue
                y = normalize(s, sets[0], torch.full_like(outs[0], float("nan")))
                err = float(torch.linalg.vector_norm(y.double() - ref) / ref_norm)
                if not err < 1e-2:  # nan compares False too
                    rows.append((s, float("inf"), f"wrong (relative error {err:.2e})"))
                    continue
                calls[s] = [functools.partial(normalize, s, t, o) for t, o in zip(sets, outs)]
                graph = autotune.graph_of(calls[s])
                us = statistics.median([autotune.time_replay(*graph) for _ in range(first_reps)])
                rows.append((s, us, "first round"))
            except Exception as e:  # noqa: BLE001 -- a candidate that fails just loses
                torch.cuda.synchronize()
                rows.append((s, float("inf"), f"failed: {type(e).__name__}: {e}"[:160]))
        del ref
        ranked = sorted((r for r in rows if r[1] != float("inf")), key=lambda r: r[1])
        if not ranked:
            raise RuntimeError(f"autotune {spec.kernel_name}: no candidate ran correctly: "
                               f"{rows[0][2]}")
        final = ranked[:max(1, finalists)]
        final += [r for r in ranked[max(1, finalists):] if r[0] is heuristic]
        if len(final) > 1:
            timed = autotune.graph_side_by_side(
                {i: calls[r[0]] for i, r in enumerate(final)}, final_reps)
            final = sorted(((r[0], timed[i], f"final round; first round {r[1]:.2f} us")
                            for i, r in enumerate(final)), key=lambda r: r[1])
            rows = final + [r for r in rows if not any(r[0] is f[0] for f in final)]
    best, best_us, _ = final[0]
    heuristic_us = next((us for s, us, _ in final if s is heuristic), None)
    kept = heuristic_us is not None and best is not heuristic and heuristic_us <= best_us * (1 + margin)
    if kept:
        best, best_us = heuristic, heuristic_us
    gbps = lambda us: spec.bytes_moved() / (us * 1e-6) / 1e9  # noqa: E731
    dump("autotune", "\n".join(
        [f"autotune {spec.kernel_name} rows={spec.rows} ({len(specs)} plans, "
         f"{len(final)} timed again side by side)"]
        + [f"  {s.plan.describe():<58} {us:9.2f} us {gbps(us) if us != float('inf') else 0:7.1f} GB/s"
           f"{' (heuristic)' if s is heuristic else ''} {note}" for s, us, note in rows]
        + [f"  pick: {best.plan.describe()}"
           + (f" (the heuristic's: the fastest is within {margin:.1%} of it)" if kept else "")]))
    if store:
        autotune.store_entry(_tune_key(spec, index), {
            "plan": {f: getattr(best, f) for f in PLAN_FIELDS}, "describe": best.plan.describe(),
            "us": best_us, "rows": spec.rows, "heuristic": heuristic.plan.describe(),
            "heuristic_us": heuristic_us})
        _spec.cache_clear()  # calls of this problem take the winner from now on
    return best


@functools.lru_cache(maxsize=4096)
def _prepare(spec: NormalizationSpec, device_index: int) -> _Prepared:
    import numpy as np

    kernel = _kernel(spec, device_index)
    plan = spec.plan
    grid = launch_grid(spec, kernel, torch.device("cuda", device_index))
    # a cluster kernel launches plainly (as runtime.fused's): its rows are long
    return _Prepared(kernel, (grid, 1, 1), (plan.block_threads, 1, 1),
                     plan.dynamic_shared_bytes, np.int32(spec.rows),
                     plan.cluster == 1 and dependent_launch(device_index))


_DEPENDENT: dict[int, bool] = {}


def dependent_launch(device_index: int) -> bool:
    """Whether normalization kernels launch on ``device_index`` as programmatic dependent
    launches (`runtime.jit.launch_ex`): on sm_90 and later, unless
    ``HOSTIR_DISABLE=dependent_launch``. Every generated normalization kernel begins with
    ``griddepcontrol.launch_dependents`` and ``griddepcontrol.wait`` (see
    ``dependent_launch_entry`` in lowering.kernels.normalization), so it touches no global
    memory before the kernel ahead of it on the stream has completed: the launch is as
    safe as a plain one, and the next kernel's launch overlaps this one's last rows.
    Back to back (the bench's graphs of 48 launches) that took 0.4-0.7 us a launch:
    0.91 -> 0.985 of copy bandwidth at 768, 0.888 -> 0.921 at 1600, under 1% from 4096
    up (benchmarks/results/norm_pdl_probe_nvidia-h200.json)."""
    on = _DEPENDENT.get(device_index)
    if on is None:
        on = (torch.cuda.get_device_capability(device_index)[0] >= 9
              and not options().disable("dependent_launch"))
        if on:
            from runtime import jit

            try:
                jit.launch_ex_available()
            except (OSError, AttributeError) as e:  # a driver without cuLaunchKernelEx
                dump("launch_params", f"dependent launches off: {e}")
                on = False
        _DEPENDENT[device_index] = on
    return on


def normalize(spec: NormalizationSpec, tensors: Mapping[str, torch.Tensor], out=None,
              dependent: bool | None = None):
    """Run ``spec``'s kernel; ``tensors`` maps `spec.parameter_names()` (but ``y``) to tensors.

    ``out`` (optional) receives the result and is returned; else a new tensor is.
    ``dependent``: None (default) launches as `dependent_launch` says for the device;
    False launches plainly (the bench times both); True as a programmatic dependent
    launch even under ``HOSTIR_DISABLE=dependent_launch``, on sm_90+ only (plainly
    before).
    """
    x = tensors.get("x")
    if x is None:
        raise InputMismatchError("normalization: tensor 'x' is missing")
    names, dtypes = spec.parameter_names(), spec.parameter_dtypes()
    _check(spec, tensors, names, dtypes)
    if out is None:
        out = empty_in_phase(x, TORCH_DTYPES[spec.output_dtype])
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
        if dependent is None:
            dependent = p.dependent
        elif dependent:
            dependent = torch.cuda.get_device_capability(dev)[0] >= 9
        p.kernel.launch_raw(p.grid, p.block, args, p.smem, handle, dependent)
    return out


def empty_in_phase(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An empty contiguous tensor shaped like ``x``, of ``dtype``, whose first element sits
    as many elements past a 16-byte boundary as x's does. Where x is a slice off 16 bytes
    (a batch cut from a tensor of odd width, say), its rows' 16-byte chunks and y's then
    line up, and the kernels store whole 16-byte vectors; a y at another phase is stored
    element by element (H200, RMS norm 24575 two bytes off: 0.22-0.24 of copy bandwidth).
    An ``out`` the caller passes is used as it is."""
    phase = x.data_ptr() % 16 // x.element_size()
    if phase == 0:
        return torch.empty(x.shape, dtype=dtype, device=x.device)
    spare = 16 // dtype.itemsize
    buf = torch.empty(x.numel() + spare, dtype=dtype, device=x.device)
    start = (phase - buf.data_ptr() % 16 // buf.element_size()) % spare
    return buf[start:start + x.numel()].view(x.shape)


def launch_grid(spec: NormalizationSpec, kernel, device, rows: int | None = None) -> int:
    """Blocks to launch: the row-wise kernel's one per group of rows; a cluster plan's, the
    clusters resident at once (asked of the driver) x their CTAs; the persistent
    kernel's, the SMs of ``device`` x the blocks of this compiled kernel resident on each
    (asked of the driver: ptxas may use fewer registers than the plan promised, and then
    more blocks fit), never more than there are groups of rows."""
    plan, rows = spec.plan, spec.rows if rows is None else rows
    if plan.cluster > 1:
        # a cluster kernel strides over the rows: as many clusters as the GPCs hold at once
        # (a cluster waiting for a second wave would double the time), never more than rows
        from runtime import jit

        kernel.ensure_smem(plan.dynamic_shared_bytes)  # the query counts the opt-in
        active = jit.active_clusters(kernel, plan.cluster, plan.block_threads,
                                     plan.dynamic_shared_bytes)
        cap = jit.cluster_cap(active, sm_count(device) * resident_blocks(kernel, plan),
                              plan.cluster)
        return min(rows, cap) * plan.cluster
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
        kernel.cluster = spec.plan.cluster  # compiled in: shown by the launch_params dump
    return kernel


def spill_report(spec: NormalizationSpec, arch: str = "sm_90") -> str:
    """'' when ``spec``'s kernel (and the out-of-line functions it calls: the source holds
    that one kernel) compiles for ``arch`` with no spills and no local memory; else what
    ptxas reported (a pinned block promise, ``blocks_per_sm``, may cap the registers below
    what the kernel needs)."""
    ck = compiled_kernel(spec, arch)
    spill, local = sum(ck.spill_bytes.values()), sum(ck.local_bytes.values())
    return f"{spill} B spills, {local} B local memory" if spill or local else ""


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
