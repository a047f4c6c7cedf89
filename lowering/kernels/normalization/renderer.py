"""The normalization kernels' renderers: a spec and its plan -> CUDA C++ source.

`NormalizationRenderer` writes the row-wise kernel (``param_cache="none"``),
`PersistentRenderer` the persistent one; both fill the tables of `templates`.
`render_normalization` picks the one the plan asks for.
"""

from __future__ import annotations

import dataclasses

from hostir.errors import LoweringError
from lowering.kernels import render
from lowering.kernels.normalization.plan import LaunchPlan
from lowering.kernels.normalization.spec import (
    DTYPE_BYTES, AddBroadcast, Cast, LayerNorm, NormalizationSpec, PointwiseOp,
)
from lowering.kernels.normalization.templates import (
    CUDA_TYPES, ENVELOPE_SNIPPETS, FROM_FLOAT, L2_HINT_LEVELS, ROW_COPY_BODIES, SHARED_ROW_SNIPPETS,
    SHORT_NAMES, SNIPPETS, TO_FLOAT,
)
from lowering.kernels.seams_templates import STAGING

# The fields of a LaunchPlan that switch how its kernel is written or launched, not
# its geometry: `render_normalization` takes a plan that differs from the spec's in
# these only.
SWITCH_FIELDS = ("packed_head", "lean_addresses", "balanced_grid")


def tail_tensors(spec: NormalizationSpec) -> list[tuple[str, str]]:
    """(name, dtype) of the 1-D tensors read after the reductions: weight, bias and the
    epilogue's (both kernel families)."""
    loads = []
    if spec.norm.weight:
        loads.append(("weight", spec.norm.weight_dtype))
    if isinstance(spec.norm, LayerNorm) and spec.norm.bias:
        loads.append(("bias", spec.norm.bias_dtype))
    return loads + [(op.name, op.dtype) for op in spec.epilogue if isinstance(op, AddBroadcast)]


def kernel_params(spec: NormalizationSpec) -> list[str]:
    """The kernel's tensor parameter declarations, in argument order (every family)."""
    names, dtypes = spec.parameter_names(), spec.parameter_dtypes()
    params = [SNIPPETS["param_in"].format(t=CUDA_TYPES[d], name=n)
              for n, d in zip(names[:-1], dtypes[:-1])]
    params.append(SNIPPETS["param_out"].format(t=CUDA_TYPES[dtypes[-1]]))
    return params


def row_reduction(plan: LaunchPlan) -> tuple[str, str, list[str]]:
    """The row-wise kernels' sums over a row's threads: the ``row_sum`` helper, the
    declaration of its shared partials (none where one warp holds the row) and the
    partials argument of the first and the second reduction."""
    if plan.warps_per_row == 1:
        return SNIPPETS["row_sum_warp"].format(), "", ["nullptr", "nullptr"]
    # Two buffers, one per reduction: the variance's partials may be written while a
    # slower warp still reads the mean's, and the next row's mean only after every warp
    # has passed the variance barrier, so no third barrier is needed.
    return (SNIPPETS["row_sum_block"].format(threads_per_row=plan.threads_per_row,
                                             warps_per_row=plan.warps_per_row),
            SNIPPETS["partials_shared"].format(rows_per_block=plan.rows_per_block,
                                               warps_per_row=plan.warps_per_row),
            ["partials[0][row_in_block]", "partials[1][row_in_block]"])


class NormalizationRenderer:
    """Fills `SNIPPETS` for one spec; the only place that knows the kernel's text."""

    def __init__(self, spec: NormalizationSpec, plan: LaunchPlan | None = None):
        self.spec = spec
        self.plan = plan or spec.plan
        self.out: list[str] = []

    @property
    def lean(self) -> bool:
        """Whether x and y are addressed from per-row pointers (``lean_addresses``)."""
        return self.plan.lean_addresses and self.plan.param_cache != "global"

    def emit(self, key: str, **fields) -> None:
        self.out.append(SNIPPETS[key].format(**fields))

    def render(self) -> str:
        s, p = self.spec, self.plan
        row_sum, shared, _ = row_reduction(p)
        self.out.append(row_sum)
        params = kernel_params(s)
        vectors = -(-s.hidden // p.vector_width)
        self.emit(
            "kernel_open", name=s.kernel_name, params=", ".join(params), block_threads=p.block_threads,
            min_blocks=p.min_blocks_per_sm,
            vec=p.vector_width, batch=p.batch, threads_per_row=p.threads_per_row,
            rows_per_block=p.rows_per_block, hidden=s.hidden, vectors=vectors,
            full_batches=vectors // p.threads_per_row, shared=shared,
            row_pointers=(SNIPPETS["x_row"].format(t=CUDA_TYPES[s.input_dtype])
                          + SNIPPETS["y_row"].format(t=CUDA_TYPES[s.output_dtype])
                          if self.lean else ""),
        )
        self._load_and_prologue()
        self._statistics()
        self._normalize_and_store()
        self.emit("kernel_close")
        # __launch_bounds__ carries a min-blocks count here (see LaunchPlan), so the
        # signature is our snippet, not Renderer.kernel's.
        return render.Renderer().source(["convert"], SNIPPETS["preamble"].format(),
                                        SNIPPETS["val_fp32"].format(), "".join(self.out))

    def _packed_lead(self) -> int:
        """How many leading (AddBroadcast, Cast) pairs of the prologue run on 16-bit
        pairs (``LaunchPlan.packed_head``): each adds a tensor of x's 16-bit dtype and
        casts back to it, so the 16-bit add gives the same bits; x in 16 bits, two lanes
        at least."""
        s = self.spec
        if not self.plan.packed_head or DTYPE_BYTES[s.input_dtype] != 2 or self.plan.vector_width < 2:
            return 0
        ops, lead = s.prologue, 0
        while (2 * lead + 1 < len(ops) and isinstance(ops[2 * lead], AddBroadcast)
               and isinstance(ops[2 * lead + 1], Cast)
               and ops[2 * lead].dtype == ops[2 * lead + 1].dtype == s.input_dtype):
            lead += 1
        return lead

    def _packed_head(self, x: str) -> tuple[int, str]:
        """Emit the `_packed_lead` pairs as 16-bit pair adds on ``h``, a copy of the
        vector ``x`` (padded slots: 0 + 0); (the pairs done, what holds x after them)."""
        s = self.spec
        lead = self._packed_lead()
        if not lead:
            return 0, x
        self.emit("head_copy", t=CUDA_TYPES[s.input_dtype], x=x)
        for op in s.prologue[:2 * lead:2]:
            self.emit("head_add2", short=SHORT_NAMES[s.input_dtype], name=op.name)
        return lead, "h"

    def _load_and_prologue(self) -> None:
        s = self.spec
        self.emit("batch_loop_open")
        self.emit("load_x_lean" if self.lean else "load_x", t=CUDA_TYPES[s.input_dtype])
        adds = [op for op in s.prologue if isinstance(op, AddBroadcast)]
        for op in adds:
            self.emit("load_param", t=CUDA_TYPES[op.dtype], name=op.name)
        lead, x = self._packed_head("v_x")
        self.emit("element_loop_open")
        self.emit("first_value", value=TO_FLOAT[s.input_dtype].format(x + ".e[e]"))
        for op in s.prologue[2 * lead:]:
            self._pointwise(op, guard="ok")
        self.emit("keep")
        self.emit("loop_close")
        self.emit("batch_loop_close")

    def _pointwise(self, op: PointwiseOp, guard: str | None = None) -> None:
        if isinstance(op, AddBroadcast):
            value = TO_FLOAT[op.dtype].format(f"v_{op.name}.e[e]")
            # padded slots must stay exactly 0 for the sums: add only where loaded
            self.emit("add", value=f"({guard} ? {value} : 0.f)" if guard else value)
        else:
            self.emit("cast", value=TO_FLOAT[op.dtype].format(FROM_FLOAT[op.dtype].format("a")))

    def _statistics(self) -> None:
        s, p = self.spec, self.plan
        part = row_reduction(p)[2]
        self.emit("sum_open")
        eps = repr(float(s.norm.eps))
        if isinstance(s.norm, LayerNorm):
            self.emit("sum_value")
            self.emit(
                "layer_norm_stats", partials0=part[0], partials1=part[1], eps=eps,
                sum_centered=SNIPPETS["sum_centered"].format(),
            )
        else:
            self.emit("sum_squares")
            self.emit("rms_norm_stats", partials0=part[0], eps=eps)

    def _normalize_and_store_tail(self) -> None:
        """Per element: normalize, weight, bias, the epilogue ops, then store the vector
        (the 1-D tensors' vectors ``v_<name>`` are in scope, however they were loaded)."""
        s = self.spec
        self.emit("out_decl", t=CUDA_TYPES[s.output_dtype])
        self.emit("element_loop_open")
        self.emit("normalize")
        if s.norm.weight:
            self.emit("mul", value=TO_FLOAT[s.norm.weight_dtype].format("v_weight.e[e]"))
        if isinstance(s.norm, LayerNorm) and s.norm.bias:
            self.emit("add", value=TO_FLOAT[s.norm.bias_dtype].format("v_bias.e[e]"))
        for op in s.epilogue:
            self._pointwise(op)
        self.emit("out_assign", value=FROM_FLOAT[s.output_dtype].format("a"))
        self.emit("loop_close")
        self.emit("store_y_lean" if self.lean else "store_y", t=CUDA_TYPES[s.output_dtype])
        self.emit("batch_loop_close")

    def _normalize_and_store(self) -> None:
        # weight, bias and epilogue tensors are read here, after the reductions, so they
        # do not hold registers across them; they are small and stay in L1/L2.
        self.emit("store_x_loop_open")
        for name, dtype in tail_tensors(self.spec):
            self.emit("load_param", t=CUDA_TYPES[dtype], name=name)
        self._normalize_and_store_tail()


class PersistentRenderer(NormalizationRenderer):
    """The persistent kernel (``plan.param_cache`` registers or shared): grid-stride over
    groups of rows, 1-D tensors loaded once per thread (registers) or block (shared)
    before the row loop, the next row's x prefetched before the current one is reduced.
    Statistics and reductions are the row-wise kernel's snippets."""

    def render(self) -> str:
        s, p = self.spec, self.plan
        self.out.append(row_reduction(p)[0])  # the row sum; its partials by the loop's rule
        params = kernel_params(s)
        names, dtypes = s.parameter_names(), s.parameter_dtypes()
        self.tensors = dict(zip(names[1:-1], dtypes[1:-1]))  # the 1-D tensors
        vectors = -(-s.hidden // p.vector_width)
        tx = CUDA_TYPES[s.input_dtype]
        self.emit("persistent_open", block_threads=p.block_threads, min_blocks=p.min_blocks_per_sm,
                  name=s.kernel_name, params=", ".join(params), vec=p.vector_width, batch=p.batch,
                  threads_per_row=p.threads_per_row, rows_per_block=p.rows_per_block,
                  hidden=s.hidden, vectors=vectors, full_batches=vectors // p.threads_per_row)
        if p.warps_per_row > 1 and self._one_barrier():
            # one barrier a row (rms_norm, or the one-pass layer norm): the buffer
            # alternates with the parity of the row, so a warp writing row n+2's partials
            # has passed row n+1's barrier, which every warp reaches only after reading
            # row n's (with one buffer a fast warp would overwrite what a slow one reads)
            triple = "[3]" if p.one_pass and isinstance(s.norm, LayerNorm) else ""
            self.emit("partials_by_parity", rows_per_block=p.rows_per_block,
                      warps_per_row=p.warps_per_row, triple=triple)
        elif p.warps_per_row > 1:
            # as in the row-wise kernel: two buffers, so no third barrier a row
            self.emit("partials_two", rows_per_block=p.rows_per_block, warps_per_row=p.warps_per_row)
        self._cache_params()
        # x of the block's first row; in the loop, the next row's is issued before the
        # current row is reduced (prefetch), or each row's at the top of the loop.
        self.emit("x_registers", t=tx)
        if p.x_staged:
            self.emit("x_ring", stages=p.stages, t=tx, x_offset=self.x_offset)
            self.emit("x_bulk_ring" if p.x_bulk else "x_ring_fill", t=tx)
        elif p.prefetch:
            self.emit("first_row")
        self.emit("row_loop_open")
        if self.lean:
            self.emit("y_row", t=CUDA_TYPES[s.output_dtype])
        if p.param_cache == "registers" and self.tensors:
            self.emit("opaque_open")
            for name in self.tensors:
                self.emit("opaque_cached", name=name)
            self.emit("opaque_close")
        elif self.tensors:
            self.emit("opaque_slot")
        if not p.prefetch:
            self.emit("this_row")
        if p.x_staged and p.x_bulk:
            # the whole row's copy: wait for its buffer's phase; the buffer read one row
            # ago takes the row kStages ahead, issued by the row's first thread once every
            # thread of the row has read it (the last row's reduction barriers)
            self.emit("bulk_take_row")
        elif p.x_staged:
            # this thread's own copies: waiting for its group is enough, no barrier
            self.emit("ring_take_row")
        if p.packed:
            self.emit("row_packed", t=CUDA_TYPES[self._carrier()])
        else:
            self.emit("row_fp32")
        self._prologue()
        if p.prefetch and not p.x_staged:
            self.emit("next_row")
        self._statistics()
        self._store()
        self.emit("block_close")
        if p.x_staged and not p.x_bulk:
            self.emit("ring_drain")
        self.emit("function_close")
        return render.Renderer().source(["convert"], SNIPPETS["preamble"].format(),
                                        self._helpers(), self._value_macro(), "".join(self.out))

    def _helpers(self) -> str:
        """The device functions the kernel calls, by the plan's variant."""
        s, p = self.spec, self.plan
        tx = CUDA_TYPES[s.input_dtype]
        load_row_body, stage_row_body = ROW_COPY_BODIES[self.lean]
        helpers = [SNIPPETS["load_row_helper"].format(body=load_row_body, t=tx)]
        if p.param_cache == "global":
            helpers.append(SNIPPETS["ldg_vec"].format())
        if p.one_pass and isinstance(s.norm, LayerNorm):
            helpers.append(SNIPPETS["chan_merge"].format())
            helpers.append(SNIPPETS["row_stats_warp"].format() if p.warps_per_row == 1 else
                           SNIPPETS["row_stats_block"].format(threads_per_row=p.threads_per_row,
                                                              warps_per_row=p.warps_per_row))
        if p.x_staged:
            evict = p.l2_hint == "evict_first"
            ptx = dict(level=L2_HINT_LEVELS[p.l2_hint],
                       policy_arg=", %3" if evict else "", policy_arg_ca=", %4" if evict else "",
                       policy_operand=', "l"(policy)' if evict else "")
            helpers.append(SNIPPETS["stage_row_helper"].format(
                policy=SNIPPETS["l2_policy"] if evict else "",
                cp16=SNIPPETS["cp_async_16"].format(**ptx), cpn=SNIPPETS["cp_async_n"].format(**ptx),
                body=stage_row_body, t=tx))
        if p.x_bulk:
            helpers.append(SNIPPETS["bulk_helpers"].format())
        return "".join(helpers)

    def _split_prologue(self):
        """(head, tail) of the prologue at its last cast to a 16-bit type (``packed``: the
        head's result is held in 16 bits, the tail recomputed in every pass)."""
        ops = self.spec.prologue
        last = max((k for k, op in enumerate(ops) if isinstance(op, Cast)
                    and DTYPE_BYTES[op.dtype] == 2), default=-1)
        return ops[:last + 1], ops[last + 1:]

    def _carrier(self) -> str:
        """The 16-bit dtype the packed row slice holds: the last cast's, else x's."""
        head, _ = self._split_prologue()
        return head[-1].dtype if head else self.spec.input_dtype

    def _value_macro(self) -> str:
        """``VAL(i, e)``, the fp32 value of slot (i, e) of the row slice the statistics and
        the normalization read: the fp32 array, or (``packed``) the 16-bit value with the
        prologue's tail ops applied again (their tensors are in scope: registers, shared
        memory)."""
        if not self.plan.packed:
            return SNIPPETS["val_fp32"].format()
        _, tail = self._split_prologue()
        expr = TO_FLOAT[self._carrier()].format("pv[i].e[e]")
        for op in tail:
            if isinstance(op, AddBroadcast):
                vec = self._param(op.name, "(i)")
                expr = f"({expr} + {TO_FLOAT[op.dtype].format(f'{vec}.e[e]')})"
            else:
                expr = TO_FLOAT[op.dtype].format(FROM_FLOAT[op.dtype].format(expr))
        return SNIPPETS["val_expr"].format(expr=expr)

    def _one_barrier(self) -> bool:
        return self.plan.one_pass or not isinstance(self.spec.norm, LayerNorm)

    def _statistics(self) -> None:
        s, p = self.spec, self.plan
        by_parity = p.warps_per_row > 1 and self._one_barrier()
        parts = "partials[parity][row_in_block]" if by_parity else "nullptr"
        flip = SNIPPETS["parity_flip"].format() if by_parity else ""
        if p.one_pass and isinstance(s.norm, LayerNorm):
            self.emit("one_pass_stats", parts=parts, flip=flip, eps=repr(float(s.norm.eps)))
        elif by_parity:  # rms_norm: its one reduction, on the buffer of this row's parity
            self.emit("sum_open")
            self.emit("sum_squares")
            self.emit("rms_norm_stats", partials0=parts, eps=repr(float(s.norm.eps)))
            self.emit("parity_flip")
        else:
            super()._statistics()

    def _param(self, name: str, i: str = "i") -> str:
        """Expression of vector slot ``i`` of a cached 1-D tensor (``"global"``: read
        here, through L1/L2; the predicate ``ok`` of the slot is in scope)."""
        if self.plan.param_cache == "registers":
            return f"c_{name}[{i}]"
        if self.plan.param_cache == "global" and name not in self._staged_names():
            t = CUDA_TYPES[self.tensors[name]]
            return f"ldg_vec<{t}, kVec>(in_{name}, {i} * kThreadsPerRow + slot, ok)"
        return f"s_{name}[{i} * kThreadsPerRow + slot]"

    def _staged_names(self) -> list[str]:
        """The 1-D tensors staged in shared memory: all of them (``"shared"``), or with
        ``"global"`` the leading ones that make up ``shared_param_bytes`` a column."""
        p = self.plan
        if p.param_cache == "shared":
            return list(self.tensors)
        if p.param_cache != "global" or not p.shared_param_bytes:
            return []
        names, total = [], 0
        for name, d in self.tensors.items():
            if total == p.shared_param_bytes:
                break
            names.append(name)
            total += DTYPE_BYTES[d]
        if total != p.shared_param_bytes:
            raise LoweringError(f"normalization kernel: shared_param_bytes="
                                f"{p.shared_param_bytes} is no sum of leading tensors' bytes")
        return names

    def _cache_params(self) -> None:
        p = self.plan
        self.x_offset = 0
        staged_names = self._staged_names()
        if p.x_staged or staged_names:
            self.emit("staged_shared")
        if staged_names:
            slots = p.threads_per_row * p.batch * p.vector_width
            self.x_offset = sum(slots * DTYPE_BYTES[self.tensors[n]] for n in staged_names)
        if not self.tensors or (p.param_cache == "global" and not staged_names):
            return
        if p.param_cache == "registers":
            self.emit("cache_registers_open")
            for name, d in self.tensors.items():
                self.emit("cache_registers_decl", t=CUDA_TYPES[d], name=name)
            self.emit("cache_registers_loop")
            for name, d in self.tensors.items():
                self.emit("cache_registers_load", t=CUDA_TYPES[d], name=name)
            self.emit("block_close")
            return
        # shared: every slot of a row (padded ones hold 0), staged once by the whole block
        self.emit("cache_shared_open")
        offset = 0
        slots = p.threads_per_row * p.batch
        staged = {n: self.tensors[n] for n in staged_names}
        for name, d in staged.items():
            self.emit("cache_shared_decl", t=CUDA_TYPES[d], name=name, offset=offset)
            offset += slots * p.vector_width * DTYPE_BYTES[d]
        self.emit("cache_shared_loop", slots=slots, block_threads=p.block_threads)
        for name, d in staged.items():
            self.emit("cache_shared_load", t=CUDA_TYPES[d], name=name)
        self.emit("cache_shared_close")

    def _prologue(self) -> None:
        s = self.spec
        self.emit("prologue_open")
        for op in s.prologue:
            if isinstance(op, AddBroadcast):
                self.emit("param_vec", t=CUDA_TYPES[op.dtype], name=op.name,
                          value=self._param(op.name))
        lead, x = self._packed_head("xr[i]")
        head, _ = self._split_prologue()
        if self.plan.packed and lead and len(head) == 2 * lead:
            # the whole head done in 16 bits: it is the slice; padded slots must be 0 for
            # the sums (x staged by a bulk copy leaves them unwritten)
            self.emit("head_only")
            return
        self.emit("element_open")
        self.emit("first_x", value=TO_FLOAT[s.input_dtype].format(x + ".e[e]"))
        if self.plan.packed:
            # the head of the prologue, held in 16 bits (exact: it ends with a 16-bit cast
            # or is x itself); padded slots hold 0, and the tail's tensors hold 0 there too
            for op in head[2 * lead:]:
                self._pointwise(op)
            self.emit("keep_packed", value=FROM_FLOAT[self._carrier()].format("ok ? a : 0.f"))
            return
        for op in s.prologue[2 * lead:]:
            self._pointwise(op)
        # padded slots must be exactly 0 for the sums (their tensors hold 0, but a cast
        # or a later op need not keep it so)
        self.emit("keep_fp32")

    def _store(self) -> None:
        self.emit("store_x_loop_open")
        for name, d in tail_tensors(self.spec):
            self.emit("param_vec", t=CUDA_TYPES[d], name=name, value=self._param(name))
        self._normalize_and_store_tail()


class SharedRowRenderer:
    """The shared-row kernel (``plan.shared_row``): one row a block at a time, the row of
    x in shared memory (and registers past 227 KiB), the 1-D tensors through L1/L2;
    fills `SHARED_ROW_SNIPPETS`."""

    def __init__(self, spec: NormalizationSpec, plan: LaunchPlan):
        self.spec, self.plan = spec, plan

    def _tensors(self, ops) -> list[tuple[str, str]]:
        return [(op.name, op.dtype) for op in ops if isinstance(op, AddBroadcast)]

    @staticmethod
    def _tensor_params(tensors) -> str:
        """``, const T* __restrict__ in_<name>`` for each (name, dtype) of ``tensors``."""
        return "".join(SHARED_ROW_SNIPPETS["tensor_param"].format(t=CUDA_TYPES[d], name=n)
                       for n, d in tensors)

    @staticmethod
    def _tensor_args(tensors) -> str:
        return "".join(f", in_{n}" for n, _ in tensors)

    @staticmethod
    def _load(name: str, dtype: str) -> str:
        key = "load32" if DTYPE_BYTES[dtype] == 4 else "load16"
        return SHARED_ROW_SNIPPETS[key].format(name=name)

    @staticmethod
    def _value(name: str, dtype: str) -> str:
        """Value e of a 1-D tensor's chunk as loaded (`_load`): raw 16-bit values, fp32."""
        return f"elem8_{SHORT_NAMES[dtype]}(t_{name}, e)" if DTYPE_BYTES[dtype] == 2 else f"t_{name}[e]"

    def _ops(self, ops, tensor_dtypes: dict[str, str], value_of=None) -> str:
        """The per-element code of ``ops`` on ``a``; ``value_of(name, dtype)``: a 1-D
        tensor's value (default `_value`, of a loaded chunk)."""
        value_of = value_of or self._value
        out = []
        for op in ops:
            if isinstance(op, AddBroadcast):
                value = value_of(op.name, op.dtype)
                out.append(SHARED_ROW_SNIPPETS["add"].format(value=value))
            else:
                value = TO_FLOAT[op.dtype].format(FROM_FLOAT[op.dtype].format("a"))
                out.append(SHARED_ROW_SNIPPETS["cast"].format(value=value))
        return "".join(out)

    def _chunk_functions(self) -> tuple[str, str, list, list]:
        """``chunk_values`` and ``chunk_output`` of this spec (the prologue up to the
        values, the norm's tensors, the epilogue and the store of one chunk); the
        prologue's and the output's 1-D tensors, (name, dtype)."""
        s = self.spec
        S = SHARED_ROW_SNIPPETS
        pro = self._tensors(s.prologue)
        outs = tail_tensors(self.spec)
        values = S["values"].format(
            tensor_params=self._tensor_params(pro), loads="".join(self._load(n, d) for n, d in pro),
            x=SHORT_NAMES[s.input_dtype], first="xf[e]", ops=self._ops(s.prologue, dict(pro)))
        output = S["output"].format(
            out_t=CUDA_TYPES[s.output_dtype], tensor_params=self._tensor_params(outs),
            loads="".join(self._load(n, d) for n, d in outs), **self._output_parts(outs))
        return values, output, pro, outs

    def _output_parts(self, outs) -> dict[str, str]:
        """The ``output`` snippets' per-element ops (the norm's weight and bias, the
        epilogue), the output vector's declaration and assignment, and its store."""
        s = self.spec
        decl, assign = "float o[8];", "o[e] = a;"
        out = "o" if DTYPE_BYTES[s.output_dtype] == 4 else f"pack8_{SHORT_NAMES[s.output_dtype]}(o)"
        bits = 8 * DTYPE_BYTES[s.output_dtype]  # 16-bit values packed two a conversion
        store = f"store{bits}<kFull, kRowsAligned>(y, {out}, col0, lo, hi);"
        return dict(out_decl=decl, ops=self._tail_ops(outs), out_assign=assign, store=store)

    def _tail_ops(self, outs, value_of=None) -> str:
        """The per-element code after the normalization: the norm's weight and bias, the
        epilogue; ``value_of`` as `_ops`'."""
        s, S = self.spec, SHARED_ROW_SNIPPETS
        value_of = value_of or self._value
        ops = []
        if s.norm.weight:
            ops.append(S["mul"].format(value=value_of("weight", s.norm.weight_dtype)))
        if isinstance(s.norm, LayerNorm) and s.norm.bias:
            ops.append(S["add"].format(value=value_of("bias", s.norm.bias_dtype)))
        return "".join(ops) + self._ops(s.epilogue, dict(outs), value_of)

    def render(self) -> str:
        s, p = self.spec, self.plan
        S = SHARED_ROW_SNIPPETS
        values, output, pro, outs = self._chunk_functions()
        targs = self._tensor_args
        out_t = CUDA_TYPES[s.output_dtype]
        eps = repr(float(s.norm.eps))
        layer = isinstance(s.norm, LayerNorm)
        one_pass = layer and p.one_pass
        if one_pass:
            stats = S["one_pass_stats"].format(eps=eps)
        elif layer:
            stats = S["layer_norm_stats"].format(eps=eps, tensor_args=targs(pro))
        else:
            stats = S["rms_norm_stats"].format(eps=eps)
        slots = -(-p.row_chunks // p.threads_per_row)
        kernel = S["kernel"].format(
            block_threads=p.block_threads, min_blocks=p.min_blocks_per_sm, name=s.kernel_name,
            params=", ".join(kernel_params(s)), threads=p.threads_per_row, hidden=s.hidden,
            slots=slots, shared=p.batch, out_t=out_t, tensor_args=targs(pro),
            out_args=targs(outs), stats=stats,
            partials_decl=S["partials_triples" if one_pass else "partials_sums"],
            accumulate_init=S["triple_init" if one_pass else "sum_init"],
            accumulate=(S["triple_accumulate"].format() if one_pass else
                        S["sum_accumulate"].format(first_sum="v[e]" if layer else "v[e] * v[e]")))
        aligned = S["aligned_flag"].format(aligned="true" if s.rows_aligned else "false")
        wait_cases = "".join(
            f'    case {n}: asm volatile("cp.async.wait_group {n};\\n" ::: "memory"); break;\n'
            for n in range(p.batch))
        helpers = S["helpers"].format(warps=p.threads_per_row // 32, wait_cases=wait_cases)
        if one_pass:
            helpers += SNIPPETS["chan_merge"].format() + S["block_stats"].format(
                warps=p.threads_per_row // 32)
        return render.Renderer().source(["convert"], SNIPPETS["preamble"].format(), aligned,
                                        helpers, values, output, kernel)


class EnvelopeRenderer(SharedRowRenderer):
    """The envelope row-wise kernel (``plan.envelope``): one row on a block's threads (or
    several rows a block, each on its own warps), the row's aligned envelope in
    registers as raw 16-bit chunks, the 1-D tensors through L1/L2; fills
    `ENVELOPE_SNIPPETS` (and the shared-row kernel's chunk helpers)."""

    def render(self) -> str:
        s, p = self.spec, self.plan
        E, S = ENVELOPE_SNIPPETS, SHARED_ROW_SNIPPETS
        if s.prologue:
            raise LoweringError("normalization kernel: the envelope kernel takes plain norms "
                                "(no prologue)")
        values, output, _, outs = self._chunk_functions()
        out_t = CUDA_TYPES[s.output_dtype]
        tparams, out_args = self._tensor_params(outs), self._tensor_args(outs)
        layer = isinstance(s.norm, LayerNorm)
        one_pass = layer and p.one_pass
        eps = repr(float(s.norm.eps))
        several = p.warps_per_row > 1
        clustered = p.cluster > 1
        exchange = E["cluster_exchange"].format() if clustered else ""
        pivots = {"pivots_doc": "", "pivots_decl": "", "pivot_copy": "", "pivot_read": ""}
        if one_pass:
            row_sum = E["row_sum2_block" if several else "row_sum2_warp"].format()
            partials = (f"__shared__ float partials[{p.rows_per_block}][{p.warps_per_row}][2];"
                        if several else "")
            first = TO_FLOAT[s.input_dtype].format("in_x[(size_t)row * kHidden]")
            if clustered:  # the shift copied a row ahead with the ring: `pivot_read`
                slot = (f"reinterpret_cast<const {CUDA_TYPES[s.input_dtype]}*>"
                        "(&pivots[set][threadIdx.x >> 5])[hx & 7]")
                pivots = {k: E[k] for k in pivots}
                pivots["pivot_read"] = E["pivot_read"].format(
                    first=TO_FLOAT[s.input_dtype].format(slot))
                first = "pivot_now"
            passes = (E["shift_init"].format(first=first)
                      + E["pass"].format(whole=E["shifted_whole"]))
            where = "partials[set]" if clustered else "partials[row_in_block]"
            stats = E["one_pass_stats"].format(eps=eps, partials=where if several else "nullptr",
                                               exchange=exchange)
        elif clustered:  # an RMS norm's (a cluster's layer norm is one pass: the planner)
            if layer:
                raise LoweringError("normalization kernel: a layer norm on a cluster takes "
                                    "its statistics in one pass")
            row_sum = E["row_sum2_block" if several else "row_sum2_warp"].format()
            partials = ""
            passes = E["sum_init"] + E["pass"].format(whole=E["rms_whole"])
            stats = E["rms_norm_cluster_stats"].format(eps=eps, exchange=exchange)
        else:
            row_sum, partials, part = row_reduction(p)
            whole = E["sum_whole" if layer else "rms_whole"]
            passes = E["sum_init"] + E["pass"].format(whole=whole)
            if layer:
                passes += E["mean"].format(partials0=part[0]) + E["pass"].format(
                    whole=E["centered_whole"])
                stats = E["layer_norm_stats"].format(eps=eps, partials1=part[1])
            else:
                stats = E["rms_norm_stats"].format(eps=eps, partials0=part[0])
        # the whole-chunk output, each 16-bit tensor by cols16k; fp32 ones as ever
        loads = "".join(E["load16"].format(name=n) if DTYPE_BYTES[d] == 2 else self._load(n, d)
                        for n, d in outs)
        # chunk_output_k: y + col0 aligned where the dispatch tests y's phase once a row
        # (then its store has no test of its own); not where the tensors are staged, whose
        # generic path (`cols16`) reads global memory only
        parts = self._output_parts(outs)
        ycheck = ydoc = ""
        if not p.staged:
            store = parts["store"].replace("<kFull, kRowsAligned>", "<kFull, true>")
            if store == parts["store"]:
                raise LoweringError("normalization kernel: the whole chunk's store "
                                    f"{parts['store']!r} has no alignment flag to fix")
            parts["store"] = store
            ycheck = " && (((size_t)y - (size_t)hx * sizeof(*y)) & 15) == 0"
            ydoc = (" (and y has x's,\n  // as the runtime allocates it: a whole chunk's "
                    "store is then one 16-byte store)")
        # a partial chunk's value (`edge_output`): the tensors' values at its column
        edge_loads = "".join(f"  const float v_{n} = {TO_FLOAT[d].format(f'in_{n}[col0 + e]')};\n"
                             for n, d in outs)
        # (the chunk's ops, each tensor's value in v_<name>, indented for a function body)
        edge_ops = self._tail_ops(outs, lambda n, d: f"v_{n}").replace("    a ", "  a ")
        edge_out = FROM_FLOAT[s.output_dtype].format("a")
        helpers = E["helpers"].format(out_t=out_t, tensor_params=tparams, out_args=out_args,
                                      loads=loads, x=SHORT_NAMES[s.input_dtype],
                                      edge_loads=edge_loads, edge_ops=edge_ops,
                                      edge_out=edge_out, **parts)
        # the row's shift is the first 16-bit tensor's; the switch needs all of theirs alike
        halves = [n for n, d in outs if DTYPE_BYTES[d] == 2]
        if p.staged:  # the 16-bit tensors read from their staged copies, on 16 bytes
            row_args = "".join(f", s_{n}" if DTYPE_BYTES[d] == 2 else f", in_{n}" for n, d in outs)
            dispatch = E["dispatch"].format(phase="0", same="true", out_args=row_args,
                                            ycheck=ycheck, ydoc=ydoc)
        elif s.rows_aligned:  # every base pointer on 16 bytes: no shift
            dispatch = E["dispatch_aligned"].format(
                out_args="".join(f", in_{n} - hx" for n, _ in outs))
        else:
            phase = f"((int)((size_t)in_{halves[0]} & 15) >> 1)" if halves else "hx"
            same = " && ".join(f"(((size_t)in_{n} ^ (size_t)in_{halves[0]}) & 15) == 0"
                               for n in halves[1:]) or "true"
            dispatch = E["dispatch"].format(phase=phase, same=same, out_args=out_args,
                                            ycheck=ycheck, ydoc=ydoc)
        load = (E["load_ring"].format(pivot_read=pivots["pivot_read"]) if clustered
                else E["load"].format())
        row = E["row"].format(out_t=out_t, load=load, first_pass=passes, stats=stats,
                              dispatch=dispatch,
                              mask=E["mask_edges" if clustered else "mask_all"])
        staging = ""
        if p.staged:  # after the pivots' slots (a layer norm's), else after the sums
            if not clustered or s.rows_aligned or p.staged != 2 * len(halves):
                raise LoweringError("normalization kernel: staged 1-D tensors are a cluster's, "
                                    "on rows off 16 bytes, every 16-bit one")
            staging = E["staging"].format(
                base="pivots + 2" if one_pass else "partials + 2",
                copies="".join(E["staging_copy"].format(k=k, name=n) for k, n in enumerate(halves)),
                pointers="".join(E["staging_pointer"].format(k=k, name=n)
                                 for k, n in enumerate(halves)))
        kernel = E["kernel_cluster" if clustered else "kernel"].format(
            block_threads=p.block_threads, min_blocks=p.min_blocks_per_sm, name=s.kernel_name,
            params=", ".join(kernel_params(s)), partials_decl=partials, row=row,
            pivots_doc=pivots["pivots_doc"], pivots_decl=pivots["pivots_decl"],
            pivot_copy=pivots["pivot_copy"], staging=staging)
        constants = E["constants"].format(threads=p.threads_per_row, hidden=s.hidden,
                                          slots=p.batch, rows_per_block=p.rows_per_block,
                                          cluster=f"\nconstexpr int kCluster = {p.cluster};"
                                          if clustered else "",
                                          staged="true" if p.staged else "false",
                                          # rows of a multiple of 64 values start on lines
                                          # where the tensor does: no chunks before them
                                          line=p.envelope_line if s.hidden % 64 else 16)
        aligned = S["aligned_flag"].format(aligned="true" if s.rows_aligned else "false")
        shared_helpers = S["helpers"].format(warps=p.threads_per_row // 32, wait_cases="")
        # a cluster's mbarriers, asynchronous shared stores and cluster barrier: the seam
        # kernels' (their STAGING helpers, guarded for sm_90)
        cluster = STAGING if clustered else ""
        return render.Renderer().source(["convert"], SNIPPETS["preamble"].format(), aligned,
                                        constants, shared_helpers, row_sum, cluster, values,
                                        output, helpers, kernel)


def render_normalization(spec: NormalizationSpec, plan: LaunchPlan | None = None) -> str:
    """CUDA C++ source of ``spec``'s kernel (entry: ``spec.kernel_name``): the persistent
    kernel, or the row-wise one when the plan says ``param_cache="none"``.

    ``plan``: ``spec.plan`` with other `SWITCH_FIELDS` (an experiment on how the kernel
    is written); any other difference is refused (pin those on the spec instead)."""
    chosen = spec.plan
    if plan is None:
        plan = chosen
    elif dataclasses.replace(plan, **{f: getattr(chosen, f) for f in SWITCH_FIELDS}) != chosen:
        raise LoweringError(
            f"normalization kernel: plan {plan.describe()!r} differs from the spec's "
            f"{chosen.describe()!r} beyond the switches {list(SWITCH_FIELDS)}; pin the "
            "plan on the spec (spec_with_plan)")
    if plan.shared_row:
        return SharedRowRenderer(spec, plan).render()
    if plan.envelope:
        return EnvelopeRenderer(spec, plan).render()
    if plan.persistent:
        return PersistentRenderer(spec, plan).render()
    return NormalizationRenderer(spec, plan).render()


def nvrtc_options(arch: str = "sm_90") -> tuple[str, ...]:
    """Compile options the kernel is written for (fast math stays off: rsqrtf is enough)."""
    return (f"-arch={arch}", "-std=c++17", "--ptxas-options=-v")
