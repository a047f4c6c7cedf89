"""Generated kernels behind ``LaunchKernel``, and the implementation behind ``Matmul``.

A program's ``KernelDef`` names a generator and its parameters; ``launcher`` returns a
function that launches it with the statement's tensors, grid, block, shared memory and
int scalars on a given stream. ``normalization`` renders the source again and compiles it
through the kernel cache (``runtime.jit``: NVRTC, memory and disk) there; ``add_norm``
hands its tensors to ``runtime.fused``, which compiles its seam kernel on first use
(and runs the torch reference off CUDA).

``MatmulChoice`` decides, per (M, N, K, dtype), whether a ``Matmul`` statement runs on
cuBLAS (torch) or on the generated split-K kernel (``runtime.matmul``): ``cublas`` and
``codegen`` force one; ``auto`` uses what ``measure`` found faster for that shape, timed
in ``Interpreter.prepare`` (never inside a program, where timing would block the host),
and cuBLAS for shapes not measured.
"""

from __future__ import annotations

import numpy as np
import torch

from hostir import ir
from hostir.errors import ExecutionError, InputMismatchError
from hostir.options import dump
from hostir.printer import format_statement


def _normalization(defn: ir.KernelDef, device: torch.device):
    from lowering.kernels.normalization import spec_from_params
    from runtime.normalization import _kernel, dependent_launch, launch_grid

    spec = spec_from_params(defn.params)
    plan = spec.plan
    major, minor = torch.cuda.get_device_capability(device)
    if plan.cluster > 1 and major < 9:
        raise ExecutionError(
            f"kernel {defn.name}: its plan splits each row over a cluster of {plan.cluster} "
            f"CTAs, which this GPU (sm_{major}{minor}) lacks; lower it with a "
            "normalization_plan that pins cluster=1 or envelope=False")
    kernel = _kernel(spec, device.index or 0)
    # a cluster kernel launches plainly (see runtime.normalization._prepare)
    dependent = plan.cluster == 1 and dependent_launch(device.index or 0)

    def launch(tensors, grid, block, smem, scalars, stream):
        for name, t in zip(spec.parameter_names(), tensors):
            if t.data_ptr() % spec.alignment:
                raise InputMismatchError(
                    f"kernel {defn.name}: tensor {name} is aligned to less than the "
                    f"{spec.alignment} bytes the kernel was generated for")
        args = tuple(np.uint64(t.data_ptr()) for t in tensors)
        args += tuple(np.int32(v) for v in scalars)
        if ((plan.persistent or plan.cluster > 1)
                and tuple(grid) == (plan.grid(scalars[0]), 1, 1)):
            # the lowering sized a persistent grid (or a cluster plan's) for
            # DEFAULT_SM_COUNT SMs; any grid is correct (the kernel loops over rows); this
            # device's SMs and the blocks (clusters) of the compiled kernel it holds fill it
            grid = (launch_grid(spec, kernel, device, scalars[0]), 1, 1)
        # dependent: see runtime.normalization.dependent_launch
        kernel.launch(tuple(grid), tuple(block), args, smem, stream, dependent)

    return launch


def _add_norm(defn: ir.KernelDef, device: torch.device):
    """The residual add + norm of ``lowering.passes.stage_norm``: args ``(x, residual,
    weight[, bias], y, h[, mean], rstd)``, ``scalars=(rows,)``. ``runtime.fused`` runs it:
    its seam kernel for CUDA fp16/bf16 tensors (the grid sized for this device's SMs: the
    persistent kernel loops over row groups, so the printed nominal grid is not needed),
    its torch reference elsewhere (CPU ranks, float32), on the statement's stream."""
    from runtime import fused

    kind, eps = defn.param("kind"), defn.param("eps")
    bias = bool(defn.param("bias", False))
    if kind not in fused.NORM_KINDS or not isinstance(eps, float):
        raise ExecutionError(f"kernel {defn.name}: add_norm needs kind in {fused.NORM_KINDS} "
                             f"and a float eps, got kind={kind!r}, eps={eps!r}")
    layer = kind == "layer_norm"
    count = 6 + bias + layer  # x, residual, weight, (bias,) y, h, (mean,) rstd

    def launch(tensors, grid, block, smem, scalars, stream):
        if len(tensors) != count:
            raise ExecutionError(f"kernel {defn.name}: expected {count} tensors (x, residual, "
                                 f"weight, {'bias, ' if bias else ''}y, h, "
                                 f"{'mean, ' if layer else ''}rstd), got {len(tensors)}")
        x, residual, weight, *rest = tensors
        b = rest.pop(0) if bias else None
        y, h, *stats = rest
        mean, rstd = (stats if layer else (None, stats[0]))
        # runtime.fused launches on torch's current stream, which is ``stream``: the CUDA
        # backend's SetCurrentStream makes a stream torch's current one as it makes it the
        # program's (a second switch here would cost host time every stage)
        fused.add_norm_forward(x, residual, weight, b, eps, kind, out=(y, h, mean, rstd))

    return launch


GENERATORS = {"normalization": _normalization, "add_norm": _add_norm}
ANY_DEVICE = {"add_norm"}  # generators with a torch path off CUDA


def launcher(defn: ir.KernelDef, device: torch.device):
    """Compile (or find in the cache) and load ``defn``; returns its launch function."""
    make = GENERATORS.get(defn.generator)
    if make is None:
        raise ExecutionError(f"kernel {defn.name}: unknown generator {defn.generator!r}; "
                             f"expected one of {sorted(GENERATORS)}")
    if device.type != "cuda" and defn.generator not in ANY_DEVICE:
        raise ExecutionError(f"kernel {defn.name}: generated kernels run on CUDA devices only")
    return make(defn, device)


class MatmulChoice:
    """cuBLAS or the generated kernel, per shape (see the module docstring)."""

    MODES = ("cublas", "codegen", "auto")

    def __init__(self, mode: str = "cublas", program: ir.Program | None = None,
                 backend_name: str = "cuda"):
        """``program``: refuse now, before anything runs, a ``codegen`` choice its matmuls
        cannot take (not after the first collective, where a refusal on one rank hangs
        the others)."""
        if mode not in self.MODES:
            raise ExecutionError(f"matmul implementation {mode!r}: expected one of {self.MODES}")
        self.mode = mode
        self.measured: dict[tuple, str] = {}
        if mode == "codegen" and program is not None:
            for s in ir.walk(program.body):
                if isinstance(s, ir.Matmul) and s.epilogue is None and (backend_name != "cuda"
                                                 or s.a.dtype not in ("float16", "bfloat16")):
                    raise ExecutionError(
                        f"`{format_statement(s)}`: --matmul codegen runs fp16/bf16 matmuls on "
                        f"CUDA, got {s.a.dtype} on the {backend_name} backend")

    def use_codegen(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        if self.mode == "cublas" or not a.is_cuda or a.dtype not in (torch.float16, torch.bfloat16):
            return False
        return self.mode == "codegen" or self.measured.get(_key(a, b)) == "codegen"

    def run(self, a2: torch.Tensor, b: torch.Tensor, out2: torch.Tensor) -> None:
        """``out2 = a2 @ b``; ``b`` contiguous or a transposed view (``w.t()``: the
        generated kernel's TN layout reads its memory as it is, so does cuBLAS)."""
        if self.use_codegen(a2, b):
            from runtime.matmul import matmul

            # "codegen" (or a measured win) means the generated kernel: no cuBLAS fallback
            if b.is_contiguous():
                matmul(a2, b, layout="NN", out=out2, cublas=False)
            else:
                matmul(a2, b.t(), layout="TN", out=out2, cublas=False)
        else:
            torch.mm(a2, b, out=out2)

    def measure(self, shapes, dtype: torch.dtype, device: torch.device, reps: int = 5) -> None:
        """Time cuBLAS and the generated kernel on fresh random operands of each shape
        (M, N, K) and remember the faster (``auto``). Synchronizes: call it from prepare."""
        if self.mode != "auto" or device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
            return
        from runtime.timing import time_us
        from runtime.matmul import matmul

        for m, n, k in sorted(set(shapes)):
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            out = torch.empty(m, n, device=device, dtype=dtype)
            times = {}
            for name, fn in (("cublas", lambda: torch.mm(a, b, out=out)),
                             ("codegen", lambda: matmul(a, b, layout="NN", out=out,
                                                        cublas=False))):
                try:
                    times[name] = time_us(fn, warmup=1, reps=reps)
                except Exception as e:  # noqa: BLE001 - a shape the generator refuses
                    dump("autotune", f"matmul {m}x{n}x{k}: {name} unavailable ({e})")
            best = min(times, key=times.get) if times else "cublas"
            self.measured[(m, n, k, dtype)] = best
            dump("autotune", f"matmul {m}x{n}x{k} {dtype}: "
                             + ", ".join(f"{k_} {v:.1f} us" for k_, v in times.items())
                             + f" -> {best}")


def _key(a: torch.Tensor, b: torch.Tensor) -> tuple:
    """What ``measure`` timed: (M, N, K, dtype) of a contiguous B. A transposed B is
    another kernel (layout TN), never measured: ``auto`` gives it to cuBLAS."""
    return (a.shape[0], b.shape[1], a.shape[1], a.dtype) + (() if b.is_contiguous() else ("TN",))


def matmul_shapes(program: ir.Program):
    """(M, N, K) of every Matmul statement without an epilogue (those run on cuBLASLt),
    with batch axes folded into M."""
    for s in ir.walk(program.body):
        if isinstance(s, ir.Matmul) and s.epilogue is None:
            a = s.a.local_shape
            m = 1
            for n in a[:-1]:
                m *= n
            yield (m, s.b.local_shape[1], a[-1])


def matmul_epilogue(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, epilogue: str,
                    aux: torch.Tensor) -> None:
    """``out = epilogue(a @ b)`` with its ``aux`` (see ``ir.Matmul``): one cuBLASLt GEMM
    when it can take the operands, else torch ops computing the same (tanh GELU)."""
    from runtime import cublaslt

    if a.is_cuda and a.is_contiguous() and out.is_contiguous() and aux.is_contiguous():
        a2, out2, aux2 = (a.reshape(-1, a.shape[-1]), out.view(-1, out.shape[-1]),
                          aux.view(-1, aux.shape[-1]))
        if cublaslt.unsupported(a2, b, out2, epilogue, aux2) is None:
            try:
                cublaslt.matmul(a2, b, out2, epilogue, aux2)
                return
            except cublaslt.NoAlgorithmError as e:  # correct but slower: say so, once
                if str(e) not in _WARNED:
                    _WARNED.add(str(e))
                    import warnings

                    warnings.warn(f"{e}; running the epilogue as torch ops", stacklevel=2)
    cublaslt.reference(a, b, out, epilogue, aux)


_WARNED: set = set()
