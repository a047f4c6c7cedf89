"""Program -> program: a GEMM+ReduceScatter program that also runs the next residual add
and norm, stage by stage, as soon as each stage's rows are reduced.

In a transformer block the attention output projection (row-parallel) is followed by
``h = y + residual; n = norm(h)`` on the same sequence-sharded rows. Stage ``i``'s rows of
``y`` are final once its reduce-scatter is waited (``pipelined``) or its last partial sum
is added (``ring``); this pass launches the fused add + norm kernel on those rows right
there, on the stream that finished them, so a stage's norm runs while the next stage
multiplies and communicates instead of after the whole program:

    FOR i in range(0, S):
      SetCurrentStream to Stream (i % numberOfStreams)
      ...
      T8 = select(T2, axis=0, index=i)
      C0 = Communication(ReduceScatter, team=[0, 1], in=T7, out=T8, op=sum)
      Wait C0
      T11 = select(T9, axis=0, index=i)           # residual rows of stage i
      T12 = select(T13, axis=0, index=i)          # normalized output
      T14 = select(T15, axis=0, index=i)          # h = y + residual, the new stream
      T16 = select(T17, axis=0, index=i)          # rstd (and mean, for layer_norm)
      LaunchKernel add_rms_norm_h4096(T8, T11, T10, T12, T14, T16) grid=(...) block=(...) smem=0 scalars=(rows)
      ...

New inputs (after the program's): the residual ``[S, rows, N]`` (the output's local
layout), the norm weight ``[N]`` and, for layer_norm with a bias, the bias ``[N]``. New
outputs (after the program's): ``n``, ``h`` ``[S, rows, N]``, then float32 ``mean``
(layer_norm) and ``rstd`` ``[S, rows]``. The kernel comes from the ``add_norm`` generator
(``runtime.fused``'s seam kernel on CUDA fp16/bf16, its torch reference elsewhere).
"""

from __future__ import annotations

import dataclasses
import re

from hostir import ir
from hostir.errors import LoweringError
from lowering.kernels.normalization.plan import DEFAULT_SM_COUNT
from lowering.kernels.seams import FORWARD_CACHE_FLOATS, NORM_KINDS, plan_row

# The runtime's persistent row grid holds this many threads an SM at most
# (``runtime.fused.FORWARD_THREADS_PER_SM``); here only for the printed nominal grid.
_THREADS_PER_SM = 2048


def _fresh_names(program: ir.Program):
    """Tensor names ``T<n>`` not used by the program, in increasing order."""
    used = [int(m.group(1)) for t in _tensors(program)
            for m in [re.fullmatch(r"T(\d+)", t.name)] if m]
    n = max(used, default=-1)
    while True:
        n += 1
        yield f"T{n}"


def _tensors(program: ir.Program):
    yield from program.inputs
    for s in ir.walk(program.body):
        for value in (getattr(s, f, None) for f in getattr(s, "__slots__", ())):
            for v in (value if isinstance(value, tuple) else (value,)):
                if isinstance(v, ir.Tensor):
                    yield v


def _stage_loop(program: ir.Program, out: ir.Tensor):
    """(position in the body, the loop, the select of the output's stage slice)."""
    for pos, s in enumerate(program.body):
        if not isinstance(s, ir.ForLoop):
            continue
        for t in s.body:
            if (isinstance(t, ir.Select) and t.input == out and t.axis == 0
                    and t.index == ir.Var(s.index.name)):
                return pos, s, t
    raise LoweringError(f"stage norm: no FOR loop selects the stages of output {out.name}; "
                        f"expected a GEMM+ReduceScatter program")


def _finished_at(loop: ir.ForLoop, slice_: ir.Tensor) -> int:
    """Position in the loop body after which the stage slice holds its final rows: the
    last top-level statement that writes it (a matmul or add) or waits on the
    communication that writes it."""
    comms = {s.handle.name: s for s in ir.walk(loop.body) if isinstance(s, ir.Communication)}
    last = None
    for pos, s in enumerate(loop.body):
        if isinstance(s, (ir.Matmul, ir.Add)) and s.out == slice_:
            last = pos
        elif isinstance(s, ir.Wait) and comms.get(s.handle.name) is not None \
                and comms[s.handle.name].output == slice_:
            last = pos
    if last is None:
        raise LoweringError(f"stage norm: nothing in the stage loop writes {slice_.name}")
    return last


def fuse_stage_norm(program: ir.Program, kind: str, eps: float, bias: bool = False) -> ir.Program:
    """``program`` (GEMM+ReduceScatter, output ``[S, rows, N]``) with the residual add and
    ``kind`` norm of each stage's rows launched after the stage; see the module docstring.
    ``bias``: a layer_norm bias input."""
    if kind not in NORM_KINDS:
        raise LoweringError(f"stage norm: kind {kind!r}: expected one of {NORM_KINDS}")
    if bias and kind != "layer_norm":
        raise LoweringError("stage norm: a bias belongs to layer_norm only")
    out = program.outputs[0]
    if len(out.shape) != 3 or out.is_sharded:
        raise LoweringError(f"stage norm: output {out.name} {list(out.shape)}: expected a "
                            f"local [stages, rows, hidden] tensor")
    stages, rows, hidden = out.shape
    if not any(isinstance(s, ir.Allocate) and s.out == out for s in program.body):
        raise LoweringError(f"stage norm: output {out.name} is not allocated at the top level")
    pos, loop, slice_ = _stage_loop(program, out)
    after = _finished_at(loop, slice_.out)
    names = _fresh_names(program)
    full = dict(shape=out.shape, dtype=out.dtype)
    residual = ir.Tensor(next(names), **full)
    weight = ir.Tensor(next(names), (hidden,), out.dtype)
    bias_t = ir.Tensor(next(names), (hidden,), out.dtype) if bias else None
    y, h = ir.Tensor(next(names), **full), ir.Tensor(next(names), **full)
    stats = [ir.Tensor(next(names), (stages, rows), "float32")
             for _ in range(2 if kind == "layer_norm" else 1)]
    index = ir.Var(loop.index.name)
    selects, stage = [], {}
    for t in (residual, y, h, *stats):
        s = ir.Select(ir.select_type(next(names), t, 0), t, 0, index)
        selects.append(s)
        stage[t.name] = s.out
    name = f"add_{kind}_h{hidden}"
    plan = plan_row(hidden, 16, FORWARD_CACHE_FLOATS)
    grid = max(1, min(-(-rows // plan.rows_per_block),
                      DEFAULT_SM_COUNT * max(1, _THREADS_PER_SM // plan.block_threads)))
    args = (slice_.out, stage[residual.name], weight, *((bias_t,) if bias else ()),
            stage[y.name], stage[h.name], *(stage[t.name] for t in stats))
    launch = ir.LaunchKernel(name, args, (grid, 1, 1), plan.block, 0, (rows,))
    body = loop.body[:after + 1] + tuple(selects) + (launch,) + loop.body[after + 1:]
    # allocated beside the output, on the stream it is allocated on (the user's): the
    # caching allocator ties a block to the stream it was allocated on
    at = next(i for i, s in enumerate(program.body)
              if isinstance(s, ir.Allocate) and s.out == out) + 1
    allocs = tuple(ir.Allocate(t) for t in (y, h, *stats))
    body = program.body[:pos] + (dataclasses.replace(loop, body=body),) + program.body[pos + 1:]
    new_body = body[:at] + allocs + body[at:]
    kernel = ir.KernelDef(name, "add_norm", (("kind", kind), ("hidden", hidden),
                                              ("bias", bias), ("eps", float(eps))))
    inputs = program.inputs + (residual, weight) + ((bias_t,) if bias else ())
    return dataclasses.replace(program, inputs=inputs, outputs=program.outputs + (y, h, *stats),
                               body=new_body, kernels=program.kernels + (kernel,),
                               provenance=f"{program.provenance}+stage_norm".lstrip("+"))
