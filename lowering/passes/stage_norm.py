"""Program -> program: a GEMM+ReduceScatter program that also runs the next residual add
and norm, stage by stage, as soon as each stage's rows are reduced.

In a transformer block the attention output projection (row-parallel) is followed by
``h = y + residual; n = norm(h)`` on the same sequence-sharded rows. Stage ``i``'s rows of
``y`` are final once its reduce-scatter is waited (``pipelined``) or its last partial sum
is added (``ring``); this pass launches the fused add + norm kernel on those rows right
there, so a stage's norm runs while the next stage multiplies and communicates instead
of after the whole program (with one stage there is no next stage: the norm then only
joins the program). ``pipelined`` (each stage on a worker stream of its own):

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
      LaunchKernel add_rms_norm_h4096(T8, T11, T10, T12, T14, T16) grid=(...) block=(...)
          smem=0 scalars=(rows)                   # (one line in the printed form)
      ...

``ring`` (every stage's GEMMs on stream 0, transfers on stream 1): after the stage's last
``add``, ``SetCurrentStream to Stream 1``, ``Synchronize Stream 0``, the selects
and the launch, then back to stream 0, so the next stage's GEMMs do not queue behind it.

New inputs (after the program's): the residual ``[S, rows, N]`` (the output's local
layout), the norm weight ``[N]`` and, for layer_norm with a bias, the bias ``[N]``. New
outputs (after the program's): ``n``, ``h`` ``[S, rows, N]``, then float32 ``mean``
(layer_norm) and ``rstd`` ``[S, rows]``. The kernel comes from the ``add_norm`` generator
(``runtime.fused``'s seam kernel on CUDA fp16/bf16, its torch reference elsewhere).
"""

from __future__ import annotations

import dataclasses
import math

from hostir import ir
from hostir.errors import LoweringError
from lowering.kernels.normalization.plan import DEFAULT_SM_COUNT
from lowering.kernels.seams import (FORWARD_CACHE_FLOATS, FORWARD_THREADS_PER_SM, NORM_KINDS,
                                    plan_row)

PROVENANCE = "stage_norm"


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


def _stream_at(program: ir.Program, pos: int, loop: ir.ForLoop, after: int):
    """The stream current after statement ``after`` of the stage loop (at ``pos``)."""
    current = None
    for s in ir.walk(program.body[:pos] + loop.body[:after + 1]):
        if isinstance(s, ir.SetCurrentStream):
            current = s.stream
    return current


def fuse_stage_norm(program: ir.Program, kind: str, eps: float, bias: bool = False) -> ir.Program:
    """``program`` (GEMM+ReduceScatter, output ``[S, rows, N]``) with the residual add and
    ``kind`` norm of each stage's rows launched after the stage; see the module docstring.
    ``bias``: a layer_norm bias input.

    Where each stage runs on a stream of its own (``pipelined``: stream ``i %
    numberOfStreams``), the launch follows the stage on it. Where every stage computes on
    one stream (``ring``: stream 0, its transfers on stream 1), the launch goes to the
    next pool stream after a ``Synchronize`` on the stage's, so that the next stage's
    GEMMs need not wait for it."""
    if kind not in NORM_KINDS:
        raise LoweringError(f"stage norm: kind {kind!r}: expected one of {NORM_KINDS}")
    if bias and kind != "layer_norm":
        raise LoweringError("stage norm: a bias belongs to layer_norm only")
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise LoweringError(f"stage norm: eps={eps!r}: expected a finite number > 0")
    if PROVENANCE in program.provenance.split("+"):
        raise LoweringError("stage norm: the program already runs a stage norm")
    out = program.outputs[0]
    if len(out.shape) != 3 or out.is_sharded:
        raise LoweringError(f"stage norm: output {out.name} {list(out.shape)}: expected a "
                            f"local [stages, rows, hidden] tensor")
    # the new outputs are allocated right after the output, on the stream it is allocated
    # on (the user's): the caching allocator ties a block to the stream it was allocated on
    at = next((i + 1 for i, s in enumerate(program.body)
               if isinstance(s, ir.Allocate) and s.out == out), None)
    if at is None:
        raise LoweringError(f"stage norm: output {out.name} is not allocated at the top level")
    stages, rows, hidden = out.shape
    pos, loop, slice_ = _stage_loop(program, out)
    after = _finished_at(loop, slice_.out)
    names = ir.fresh_tensor_names(program)
    full = dict(shape=out.shape, dtype=out.dtype)
    residual = ir.Tensor(next(names), **full)
    weight = ir.Tensor(next(names), (hidden,), out.dtype)
    bias_t = ir.Tensor(next(names), (hidden,), out.dtype) if bias else None
    normed, h = ir.Tensor(next(names), **full), ir.Tensor(next(names), **full)
    stats = [ir.Tensor(next(names), (stages, rows), "float32")
             for _ in range(2 if kind == "layer_norm" else 1)]
    index = ir.Var(loop.index.name)
    selects, stage = [], {}
    for t in (residual, normed, h, *stats):
        s = ir.Select(ir.select_type(next(names), t, 0), t, 0, index)
        selects.append(s)
        stage[t.name] = s.out
    name = f"add_{kind}_h{hidden}"
    plan = plan_row(hidden, alignment=16, cache_floats=FORWARD_CACHE_FLOATS)
    grid = max(1, min(-(-rows // plan.rows_per_block),
                      DEFAULT_SM_COUNT * max(1, FORWARD_THREADS_PER_SM // plan.block_threads)))
    args = (slice_.out, stage[residual.name], weight, *((bias_t,) if bias else ()),
            stage[normed.name], stage[h.name], *(stage[t.name] for t in stats))
    launch = (*selects, ir.LaunchKernel(name, args, (grid, 1, 1), plan.block, 0, (rows,)))
    current = _stream_at(program, pos, loop, after)
    if (isinstance(current, ir.PoolStream) and loop.index.name not in ir.free_vars(current.index)
            and program.number_of_streams > 1):
        side = ir.PoolStream(ir.Const(current.index.value + 1)
                             if isinstance(current.index, ir.Const)
                             else ir.BinOp("+", current.index, ir.Const(1)))
        launch = (ir.SetCurrentStream(side), ir.Synchronize(current), *launch,
                  ir.SetCurrentStream(current))
    body = loop.body[:after + 1] + launch + loop.body[after + 1:]
    allocs = tuple(ir.Allocate(t) for t in (normed, h, *stats))
    body = program.body[:pos] + (dataclasses.replace(loop, body=body),) + program.body[pos + 1:]
    new_body = body[:at] + allocs + body[at:]
    kernel = ir.KernelDef(name, "add_norm", (("kind", kind), ("hidden", hidden),
                                              ("bias", bias), ("eps", float(eps))))
    inputs = program.inputs + (residual, weight) + ((bias_t,) if bias else ())
    return dataclasses.replace(program, inputs=inputs,
                               outputs=program.outputs + (normed, h, *stats), body=new_body,
                               kernels=program.kernels + (kernel,),
                               provenance="+".join(filter(None, (program.provenance, PROVENANCE))))
