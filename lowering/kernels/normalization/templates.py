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
// x + b for 16-bit vectors, two lanes an instruction (PACKED_HEAD). Exactly the
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
// no-ops. Measured: benchmarks/results/norm_pdl_probe_nvidia-h200.json.
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
}


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
