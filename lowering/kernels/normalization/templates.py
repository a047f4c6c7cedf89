"""The normalization kernels' CUDA text: snippet tables the renderer fills.

Every piece of device code the renderers emit comes from here: `SNIPPETS` (format
templates, ``{{``/``}}`` for a literal brace), `ROW_COPY_BODIES` (the loops that bring a
row of x in) and the dtype names of the shared renderer (`lowering.kernels.render`).
"""

from __future__ import annotations

from lowering.kernels import render

# The shared renderer's names for our dtypes: its "convert" snippet carries 16-bit floats
# as raw bits and converts them with one PTX instruction (no headers, see render.py).
SHORT_NAMES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
CUDA_TYPES = {d: render.C_TYPES[s] for d, s in SHORT_NAMES.items()}
TO_FLOAT = {d: render.TO_FLOAT[s] + "({})" for d, s in SHORT_NAMES.items()}
FROM_FLOAT = {d: render.FROM_FLOAT[s] + "({})" for d, s in SHORT_NAMES.items()}

# This kernel's own snippets, one table, filled by `renderer.NormalizationRenderer`.

SNIPPETS = {
    "preamble": """\
// A vector of N elements moved by one instruction: the union with the built-in type
// of its size makes a 16-byte one an LDG.128/STG.128, and lets it go through
// __ldcs/__stcs (streaming, evict-first: x and y are touched once), which exist for
// built-in types only.
template <int Bytes> struct Raw;
template <> struct Raw<16> {{ using type = uint4; }};
template <> struct Raw<8> {{ using type = uint2; }};
template <> struct Raw<4> {{ using type = unsigned int; }};
template <> struct Raw<2> {{ using type = unsigned short; }};

template <typename T, int N>
union Vec {{
  typename Raw<sizeof(T) * N>::type raw;
  T e[N];
}};

__device__ __forceinline__ float warp_sum(float v) {{
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}}
// x + b for 16-bit vectors, two lanes an instruction (packed_head). Exactly the
// prologue's half(float(x) + float(b)): the fp32 sum of two 16-bit values rounded once
// to 16 bits is their correctly rounded 16-bit sum (fp32 carries 24 >= 2p + 2 bits, so
// the double rounding is innocuous), which add.rn.f16x2 computes, and fma.rn.bf16x2
// with a factor of 1 (sm_80 has no bf16x2 add).
__device__ __forceinline__ unsigned int pair_add_fp16(unsigned int a, unsigned int b) {{
  unsigned int d; asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d;
}}
__device__ __forceinline__ unsigned int pair_add_bf16(unsigned int a, unsigned int b) {{
  unsigned int d; asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(0x3f803f80u), "r"(b));
  return d;
}}
#define HOSTIR_ADD2(T) \
  __device__ __forceinline__ void add2_##T(uint4& a, const uint4& b) {{ \
    a.x = pair_add_##T(a.x, b.x); a.y = pair_add_##T(a.y, b.y); \
    a.z = pair_add_##T(a.z, b.z); a.w = pair_add_##T(a.w, b.w); }} \
  __device__ __forceinline__ void add2_##T(uint2& a, const uint2& b) {{ \
    a.x = pair_add_##T(a.x, b.x); a.y = pair_add_##T(a.y, b.y); }} \
  __device__ __forceinline__ void add2_##T(unsigned int& a, const unsigned int& b) {{ a = pair_add_##T(a, b); }}
HOSTIR_ADD2(fp16)
HOSTIR_ADD2(bf16)
// Programmatic dependent launch (sm_90+, runtime.normalization launches with it): let
// the next kernel on the stream launch now, so that its launch overlaps this one's last
// rows, then wait until the kernel before this one has completed and its writes are
// visible, before any global memory is touched. Without the launch attribute both are
// no-ops.
__device__ __forceinline__ void dependent_launch_entry() {{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}}
""",
    # Sum over the threads of one row. With several warps a row: each warp's lane 0
    # writes its partial, one barrier, then every warp sums all partials itself, which
    # saves the second barrier a broadcast through shared memory would need.
    "row_sum_warp": """\
__device__ __forceinline__ float row_sum(float v, float* /*partials*/) {{
  return warp_sum(v);
}}
""",
    "row_sum_block": """\
__device__ __forceinline__ float row_sum(float v, float* partials) {{
  const int lane = threadIdx.x & 31;
  const int warp = (threadIdx.x % {threads_per_row}) >> 5;
  v = warp_sum(v);
  if (lane == 0) partials[warp] = v;
  __syncthreads();
  return warp_sum(lane < {warps_per_row} ? partials[lane] : 0.f);
}}
""",
    "kernel_open": """\
extern "C" __global__ void __launch_bounds__({block_threads}, {min_blocks})
{name}({params}, const int rows) {{
  dependent_launch_entry();
  constexpr int kVec = {vec}, kBatch = {batch}, kThreadsPerRow = {threads_per_row};
  constexpr int kRowsPerBlock = {rows_per_block}, kHidden = {hidden};
  constexpr int kVectors = {vectors};      // vectors in a row
  constexpr int kFullBatches = {full_batches};  // batch slots every thread fills
  {shared}
  const int lane = threadIdx.x % kThreadsPerRow;
  const int row_in_block = threadIdx.x / kThreadsPerRow;
  const int groups = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  // The row loop: no unroll. The persistent batch already holds a whole row slice in
  // registers; a second row in flight would double them and spill.
#pragma unroll 1
  for (int group = blockIdx.x; group < groups; group += gridDim.x) {{
    const int row = group * kRowsPerBlock + row_in_block;
    // Rows past the end still join the barriers of the reduction; they only skip memory.
    const bool row_ok = row < rows;
    const size_t row_base = (size_t)row * kHidden;
{row_pointers}    float v[kBatch][kVec];
""",
    # Slot i of the batch holds vector i*kThreadsPerRow + lane: consecutive lanes read
    # consecutive vectors, so a warp's access is one contiguous 512-byte span.
    "batch_loop_open": """\
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {{
      const int vec = i * kThreadsPerRow + lane;
      const bool ok = row_ok && (i < kFullBatches || vec < kVectors);  // predication
""",
    "load_x": """\
      Vec<{t}, kVec> v_x;
      v_x.raw = {{}};
      if (ok) v_x.raw = __ldcs(&(reinterpret_cast<const Vec<{t}, kVec>*>(in_x + row_base) + vec)->raw);
""",
    "load_param": """\
      Vec<{t}, kVec> v_{name};
      v_{name}.raw = {{}};
      if (ok) v_{name}.raw = (reinterpret_cast<const Vec<{t}, kVec>*>(in_{name}) + vec)->raw;
""",
    "element_loop_open": """\
#pragma unroll
      for (int e = 0; e < kVec; ++e) {{
""",
    "loop_close": "      }}\n",
    "batch_loop_close": "    }}\n",
    "first_value": "        float a = ok ? {value} : 0.f;\n",
    "add": "        a += {value};\n",
    "cast": "        a = {value};\n",
    "keep": "        v[i][e] = a;\n",
    "sum_open": "    float s = 0.f;\n",
    "sum_value": """\
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
#pragma unroll
      for (int e = 0; e < kVec; ++e) s += VAL(i, e);
""",
    # Second pass over the registers: sum (v - mean)^2. Padded slots hold 0 and must
    # not count, hence the same predicate as the loads.
    "sum_centered": """\
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {{
      const bool ok = i < kFullBatches || i * kThreadsPerRow + lane < kVectors;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {{
        const float d = VAL(i, e) - mean;
        s += ok ? d * d : 0.f;
      }}
    }}
""",
    "sum_squares": """\
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
#pragma unroll
      for (int e = 0; e < kVec; ++e) s += VAL(i, e) * VAL(i, e);
""",
    "layer_norm_stats": """\
    const float mean = row_sum(s, {partials0}) * (1.f / kHidden);
    s = 0.f;
{sum_centered}\
    const float rstd = rsqrtf(row_sum(s, {partials1}) * (1.f / kHidden) + {eps}f);
    const float center = mean;
""",
    "rms_norm_stats": """\
    const float rstd = rsqrtf(row_sum(s, {partials0}) * (1.f / kHidden) + {eps}f);
    const float center = 0.f;
""",
    "store_x_loop_open": """\
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {{
      const int vec = i * kThreadsPerRow + lane;
      const bool ok = row_ok && (i < kFullBatches || vec < kVectors);
      if (!ok) continue;
""",
    "normalize": "        float a = (VAL(i, e) - center) * rstd;\n",
    "mul": "        a *= {value};\n",
    "out_decl": "      Vec<{t}, kVec> v_y;\n",
    "out_assign": "        v_y.e[e] = {value};\n",
    "store_y": "      __stcs(&(reinterpret_cast<Vec<{t}, kVec>*>(out_y + row_base) + vec)->raw, v_y.raw);\n",
    # LaunchPlan.lean_addresses: slot i at a constant offset from the row's pointers
    "store_y_lean": "      __stcs(&y_row[i * kThreadsPerRow].raw, v_y.raw);\n",
    "load_x_lean": """\
      Vec<{t}, kVec> v_x;
      v_x.raw = {{}};
      if (ok) v_x.raw = __ldcs(&x_row[i * kThreadsPerRow].raw);
""",
    "x_row": "    const Vec<{t}, kVec>* const x_row = reinterpret_cast<const Vec<{t}, kVec>*>(in_x + row_base) + lane;\n",
    "y_row": "    Vec<{t}, kVec>* const y_row = reinterpret_cast<Vec<{t}, kVec>*>(out_y + row_base) + lane;\n",
    "kernel_close": "  }}\n}}\n",
    # the kernel's parameters (in_/out_ prefixes keep tensor names apart from its locals)
    "param_in": "const {t}* __restrict__ in_{name}",
    "param_out": "{t}* __restrict__ out_y",
    # two buffers of partials, one per reduction (the row-wise kernel's `shared` field)
    "partials_shared": "__shared__ float partials[2][{rows_per_block}][{warps_per_row}];",
    # the prologue's leading (+ b, 16-bit cast) pairs as 16-bit pair adds on a copy of x
    "head_copy": "      Vec<{t}, kVec> h = {x};\n",
    "head_add2": "      add2_{short}(h.raw, v_{name}.raw);\n",
    # VAL(i, e): the fp32 value of slot (i, e) of the row slice
    "val_fp32": "#define VAL(i, e) v[i][e]\n",
    "val_expr": "#define VAL(i, e) {expr}\n",

    # ---- the persistent kernel (PersistentRenderer)
    "persistent_open": """\
extern "C" __global__ void __launch_bounds__({block_threads}, {min_blocks})
{name}({params}, const int rows) {{
  dependent_launch_entry();
  constexpr int kVec = {vec}, kBatch = {batch}, kThreadsPerRow = {threads_per_row};
  constexpr int kRowsPerBlock = {rows_per_block}, kHidden = {hidden};
  constexpr int kVectors = {vectors};      // vectors in a row
  constexpr int kFullBatches = {full_batches};  // batch slots every thread fills
  const int lane = threadIdx.x % kThreadsPerRow;
  const int row_in_block = threadIdx.x / kThreadsPerRow;
  const int groups = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
""",
    # one barrier a row: the buffer alternates with the parity of the row
    "partials_by_parity": "  __shared__ float partials[2][{rows_per_block}][{warps_per_row}]{triple};\n"
                          "  int parity = 0;\n",
    "partials_two": "  __shared__ float partials[2][{rows_per_block}][{warps_per_row}];\n",
    "staged_shared": "  extern __shared__ __align__(16) unsigned char staged[];\n",
    # the 1-D tensors in registers, each thread's slice loaded once before the row loop
    "cache_registers_open": "  // Each thread's slice of the 1-D tensors, loaded once; 16-bit values stay packed.\n",
    "cache_registers_decl": "  Vec<{t}, kVec> c_{name}[kBatch];\n",
    "cache_registers_loop": """\
#pragma unroll
  for (int i = 0; i < kBatch; ++i) {{
    const int vec = i * kThreadsPerRow + lane;
    const bool ok = i < kFullBatches || vec < kVectors;
""",
    "cache_registers_load": "    c_{name}[i].raw = {{}};\n"
                            "    if (ok) c_{name}[i].raw = (reinterpret_cast<const Vec<{t}, kVec>*>(in_{name}) + vec)->raw;\n",
    "block_close": "  }}\n",
    # the 1-D tensors staged in shared memory once per block, every slot of a row
    "cache_shared_open": "  // The 1-D tensors staged once per block; each row reads them from shared memory.\n",
    "cache_shared_decl": "  Vec<{t}, kVec>* s_{name} = reinterpret_cast<Vec<{t}, kVec>*>(staged + {offset});\n",
    "cache_shared_loop": "  for (int j = threadIdx.x; j < {slots}; j += {block_threads}) {{\n",
    "cache_shared_load": "    s_{name}[j].raw = {{}};\n"
                         "    if (j < kVectors) s_{name}[j].raw = (reinterpret_cast<const Vec<{t}, kVec>*>(in_{name}) + j)->raw;\n",
    "cache_shared_close": "  }}\n  __syncthreads();\n",
    "x_registers": "  Vec<{t}, kVec> xr[kBatch];\n",
    "x_ring": """\
  // x through shared memory: a ring of kStages + 1 buffers for each row of the block,
  // one being read while the copies of the next kStages rows land in the others (one
  // cp.async group a row, so waiting for all but the newest kStages - 1 groups is
  // waiting for the current row)
  constexpr int kStages = {stages}, kSlotsPerRow = kThreadsPerRow * kBatch;
  Vec<{t}, kVec>* s_xbuf = reinterpret_cast<Vec<{t}, kVec>*>(staged + {x_offset})
                         + row_in_block * (kStages + 1) * kSlotsPerRow;
  int buf = 0;
""",
    "x_bulk_ring": """  // x_bulk: each row by one bulk copy that the row's first thread issues; buffer b's
  // mbarrier completes a phase when its row landed. The block's n-th row (n from 0) is
  // in buffer n % (kStages + 1), on that buffer's phase n / (kStages + 1).
  constexpr unsigned kRowBytes = kHidden * sizeof({t});
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
""",
    "x_ring_fill": """#pragma unroll
  for (int k = 0; k < kStages; ++k)
    stage_row(s_xbuf + k * kSlotsPerRow, in_x,
              (blockIdx.x + k * gridDim.x) * kRowsPerBlock + row_in_block, rows, lane);
""",
    "first_row": "  load_row(xr, in_x, blockIdx.x * kRowsPerBlock + row_in_block, rows, lane);\n",
    "row_loop_open": """\
  // The row loop: grid-stride, no unroll (a second row's fp32 values would double the
  // registers; the prefetch holds only the next row's packed x).
#pragma unroll 1
  for (int group = blockIdx.x; group < groups; group += gridDim.x) {{
    const int row = group * kRowsPerBlock + row_in_block;
    // Rows past the end still join the barriers of the reduction; they only skip memory.
    const bool row_ok = row < rows;
    const size_t row_base = (size_t)row * kHidden;
""",
    "opaque_open": "#pragma unroll\n    for (int i = 0; i < kBatch; ++i) {{\n",
    "opaque_cached": "      opaque(c_{name}[i].raw);\n",
    "opaque_close": "    }}\n",
    "opaque_slot": "    int slot = lane;\n    opaque(slot);\n",
    "this_row": "    load_row(xr, in_x, row, rows, lane);\n",
    "bulk_take_row": """\
    bulk_wait(&xbar[row_in_block][buf], (nrow / (kStages + 1)) & 1);
#pragma unroll
    for (int i = 0; i < kBatch; ++i) xr[i] = s_xbuf[buf * kSlotsPerRow + i * kThreadsPerRow + lane];
    const int ahead = buf == 0 ? kStages : buf - 1;
    buf = buf == kStages ? 0 : buf + 1;
    ++nrow;
    if (lane == 0) {{
      const int r = (group + kStages * gridDim.x) * kRowsPerBlock + row_in_block;
      bulk_row(s_xbuf + ahead * kSlotsPerRow, in_x + (size_t)r * kHidden, kRowBytes,
               &xbar[row_in_block][ahead], r < rows);
    }}
""",
    "ring_take_row": """\
    cp_async_wait_group<kStages - 1>();
#pragma unroll
    for (int i = 0; i < kBatch; ++i) xr[i] = s_xbuf[buf * kSlotsPerRow + i * kThreadsPerRow + lane];
    // the buffer read one row ago (this thread's own slots, read into registers then)
    // takes the row kStages ahead
    const int ahead = buf == 0 ? kStages : buf - 1;
    buf = buf == kStages ? 0 : buf + 1;
    stage_row(s_xbuf + ahead * kSlotsPerRow, in_x,
              (group + kStages * gridDim.x) * kRowsPerBlock + row_in_block, rows, lane);
""",
    "row_packed": "    Vec<{t}, kVec> pv[kBatch];\n",
    "row_fp32": "    float v[kBatch][kVec];\n",
    "next_row": "    load_row(xr, in_x, (group + gridDim.x) * kRowsPerBlock + row_in_block, rows, lane);\n",
    "ring_drain": "  cp_async_wait_all();  // no copy outlives the block (the last one only zero-fills)\n",
    "function_close": "}}\n",
    # the prologue of a row in the persistent kernel: x from xr, tensors from their cache
    "prologue_open": """\
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {{
      const bool ok = i < kFullBatches || i * kThreadsPerRow + lane < kVectors;
""",
    "param_vec": "      const Vec<{t}, kVec> v_{name} = {value};\n",
    "head_only": "      if (!ok) h.raw = {{}};\n      pv[i] = h;\n    }}\n",
    "element_open": "#pragma unroll\n      for (int e = 0; e < kVec; ++e) {{\n",
    "first_x": "        float a = {value};\n",
    "keep_packed": "        pv[i].e[e] = {value};\n      }}\n    }}\n",
    "keep_fp32": "        v[i][e] = ok ? a : 0.f;\n      }}\n    }}\n",
    "parity_flip": "    parity ^= 1;\n",
    # One pass: this thread's slice exactly (count, mean, then the squares about that
    # mean, all in registers), then the row's (count, mean, M2) triples merged
    # pairwise, one barrier: no E[x^2] - E[x]^2 cancellation on rows with a large mean.
    "one_pass_stats": """\
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
    const float rstd = rsqrtf(q * (1.f / kHidden) + {eps}f);
    const float center = mean;
""",
    # ---- the persistent kernel's device functions, before the kernel
    "load_row_helper": """\
// One row's x slice into packed registers, streaming (__ldcs: read once); slots past the
// row or rows past the end read nothing and hold 0.
template <typename T, int kVec, int kBatch, int kThreadsPerRow, int kVectors, int kFullBatches>
__device__ __forceinline__ void load_row_t(Vec<T, kVec> (&xr)[kBatch], const T* __restrict__ x,
                                         int row, int rows, int lane, int hidden) {{
{body}
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
  load_row_t<{t}, kVec, kBatch, kThreadsPerRow, kVectors, kFullBatches>(xr, x, row, rows, lane, kHidden)
""",
    "ldg_vec": """\
// A vector of a 1-D tensor through the read-only path (L1, then L2); 0 where !ok.
template <typename T, int kVec>
__device__ __forceinline__ Vec<T, kVec> ldg_vec(const T* __restrict__ p, int vec, bool ok) {{
  Vec<T, kVec> r;
  r.raw = {{}};
  if (ok) r.raw = __ldg(&(reinterpret_cast<const Vec<T, kVec>*>(p) + vec)->raw);
  return r;
}}
""",
    # x is read once: with "evict_first" its lines are the first the L2 evicts
    "l2_policy": '  unsigned long long policy;\n'
                 '  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\\n" : "=l"(policy));\n',
    # .cg (L2 only) takes 16 bytes; narrower copies go .ca. The hint is the same.
    "cp_async_16": ('    asm volatile("cp.async.cg.shared.global{level} [%0], [%1], 16, %2{policy_arg};\\n" '
                    ':: "r"(d), "l"(src), "r"(n){policy_operand} : "memory");'),
    "cp_async_n": ('    asm volatile("cp.async.ca.shared.global{level} [%0], [%1], %2, %3{policy_arg_ca};\\n" '
                   ':: "r"(d), "l"(src), "n"(Bytes), "r"(n){policy_operand} : "memory");'),
    "stage_row_helper": """\
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
{body}
  asm volatile("cp.async.commit_group;\\n" ::: "memory");
}}
#define stage_row(buf, x, row, rows, lane) \\
  stage_row_t<{t}, kVec, kBatch, kThreadsPerRow, kVectors, kFullBatches>(buf, x, row, rows, lane, kHidden)
""",
    "bulk_helpers": """\
// x_bulk (PTX ISA: cp.async.bulk, mbarrier): one row of x, `bytes` long, into a shared
// buffer by the TMA engine, completing its bytes on mbarrier `bar` (expected first);
// a row past the end copies nothing and only arrives, so the phase still completes.
__device__ __forceinline__ void bulk_bar_init(unsigned long long* bar) {{
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\\n"
               :: "r"((unsigned)__cvta_generic_to_shared(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");
}}
__device__ __forceinline__ void bulk_row(void* dst, const void* src, unsigned bytes,
                                         unsigned long long* bar, bool ok) {{
  const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
  if (!ok) {{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\\n" :: "r"(b) : "memory");
    return;
  }}
  // the buffer was last read by ordinary loads: order them before the async-proxy write
  asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n"
               :: "r"(b), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1], %2, [%3];\\n"
               :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "r"(bytes), "r"(b)
               : "memory");
}}
__device__ __forceinline__ void bulk_wait(unsigned long long* bar, unsigned parity) {{
  asm volatile("{{\\n.reg .pred done;\\nWAIT:\\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\\n"
               "@!done bra WAIT;\\n}}\\n"
               :: "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(parity) : "memory");
}}
""",
    "chan_merge": """\
// (count, mean, M2) of a set merged with another's (Chan, Golub, LeVeque): exact in
// the way a two-pass variance is, the mean difference is small against the values.
__device__ __forceinline__ void chan_merge(float& n, float& m, float& q, float n2, float m2, float q2) {{
  const float nn = n + n2;
  if (nn > 0.f) {{
    const float d = m2 - m, f = n2 / nn;
    m += d * f;
    q += q2 + d * d * n * f;
    n = nn;
  }}
}}
__device__ __forceinline__ void warp_stats(float& n, float& m, float& q) {{
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    chan_merge(n, m, q, __shfl_xor_sync(0xffffffffu, n, offset),
               __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, q, offset));
}}
""",
    "row_stats_warp": """\
__device__ __forceinline__ void row_stats(float& n, float& m, float& q, void*) {{ warp_stats(n, m, q); }}
""",
    "row_stats_block": """\
// Several warps a row: each warp's lane 0 writes its triple, one barrier, then every
// warp merges all of them itself (the same order in every warp).
__device__ __forceinline__ void row_stats(float& n, float& m, float& q, float (*partials)[3]) {{
  const int lane = threadIdx.x & 31;
  const int warp = (threadIdx.x % {threads_per_row}) >> 5;
  warp_stats(n, m, q);
  if (lane == 0) {{ partials[warp][0] = n; partials[warp][1] = m; partials[warp][2] = q; }}
  __syncthreads();
  const bool mine = lane < {warps_per_row};
  n = mine ? partials[lane][0] : 0.f;
  m = mine ? partials[lane][1] : 0.f;
  q = mine ? partials[lane][2] : 0.f;
  warp_stats(n, m, q);
}}
""",
}

# The PTX level suffix of the cp.async of x for each `LaunchPlan.l2_hint`.
L2_HINT_LEVELS = {"": "", "evict_first": ".L2::cache_hint", "prefetch_256b": ".L2::256B"}


# The loops of load_row_t and stage_row_t (PersistentRenderer), by
# LaunchPlan.lean_addresses. Lean:
# one pointer to the row's (row 0's for a row past the end) first vector of this thread,
# each slot a constant offset from it; a slot of the last, partial batch past the row
# points at x itself (a cp.async of 0 bytes still names a readable address).
ROW_COPY_BODIES = {
    False: ("""\
#pragma unroll
  for (int i = 0; i < kBatch; ++i) {
    const int vec = i * kThreadsPerRow + lane;
    xr[i].raw = {};
    if (row < rows && (i < kFullBatches || vec < kVectors))
      xr[i].raw = __ldcs(&(reinterpret_cast<const Vec<T, kVec>*>(x + (size_t)row * hidden) + vec)->raw);
  }""", """\
#pragma unroll
  for (int i = 0; i < kBatch; ++i) {
    const int vec = i * kThreadsPerRow + lane;
    const bool ok = row < rows && (i < kFullBatches || vec < kVectors);
    const T* src = ok ? x + (size_t)row * hidden + (size_t)vec * kVec : x;
    cp_async<sizeof(T) * kVec>(buf + i * kThreadsPerRow + lane, src, ok);
  }"""),
    True: ("""\
  const bool in = row < rows;
  const Vec<T, kVec>* const src = reinterpret_cast<const Vec<T, kVec>*>(x + (size_t)(in ? row : 0) * hidden) + lane;
#pragma unroll
  for (int i = 0; i < kBatch; ++i) {
    xr[i].raw = {};
    if (in && (i < kFullBatches || i * kThreadsPerRow + lane < kVectors))
      xr[i].raw = __ldcs(&src[i * kThreadsPerRow].raw);
  }""", """\
  const bool in = row < rows;
  const Vec<T, kVec>* const src = reinterpret_cast<const Vec<T, kVec>*>(x + (size_t)(in ? row : 0) * hidden) + lane;
#pragma unroll
  for (int i = 0; i < kBatch; ++i) {
    const bool ok = in && (i < kFullBatches || i * kThreadsPerRow + lane < kVectors);
    const void* from = src + i * kThreadsPerRow;
    if (i >= kFullBatches && !ok) from = x;
    cp_async<sizeof(T) * kVec>(buf + i * kThreadsPerRow + lane, from, ok);
  }"""),
}


# ---- the shared-row kernel (`renderer.SharedRowRenderer`, `LaunchPlan.shared_row`)
# Slot i's chunk c of the row in the shared-row kernel's passes: its 16 raw bytes (shared
# memory for the first kShared slots, registers after), its first column and the lanes
# [lo, hi) that belong to the row (the aligned envelope's ends are masked).
_CHUNK_OF_SLOT = """\
        const uint4 raw = i < kShared ? s_x[i * kT + tid] : xr[i >= kShared ? i - kShared : 0];
        const int col0 = 8 * c - hx, lo = c == 0 ? hx : 0, hi = min(8, kHidden - col0);
        float v[8];
"""

SHARED_ROW_SNIPPETS = {
    "helpers": """\
// Sum over the block (one row a block): each warp's lane 0 writes its partial, one
// barrier, every warp sums them. The buffer alternates with each reduction: a warp
// writing reduction k+2's partials has passed k+1's barrier, which every warp reaches
// only after reading k's.
__device__ __forceinline__ float block_sum(float v, float (*partials)[32], int& parity) {{
  const int lane = threadIdx.x & 31;
  v = warp_sum(v);
  if (lane == 0) partials[parity][threadIdx.x >> 5] = v;
  __syncthreads();
  v = warp_sum(lane < {warps} ? partials[parity][lane] : 0.f);
  parity ^= 1;
  return v;
}}
// Raw 16-bit values of columns col0 .. col0+7 of a 1-D tensor, 0 outside [lo, hi).
// A full chunk is one 16-byte load where it is aligned, else the two aligned 16-byte
// vectors around it funnel-shifted into place (every byte read lies in a 16-byte
// granule holding an element of the tensor, so in its allocation's pages).
template <bool kFull, bool kAligned>
__device__ __forceinline__ uint4 cols16(const unsigned short* __restrict__ p, int col0, int lo,
                                        int hi) {{
  if (kFull) {{
    const size_t a = (size_t)(p + col0);
    const uint4* q = reinterpret_cast<const uint4*>(a & ~(size_t)15);
    uint4 u = __ldg(q);
    const int sh = kAligned ? 0 : (int)(a & 15) >> 1;  // elements into the aligned vector
    if (sh != 0) {{
      const uint4 n = __ldg(q + 1);
      const unsigned w[8] = {{u.x, u.y, u.z, u.w, n.x, n.y, n.z, n.w}};
      const int k = sh >> 1;
      const unsigned f = (sh & 1) * 16;
      unsigned s[5];
#pragma unroll
      for (int m = 0; m < 5; ++m) {{
        s[m] = w[m];
        s[m] = k == 1 ? w[m + 1] : s[m];
        s[m] = k == 2 ? w[m + 2] : s[m];
        s[m] = k == 3 ? w[m + 3] : s[m];
      }}
      u.x = __funnelshift_r(s[0], s[1], f);
      u.y = __funnelshift_r(s[1], s[2], f);
      u.z = __funnelshift_r(s[2], s[3], f);
      u.w = __funnelshift_r(s[3], s[4], f);
    }}
    return u;
  }} else {{
    Vec<unsigned short, 8> v;
#pragma unroll
    for (int e = 0; e < 8; ++e) v.e[e] = (e >= lo && e < hi) ? p[col0 + e] : (unsigned short)0;
    return v.raw;
  }}
}}
// A chunk's eight 16-bit values as floats, two a word (`unpack_*x2`), and back, two a
// conversion (`pack_*x2`): one instruction for each value in, one for two out, where
// taking the values out of the vector one by one cost a permute more for every other
// value in and one for every two out (layer norms 2-15% faster on an H200).
__device__ __forceinline__ void unpack8_bf16(float (&f)[8], const uint4 r) {{
  unpack_bf16x2(r.x, f[0], f[1]); unpack_bf16x2(r.y, f[2], f[3]);
  unpack_bf16x2(r.z, f[4], f[5]); unpack_bf16x2(r.w, f[6], f[7]);
}}
__device__ __forceinline__ void unpack8_fp16(float (&f)[8], const uint4 r) {{
  unpack_f16x2(r.x, f[0], f[1]); unpack_f16x2(r.y, f[2], f[3]);
  unpack_f16x2(r.z, f[4], f[5]); unpack_f16x2(r.w, f[6], f[7]);
}}
// Value e (a constant once unrolled) of a raw chunk as a float, one instruction: what a
// 1-D tensor's chunk is read with, so that it stays four registers until used.
__device__ __forceinline__ float elem8_bf16(const uint4 r, const int e) {{
  const unsigned w = e < 2 ? r.x : e < 4 ? r.y : e < 6 ? r.z : r.w;
  return __uint_as_float((e & 1) ? (w & 0xffff0000u) : (w << 16));
}}
__device__ __forceinline__ float elem8_fp16(const uint4 r, const int e) {{
  const unsigned w = e < 2 ? r.x : e < 4 ? r.y : e < 6 ? r.z : r.w;
  float lo, hi;
  unpack_f16x2(w, lo, hi);
  return (e & 1) ? hi : lo;
}}
__device__ __forceinline__ Vec<unsigned short, 8> pack8_bf16(const float (&o)[8]) {{
  Vec<unsigned short, 8> v;
  v.raw = make_uint4(pack_bf16x2(o[0], o[1]), pack_bf16x2(o[2], o[3]), pack_bf16x2(o[4], o[5]),
                     pack_bf16x2(o[6], o[7]));
  return v;
}}
__device__ __forceinline__ Vec<unsigned short, 8> pack8_fp16(const float (&o)[8]) {{
  Vec<unsigned short, 8> v;
  v.raw = make_uint4(pack_f16x2(o[0], o[1]), pack_f16x2(o[2], o[3]), pack_f16x2(o[4], o[5]),
                     pack_f16x2(o[6], o[7]));
  return v;
}}
// The same for fp32 tensors: two 16-byte loads where aligned, else element by element.
template <bool kFull, bool kAligned>
__device__ __forceinline__ void cols32(float (&r)[8], const float* __restrict__ p, int col0,
                                       int lo, int hi) {{
  if (kFull && (kAligned || ((size_t)(p + col0) & 15) == 0)) {{
    const float4 a = __ldg(reinterpret_cast<const float4*>(p + col0));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p + col0) + 1);
    r[0] = a.x; r[1] = a.y; r[2] = a.z; r[3] = a.w; r[4] = b.x; r[5] = b.y; r[6] = b.z; r[7] = b.w;
  }} else {{
#pragma unroll
    for (int e = 0; e < 8; ++e) r[e] = (kFull || (e >= lo && e < hi)) ? __ldg(p + col0 + e) : 0.f;
  }}
}}
// Stores of 8 output values to columns col0 .. col0+7 of a row of y: 16-byte stores
// where the chunk is full and aligned, else element by element within [lo, hi) (a
// partial chunk shares its granule with the next or previous row: those are not ours).
template <bool kFull, bool kAligned>
__device__ __forceinline__ void store16(unsigned short* __restrict__ y, const Vec<unsigned short, 8>& v,
                                        int col0, int lo, int hi) {{
  if (kFull && (kAligned || ((size_t)(y + col0) & 15) == 0)) {{
    __stcs(reinterpret_cast<uint4*>(y + col0), v.raw);
  }} else {{
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (kFull || (e >= lo && e < hi)) y[col0 + e] = v.e[e];
  }}
}}
template <bool kFull, bool kAligned>
__device__ __forceinline__ void store32(float* __restrict__ y, const float (&o)[8], int col0,
                                        int lo, int hi) {{
  if (kFull && (kAligned || ((size_t)(y + col0) & 15) == 0)) {{
    __stcs(reinterpret_cast<float4*>(y + col0), make_float4(o[0], o[1], o[2], o[3]));
    __stcs(reinterpret_cast<float4*>(y + col0) + 1, make_float4(o[4], o[5], o[6], o[7]));
  }} else {{
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (kFull || (e >= lo && e < hi)) y[col0 + e] = o[e];
  }}
}}
// cp.async of one 16-byte chunk, global -> shared (L2 only: x is read once).
__device__ __forceinline__ void copy_chunk(uint4* dst, const uint4* src) {{
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\\n"
               :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src) : "memory");
}}
__device__ __forceinline__ void copy_commit() {{ asm volatile("cp.async.commit_group;\\n" ::: "memory"); }}
__device__ __forceinline__ void copy_wait() {{ asm volatile("cp.async.wait_all;\\n" ::: "memory"); }}
// Wait until at most n of this thread's newest copy groups are pending (n is a constant
// once the slot loop is unrolled: one instruction).
__device__ __forceinline__ void copy_wait_pending(int n) {{
  switch (n) {{
{wait_cases}    default: asm volatile("cp.async.wait_all;\\n" ::: "memory");
  }}
}}
""",
    # the fp32 values of one chunk of x after the prologue, 0 outside [lo, hi)
    "values": """\
template <bool kFull>
__device__ __forceinline__ void chunk_values(float (&v)[8], const uint4 raw, const int col0,
                                             const int lo, const int hi{tensor_params}) {{
  float xf[8];
  unpack8_{x}(xf, raw);
{loads}#pragma unroll
  for (int e = 0; e < 8; ++e) {{
    float a = {first};
{ops}    v[e] = (kFull || (e >= lo && e < hi)) ? a : 0.f;
  }}
}}
""",
    # normalize one chunk's values, the norm's weight and bias, the epilogue, store
    "output": """\
template <bool kFull>
__device__ __forceinline__ void chunk_output(const float (&v)[8], const float center, const float rstd,
                                             {out_t}* __restrict__ y, const int col0, const int lo,
                                             const int hi{tensor_params}) {{
{loads}  {out_decl}
#pragma unroll
  for (int e = 0; e < 8; ++e) {{
    float a = (v[e] - center) * rstd;
{ops}    {out_assign}
  }}
  {store}
}}
""",
    "tensor_param": ", const {t}* __restrict__ in_{name}",
    "load16": "  const uint4 t_{name} = cols16<kFull, kRowsAligned>(in_{name}, col0, lo, hi);\n",
    "load32": "  float t_{name}[8];\n  cols32<kFull, kRowsAligned>(t_{name}, in_{name}, col0, lo, hi);\n",
    "add": "    a += {value};\n",
    "mul": "    a *= {value};\n",
    "cast": "    a = {value};\n",
    "kernel": """\
extern "C" __global__ void __launch_bounds__({block_threads}, {min_blocks})
{name}({params}, const int rows) {{
  dependent_launch_entry();
  // kSlots chunks a thread: the first kShared in shared memory, the rest in registers
  constexpr int kT = {threads}, kHidden = {hidden}, kSlots = {slots}, kShared = {shared};
  constexpr int kRegs = kSlots - kShared;
  extern __shared__ __align__(16) unsigned char staged[];
  uint4* const s_x = reinterpret_cast<uint4*>(staged);
  {partials_decl}
  int parity = 0;
  uint4 xr[kRegs > 0 ? kRegs : 1];
  const int tid = threadIdx.x;
  // the block's first row: every chunk of it requested before the loop
  {{
    const int row = blockIdx.x;
    const size_t xa = (size_t)(in_x + (size_t)row * kHidden);
    const int hx = kRowsAligned ? 0 : (int)(xa & 15) >> 1;
    const uint4* const src = reinterpret_cast<const uint4*>(xa - (xa & 15));
    const int nch = (hx + kHidden + 7) >> 3;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {{
      const int c = i * kT + tid;
      if (row < rows && c < nch) {{
        if (i < kShared) copy_chunk(s_x + i * kT + tid, src + c);
        else xr[i >= kShared ? i - kShared : 0] = __ldcs(src + c);
      }}
      if (i < kShared) copy_commit();  // one group a slot: the first pass waits slot by slot
    }}
  }}
#pragma unroll 1
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {{
    // the row in its aligned envelope: hx elements of the granule before it, nch chunks
    const size_t xa = (size_t)(in_x + (size_t)row * kHidden);
    const int hx = kRowsAligned ? 0 : (int)(xa & 15) >> 1;
    const int nch = (hx + kHidden + 7) >> 3;
    {out_t}* const y = out_y + (size_t)row * kHidden;
    {accumulate_init}
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {{
      const int c = i * kT + tid;
      // this thread's copy of slot i has landed (its own copies: no barrier); the later
      // slots' may still be on their way while this one is summed
      if (i < kShared) copy_wait_pending(kShared - 1 - i);
      if (c < nch) {{
""" + _CHUNK_OF_SLOT + """        if (kRowsAligned || (lo == 0 && hi == 8)) chunk_values<true>(v, raw, col0, lo, hi{tensor_args});
        else chunk_values<false>(v, raw, col0, lo, hi{tensor_args});
{accumulate}      }}
    }}
{stats}
    // the output pass; each chunk, once read, takes the block's next row's chunk
    const int next = row + gridDim.x;
    const size_t na = (size_t)(in_x + (size_t)(next < rows ? next : row) * kHidden);
    const int nhx = kRowsAligned ? 0 : (int)(na & 15) >> 1;
    const int nnch = next < rows ? (nhx + kHidden + 7) >> 3 : 0;
    const uint4* const nsrc = reinterpret_cast<const uint4*>(na - (na & 15));
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {{
      const int c = i * kT + tid;
      if (c < nch) {{
""" + _CHUNK_OF_SLOT + """        if (kRowsAligned || (lo == 0 && hi == 8)) {{
          chunk_values<true>(v, raw, col0, lo, hi{tensor_args});
          chunk_output<true>(v, center, rstd, y, col0, lo, hi{out_args});
        }} else {{
          chunk_values<false>(v, raw, col0, lo, hi{tensor_args});
          chunk_output<false>(v, center, rstd, y, col0, lo, hi{out_args});
        }}
      }}
      if (c < nnch) {{
        if (i < kShared) copy_chunk(s_x + i * kT + tid, nsrc + c);
        else xr[i >= kShared ? i - kShared : 0] = __ldcs(nsrc + c);
      }}
      if (i < kShared) copy_commit();
    }}
  }}
  copy_wait();
}}
""",
    # layer norm: the mean, then the squares about it (a second pass over shared memory)
    "layer_norm_stats": """\
    const float mean = block_sum(s, partials, parity) * (1.f / kHidden);
    s = 0.f;
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {{
      const int c = i * kT + tid;
      if (c < nch) {{
""" + _CHUNK_OF_SLOT + """        if (kRowsAligned || (lo == 0 && hi == 8)) {{
          chunk_values<true>(v, raw, col0, lo, hi{tensor_args});
#pragma unroll
          for (int e = 0; e < 8; ++e) {{ const float d = v[e] - mean; s += d * d; }}
        }} else {{
          chunk_values<false>(v, raw, col0, lo, hi{tensor_args});
#pragma unroll
          for (int e = 0; e < 8; ++e) {{ const float d = v[e] - mean; s += (e >= lo && e < hi) ? d * d : 0.f; }}
        }}
      }}
    }}
    const float rstd = rsqrtf(block_sum(s, partials, parity) * (1.f / kHidden) + {eps}f);
    const float center = mean;
""",
    "partials_sums": "__shared__ float partials[2][32];",
    "partials_triples": "__shared__ float partials[2][32][3];",
    "sum_init": "float s = 0.f;",
    "sum_accumulate": """\
#pragma unroll
        for (int e = 0; e < 8; ++e) s += {first_sum};
""",
    # one pass (a layer norm on one block an SM): each chunk's (count, mean, M2) exactly,
    # merged into the thread's by Chan's formula as the chunks land
    "triple_init": "float n = 0.f, m = 0.f, q = 0.f;",
    "triple_accumulate": """\
        {{
          const float k = (float)(hi - lo);
          float cs = 0.f;
#pragma unroll
          for (int e = 0; e < 8; ++e) cs += v[e];  // masked lanes hold 0
          const float cm = __fdividef(cs, k);
          float cq = 0.f;
#pragma unroll
          for (int e = 0; e < 8; ++e) {{
            const float d = v[e] - cm;
            cq += (e >= lo && e < hi) ? d * d : 0.f;
          }}
          chan_merge(n, m, q, k, cm, cq);
        }}
""",
    "one_pass_stats": """\
    block_stats(n, m, q, partials, parity);
    const float mean = m;
    const float rstd = rsqrtf(q * (1.f / kHidden) + {eps}f);
    const float center = mean;
""",
    "block_stats": """\
// The block's (count, mean, M2) from each thread's: warp shuffles, each warp's lane 0
// writes its triple, one barrier, every warp merges them all (the same order in each).
__device__ __forceinline__ void block_stats(float& n, float& m, float& q, float (*partials)[32][3],
                                            int& parity) {{
  const int lane = threadIdx.x & 31;
  warp_stats(n, m, q);
  if (lane == 0) {{
    float* p = partials[parity][threadIdx.x >> 5];
    p[0] = n; p[1] = m; p[2] = q;
  }}
  __syncthreads();
  const bool mine = lane < {warps};
  n = mine ? partials[parity][lane][0] : 0.f;
  m = mine ? partials[parity][lane][1] : 0.f;
  q = mine ? partials[parity][lane][2] : 0.f;
  warp_stats(n, m, q);
  parity ^= 1;
}}
""",
    "rms_norm_stats": """\
    const float rstd = rsqrtf(block_sum(s, partials, parity) * (1.f / kHidden) + {eps}f);
    const float center = 0.f;
""",
    "aligned_flag": "constexpr bool kRowsAligned = {aligned};\n",
}


# ---- the envelope row-wise kernel (`renderer.EnvelopeRenderer`, `LaunchPlan.envelope`)
# One row on kT threads, kRowsPerBlock rows a block, no loop: the row's aligned envelope
# (its 16-byte granules, `row_chunks`) in registers as raw 16-bit values, chunk c in slot
# c / kT of thread c % kT; each pass converts a chunk's values again (chunk_values of
# SHARED_ROW_SNIPPETS). The unrolled passes take whole chunks only; the row's partial
# first and last chunks (at most two a row) are taken after them, one value a lane
# (`edge_output`), so the element-wise stores are not repeated for every slot. The output
# pass is instantiated for each word shift of the 1-D tensors' chunks against x's (the
# same for every chunk of a row), so a chunk of a tensor is two loads and four funnel
# shifts; tensors with 16-byte phases of their own take the general helper.
ENVELOPE_SNIPPETS = {
    "constants": """\
constexpr int kT = {threads}, kHidden = {hidden}, kSlots = {slots};
constexpr int kRowsPerBlock = {rows_per_block};{cluster}
// The envelope's start: the row's first value rounded down to kLine bytes (16, or a
// cache line, 128, on a cluster: `LaunchPlan.envelope_line`); hx values of the envelope
// lie before the row, and chunks 0 .. hx / 8 - 1 hold none of it.
constexpr int kLine = {line};
// A row's last chunk: kLastA = ceil(kHidden / 8) - 1 where the row starts the envelope, up
// to kLastB further in (kLine / 2 - 1 values in); the slots that may hold it, kEdgeA and
// kEdgeB (chunk c is slot (c % (kT * kSlots)) / kT of its thread, in every CTA of a
// cluster alike; kT >= 32 chunks apart, the last's candidates span two slots at most).
constexpr int kLastA = (kHidden + 7) / 8 - 1;
constexpr int kLastB = kLine == 16 ? kLastA + 1 : (kHidden + kLine / 2 - 2) / 8;
constexpr int kEdgeA = (kLastA % (kT * kSlots)) / kT;
constexpr int kEdgeB = (kLastB % (kT * kSlots)) / kT;
constexpr int kPastA = (kLastA / kT + 1) * kT;  // the first chunk past kEdgeA's slot
constexpr bool kStaged = {staged};  // a cluster's 1-D tensors in shared memory (`staging`)
""",
    "helpers": """\
// A 16-byte vector of a 1-D tensor: where the cluster staged them, a plain (generic)
// load from shared memory (NVVM leaves it generic; an explicit ld.shared cost the
// kernel 8 registers and spilled), else by the read-only path.
__device__ __forceinline__ uint4 cols_vector(const uint4* q) {{ return kStaged ? *q : __ldg(q); }}
// Columns col0 .. col0+7 of a 16-bit 1-D tensor for a whole chunk, with the chunk kK
// words and f bits (0 or 16) past the aligned vector at p + col0 (a granule past it
// only where the chunk straddles two).
template <int kK>
__device__ __forceinline__ uint4 cols16k(const unsigned short* __restrict__ p, int col0, unsigned f) {{
  const uint4* q = reinterpret_cast<const uint4*>((size_t)(p + col0) & ~(size_t)15);
  const uint4 u = cols_vector(q);
  const uint4 n = (kK != 0 || f != 0) ? cols_vector(q + 1) : u;
  const unsigned w[8] = {{u.x, u.y, u.z, u.w, n.x, n.y, n.z, n.w}};
  return make_uint4(__funnelshift_r(w[kK], w[kK + 1], f), __funnelshift_r(w[kK + 1], w[kK + 2], f),
                    __funnelshift_r(w[kK + 2], w[kK + 3], f), __funnelshift_r(w[kK + 3], w[kK + 4], f));
}}
// normalize one whole chunk, the norm's weight and bias, the epilogue, store (where the
// tensors are not staged, y + col0 is 16-byte aligned: the dispatch checks it once a row)
template <int kK>
__device__ __forceinline__ void chunk_output_k(const float (&v)[8], const float center, const float rstd,
                                               {out_t}* __restrict__ y, const int col0,
                                               const unsigned f{tensor_params}) {{
  constexpr bool kFull = true;
  const int lo = 0, hi = 8;
{loads}  {out_decl}
#pragma unroll
  for (int e = 0; e < 8; ++e) {{
    float a = (v[e] - center) * rstd;
{ops}    {out_assign}
  }}
  {store}
}}
// A chunk with the elements outside lanes [lo, hi) set to 0 (the envelope's ends: x's
// neighbouring rows, or bytes past x), so that the passes need no mask.
__device__ __forceinline__ uint4 mask_chunk(const uint4 r, const int lo, const int hi) {{
  unsigned w[4] = {{r.x, r.y, r.z, r.w}};
#pragma unroll
  for (int k = 0; k < 4; ++k)
    w[k] &= ((2 * k >= lo && 2 * k < hi) ? 0xffffu : 0u)
          | ((2 * k + 1 >= lo && 2 * k + 1 < hi) ? 0xffff0000u : 0u);
  return make_uint4(w[0], w[1], w[2], w[3]);
}}
// Whether this thread's chunk c of slot i lies wholly before the row: only on a line
// envelope (kLine 128), where slot 0's chunks before the row's first, cf = hx / 8, hold
// none of it. The passes skip such a chunk; mask_edges zeroes it.
__device__ __forceinline__ bool chunk_before_row(const int i, const int c, const int cf) {{
  return kLine > 16 && i == 0 && c < cf;
}}
// One value of a partial chunk (the row's first or last: its granule is shared with the
// neighbouring row), value e of raw at column col0 + e: one lane each, out of line, its
// arguments all scalars (an array's address would put the caller's values in local memory)
__device__ __noinline__ void edge_output(const uint4 raw, const float center, const float rstd,
                                         {out_t}* __restrict__ y, const int col0,
                                         const int e{tensor_params}) {{
  float a = (elem8_{x}(raw, e) - center) * rstd;
{edge_loads}{edge_ops}  y[col0 + e] = {edge_out};
}}
__device__ __forceinline__ uint4 shfl_chunk(const uint4 v, const int from) {{
  return make_uint4(__shfl_sync(0xffffffffu, v.x, from), __shfl_sync(0xffffffffu, v.y, from),
                    __shfl_sync(0xffffffffu, v.z, from), __shfl_sync(0xffffffffu, v.w, from));
}}
// the output pass over this thread's whole chunks, the tensors kK words (and f bits)
// shifted; kK < 0: each chunk's shift from its own address (chunk_output)
template <int kK>
__device__ __forceinline__ void output_pass(const uint4 (&xr)[kSlots], const int tid, const int nch,
                                            const int hx, const float center, const float rstd,
                                            {out_t}* __restrict__ y, const unsigned f{tensor_params}) {{
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {{
    const int c = i * kT + tid;
    if (c < nch) {{
      const int col0 = 8 * c - hx;
      // a partial chunk (the row's first or last) lies in slot 0, kEdgeA or kEdgeB only,
      // and is taken after the loop: the other slots take no test; so do the chunks
      // before the row (slot 0, kLine 128), which are not stored
      const bool edge = !kRowsAligned && (i == 0 || i == kEdgeA || i == kEdgeB)
                        && ((kLine == 16 ? c == 0 && hx != 0 : c == (hx >> 3) && (hx & 7) != 0)
                            || col0 + 8 > kHidden);
      // (rows on 16 bytes come with hx 0: their chunks before the row number nch less
      // the row's own, kLastA + 1)
      const bool before = kLine > 16 && i == 0 && (kRowsAligned ? c < nch - (kLastA + 1) : col0 < 0);
      if (!edge && !before) {{
        float v[8];
        chunk_values<true>(v, xr[i], col0, 0, 8);
        if constexpr (kK >= 0) chunk_output_k<kK>(v, center, rstd, y, col0, f{out_args});
        else chunk_output<true>(v, center, rstd, y, col0, 0, 8{out_args});
      }}
    }}
  }}
  if (!kRowsAligned) {{
    // the row's partial chunks, one value a lane of the warp that holds each: lanes 0-7
    // its first (chunk hx / 8, slot 0 of thread hx / 8, where the row starts inside its
    // granule; it may be the last too), lanes 8-15 its last (slot kEdgeA or kEdgeB of its
    // holder), the chunk from its holder by shuffles. Each taken by its holder alone,
    // element by element, they cost a row of 513 values a fifth of its time (H200). The
    // conditions are the warp's alike (its rows' and its first thread's), as the
    // shuffles need.
    const int tail = (hx + kHidden) & 7;
    // (kLine 16: the row's first chunk is chunk 0, and hx its values before the row)
    const int cf = kLine == 16 ? 0 : hx >> 3, h0 = kLine == 16 ? hx : hx & 7;
    const int last = nch - 1;
    const int lane = threadIdx.x & 31, base = tid - lane;  // the warp's first thread
    const bool first = base == 0 && nch > 0 && (h0 != 0 || (last == cf && tail != 0));
    const bool in_a = kLine == 16 ? last == kLastA : last < kPastA;  // kEdgeA's slot, or kEdgeB's
    const int holder = kLine == 16 ? (in_a ? kLastA - kEdgeA * kT : kLastA + 1 - kEdgeB * kT)
                                   : last - (in_a ? kEdgeA : kEdgeB) * kT;
    const bool end = tail != 0 && last > cf && holder >= base && holder < base + 32;
    if (first || end) {{
      uint4 raw = make_uint4(0u, 0u, 0u, 0u);
      int col0 = 0, lo = 0, hi = 0;
      if (first) {{
        const uint4 a = shfl_chunk(xr[0], cf);
        if (lane < 8) {{ raw = a; col0 = -h0; lo = h0; hi = min(8, kHidden + h0); }}
      }}
      if (end) {{
        const uint4 b = shfl_chunk(in_a ? xr[kEdgeA] : xr[kEdgeB], holder - base);
        if (lane >= 8 && lane < 16) {{ raw = b; col0 = 8 * last - hx; hi = tail; }}
      }}
      const int e = lane & 7;
      if (e >= lo && e < hi) edge_output(raw, center, rstd, y, col0, e{out_args});
    }}
  }}
}}
""",
    "row_sum2_warp": """\
__device__ __forceinline__ void row_sum2(float& a, float& b, float (*)[2]) {{
  a = warp_sum(a);
  b = warp_sum(b);
}}
""",
    "row_sum2_block": """\
// two sums over the threads of one row: each warp's lane 0 writes its partials, one
// barrier, every warp adds them all
__device__ __forceinline__ void row_sum2(float& a, float& b, float (*partials)[2]) {{
  const int lane = threadIdx.x & 31;
  const int warp = (threadIdx.x % kT) >> 5;
  a = warp_sum(a);
  b = warp_sum(b);
  if (lane == 0) {{ partials[warp][0] = a; partials[warp][1] = b; }}
  __syncthreads();
  a = warp_sum(lane < kT / 32 ? partials[lane][0] : 0.f);
  b = warp_sum(lane < kT / 32 ? partials[lane][1] : 0.f);
}}
""",
    "load16": "  const uint4 t_{name} = cols16k<kK>(in_{name}, col0, f);\n",
    # a pass over the row's chunks: the whole ones in the unrolled loop, then the edges
    # a pass over the row's chunks (the envelope's ends hold 0: see mask_chunk)
    "pass": """\
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {{
    const int c = i * kT + tid;
    // (not the chunks before the row, kLine 128: a layer norm's shifted sums would take
    // their -shift back out, badly where the mean is large against the spread)
    if (c < nch && !chunk_before_row(i, c, hx >> 3)) {{
      float v[8];
      chunk_values<true>(v, xr[i], 8 * c - hx, 0, 8);
#pragma unroll
      for (int e = 0; e < 8; ++e) {{
{whole}      }}
    }}
  }}
""",
    "kernel": """\
extern "C" __global__ void __launch_bounds__({block_threads}, {min_blocks})
{name}({params}, const int rows) {{
  dependent_launch_entry();
  {partials_decl}
  const int tid = threadIdx.x % kT;
  const int row_in_block = threadIdx.x / kT;
  const int row = blockIdx.x * kRowsPerBlock + row_in_block;
  const bool row_ok = row < rows;
{row}}}
""",
    # A row split over a cluster (``LaunchPlan.cluster``), persistent: the cluster strides
    # over the rows, CTA r holding chunks r * kT * kSlots on of each. A row's sums: the
    # block's (warp shuffles, then shared memory), then thread 0 pushes them into slot r
    # of every CTA's shared memory by asynchronous stores that count their bytes on that
    # CTA's mbarrier (`share_push`: no fence, so no wait for the y stores in flight), and
    # every thread waits for its own CTA's mbarrier and adds the kCluster slots in rank
    # order: the same statistics in every CTA. Two sets of slots and mbarriers, by the
    # parity of the CTA's row count: a CTA pushes row n + 2's sums only after every CTA's
    # row n + 1 sums reached it, which each pushed after it had read row n's slots.
    "kernel_cluster": """\
extern "C" __global__ void __launch_bounds__({block_threads}, {min_blocks}) __cluster_dims__(kCluster, 1, 1)
{name}({params}, const int rows) {{
  dependent_launch_entry();
  // dynamic shared memory (`LaunchPlan.dynamic_shared_bytes`): the ring of this CTA's
  // chunks of the next row, then by the parity of the row: the mbarriers counting its
  // shares, the shares (every CTA's sums of the row), the warps' sums{pivots_doc}
  uint4* const ring = reinterpret_cast<uint4*>(seam_dynamic_smem());  // kSlots x kT chunks
  unsigned long long* const bars = reinterpret_cast<unsigned long long*>(ring + kSlots * kT);
  float (*const slots)[kCluster][2] = reinterpret_cast<float (*)[kCluster][2]>(bars + 2);
  float (*const partials)[kT / 32][2] = reinterpret_cast<float (*)[kT / 32][2]>(slots + 2);
{pivots_decl}  const int rank = (int)cluster_rank();
  const int tid = threadIdx.x + rank * (kT * kSlots);  // chunk i * kT + tid of slot i
  if (threadIdx.x == 0) {{
    mbar_init(&bars[0]);
    mbar_init(&bars[1]);
  }}
{staging}  cluster_sync();  // every CTA's mbarriers initialized before a share is pushed to them
  const int teams = gridDim.x / kCluster;
  // this thread's chunks of a row, by cp.async into its slots of the ring (a row ahead)
  const auto prefetch = [&](const int r, const int set) {{
    if (r < rows) {{
      const size_t a = (size_t)(in_x + (size_t)r * kHidden);
      const int h = kRowsAligned && kLine == 16 ? 0 : (int)(a & (kLine - 1)) >> 1;
      const int chunks = (h + kHidden + 7) >> 3;
      const uint4* const from = reinterpret_cast<const uint4*>(a - (a & (kLine - 1)));
      const uint4* const from_t = from + tid;  // this thread's chunks: constant offsets from it
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {{  // (not the chunks before the row: slot 0)
        if (i * kT + tid < chunks && (i > 0 || tid >= (h >> 3)))
          cp_async16(ring + i * kT + threadIdx.x, from_t + i * kT);
      }}
{pivot_copy}    }}
    cp_async_commit();
  }};
  prefetch(blockIdx.x / kCluster, 0);
  int n = 0;
#pragma unroll 1
  for (int row = blockIdx.x / kCluster; row < rows; row += teams, ++n) {{
    const int set = n & 1;
    if (threadIdx.x == 0) mbar_expect(&bars[set], kCluster * 8);
    constexpr bool row_ok = true;
{row}  }}
}}
""",
    # the exchange of a row's two block sums s, q over the cluster (see kernel_cluster)
    "cluster_exchange": """\
  if (threadIdx.x == 0) {{
#pragma unroll
    for (int r = 0; r < kCluster; ++r) share_push(&slots[set][rank][0], r, s, q, &bars[set]);
  }}
  mbar_wait_cluster(&bars[set], (n >> 1) & 1);
  s = 0.f;
  q = 0.f;
#pragma unroll
  for (int r = 0; r < kCluster; ++r) {{
    s += slots[set][r][0];
    q += slots[set][r][1];
  }}
""",
    # the statistics of an RMS norm's row on a cluster: its sum of squares in s
    "rms_norm_cluster_stats": """\
  float q = 0.f;
  row_sum2(s, q, partials[set]);
{exchange}  const float rstd = rsqrtf(s * (1.f / kHidden) + {eps}f);
  const float center = 0.f;
""",
    # one row in its aligned envelope: hx elements of the granule before it, nch chunks
    "row": """\
  const size_t xa = (size_t)(in_x + (size_t)(row_ok ? row : 0) * kHidden);
  const int hx = kRowsAligned && kLine == 16 ? 0 : (int)(xa & (kLine - 1)) >> 1;
  const int nch = row_ok ? (hx + kHidden + 7) >> 3 : 0;
  const uint4* const src = reinterpret_cast<const uint4*>(xa - (xa & (kLine - 1)));
  {out_t}* const y = out_y + (size_t)(row_ok ? row : 0) * kHidden;
  uint4 xr[kSlots];
  int masked = 0;  // elements of this thread's chunks outside the row (held as 0)
{load}  if (!kRowsAligned || kLine > 16) {{
{mask}  }}
{first_pass}{stats}{dispatch}""",
    # the row's partial chunks zeroed outside the row, `masked` counting what was zeroed:
    # on one CTA every slot is tested (a test of slots 0, kEdgeA and kEdgeB only, as the
    # output pass does, ran a layer norm of 8191 columns 18% slower on the H200), on a
    # cluster those three only (`mask_edges`: layer norms of 30001-65535 columns 2-5%
    # faster on the H200, RMS norms -0.4% to +2.4%)
    "mask_all": """\
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int c = i * kT + tid;
      const int lo = c == 0 ? hx : 0, hi = min(8, kHidden - (8 * c - hx));
      if (c < nch && (lo != 0 || hi != 8)) {
        xr[i] = mask_chunk(xr[i], lo, hi);
        masked += 8 - (hi - lo);
      }
    }
""",
    "mask_edges": """\
    const int tail = (hx + kHidden) & 7;  // values of the row in its last chunk (0: all 8)
    const int cf = hx >> 3, h0 = hx & 7;  // the row's first chunk, its values before the row
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      if (i == 0 || i == kEdgeA || i == kEdgeB) {
        const int c = i * kT + tid;
        const bool last = c == nch - 1 && tail != 0;
        if (chunk_before_row(i, c, cf)) {  // (its slot not copied) out of the passes;
          // zeroed here, not at the load (36 bytes of spills there)
          xr[i] = make_uint4(0u, 0u, 0u, 0u);
        } else if (c < nch && ((c == cf && h0 != 0) || last)) {
          const int lo = c == cf ? h0 : 0, hi = last ? tail : 8;
          xr[i] = mask_chunk(xr[i], lo, hi);
          masked += 8 - (hi - lo);
        }
      }
    }
""",
    "load": """\
  const uint4* const src_t = src + tid;  // this thread's chunks: constant offsets from it
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {{
    xr[i] = make_uint4(0u, 0u, 0u, 0u);
    if (i * kT + tid < nch) xr[i] = __ldcs(src_t + i * kT);
  }}
""",
    # a cluster's row: copied into the ring during the row before (`prefetch`); read
    # into registers, then the ring takes the next row (and a layer norm's shift, the
    # row's first value, is loaded a row ahead too)
    "load_ring": """\
  cp_async_wait<0>();
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {{
    const int c = i * kT + tid;
    xr[i] = c < nch ? ring[i * kT + threadIdx.x] : make_uint4(0u, 0u, 0u, 0u);
  }}
{pivot_read}  asm volatile("" ::: "memory");  // those reads stay before the copies into their slots
  prefetch(row + teams, set ^ 1);
""",
    "dispatch": """\
  // the 1-D tensors' chunks sit sh elements into their aligned vectors, for every whole
  // chunk of the row alike where the tensors share their 16-byte phase{ydoc}
  const int sh = ({phase} - hx) & 7;
  const unsigned f = (sh & 1) * 16;
  switch (({same}){ycheck} ? sh >> 1 : -1) {{
    case 0: output_pass<0>(xr, tid, nch, hx, center, rstd, y, f{out_args}); break;
    case 1: output_pass<1>(xr, tid, nch, hx, center, rstd, y, f{out_args}); break;
    case 2: output_pass<2>(xr, tid, nch, hx, center, rstd, y, f{out_args}); break;
    case 3: output_pass<3>(xr, tid, nch, hx, center, rstd, y, f{out_args}); break;
    default: output_pass<-1>(xr, tid, nch, hx, center, rstd, y, f{out_args});
  }}
""",
    # rows on 16 bytes: y and the tensors taken hx values back (kLine 128; 0 on 16), so
    # that chunk c's columns are 8c, constant offsets from them (with hx in the columns
    # instead, held layer norms on clusters spilled 8-16 bytes at 48-56 registers)
    "dispatch_aligned": "  output_pass<0>(xr, tid, nch, 0, center, rstd, y - hx, 0u{out_args});\n",
    "sum_init": "  float s = 0.f;\n",
    "rms_whole": "        s += v[e] * v[e];\n",
    "sum_whole": "        s += v[e];\n",
    "centered_whole": "        const float d = v[e] - mean;\n        s += d * d;\n",
    "rms_norm_stats": """\
  const float rstd = rsqrtf(row_sum(s, {partials0}) * (1.f / kHidden) + {eps}f);
  const float center = 0.f;
""",
    # layer norm, two passes: the mean, then the squares about it
    "mean": """\
  const float mean = row_sum(s, {partials0}) * (1.f / kHidden);
  s = 0.f;
""",
    # (the masked elements' (0 - mean)^2 taken back out)
    "layer_norm_stats": """\
  s -= (float)masked * mean * mean;
  const float rstd = rsqrtf(row_sum(s, {partials1}) * (1.f / kHidden) + {eps}f);
  const float center = mean;
""",
    # layer norm, one pass (``LaunchPlan.one_pass``): the sums of d and d^2 for d the
    # values less the row's first one (shifted data: no cancellation of a large mean)
    "shift_init": "  const float shift = row_ok ? {first} : 0.f;\n  float s = 0.f, q = 0.f;\n",
    # rows off 16 bytes on a cluster (`LaunchPlan.staged`): the CTA's columns of each
    # 16-bit 1-D tensor, at any shift of the row, copied once into shared memory on 16
    # bytes; the row reads them through s_<name> (phase 0: the dispatch takes every row's
    # shift from x alone), two shared vectors a chunk where it read two global ones
    # (`cols_vector`)
    "staging": """\
  // the CTA's chunks' columns, their 16-byte granules and kLine / 16 before (a chunk's
  // vectors lie up to kLine / 16 granules before its first column) and one after
  constexpr int kStagedColumns = 8 * (kT * kSlots + 1 + kLine / 16);
  unsigned short* const staged = reinterpret_cast<unsigned short*>({base});
  const int staged_lo = 8 * (rank * (kT * kSlots) - kLine / 16);  // the first column staged
  for (int e = threadIdx.x; e < kStagedColumns; e += kT) {{
    const int col = staged_lo + e;
    const bool in = col >= 0 && col < kHidden;
{copies}  }}
{pointers}""",
    "staging_copy": "    staged[{k} * kStagedColumns + e] = in ? in_{name}[col] : (unsigned short)0;\n",
    "staging_pointer": "  const unsigned short* const s_{name} = staged + {k} * kStagedColumns - staged_lo;\n",
    # a cluster's layer norm: the shift (the row's first value) is copied a row ahead with
    # the ring, the 16 bytes holding it into a slot of each warp (by the row's parity), so
    # that it waits with the ring's copies; a load of it from global memory a row ahead
    # had ptxas move it to a uniform register at once, waiting on the load every row
    "pivots_doc": ", the\n  // granule holding each row's first value, a copy for each warp",
    "pivots_decl": "  uint4 (*const pivots)[kT / 32] = reinterpret_cast<uint4 (*)[kT / 32]>(partials + 2);\n",
    "pivot_copy": "      if ((threadIdx.x & 31) == 0) cp_async16(&pivots[set][threadIdx.x >> 5], from + (h >> 3));\n",
    "pivot_read": """\
  __syncwarp();  // lane 0's copy of the granule, waited for above, seen by its warp
  const float pivot_now = {first};
""",
    "shifted_whole": "        const float d = v[e] - shift;\n        s += d;\n        q += d * d;\n",
    "one_pass_stats": """\
  s += (float)masked * shift;  // the masked elements' d = -shift taken back out
  q -= (float)masked * shift * shift;
  row_sum2(s, q, {partials});
{exchange}  const float m1 = s * (1.f / kHidden);
  const float mean = shift + m1;
  const float rstd = rsqrtf(fmaxf(q * (1.f / kHidden) - m1 * m1, 0.f) + {eps}f);
  const float center = mean;
""",
}
