"""Fusion -> host program: a row-wise normalization with its fused pointwise ops becomes
one generated kernel (persistent, or row-wise for rows one warp covers), launched by a
``LaunchKernel`` on the current stream.

The fusion is a chain from one input ``x[rows, hidden]`` (fp16 or bf16):

    prologue:  add(v, b) with b[hidden] broadcast over rows; cast(v, dtype)
    norm:      layer_norm(v, weight?, bias?, eps) | rms_norm(v, weight?, eps)
    epilogue:  add / cast as above

Math is fp32 in the kernel; an ``add`` whose result is half (fp16 + fp16) rounds to half,
as ``half(float(x) + float(b))`` does, and a ``cast`` to half rounds; casts to float32 are
free. A cast to half at the very end is the output's dtype. Example, the fusion of
nvFuser's report:

    t9 = add(x, b0)                  # fp16: half(float(x) + float(b0))
    t13 = add(cast(t9, float32), b1)
    y = cast(layer_norm(t13, w, b2), float16)

The program:

    T9 = ALLOCATE(float16[8192, 5140])
    LaunchKernel hostir_layer_norm_5140_...(T0, T1, T2, T3, T4, T9) grid=(...) block=(...) smem=0 scalars=(8192)
"""

from __future__ import annotations

import dataclasses

from hostir import ir
from hostir.errors import LoweringError
from lowering.fusion import Fusion
from lowering.kernels.normalization import (
    PLAN_FIELDS, AddBroadcast, Cast, LayerNorm, NormalizationSpec, RmsNorm, spec_params,
)

NORM_OPS = ("layer_norm", "rms_norm")
HALF = ("float16", "bfloat16")


def is_normalization(fusion: Fusion) -> bool:
    return any(op.kind in NORM_OPS for op in fusion.ops)


def _broadcast_operand(op, fusion: Fusion, hidden: int):
    b = op.inputs[1]
    if b not in fusion.inputs or b.shape != [hidden]:
        raise LoweringError(
            f"add {op.output.name}: operand {b.name} of shape {b.shape} must be a fusion input "
            f"of shape [{hidden}] (broadcast over rows)")
    return b


def _pointwise(op, fusion: Fusion, hidden: int, tensors: dict):
    """The spec ops of one add/cast of the chain."""
    if op.kind == "cast":
        dtype = op.attr("dtype")
        return [Cast(dtype)] if dtype in HALF else []
    if op.kind == "add":
        b = _broadcast_operand(op, fusion, hidden)
        tensors[b.name] = b
        out = [AddBroadcast(b.dtype, b.name)]
        return out + ([Cast(op.output.dtype)] if op.output.dtype in HALF else [])
    raise LoweringError(f"{op.kind} {op.output.name}: not a pointwise op this pass fuses; "
                        "expected add or cast")


def lower_normalization(fusion: Fusion, plan=None) -> ir.Program:
    """``plan`` (optional): called with the fusion's `NormalizationSpec` (the heuristic's
    plan), returns the spec to generate, e.g. with the autotuner's stored winner for a
    device pinned: ``functools.partial(runtime.normalization.choose, device_index=0)``.
    The pinned plan goes into the program's kernel table, so the printed program names
    the plan that runs. It must keep the problem (everything but the plan fields)."""
    if not isinstance(fusion, Fusion):
        raise LoweringError(f"expected a Fusion, got {type(fusion).__name__}")
    if len(fusion.outputs) != 1:
        raise LoweringError(f"normalization fusion: expected one output, got {len(fusion.outputs)}")
    x = fusion.ops[0].inputs[0] if fusion.ops else None
    if x is None or x not in fusion.inputs or len(x.shape) != 2 or x.dtype not in HALF:
        raise LoweringError(
            "normalization fusion: expected the first op to read an input x[rows, hidden] of "
            f"float16 or bfloat16, got {x!r}")
    rows, hidden = x.shape
    if any(p is not ir.ParallelType.Serial for p in x.parallel):
        raise LoweringError(f"tensor {x.name}: a normalization fusion runs on one device; "
                            f"expected no DIDx or Stream axis, got {[p.value for p in x.parallel]}")
    tensors = {"x": x}
    prologue, epilogue, norm, current = [], [], None, x
    for op in fusion.ops:
        if op.inputs[0] is not current:
            raise LoweringError(
                f"{op.kind} {op.output.name}: expected it to read {current.name}, the result "
                f"of the op before it (a normalization fusion is one chain)")
        if op.kind in NORM_OPS:
            if norm is not None:
                raise LoweringError(f"{op.kind} {op.output.name}: expected one norm per fusion")
            has_w, has_b = op.attr("weight"), op.attr("bias")
            w = op.inputs[1] if has_w else None
            b = op.inputs[1 + bool(has_w)] if has_b else None
            for t in (w, b):
                if t is not None and t not in fusion.inputs:
                    raise LoweringError(f"{op.kind}: {t.name} must be a fusion input")
            if w is not None:
                tensors["weight"] = w
            if b is not None:
                tensors["bias"] = b
            norm = (LayerNorm(op.attr("eps"), bool(has_w), bool(has_b),
                              w.dtype if w else "float16", b.dtype if b else "float16")
                    if op.kind == "layer_norm" else
                    RmsNorm(op.attr("eps"), bool(has_w), w.dtype if w else "float16"))
        else:
            (epilogue if norm is not None else prologue).extend(
                _pointwise(op, fusion, hidden, tensors))
        current = op.output
    if norm is None:
        raise LoweringError("normalization fusion: expected a layer_norm or rms_norm op")
    if current is not fusion.outputs[0]:
        raise LoweringError(f"normalization fusion: the chain ends at {current.name}, "
                            f"expected the fusion output {fusion.outputs[0].name}")
    out_dtype = current.dtype
    if epilogue and isinstance(epilogue[-1], Cast):  # the store rounds to the output's dtype
        epilogue.pop()
    spec = NormalizationSpec(rows, hidden, norm, x.dtype, out_dtype, tuple(prologue),
                             tuple(epilogue))
    if plan is not None:
        chosen = plan(spec)
        unpinned = {f: None for f in PLAN_FIELDS}
        if (not isinstance(chosen, NormalizationSpec)
                or dataclasses.replace(chosen, **unpinned) != spec):
            raise LoweringError(
                f"normalization plan chooser: expected {spec.kernel_name}'s spec with plan "
                f"fields ({', '.join(PLAN_FIELDS)}) pinned at most, got {chosen!r}")
        spec = chosen
    ins = tuple(ir.Tensor(t.name, tuple(t.shape), t.dtype) for t in fusion.inputs)
    by_name = {t.name: t for t in ins}
    y = ir.Tensor(current.name, (rows, hidden), out_dtype)
    args = tuple(y if pname == "y" else by_name[tensors[pname].name]
                 for pname in spec.parameter_names())
    plan = spec.plan
    kernel = ir.KernelDef(spec.kernel_name, "normalization", spec_params(spec))
    body = (
        ir.Allocate(y),
        # the persistent kernel (and a plan splitting rows over clusters) loops over
        # rows, so this grid (resident blocks on DEFAULT_SM_COUNT SMs, an H100/H200) is
        # correct on any device that runs it; the launcher re-sizes it to the device
        # (runtime.kernels). The row-wise kernel has a block per group of rows anywhere.
        ir.LaunchKernel(spec.kernel_name, args, (plan.grid(rows), 1, 1),
                        (plan.block_threads, 1, 1), plan.dynamic_shared_bytes, (rows,)),
    )
    return ir.Program(ins, (y,), body, 1, provenance="lower_normalization", kernels=(kernel,))
