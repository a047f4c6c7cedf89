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
    CUDA_TYPES, FROM_FLOAT, ROW_COPY_BODIES, SHORT_NAMES, SNIPPETS, TO_FLOAT,
)

# The fields of a LaunchPlan that switch how its kernel is written or launched, not
# its geometry: `render_normalization` takes a plan that differs from the spec's in
# these only.
SWITCH_FIELDS = ("packed_head", "lean_addresses", "balanced_grid")


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

    def _row_sum_and_params(self) -> list[str]:
        """Emit the row-sum helper the plan needs; the kernel's parameter declarations."""
        s, p = self.spec, self.plan
        if p.warps_per_row == 1:
            self.emit("row_sum_warp")
        else:
            self.emit("row_sum_block", threads_per_row=p.threads_per_row, warps_per_row=p.warps_per_row)
        names, dtypes = s.parameter_names(), s.parameter_dtypes()
        # in_/out_/v_ prefixes keep tensor names apart from the kernel's own locals
        params = [f"const {CUDA_TYPES[d]}* __restrict__ in_{n}" for n, d in zip(names[:-1], dtypes[:-1])]
        params.append(f"{CUDA_TYPES[dtypes[-1]]}* __restrict__ out_y")
        return params

    def render(self) -> str:
        s, p = self.spec, self.plan
        params = self._row_sum_and_params()
        shared = ""
        if p.warps_per_row > 1:
            # Two buffers, one per reduction: the variance's partials may be written while
            # a slower warp still reads the mean's, and the next row's mean only after
            # every warp has passed the variance barrier, so no third barrier is needed.
            shared = f"__shared__ float partials[2][{p.rows_per_block}][{p.warps_per_row}];"
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
                                        "#define VAL(i, e) v[i][e]\n", "".join(self.out))

    def _packed_lead(self) -> int:
        """How many leading (AddBroadcast, Cast) pairs of the prologue run on 16-bit
        pairs (``LaunchPlan.packed_head``): each adds a tensor of x's 16-bit dtype and casts back to
        it, so the 16-bit add gives the same bits; x in 16 bits, two lanes at least."""
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
        self.out.append(f"      Vec<{CUDA_TYPES[s.input_dtype]}, kVec> h = {x};\n")
        for op in s.prologue[:2 * lead:2]:
            self.out.append(f"      add2_{SHORT_NAMES[s.input_dtype]}(h.raw, v_{op.name}.raw);\n")
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
        part = ["partials[0][row_in_block]", "partials[1][row_in_block]"] if p.warps_per_row > 1 else ["nullptr", "nullptr"]
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
        s = self.spec
        # weight, bias and epilogue tensors are read here, after the reductions, so they
        # do not hold registers across them; they are small and stay in L1/L2.
        loads = []
        if s.norm.weight:
            loads.append(("weight", s.norm.weight_dtype))
        if isinstance(s.norm, LayerNorm) and s.norm.bias:
            loads.append(("bias", s.norm.bias_dtype))
        loads += [(op.name, op.dtype) for op in s.epilogue if isinstance(op, AddBroadcast)]
        self.emit("store_x_loop_open")
        for name, dtype in loads:
            self.emit("load_param", t=CUDA_TYPES[dtype], name=name)
        self._normalize_and_store_tail()



class PersistentRenderer(NormalizationRenderer):
    """The persistent kernel (``plan.param_cache`` registers or shared): grid-stride over
    groups of rows, 1-D tensors loaded once per thread (registers) or block (shared)
    before the row loop, the next row's x prefetched before the current one is reduced.
    Statistics and reductions are the row-wise kernel's snippets."""

    def render(self) -> str:
        s, p = self.spec, self.plan
        params = self._row_sum_and_params()
        names, dtypes = s.parameter_names(), s.parameter_dtypes()
        self.tensors = dict(zip(names[1:-1], dtypes[1:-1]))  # the 1-D tensors
        vectors = -(-s.hidden // p.vector_width)
        tx = CUDA_TYPES[s.input_dtype]
        out = self.out
        out.append(f"""\
extern "C" __global__ void __launch_bounds__({p.block_threads}, {p.min_blocks_per_sm})
{s.kernel_name}({", ".join(params)}, const int rows) {{
  dependent_launch_entry();
  constexpr int kVec = {p.vector_width}, kBatch = {p.batch}, kThreadsPerRow = {p.threads_per_row};
  constexpr int kRowsPerBlock = {p.rows_per_block}, kHidden = {s.hidden};
  constexpr int kVectors = {vectors};      // vectors in a row
  constexpr int kFullBatches = {vectors // p.threads_per_row};  // batch slots every thread fills
  const int lane = threadIdx.x % kThreadsPerRow;
  const int row_in_block = threadIdx.x / kThreadsPerRow;
  const int groups = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
""")
        if p.warps_per_row > 1 and self._one_barrier():
            # one barrier a row (rms_norm, or the one-pass layer norm): the buffer
            # alternates with the parity of the row, so a warp writing row n+2's partials
            # has passed row n+1's barrier, which every warp reaches only after reading
            # row n's (with one buffer a fast warp would overwrite what a slow one reads)
            triple = "[3]" if p.one_pass and isinstance(s.norm, LayerNorm) else ""
            out.append(f"  __shared__ float partials[2][{p.rows_per_block}][{p.warps_per_row}]{triple};\n"
                       "  int parity = 0;\n")
        elif p.warps_per_row > 1:
            # as in the row-wise kernel: two buffers, so no third barrier a row
            out.append(f"  __shared__ float partials[2][{p.rows_per_block}][{p.warps_per_row}];\n")
        self._cache_params()
        # x of the block's first row; in the loop, the next row's is issued before the
        # current row is reduced (prefetch), or each row's at the top of the loop.
        out.append(f"  Vec<{tx}, kVec> xr[kBatch];\n")
        if p.x_staged:
            out.append(f"""\
  // x through shared memory: a ring of kStages + 1 buffers for each row of the block,
  // one being read while the copies of the next kStages rows land in the others (one
  // cp.async group a row, so waiting for all but the newest kStages - 1 groups is
  // waiting for the current row)
  constexpr int kStages = {p.stages}, kSlotsPerRow = kThreadsPerRow * kBatch;
  Vec<{tx}, kVec>* s_xbuf = reinterpret_cast<Vec<{tx}, kVec>*>(staged + {self.x_offset})
                         + row_in_block * (kStages + 1) * kSlotsPerRow;
  int buf = 0;
""")
            if p.x_bulk:
                out.append(f"""  // x_bulk: each row by one bulk copy that the row's first thread issues; buffer b's
  // mbarrier completes a phase when its row landed. The block's n-th row (n from 0) is
  // in buffer n % (kStages + 1), on that buffer's phase n / (kStages + 1).
  constexpr unsigned kRowBytes = kHidden * sizeof({tx});
  __shared__ __align__(8) unsigned long long xbar[kRowsPerBlock][kStages + 1];
  if (lane == 0) {{
    for (int k = 0; k <= kStages; ++k) bulk_bar_init(&xbar[row_in_block][k]);
  }}
  __syncthreads();
  int nrow = 0;
  if (lane == 0) {{
#pragma unroll
    for (int k = 0; k < kStages; ++k) {{
      const int r = (blockIdx.x + k * gridDim.x) * kRowsPerBlock + row_in_block;
      bulk_row(s_xbuf + k * kSlotsPerRow, in_x + (size_t)r * kHidden, kRowBytes,
               &xbar[row_in_block][k], r < rows);
    }}
  }}
""")
            else:
                out.append("""#pragma unroll
  for (int k = 0; k < kStages; ++k)
    stage_row(s_xbuf + k * kSlotsPerRow, in_x,
              (blockIdx.x + k * gridDim.x) * kRowsPerBlock + row_in_block, rows, lane);
""")
        elif p.prefetch:
            out.append("  load_row(xr, in_x, blockIdx.x * kRowsPerBlock + row_in_block, rows, lane);\n")
        out.append("""\
  // The row loop: grid-stride, no unroll (a second row's fp32 values would double the
  // registers; the prefetch holds only the next row's packed x).
#pragma unroll 1
  for (int group = blockIdx.x; group < groups; group += gridDim.x) {
    const int row = group * kRowsPerBlock + row_in_block;
    // Rows past the end still join the barriers of the reduction; they only skip memory.
    const bool row_ok = row < rows;
    const size_t row_base = (size_t)row * kHidden;
""")
        if self.lean:
            out.append(SNIPPETS["y_row"].format(t=CUDA_TYPES[s.output_dtype]))
        if p.param_cache == "registers" and self.tensors:
            out.append("#pragma unroll\n    for (int i = 0; i < kBatch; ++i) {\n")
            for name in self.tensors:
                out.append(f"      opaque(c_{name}[i].raw);\n")
            out.append("    }\n")
        elif self.tensors:
            out.append("    int slot = lane;\n    opaque(slot);\n")
        if not p.prefetch:
            out.append("    load_row(xr, in_x, row, rows, lane);\n")
        if p.x_staged and p.x_bulk:
            # the whole row's copy: wait for its buffer's phase; the buffer read one row
            # ago takes the row kStages ahead, issued by the row's first thread once every
            # thread of the row has read it (the last row's reduction barriers)
            out.append("""\
    bulk_wait(&xbar[row_in_block][buf], (nrow / (kStages + 1)) & 1);
#pragma unroll
    for (int i = 0; i < kBatch; ++i) xr[i] = s_xbuf[buf * kSlotsPerRow + i * kThreadsPerRow + lane];
    const int ahead = buf == 0 ? kStages : buf - 1;
    buf = buf == kStages ? 0 : buf + 1;
    ++nrow;
    if (lane == 0) {
      const int r = (group + kStages * gridDim.x) * kRowsPerBlock + row_in_block;
      bulk_row(s_xbuf + ahead * kSlotsPerRow, in_x + (size_t)r * kHidden, kRowBytes,
               &xbar[row_in_block][ahead], r < rows);
    }
""")
        elif p.x_staged:
            # this thread's own copies: waiting for its group is enough, no barrier
            out.append("""\
    cp_async_wait_group<kStages - 1>();
#pragma unroll
    for (int i = 0; i < kBatch; ++i) xr[i] = s_xbuf[buf * kSlotsPerRow + i * kThreadsPerRow + lane];
    // the buffer read one row ago (this thread's own slots, read into registers then)
    // takes the row kStages ahead
    const int ahead = buf == 0 ? kStages : buf - 1;
    buf = buf == kStages ? 0 : buf + 1;
    stage_row(s_xbuf + ahead * kSlotsPerRow, in_x,
              (group + kStages * gridDim.x) * kRowsPerBlock + row_in_block, rows, lane);
""")
        if p.packed:
            out.append(f"    Vec<{CUDA_TYPES[self._carrier()]}, kVec> pv[kBatch];\n")
        else:
            out.append("    float v[kBatch][kVec];\n")
        self._prologue()
        if p.prefetch and not p.x_staged:
            out.append("    load_row(xr, in_x, (group + gridDim.x) * kRowsPerBlock + row_in_block, rows, lane);\n")
        self._statistics()
        self._store()
        out.append("  }\n")
        if p.x_staged and not p.x_bulk:
            out.append("  cp_async_wait_all();  // no copy outlives the block (the last one only zero-fills)\n")
        out.append("}\n")
        load_row_body, stage_row_body = ROW_COPY_BODIES[self.lean]
        helper = f"""\
// One row's x slice into packed registers, streaming (__ldcs: read once); slots past the
// row or rows past the end read nothing and hold 0.
template <typename T, int kVec, int kBatch, int kThreadsPerRow, int kVectors, int kFullBatches>
__device__ __forceinline__ void load_row_t(Vec<T, kVec> (&xr)[kBatch], const T* __restrict__ x,
                                         int row, int rows, int lane, int hidden) {{
{load_row_body}
}}
// An empty asm that "changes" a value: the row loop calls it on the cached 1-D tensors
// (and the shared-memory index) at every row, so that the compiler cannot hoist their
// conversions to fp32 out of the loop, which would undo the packing (twice the
// registers: seen as spills at 1024+ with four tensors).
__device__ __forceinline__ void opaque(uint4& r) {{
  asm volatile("" : "+r"(r.x), "+r"(r.y), "+r"(r.z), "+r"(r.w));
}}
__device__ __forceinline__ void opaque(uint2& r) {{ asm volatile("" : "+r"(r.x), "+r"(r.y)); }}
__device__ __forceinline__ void opaque(unsigned int& r) {{ asm volatile("" : "+r"(r)); }}
__device__ __forceinline__ void opaque(int& r) {{ asm volatile("" : "+r"(r)); }}
__device__ __forceinline__ void opaque(unsigned short& r) {{ asm volatile("" : "+h"(r)); }}
#define load_row(xr, x, row, rows, lane) \\
  load_row_t<{tx}, kVec, kBatch, kThreadsPerRow, kVectors, kFullBatches>(xr, x, row, rows, lane, kHidden)
"""
        if p.param_cache == "global":
            helper += """\
// A vector of a 1-D tensor through the read-only path (L1, then L2); 0 where !ok.
template <typename T, int kVec>
__device__ __forceinline__ Vec<T, kVec> ldg_vec(const T* __restrict__ p, int vec, bool ok) {
  Vec<T, kVec> r;
  r.raw = {};
  if (ok) r.raw = __ldg(&(reinterpret_cast<const Vec<T, kVec>*>(p) + vec)->raw);
  return r;
}
"""
        if p.one_pass and isinstance(s.norm, LayerNorm):
            helper += self._row_stats_helper()
        if p.x_staged:
            # .cg (L2 only) takes 16 bytes; narrower copies go .ca. The hint is the same.
            level = {"": "", "evict_first": ".L2::cache_hint", "prefetch_256b": ".L2::256B"}[p.l2_hint]
            policy = ""
            if p.l2_hint == "evict_first":
                # x is read once: its lines are the first the L2 evicts
                policy = ('  unsigned long long policy;\n'
                          '  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\\n" : "=l"(policy));\n')
            pol_arg, pol_op = (', %3', ', "l"(policy)') if p.l2_hint == "evict_first" else ("", "")
            pol_arg_ca = ', %4' if p.l2_hint == "evict_first" else ""
            cp16 = (f'    asm volatile("cp.async.cg.shared.global{level} [%0], [%1], 16, %2{pol_arg};\\n" '
                    f':: "r"(d), "l"(src), "r"(n){pol_op} : "memory");')
            cpn = (f'    asm volatile("cp.async.ca.shared.global{level} [%0], [%1], %2, %3{pol_arg_ca};\\n" '
                   f':: "r"(d), "l"(src), "n"(Bytes), "r"(n){pol_op} : "memory");')
            helper += f"""\
// cp.async of one vector, global -> shared; zero-filled (nothing read) when !pred.
template <int Bytes>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool pred) {{
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  const int n = pred ? Bytes : 0;
{policy}  if constexpr (Bytes == 16)
{cp16}
  else
{cpn}
}}
__device__ __forceinline__ void cp_async_wait_all() {{ asm volatile("cp.async.wait_all;\\n" ::: "memory"); }}
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {{ asm volatile("cp.async.wait_group %0;\\n" :: "n"(N) : "memory"); }}
// One row's x slice into this thread's slots of a shared buffer, one commit group.
template <typename T, int kVec, int kBatch, int kThreadsPerRow, int kVectors, int kFullBatches>
__device__ __forceinline__ void stage_row_t(Vec<T, kVec>* buf, const T* __restrict__ x,
                                          int row, int rows, int lane, int hidden) {{
{stage_row_body}
  asm volatile("cp.async.commit_group;\\n" ::: "memory");
}}
#define stage_row(buf, x, row, rows, lane) \\
  stage_row_t<{tx}, kVec, kBatch, kThreadsPerRow, kVectors, kFullBatches>(buf, x, row, rows, lane, kHidden)
"""
        if p.x_bulk:
            helper += """\
// x_bulk (PTX ISA: cp.async.bulk, mbarrier): one row of x, `bytes` long, into a shared
// buffer by the TMA engine, completing its bytes on mbarrier `bar` (expected first);
// a row past the end copies nothing and only arrives, so the phase still completes.
__device__ __forceinline__ void bulk_bar_init(unsigned long long* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\\n"
               :: "r"((unsigned)__cvta_generic_to_shared(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");
}
__device__ __forceinline__ void bulk_row(void* dst, const void* src, unsigned bytes,
                                         unsigned long long* bar, bool ok) {
  const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
  if (!ok) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\\n" :: "r"(b) : "memory");
    return;
  }
  // the buffer was last read by ordinary loads: order them before the async-proxy write
  asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n"
               :: "r"(b), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1], %2, [%3];\\n"
               :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "r"(bytes), "r"(b)
               : "memory");
}
__device__ __forceinline__ void bulk_wait(unsigned long long* bar, unsigned parity) {
  asm volatile("{\\n.reg .pred done;\\nWAIT:\\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\\n"
               "@!done bra WAIT;\\n}\\n"
               :: "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(parity) : "memory");
}
"""
        return render.Renderer().source(["convert"], SNIPPETS["preamble"].format(), helper,
                                        self._value_macro(), "".join(self.out))

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
            return "#define VAL(i, e) v[i][e]\n"
        _, tail = self._split_prologue()
        expr = TO_FLOAT[self._carrier()].format("pv[i].e[e]")
        for op in tail:
            if isinstance(op, AddBroadcast):
                vec = self._param(op.name, "(i)")
                expr = f"({expr} + {TO_FLOAT[op.dtype].format(f'{vec}.e[e]')})"
            else:
                expr = TO_FLOAT[op.dtype].format(FROM_FLOAT[op.dtype].format(expr))
        return f"#define VAL(i, e) {expr}\n"

    def _one_barrier(self) -> bool:
        return self.plan.one_pass or not isinstance(self.spec.norm, LayerNorm)

    def _statistics(self) -> None:
        s, p, out = self.spec, self.plan, self.out
        if p.warps_per_row > 1 and self._one_barrier():
            parts = "partials[parity][row_in_block]"
            flip = "    parity ^= 1;\n"
        else:
            parts, flip = "nullptr", ""
        if not (p.one_pass and isinstance(s.norm, LayerNorm)):
            if flip:  # rms_norm: its one reduction, on the buffer of this row's parity
                self.emit("sum_open")
                self.emit("sum_squares")
                self.emit("rms_norm_stats", partials0=parts, eps=repr(float(s.norm.eps)))
                out.append(flip)
            else:
                super()._statistics()
            return
        # One pass: this thread's slice exactly (count, mean, then the squares about that
        # mean, all in registers), then the row's (count, mean, M2) triples merged
        # pairwise, one barrier: no E[x^2] - E[x]^2 cancellation on rows with a large mean.
        out.append(f"""\
    float n = 0.f, m = 0.f, q = 0.f;
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {{
      const bool ok = i < kFullBatches || i * kThreadsPerRow + lane < kVectors;
      n += ok ? (float)kVec : 0.f;
#pragma unroll
      for (int e = 0; e < kVec; ++e) m += VAL(i, e);  // padded slots hold 0
    }}
    m = n > 0.f ? m / n : 0.f;
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {{
      const bool ok = i < kFullBatches || i * kThreadsPerRow + lane < kVectors;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {{
        const float d = VAL(i, e) - m;
        q += ok ? d * d : 0.f;
      }}
    }}
    row_stats(n, m, q, {parts});
{flip}\
    const float mean = m;
    const float rstd = rsqrtf(q * (1.f / kHidden) + {float(s.norm.eps)!r}f);
    const float center = mean;
""")

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
        p, out = self.plan, self.out
        self.x_offset = 0
        staged_names = self._staged_names()
        if p.x_staged or staged_names:
            out.append("  extern __shared__ __align__(16) unsigned char staged[];\n")
        if staged_names:
            slots = p.threads_per_row * p.batch * p.vector_width
            self.x_offset = sum(slots * DTYPE_BYTES[self.tensors[n]] for n in staged_names)
        if not self.tensors or (p.param_cache == "global" and not staged_names):
            return
        if p.param_cache == "registers":
            out.append("  // Each thread's slice of the 1-D tensors, loaded once; 16-bit values stay packed.\n")
            for name, d in self.tensors.items():
                out.append(f"  Vec<{CUDA_TYPES[d]}, kVec> c_{name}[kBatch];\n")
            out.append("""\
#pragma unroll
  for (int i = 0; i < kBatch; ++i) {
    const int vec = i * kThreadsPerRow + lane;
    const bool ok = i < kFullBatches || vec < kVectors;
""")
            for name, d in self.tensors.items():
                t = CUDA_TYPES[d]
                out.append(f"    c_{name}[i].raw = {{}};\n")
                out.append(f"    if (ok) c_{name}[i].raw = (reinterpret_cast<const Vec<{t}, kVec>*>(in_{name}) + vec)->raw;\n")
            out.append("  }\n")
            return
        # shared: every slot of a row (padded ones hold 0), staged once by the whole block
        out.append("  // The 1-D tensors staged once per block; each row reads them from shared memory.\n")
        offset = 0
        slots = p.threads_per_row * p.batch
        staged = {n: self.tensors[n] for n in staged_names}
        for name, d in staged.items():
            t = CUDA_TYPES[d]
            out.append(f"  Vec<{t}, kVec>* s_{name} = reinterpret_cast<Vec<{t}, kVec>*>(staged + {offset});\n")
            offset += slots * p.vector_width * DTYPE_BYTES[d]
        out.append(f"  for (int j = threadIdx.x; j < {slots}; j += {p.block_threads}) {{\n")
        for name, d in staged.items():
            t = CUDA_TYPES[d]
            out.append(f"    s_{name}[j].raw = {{}};\n")
            out.append(f"    if (j < kVectors) s_{name}[j].raw = (reinterpret_cast<const Vec<{t}, kVec>*>(in_{name}) + j)->raw;\n")
        out.append("  }\n  __syncthreads();\n")

    def _prologue(self) -> None:
        s, out = self.spec, self.out
        out.append("""\
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const bool ok = i < kFullBatches || i * kThreadsPerRow + lane < kVectors;
""")
        adds = [op for op in s.prologue if isinstance(op, AddBroadcast)]
        for op in adds:
            out.append(f"      const Vec<{CUDA_TYPES[op.dtype]}, kVec> v_{op.name} = {self._param(op.name)};\n")
        lead, x = self._packed_head("xr[i]")
        head, _ = self._split_prologue()
        if self.plan.packed and lead and len(head) == 2 * lead:
            # the whole head done in 16 bits: it is the slice; padded slots must be 0 for
            # the sums (x staged by a bulk copy leaves them unwritten)
            out.append("      if (!ok) h.raw = {};\n      pv[i] = h;\n    }\n")
            return
        out.append("#pragma unroll\n      for (int e = 0; e < kVec; ++e) {\n")
        out.append(f"        float a = {TO_FLOAT[s.input_dtype].format(x + '.e[e]')};\n")
        if self.plan.packed:
            # the head of the prologue, held in 16 bits (exact: it ends with a 16-bit cast
            # or is x itself); padded slots hold 0, and the tail's tensors hold 0 there too
            for op in head[2 * lead:]:
                self._pointwise(op)
            carrier = self._carrier()
            out.append(f"        pv[i].e[e] = {FROM_FLOAT[carrier].format('ok ? a : 0.f')};\n"
                       "      }\n    }\n")
            return
        for op in s.prologue[2 * lead:]:
            self._pointwise(op)
        # padded slots must be exactly 0 for the sums (their tensors hold 0, but a cast
        # or a later op need not keep it so)
        out.append("        v[i][e] = ok ? a : 0.f;\n      }\n    }\n")

    def _store(self) -> None:
        s, out = self.spec, self.out
        out.append("""\
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int vec = i * kThreadsPerRow + lane;
      const bool ok = row_ok && (i < kFullBatches || vec < kVectors);
      if (!ok) continue;
""")
        loads = []
        if s.norm.weight:
            loads.append(("weight", s.norm.weight_dtype))
        if isinstance(s.norm, LayerNorm) and s.norm.bias:
            loads.append(("bias", s.norm.bias_dtype))
        loads += [(op.name, op.dtype) for op in s.epilogue if isinstance(op, AddBroadcast)]
        for name, d in loads:
            out.append(f"      const Vec<{CUDA_TYPES[d]}, kVec> v_{name} = {self._param(name)};\n")
        self._normalize_and_store_tail()


    def _row_stats_helper(self) -> str:
        p = self.plan
        text = """\
// (count, mean, M2) of a set merged with another's (Chan, Golub, LeVeque): exact in
// the way a two-pass variance is, the mean difference is small against the values.
__device__ __forceinline__ void chan_merge(float& n, float& m, float& q, float n2, float m2, float q2) {
  const float nn = n + n2;
  if (nn > 0.f) {
    const float d = m2 - m, f = n2 / nn;
    m += d * f;
    q += q2 + d * d * n * f;
    n = nn;
  }
}
__device__ __forceinline__ void warp_stats(float& n, float& m, float& q) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    chan_merge(n, m, q, __shfl_xor_sync(0xffffffffu, n, offset),
               __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, q, offset));
}
"""
        if p.warps_per_row == 1:
            return text + """\
__device__ __forceinline__ void row_stats(float& n, float& m, float& q, void*) { warp_stats(n, m, q); }
"""
        return text + f"""\
// Several warps a row: each warp's lane 0 writes its triple, one barrier, then every
// warp merges all of them itself (the same order in every warp).
__device__ __forceinline__ void row_stats(float& n, float& m, float& q, float (*partials)[3]) {{
  const int lane = threadIdx.x & 31;
  const int warp = (threadIdx.x % {p.threads_per_row}) >> 5;
  warp_stats(n, m, q);
  if (lane == 0) {{ partials[warp][0] = n; partials[warp][1] = m; partials[warp][2] = q; }}
  __syncthreads();
  const bool mine = lane < {p.warps_per_row};
  n = mine ? partials[lane][0] : 0.f;
  m = mine ? partials[lane][1] : 0.f;
  q = mine ? partials[lane][2] : 0.f;
  warp_stats(n, m, q);
}}
"""


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
    if plan.persistent:
        return PersistentRenderer(spec, plan).render()
    return NormalizationRenderer(spec, plan).render()


def nvrtc_options(arch: str = "sm_90") -> tuple[str, ...]:
    """Compile options the kernel is written for (fast math stays off: rsqrtf is enough)."""
    return (f"-arch={arch}", "-std=c++17", "--ptxas-options=-v")
