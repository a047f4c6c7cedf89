"""CUDA C++ text of the transformer-seam kernels (`lowering.kernels.seams` assembles it).

Every kernel carries 16-bit floats as raw bits (`render.SNIPPETS["convert"]`) and does
its math in fp32. The pieces:

- ``vec_io``: loads and stores of V = 1, 2, 4 or 8 consecutive 16-bit values as one
  2-, 4-, 8- or 16-byte access, converted to / from floats through ``to_f`` / ``from_f``
  and ``pack2`` (defined per dtype by the renderer).
- ``row_sum``: the sum of N floats over the TPR threads of one row (a ``threadIdx.y``
  slot of the block): warp shuffles, then one shared-memory exchange between the warps.
- the kernels' bodies (`ADD_NORM_FORWARD`, `ADD_NORM_BACKWARD`, `COLUMN_REDUCE`,
  `ELEMENTWISE`) and the pointwise math of the elementwise ops (`POINTWISE`).

The row kernels are persistent: a grid of a few CTAs per SM (the forward) or one CTA an
SM (the backward, whose tiles of rows are staged through shared memory by cp.async,
`STAGING`) strides over groups of RPB rows, so that the backward can keep each thread's
weight-gradient partial sums in registers over all of its rows and write them once per
CTA (or cluster of CTAs, for rows wider than one CTA holds).
"""

from __future__ import annotations

from lowering.kernels import render

# The kernels' only view of their dtype: to_f / from_f / pack2 over render's conversions
# (@TO@, @FROM@, @PACK@ filled per dtype), unpack2 from `UNPACK2`.
DTYPE_FUNCTIONS = r"""
__device__ __forceinline__ float to_f(unsigned short x) { return @TO@(x); }
__device__ __forceinline__ unsigned short from_f(float x) { return @FROM@(x); }
__device__ __forceinline__ unsigned int pack2(float lo, float hi) { return @PACK@(lo, hi); }
__device__ __forceinline__ void unpack2(unsigned int w, float& lo, float& hi) { @UNPACK@ }
"""
UNPACK2 = {d: f"{name}(w, lo, hi);" for d, name in render.UNPACK2.items()}

VEC_IO = r"""
// V consecutive 16-bit values as one access of 2*V bytes (the caller keeps it aligned).
template <int V> __device__ __forceinline__ void load_vec(const unsigned short* p, float* f) {
  if constexpr (V == 8) {
    const uint4 r = *reinterpret_cast<const uint4*>(p);
    unpack2(r.x, f[0], f[1]); unpack2(r.y, f[2], f[3]);
    unpack2(r.z, f[4], f[5]); unpack2(r.w, f[6], f[7]);
  } else if constexpr (V == 4) {
    const uint2 r = *reinterpret_cast<const uint2*>(p);
    unpack2(r.x, f[0], f[1]); unpack2(r.y, f[2], f[3]);
  } else if constexpr (V == 2) {
    unpack2(*reinterpret_cast<const unsigned int*>(p), f[0], f[1]);
  } else {
    f[0] = to_f(*p);
  }
}
template <int V> __device__ __forceinline__ void store_vec(unsigned short* p, const float* f) {
  if constexpr (V == 8) {
    uint4 r;
    r.x = pack2(f[0], f[1]); r.y = pack2(f[2], f[3]);
    r.z = pack2(f[4], f[5]); r.w = pack2(f[6], f[7]);
    *reinterpret_cast<uint4*>(p) = r;
  } else if constexpr (V == 4) {
    uint2 r;
    r.x = pack2(f[0], f[1]); r.y = pack2(f[2], f[3]);
    *reinterpret_cast<uint2*>(p) = r;
  } else if constexpr (V == 2) {
    *reinterpret_cast<unsigned int*>(p) = pack2(f[0], f[1]);
  } else {
    *p = from_f(f[0]);
  }
}
// Eight values as one 16-byte global store, kept whole: through a pointer with a run-time
// offset of 2-byte steps (the phased backward's dx) the compiler split store_vec<8>'s
// into four 4-byte stores, which the caller knows to be aligned.
__device__ __forceinline__ void store_vec8_whole(unsigned short* p, const float* f) {
#ifdef SEAM_HOST
  if ((unsigned long long)p & 15) std::abort();  // the GPU would fault
  store_vec<8>(p, f);
#else
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(pack2(f[0], f[1])),
               "r"(pack2(f[2], f[3])), "r"(pack2(f[4], f[5])), "r"(pack2(f[6], f[7])));
#endif
}
// A thread's weight-gradient sums of one vector, V fp32 values (a multiple of 4): w's at
// pw and, with BIAS (a layer norm's dbias), b's at pb, as 16-byte stores taken in turn
// (the callers keep pw and pb 16-byte aligned), into shared or global memory.
template <int V, bool BIAS>
__device__ __forceinline__ void store_sums(float* pw, const float* w, float* pb, const float* b) {
  static_assert(V % 4 == 0, "whole 16-byte stores");
#pragma unroll
  for (int i = 0; i < V; i += 4) {
    *reinterpret_cast<float4*>(pw + i) = make_float4(w[i], w[i + 1], w[i + 2], w[i + 3]);
    if constexpr (BIAS)
      *reinterpret_cast<float4*>(pb + i) = make_float4(b[i], b[i + 1], b[i + 2], b[i + 3]);
  }
}
// The value as the dtype holds it (the residual stream is stored rounded, and the norm
// is taken of what was stored, as the reference does).
__device__ __forceinline__ float rounded(float v) { return to_f(from_f(v)); }
// A vector's raw 16-bit values, held packed (half the registers of floats) while a load
// is in flight across other work; `raw_to_f` converts once it is needed.
template <int V> struct Raw { unsigned int w[V > 1 ? V / 2 : 1]; };
template <int V> __device__ __forceinline__ void load_raw(const unsigned short* p, Raw<V>& r) {
  if constexpr (V == 8) {
    const uint4 q = *reinterpret_cast<const uint4*>(p);
    r.w[0] = q.x; r.w[1] = q.y; r.w[2] = q.z; r.w[3] = q.w;
  } else if constexpr (V == 4) {
    const uint2 q = *reinterpret_cast<const uint2*>(p);
    r.w[0] = q.x; r.w[1] = q.y;
  } else if constexpr (V == 2) {
    r.w[0] = *reinterpret_cast<const unsigned int*>(p);
  } else {
    r.w[0] = *p;
  }
}
template <int V> __device__ __forceinline__ void raw_to_f(const Raw<V>& r, float* f) {
  if constexpr (V == 1) {
    f[0] = to_f((unsigned short)r.w[0]);
  } else {
#pragma unroll
    for (int i = 0; i < V / 2; ++i) unpack2(r.w[i], f[2 * i], f[2 * i + 1]);
  }
}
"""

# Programmatic dependent launch (sm_90+; runtime.fused launches so there): the next
# kernel on the stream may launch now, its launch overlapping this one's last rows; then
# wait until the kernel before this one has completed and its writes are visible, before
# any global memory is touched. Without the launch attribute both are no-ops, so every
# seam kernel calls this first and is as safe as a plain launch.
DEPENDENT_ENTRY = r"""
__device__ __forceinline__ void dependent_launch_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
"""

ROW_SUM = r"""
// A sum of N floats over the TPR threads of one row, in two halves for a caller whose own
// barrier lies between them: row_part sums each warp's values and leaves them in `red`
// (this row's shared slot of WARPS * N floats; with one warp a row, the totals are in
// `v` already); after that barrier, row_total sums the slot's warps into every thread.
// warp_sum: each of N floats summed over the warp into every lane (a butterfly: every
// lane adds the same pairs, so every lane holds the same bits).
template <int N>
__device__ __forceinline__ void warp_sum(float (&v)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
  }
}
template <int N>
__device__ __forceinline__ void row_part(float (&v)[N], float* red) {
  warp_sum<N>(v);
  if constexpr (WARPS > 1) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < N; ++i) red[warp * N + i] = v[i];
    }
  }
}
// Lanes in use for n entries, one a lane: n rounded up to a power of two.
__host__ __device__ constexpr int lanes_in_use(int n) { return n >= 32 ? 32 : n <= 1 ? 1 : 2 * lanes_in_use((n + 1) / 2); }
template <int N, bool LANES = false>
__device__ __forceinline__ void row_total(float (&v)[N], const float* red) {
  if constexpr (WARPS > 1 && LANES) {
    // the slot's WARPS x N entries one a lane (lane l: column l % N), a butterfly over
    // the lanes of each column, then lane i's total is column i's: one load and log2 of
    // the lanes in use shuffles, where each thread adding the entries itself pays WARPS
    // x N loads and adds (16 warps of two sums: 32 of each). Every warp adds the same
    // pairs in the same order, so every thread holds the same bits.
    static_assert(WARPS * N <= 32 && 32 % N == 0, "one entry a lane, a column's lanes alike");
    const int lane = threadIdx.x & 31;
    float t = 0.f;
    if (lane < WARPS * N) t += red[lane];
#pragma unroll
    for (int o = N; o < lanes_in_use(WARPS * N); o <<= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = __shfl_sync(0xffffffffu, t, i);
  } else if constexpr (WARPS > 1) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) s += red[w * N + i];
      v[i] = s;
    }
  }
}
// Both halves with the barrier between: every thread gets the totals. All threads of the
// block call it the same number of times (rows past the end contribute zeros), so the
// barriers match. REUSED_NEXT: the next call writes the same slot, so a second barrier
// waits until every thread has read it out; a caller alternating between two slots
// passes false (a slot is written again only two calls on, after every thread passed
// the call between).
template <int N, bool REUSED_NEXT = true, bool LANES = false>
__device__ __forceinline__ void row_sum(float (&v)[N], float* red) {
  row_part<N>(v, red);
  if constexpr (WARPS > 1) {
    __syncthreads();
    row_total<N, LANES>(v, red);
    if constexpr (REUSED_NEXT) __syncthreads();
  }
}
"""

# h = x (+ residual), stored rounded; y = (h - mean) * rstd * w (+ b); mean, rstd saved.
# CACHED: the row's values stay in registers (K vectors a thread); else each pass reads
# the row again (the second and third reads hit L2: the row was just touched).
ADD_NORM_FORWARD = r"""
dependent_launch_entry();
__shared__ float red[RPB][WARPS * 2];
const int tx = threadIdx.x, ty = threadIdx.y;
const int groups = (rows + RPB - 1) / RPB;
// the stream the norm reads back: h where it is written, else x itself
const unsigned short* src = RESIDUAL ? (const unsigned short*)h : x;
for (int g = blockIdx.x; g < groups; g += gridDim.x) {
  const int row = g * RPB + ty;
  const bool live = row < rows;
  const size_t base = (size_t)(live ? row : 0) * HIDDEN;
  float s[1] = {0.f};
#if SEAM_CACHED
  float v[K][V];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = tx + k * TPR;
    if (live && c < NVEC) {
      load_vec<V>(x + base + (size_t)c * V, v[k]);
      if constexpr (RESIDUAL) {
        float r[V];
        load_vec<V>(residual + base + (size_t)c * V, r);
#pragma unroll
        for (int i = 0; i < V; ++i) v[k][i] = rounded(v[k][i] + r[i]);
        store_vec<V>(h + base + (size_t)c * V, v[k]);
      }
#pragma unroll
      for (int i = 0; i < V; ++i) s[0] += LAYER ? v[k][i] : v[k][i] * v[k][i];
    } else {
#pragma unroll
      for (int i = 0; i < V; ++i) v[k][i] = 0.f;
    }
  }
#else
  for (int c = tx; c < NVEC; c += TPR) {
    if (!live) break;
    float v[V];
    load_vec<V>(x + base + (size_t)c * V, v);
    if constexpr (RESIDUAL) {
      float r[V];
      load_vec<V>(residual + base + (size_t)c * V, r);
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = rounded(v[i] + r[i]);
      store_vec<V>(h + base + (size_t)c * V, v);
    }
#pragma unroll
    for (int i = 0; i < V; ++i) s[0] += LAYER ? v[i] : v[i] * v[i];
  }
#endif
  row_sum<1>(s, red[ty]);
  float mean = 0.f, rstd;
  if constexpr (LAYER) {
    mean = s[0] * (1.f / HIDDEN);
    // two-pass (centered) variance: no cancellation for rows with a large mean
    float q[1] = {0.f};
#if SEAM_CACHED
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = tx + k * TPR;
      if (live && c < NVEC) {
#pragma unroll
        for (int i = 0; i < V; ++i) { const float d = v[k][i] - mean; q[0] += d * d; }
      }
    }
#else
    for (int c = tx; c < NVEC; c += TPR) {
      if (!live) break;
      float v[V];
      load_vec<V>(src + base + (size_t)c * V, v);
#pragma unroll
      for (int i = 0; i < V; ++i) { const float d = v[i] - mean; q[0] += d * d; }
    }
#endif
    row_sum<1>(q, red[ty]);
    rstd = rsqrtf(q[0] * (1.f / HIDDEN) + eps);
  } else {
    rstd = rsqrtf(s[0] * (1.f / HIDDEN) + eps);
  }
  if (!live) continue;
  if (tx == 0) {
    rstd_out[row] = rstd;
    if constexpr (LAYER) mean_out[row] = mean;
  }
#if SEAM_CACHED
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = tx + k * TPR;
    if (c < NVEC) {
      float* hv = v[k];
#else
  for (int c = tx; c < NVEC; c += TPR) {
    {
      float hv[V];
      load_vec<V>(src + base + (size_t)c * V, hv);
#endif
      float w[V], out[V];
      load_vec<V>(weight + (size_t)c * V, w);
#pragma unroll
      for (int i = 0; i < V; ++i) out[i] = (hv[i] - mean) * rstd * w[i];
      if constexpr (BIAS) {
        float b[V];
        load_vec<V>(bias + (size_t)c * V, b);
#pragma unroll
        for (int i = 0; i < V; ++i) out[i] += b[i];
      }
      store_vec<V>(y + base + (size_t)c * V, out);
    }
  }
}
"""

# Shared-memory staging of the backward (sm_80+: cp.async; sm_90+: clusters). A
# 16-byte chunk that holds a byte of a tensor lies in the same page as that byte, so a
# row's first and last chunks may be copied whole (their bytes outside the row are never
# read back) without faulting. The host tests swap these for plain copies.
STAGING = r"""
#ifndef SEAM_HOST
__device__ __forceinline__ unsigned char* seam_dynamic_smem() {
  extern __shared__ __align__(16) unsigned char seam_smem[];
  return seam_smem;
}
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}
// Bulk copies (sm_90+): one thread copies a whole span into shared memory, its bytes
// counted on a stage's mbarrier, which the readers wait on; SEAM_BULK 0 below sm_90.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SEAM_BULK 1
__device__ __forceinline__ void mbar_init(void* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" :: "r"(smem_addr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Two floats stored into CTA `rank` of the cluster at `dst`'s offset, counted as 8 bytes
// on that CTA's mbarrier at `bar`'s offset: an asynchronous store, no fence (a release
// would wait for this thread's global stores in flight), made visible to the threads
// that see the mbarrier's phase complete.
__device__ __forceinline__ void share_push(float* dst, unsigned rank, float a, float b, void* bar) {
  unsigned rdst, rbar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rdst) : "r"(smem_addr(dst)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rbar) : "r"(smem_addr(bar)), "r"(rank));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];\n"
               :: "r"(rdst), "r"(__float_as_uint(a)), "r"(__float_as_uint(b)), "r"(rbar) : "memory");
}
// A wait for a phase of this CTA's mbarrier that other CTAs' asynchronous stores complete:
// acquire at cluster scope, the scope of their release (the default is the CTA's).
__device__ __forceinline__ void mbar_wait_cluster(void* bar, unsigned parity) {
  asm volatile("{\n .reg .pred p;\n WAITC:\n"
               " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
               " @!p bra WAITC;\n}\n" :: "r"(smem_addr(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ void mbar_expect(void* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, void* bar) {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1], %2, [%3];\n"
               :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(void* bar, unsigned parity) {
  asm volatile("{\n .reg .pred p;\n WAIT:\n"
               " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               " @!p bra WAIT;\n}\n" :: "r"(smem_addr(bar)), "r"(parity) : "memory");
}
#else
#define SEAM_BULK 0
__device__ __forceinline__ void mbar_init(void*) {}
__device__ __forceinline__ void mbar_expect(void*, unsigned) {}
__device__ __forceinline__ void bulk_copy(void*, const void*, unsigned, void*) {}
__device__ __forceinline__ void mbar_wait(void*, unsigned) {}
__device__ __forceinline__ void mbar_wait_cluster(void*, unsigned) {}
__device__ __forceinline__ void share_push(float* dst, unsigned, float a, float b, void*) {
  dst[0] = a; dst[1] = b;
}
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r)); return r;
}
// every thread of every CTA of the cluster, release / acquire at cluster scope; or its
// two halves, with work between
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_sync() { cluster_arrive(); cluster_wait(); }
#else
__device__ __forceinline__ unsigned cluster_rank() { return 0; }
__device__ __forceinline__ void cluster_arrive() {}
__device__ __forceinline__ void cluster_wait() {}
__device__ __forceinline__ void cluster_sync() {}
#endif
#endif
"""

# dx = rstd * (g - mean(g) - n * mean(g * n)) (+ dh), g = dy * w, n = (h - mean) * rstd
# (rms: no mean(g) term, mean = 0).
#
# Persistent, one CTA an SM (or one cluster of CLUSTER CTAs per CLUSTER SMs): a team (a
# CTA, or a cluster whose CTAs each own a SL-wide column slice of the row) strides over
# tiles of RPB rows. A tile's dy, h (and dh) and its rows' rstd / mean are copied by
# cp.async into one of STAGES shared-memory stages, STAGES - 1 tiles ahead of the one
# being reduced, so the bytes in flight do not depend on registers. Staged in 16-byte
# chunks of the span's aligned cover, so any width and any base address is copied with
# 16-byte accesses; the stage is read in accesses of VS values (8 where every row starts
# 16-byte aligned, else the widest that every row start allows: 4, 2 or 1) at the span's
# offset in its first chunk (`shift`, a multiple of VS).
# Each thread sums dy * n (and dy) of its columns (c = tx + k * TPR, VS values each) over
# all rows it meets in registers; at the end the RPB row slots are summed through shared
# memory and each team writes one row of the fp32 workspace [sets][teams][HIDDEN], summed
# by `COLUMN_REDUCE`. A row's two sums: warp shuffles, then shared memory between the
# warps; in a cluster every warp's sums are pushed into every CTA's shared memory
# (`share_push`) and each CTA adds the CLUSTER x WARPS shares in one order.
ADD_NORM_BACKWARD = r"""
dependent_launch_entry();
unsigned char* smem = seam_dynamic_smem();
float* stats = reinterpret_cast<float*>(smem + STATS_OFF);        // [STAGES][2][RPB]
unsigned short* w_s = reinterpret_cast<unsigned short*>(smem + W_OFF);  // [SL + 8]
float* red = reinterpret_cast<float*>(smem + RED_OFF);            // [2][RPB][WARPS * 2]
float* cslot = reinterpret_cast<float*>(smem + CSLOT_OFF);  // [NSLOT][CLUSTER * WARPS][2]
unsigned long long* sbars = reinterpret_cast<unsigned long long*>(smem + SBAR_OFF);  // [NSLOT]
unsigned long long* bars = reinterpret_cast<unsigned long long*>(smem + BAR_OFF);  // [STAGES]
// BULK (`BackwardPlan.bulk`): each stream's span of a tile (its 16-byte cover where rows
// do not start aligned) is copied by one bulk copy, issued by thread 0 and counted on its
// stage's mbarrier, instead of 16-byte cp.asyncs from every thread (`seams.BULK_COPIES`).
constexpr bool BULK_SPANS = BULK && SEAM_BULK;
const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * TPR + tx;
const int rank = CLUSTER > 1 ? (int)cluster_rank() : 0;
const int team = blockIdx.x / CLUSTER, teams = gridDim.x / CLUSTER;
const int c0 = rank * SL;
const int len = HIDDEN - c0 < SL ? HIDDEN - c0 : SL;  // columns of this CTA's slice
// PHASED: rows off 16 bytes whose streams (dy, h, dh, dx) share each row's 16-byte phase.
// Rows r and r + PERIOD (`phase_period`) start at one phase, so a team takes the rows of
// one class of the row index mod PERIOD (`tile_at`) and works on the positions of its
// slice's 16-byte cover (column c0 + c at position ph + c): 16-byte accesses, the weight
// copied to the same positions, its dweight sums held at fixed positions; only a row's
// first and last chunks are masked. Else column c0 + c is at c, and a team takes every teams-th row.
// (a class without a team has its rows skipped: the runtime launches PERIOD teams or more,
// or no more teams than rows, `runtime.fused._backward_record`)
const int cls = team % PERIOD, cls_team = team / PERIOD;
const int cls_teams = (teams - cls + PERIOD - 1) / PERIOD;  // the teams of class cls
auto tile_at = [&](int it) {
  return PHASED ? cls + PERIOD * (cls_team + it * cls_teams) : team + it * teams;
};
const int ph = PHASED ? (int)(((unsigned long long)(dy + (size_t)cls * HIDDEN + c0) & 15ull) >> 1) : 0;
const int lim = ph + len;  // the slice's end, in positions
// Narrow accesses (VS < 8: 9-32 of them a thread a row) fold their bounds checks where
// they are known to hold: accesses k < FULL_K lie within every CTA's slice for every
// thread (the shortest slice, a cluster's last, holds FULL_K whole rounds of TPR
// accesses), and a tile of one row is one of the rows. On the H200, LayerNorm at 4097-65535
// columns on a slice 2 bytes off ran 0.52-0.70 of copy bandwidth with the checks,
// 0.62-0.79 without; at VS 8 (K <= 4) the folds were as fast in one CTA and 4-10% slower
// in clusters (RMS norm 37376: 0.94 -> 0.85), so they stay there.
constexpr bool FOLD = VS < 8;
constexpr int FULL_K = FOLD ? (HIDDEN - (CLUSTER - 1) * SL) / (TPR * VS) : 0;
// every tile of this CTA bulk-copied, a cluster's shorter last slice too (its span's
// length known only here; on 512 threads' cp.asyncs it held its cluster's rows up:
// H200, layer norm 40008 0.73 -> 0.87 of copy bandwidth, see docs/KERNELS.md). Where
// the slices are even the test stays as it was, a runtime one: written as a constant it
// changed those kernels' code, 2-4% slower (layer norm 52224-58880, H200).
constexpr bool RAGGED = CLUSTER > 1 && HIDDEN != CLUSTER * SL;
const bool bulk = BULK_SPANS && (VS < 8 || PHASED || CLUSTER == 1 || RAGGED || len == SL);
const int tiles = (rows + RPB - 1) / RPB;
// the weight's slice, copied like a stream's span
const unsigned short* w_src = weight + c0;
if constexpr (!PHASED) {
  const char* w_lo = reinterpret_cast<const char*>((unsigned long long)w_src & ~15ull);
  const int chunks = (int)((reinterpret_cast<const char*>(w_src + len) - w_lo + 15) >> 4);
  for (int j = tid; j < chunks; j += THREADS)
    cp_async16(reinterpret_cast<unsigned char*>(w_s) + 16 * j, w_lo + 16 * j);
}
w_s += VS == 8 ? 0 : (int)(((unsigned long long)w_src & 15ull) >> 1);
// Group 0 is the weight alone: the tiles' copies follow it at once, then the weight is
// read into registers where the row's n and g are held too (HOLD), else read per row.
cp_async_commit();
float aw[K][VS], ab[LAYER ? K : 1][VS];
#pragma unroll
for (int k = 0; k < K; ++k) {
#pragma unroll
  for (int i = 0; i < VS; ++i) { aw[k][i] = 0.f; ab[LAYER ? k : 0][i] = 0.f; }
}
const unsigned short* srcs[NSTREAM > 2 ? 3 : 2];
srcs[0] = dy; srcs[1] = h;
if constexpr (HAS_DH) srcs[NSTREAM - 1] = dh;
// The copies of tile `tile` into stage `stage` (none past the last tile), one group.
auto issue = [&](int tile, int stage) {
  if (tile < tiles) {
    const int row0 = tile * RPB;
    const int nrows = rows - row0 < RPB ? rows - row0 : RPB;
    const size_t first = (size_t)row0 * HIDDEN + c0;
    if (bulk) {
      if (tid == 0 && VS == 8 && !PHASED && LINE) {
        // LINE: each stream's span from the 128-byte line it starts in (a copy from 16
        // bytes into a line ran 5-11% slower, H200); the row lies (a & 127) bytes into
        // its stage (`begin`)
        constexpr unsigned SPAN = 2 * (CLUSTER > 1 ? SL : RPB * HIDDEN);
        unsigned long long lo[NSTREAM > 2 ? 3 : 2];
        unsigned bytes[NSTREAM > 2 ? 3 : 2], total = 0;
#pragma unroll
        for (int s = 0; s < NSTREAM; ++s) {
          const unsigned long long a = (unsigned long long)(srcs[s] + first);
          lo[s] = a & ~127ull;
          bytes[s] = SPAN + (unsigned)(a & 127ull);
          total += bytes[s];
        }
        mbar_expect(bars + stage, total);
#pragma unroll
        for (int s = 0; s < NSTREAM; ++s)
          bulk_copy(smem + (size_t)(stage * NSTREAM + s) * STREAM_BYTES,
                    reinterpret_cast<const void*>(lo[s]), bytes[s], bars + stage);
      } else if (tid == 0 && VS == 8 && !PHASED && (!RAGGED || len == SL)) {
        // at VS 8 a tile's span has a constant length (one row a tile is never
        // partial), but for a cluster's shorter last slice, which takes the next branch
        constexpr unsigned SPAN = 2 * (CLUSTER > 1 ? SL : RPB * HIDDEN);
        mbar_expect(bars + stage, NSTREAM * SPAN);
#pragma unroll
        for (int s = 0; s < NSTREAM; ++s)
          bulk_copy(smem + (size_t)(stage * NSTREAM + s) * STREAM_BYTES, srcs[s] + first, SPAN,
                    bars + stage);
      } else if (tid == 0) {
        // each stream's span's 16-byte cover, of a length known only here (measured on
        // the H200, this reckoning in aligned clusters' tiles cost 2%: they keep SPAN)
        const int count = CLUSTER > 1 ? len : nrows * HIDDEN;
        unsigned long long lo[NSTREAM > 2 ? 3 : 2];
        unsigned bytes[NSTREAM > 2 ? 3 : 2], total = 0;
#pragma unroll
        for (int s = 0; s < NSTREAM; ++s) {
          const unsigned long long a = (unsigned long long)(srcs[s] + first);
          lo[s] = a & ~15ull;
          bytes[s] = (unsigned)(((a + 2ull * count + 15ull) & ~15ull) - lo[s]);
          total += bytes[s];
        }
        mbar_expect(bars + stage, total);
#pragma unroll
        for (int s = 0; s < NSTREAM; ++s)
          bulk_copy(smem + (size_t)(stage * NSTREAM + s) * STREAM_BYTES,
                    reinterpret_cast<const void*>(lo[s]), bytes[s], bars + stage);
      }
    } else if (VS == 8 && !PHASED && (CLUSTER > 1 ? len == SL : nrows == RPB)) {
      // The common span (a whole tile, or a whole slice): 16-byte aligned (every row
      // start is, at VS 8) and of a length known here, so the copies unroll with
      // constant offsets; the general loop below costs ~40 instructions a stream a row,
      // as many as a LayerNorm row's extra math.
      constexpr int CHUNKS = (CLUSTER > 1 ? SL : RPB * HIDDEN) / 8;
#pragma unroll
      for (int s = 0; s < NSTREAM; ++s) {
        const char* src = reinterpret_cast<const char*>(srcs[s] + first) + 16 * tid;
        unsigned char* dst = smem + (size_t)(stage * NSTREAM + s) * STREAM_BYTES + 16 * tid;
#pragma unroll
        for (int u = 0; u < (CHUNKS + THREADS - 1) / THREADS; ++u) {
          if (CHUNKS % THREADS == 0 || tid + u * THREADS < CHUNKS)
            cp_async16(dst + 16 * THREADS * u, src + 16 * THREADS * u);
        }
      }
    } else {
      const int count = CLUSTER > 1 ? len : nrows * HIDDEN;  // one contiguous span
#pragma unroll
      for (int s = 0; s < NSTREAM; ++s) {
        const unsigned short* src = srcs[s] + first;
        const char* lo = reinterpret_cast<const char*>((unsigned long long)src & ~15ull);
        const int chunks = (int)((reinterpret_cast<const char*>(src + count) - lo + 15) >> 4);
        unsigned char* dst = smem + (size_t)(stage * NSTREAM + s) * STREAM_BYTES;
        for (int j = tid; j < chunks; j += THREADS) cp_async16(dst + 16 * j, lo + 16 * j);
      }
    }
    if (tid < nrows) {
      cp_async4(stats + (stage * 2) * RPB + tid, rstd + row0 + tid);
      if constexpr (LAYER) cp_async4(stats + (stage * 2 + 1) * RPB + tid, mean + row0 + tid);
    }
  }
  cp_async_commit();
};
// DEFER: a row's second phase waits for the next row's first, so that what it waits for
// completes meanwhile (in a cluster, its partners' shares; in one CTA, the barrier at
// the next tile's top, so that a row pays one block barrier, not two); its stage is
// still read then, so LOOKAHEAD is one fewer (in a cluster, SLACK fewer).
if (bulk && tid == 0) {
  for (int s = 0; s < STAGES; ++s) mbar_init(bars + s);
}
#pragma unroll 1
for (int s = 0; s < LOOKAHEAD; ++s) issue(tile_at(s), s);
if constexpr (PHASED) {
  // the weight at the slice's positions, zeros around it (g is then 0 outside the row),
  // while the first tiles land, every load issued before any store; the barrier at the
  // first tile's top (or the held weight's) orders these stores before any read
  constexpr int WN = (SL + 14 + THREADS - 1) / THREADS;  // ceil8(ph + len) <= SL + 14
  unsigned short wv[WN];
#pragma unroll
  for (int u = 0; u < WN; ++u) {
    const int j = tid + u * THREADS;
    wv[u] = j >= ph && j < lim ? w_src[j - ph] : (unsigned short)0;
  }
#pragma unroll
  for (int u = 0; u < WN; ++u) {
    if (tid + u * THREADS < ((lim + 7) & ~7)) w_s[tid + u * THREADS] = wv[u];
  }
}
// PHASED: bit k set where this thread's k-th chunk is the slice's first (positions before
// ph) or last (positions past lim): the only chunks masked and stored value by value
unsigned edges = 0;
if constexpr (PHASED) {
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int col = (tx + k * TPR) * VS;
    if (col < ph || (col < lim && col + VS > lim)) edges |= 1u << k;
  }
}
float wr[HOLD ? K : 1][VS];
if constexpr (HOLD) {
  cp_async_wait<LOOKAHEAD>();  // group 0: the weight
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int col = (tx + k * TPR) * VS;
    if (col < lim) load_vec<VS>(w_s + col, wr[k]);
  }
}
// A row between its two phases: where it is, its statistics, its stage, its sums.
struct RowState {
  bool live, pending; int row, stage, it; float r, m; const unsigned short* st[NSTREAM > 2 ? 3 : 2];
  float s[LAYER ? 2 : 1];
};
float hn[HOLD ? K : 1][VS], hg[HOLD ? K : 1][VS];
// Phase 1 of tile `tile` (the `it`-th of this team): n and g, the weight-gradient terms,
// the row's sums over this CTA (and, in a cluster, this CTA's share in its slot).
auto begin = [&](int tile, int it, RowState& q) {
  q.stage = it % STAGES;
  q.it = it;
  q.pending = true;
  q.row = tile * RPB + ty;
  q.live = (FOLD && RPB == 1) || q.row < rows;
  q.r = q.live ? stats[(q.stage * 2) * RPB + ty] : 0.f;
  const float m = (LAYER && q.live) ? stats[(q.stage * 2 + 1) * RPB + ty] : 0.f;
  // n = (h - m) * r, not the one fma h * r - m * r: that leaves the rounding of m * r in
  // n (a row of one value, or a large mean, would get n != 0 where h == m)
  q.m = m;
  const size_t first = (size_t)tile * RPB * HIDDEN + c0;
#pragma unroll
  for (int s = 0; s < NSTREAM; ++s) {
    // (LINE: a bulk-copied span lies its 128-byte line's offset into its stage)
    const int shift = VS == 8 ? (LINE && bulk ? (int)(((unsigned long long)(srcs[s] + first) & 127ull) >> 1) : 0)
                              : (int)(((unsigned long long)(srcs[s] + first) & 15ull) >> 1);
    q.st[s] = reinterpret_cast<const unsigned short*>(smem + (size_t)(q.stage * NSTREAM + s) * STREAM_BYTES)
              + shift + ty * SL;
  }
#pragma unroll
  for (int j = 0; j < (LAYER ? 2 : 1); ++j) q.s[j] = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int col = (tx + k * TPR) * VS;
    if (q.live && (k < FULL_K || col < lim)) {
      float d[VS], n[VS], wl[VS];
      load_vec<VS>(q.st[0] + col, d);
      load_vec<VS>(q.st[1] + col, n);
      if constexpr (!HOLD) load_vec<VS>(w_s + col, wl);
      if (PHASED && ((edges >> k) & 1)) {  // the slice's first or last chunk
#pragma unroll
        for (int i = 0; i < VS; ++i) {
          if (col + i < ph || col + i >= lim) { d[i] = 0.f; n[i] = q.m; }  // n = 0 below
        }
      }
      const float* w = HOLD ? wr[HOLD ? k : 0] : wl;
#pragma unroll
      for (int i = 0; i < VS; ++i) {
        n[i] = (n[i] - q.m) * q.r;
        aw[k][i] += d[i] * n[i];
        if constexpr (LAYER) ab[k][i] += d[i];
        const float g = d[i] * w[i];
        q.s[0] += g * n[i];
        if constexpr (LAYER) q.s[LAYER ? 1 : 0] += g;
        if constexpr (HOLD) { hn[k][i] = n[i]; hg[k][i] = g; }
      }
    }
  }
  constexpr int NS = LAYER ? 2 : 1;
  if constexpr (CLUSTER > 1) {
    // Each warp's sums pushed into its slot (rank, warp) of the row's slot set in every
    // CTA of the cluster (itself too), lane c to CTA c, by asynchronous stores that count
    // their bytes on that CTA's mbarrier of the set: no barrier and no fence a row (a
    // cluster barrier's release, every thread's, waited for the thread's dx stores in
    // flight). A CTA waits for a row's shares only when it finishes the row, SLACK rows
    // later; thread 0 arms the set for them here (shares that land before it count the
    // same: the phase cannot complete before its one arrival).
    const int lane = tid & 31, warp = tid >> 5, set = it % NSLOT;
    if (tid == 0) mbar_expect(sbars + set, CLUSTER * WARPS * 8);
    warp_sum<NS>(q.s);
    if (lane < CLUSTER)
      share_push(cslot + ((set * CLUSTER + rank) * WARPS + warp) * 2, lane, q.s[0],
                 q.s[NS - 1], sbars + set);
  } else {
    float* slot = red + ((it & 1) * RPB + ty) * WARPS * 2;
    if constexpr (DEFER) row_part<NS>(q.s, slot);
    else row_sum<NS, false, true>(q.s, slot);
  }
};
// Phase 2 (in a cluster, once the partners' shares of the row have landed): the row's
// totals, dx.
auto finish = [&](int it, RowState& q) {
  if constexpr (CLUSTER == 1 && DEFER)  // past the barrier at the next tile's top
    row_total<LAYER ? 2 : 1, true>(q.s, red + ((it & 1) * RPB + ty) * WARPS * 2);
  if constexpr (CLUSTER > 1) {
    // the row's CLUSTER x WARPS shares, once all have arrived: each warp sums them over
    // its lanes then across them, in one order in every warp of every CTA
    const int set = q.it % NSLOT, lane = tid & 31;
    mbar_wait_cluster(sbars + set, (q.it / NSLOT) & 1);
    const float* shares = cslot + set * CLUSTER * WARPS * 2;
#pragma unroll
    for (int j = 0; j < (LAYER ? 2 : 1); ++j) {
      float t[1] = {0.f};
#pragma unroll
      for (int p = 0; p < (CLUSTER * WARPS + 31) / 32; ++p) {
        if ((CLUSTER * WARPS) % 32 == 0 || lane + 32 * p < CLUSTER * WARPS)
          t[0] += shares[(lane + 32 * p) * 2 + j];
      }
      warp_sum<1>(t);
      q.s[j] = t[0];
    }
  }
  q.pending = false;
  // dx = r * (g - gmean - n * dot) (+ dh): g - gmean first, so that it is exactly 0
  // where g is the row's mean (r * g - r * gmean in fmas leaves the rounding of
  // r * gmean), then one fma for n's term and one for r and dh: two instructions a
  // value past g - gmean. Where n is not held it is read as h - mean, its r folded into
  // n's coefficient: dx = (h - mean) (r^2 (-dot)) + r (g - gmean) (+ dh), one multiply a
  // value fewer, and still exactly r (g - gmean) where h is the mean (H200, 8192 rows:
  // LayerNorm on clusters 1-3% faster at 16896-43520 columns, one CTA and RMSNorm alike).
  const float kn = -(q.s[0] * (1.f / HIDDEN));
  const float kn2 = kn * q.r * q.r;
  const float gm = LAYER ? q.s[LAYER ? 1 : 0] * (1.f / HIDDEN) : 0.f;
  // PHASED: the slice's 16-byte cover (dx at dy's phase)
  unsigned short* out_row = dx + (size_t)(q.live ? q.row : 0) * HIDDEN + c0 - ph;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int col = (tx + k * TPR) * VS;
    if (q.live && (k < FULL_K || col < lim)) {
      float n[VS], g[VS], out[VS];
      if constexpr (HOLD) {
#pragma unroll
        for (int i = 0; i < VS; ++i) { n[i] = hn[k][i]; g[i] = hg[k][i]; }
      } else {
        float w[VS];
        load_vec<VS>(q.st[0] + col, g);
        load_vec<VS>(q.st[1] + col, n);
        load_vec<VS>(w_s + col, w);
#pragma unroll
        for (int i = 0; i < VS; ++i) { n[i] = n[i] - q.m; g[i] *= w[i]; }  // n unscaled
      }
      float e[VS];
      if constexpr (HAS_DH) load_vec<VS>(q.st[NSTREAM - 1] + col, e);
#pragma unroll
      for (int i = 0; i < VS; ++i) {
        const float gc = LAYER ? g[i] - gm : g[i];
        if constexpr (HOLD) {
          const float t = fmaf(n[i], kn, gc);
          out[i] = HAS_DH ? fmaf(q.r, t, e[i]) : q.r * t;
        } else {
          out[i] = fmaf(n[i], kn2, HAS_DH ? fmaf(q.r, gc, e[i]) : q.r * gc);
        }
      }
      if (!PHASED) {
        store_vec<VS>(out_row + col, out);
      } else if (!((edges >> k) & 1)) {
        // (store_vec's 16-byte store was split in four here: H200, 0.60 of copy
        // bandwidth against 0.79 on aligned rows of the same plan)
        store_vec8_whole(out_row + col, out);
      } else {
#pragma unroll
        for (int i = 0; i < VS; ++i) {
          if (col + i >= ph && col + i < lim) out_row[col + i] = from_f(out[i]);
        }
      }
    }
  }
};
// The top of iteration `it` (tile `tile`): its copies landed, the stage refilled next
// read out by every thread; the copies LOOKAHEAD tiles on issued (unless `late`).
auto top = [&](int tile, int it, bool late) {
  cp_async_wait<LOOKAHEAD - 1>();  // this thread's copies of `tile` (group it + 1) landed
  __syncthreads();  // everyone's; and the stage refilled next is read out
  // a bulk tile: its stage's barrier completes its (it / STAGES)-th phase
  if (bulk) mbar_wait(bars + it % STAGES, (it / STAGES) & 1);
  if (!late) issue(tile_at(it + LOOKAHEAD), (it + LOOKAHEAD) % STAGES);
};
if constexpr (CLUSTER > 1) {
  // A cluster: a row's second phase SLACK iterations after its first (its stage held as
  // long), so a CTA waits for its partners' shares only where they are SLACK rows behind.
  if (tid == 0) {
    for (int s = 0; s < NSLOT; ++s) mbar_init(sbars + s);
  }
  // every CTA of the cluster running, its slots' mbarriers set, before any pushes
  cluster_sync();
  RowState qs[SLACK + 1];
#pragma unroll
  for (int v = 0; v <= SLACK; ++v) qs[v].pending = false;
  bool more = true;
#pragma unroll 1
  for (int base = 0; more; base += SLACK + 1) {
    // unrolled by the ring's length, so that each row state has a constant index
#pragma unroll
    for (int u = 0; u <= SLACK; ++u) {
      const int it = base + u, tile = tile_at(it);
      if (more && tile < tiles) {
        top(tile, it, false);
        RowState& old = qs[(u + 1) % (SLACK + 1)];  // row it - SLACK's
        if (SLACK > 0 && old.pending) finish(old.it, old);
        begin(tile, it, qs[u]);
        if constexpr (SLACK == 0) finish(it, qs[u]);
      } else {
        more = false;
      }
    }
  }
#pragma unroll
  for (int v = 0; v <= SLACK; ++v) {  // the last SLACK rows (any order)
    if (qs[v].pending) finish(qs[v].it, qs[v]);
  }
} else {
  RowState q;
  int it = 0;
#pragma unroll 1
  for (int tile = tile_at(0); tile < tiles; tile = tile_at(++it)) {
    // A deferring CTA issues the next tile's copies after the row's work, not before it:
    // issued at once after the barrier, the 16 warps' copies filled the load queue and
    // held the row's math back (0.4-1.3% slower on the H200, docs/EXPERIMENTS.md).
    top(tile, it, DEFER);
    if constexpr (DEFER) {
      // the previous row's second phase: the barrier above was its barrier
      if (it > 0) finish(it - 1, q);
      begin(tile, it, q);
      issue(tile_at(it + LOOKAHEAD), (it + LOOKAHEAD) % STAGES);
    } else {
      begin(tile, it, q);
      finish(it, q);
    }
  }
  if constexpr (DEFER) {
    if (it > 0) {
      __syncthreads();  // the last row's warp sums
      finish(it - 1, q);
    }
  }
}
cp_async_wait<0>();
__syncthreads();  // the stages are free: they hold the row slots' sums now
const int sets = LAYER ? 2 : 1;
if constexpr (PHASED) {
  // the sums at their positions into shared memory (the stages, stats and weight are
  // free), then written by column, lanes on consecutive columns: stored from the
  // registers, lanes 32 bytes apart and a width off 16 bytes, each 4-byte store was a
  // sector of its own (H200, LayerNorm 8184 two bytes off: 0.60 of copy against 0.72)
  constexpr int SPAN = (SL + 15) & ~7;  // positions of a set, ceil8(ph + len) at most
  float* acc = reinterpret_cast<float*>(smem);  // [sets][SPAN]
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int col = (tx + k * TPR) * VS;
    if (col < lim) {
      store_sums<VS, LAYER>(acc + col, aw[k], acc + SPAN + col, ab[LAYER ? k : 0]);
    }
  }
  __syncthreads();
  for (int set = 0; set < sets; ++set) {
    float* to = ws + ((size_t)set * teams + team) * HIDDEN + c0;
    for (int e = tid; e < len; e += THREADS) to[e] = acc[set * SPAN + ph + e];
  }
} else if constexpr (RPB > 1) {
  float* acc = reinterpret_cast<float*>(smem);  // [sets][RPB][SL]
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int col = (tx + k * TPR) * VS;
    if constexpr (VS >= 4 && SL % 4 == 0) {
      // 16-byte stores: a scalar store a value, its lanes VS floats apart, was an 8-way
      // bank conflict at VS 8 (a layer norm's two sets: 1.7 us of a 512-column backward
      // on the H200, docs/EXPERIMENTS.md)
      if (col + VS <= len) {
        store_sums<VS, LAYER>(acc + (size_t)ty * SL + col, aw[k],
                              acc + (size_t)(RPB + ty) * SL + col, ab[LAYER ? k : 0]);
        continue;
      }
    }
#pragma unroll
    for (int i = 0; i < VS; ++i) {
      if (col + i < len) {
        acc[(size_t)ty * SL + col + i] = aw[k][i];
        if constexpr (LAYER) acc[(size_t)(RPB + ty) * SL + col + i] = ab[k][i];
      }
    }
  }
  __syncthreads();
  for (int set = 0; set < sets; ++set) {
    for (int e = tid; e < len; e += THREADS) {
      float s = 0.f;
#pragma unroll
      for (int q = 0; q < RPB; ++q) s += acc[(size_t)(set * RPB + q) * SL + e];
      ws[((size_t)set * teams + team) * HIDDEN + c0 + e] = s;
    }
  }
} else {
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int col = (tx + k * TPR) * VS;
    float* w_row = ws + (size_t)team * HIDDEN + c0 + col;
    float* b_row = ws + ((size_t)teams + team) * HIDDEN + c0 + col;
    if constexpr (VS >= 4) {
      // 16-byte stores: at VS 4 or 8 the width, a slice's start and col are multiples
      // of 4 (the workspace is 16-byte aligned); the scalar stores below were a warp
      // instruction a value, its lanes 32 bytes apart
      if (col + VS <= len) {
        store_sums<VS, LAYER>(w_row, aw[k], b_row, ab[LAYER ? k : 0]);
        continue;
      }
    }
#pragma unroll
    for (int i = 0; i < VS; ++i) {
      if (col + i < len) {
        w_row[i] = aw[k][i];
        if constexpr (LAYER) b_row[i] = ab[k][i];
      }
    }
  }
}
if constexpr (CLUSTER > 1) cluster_sync();  // no CTA leaves while its slots may be read
"""

# out[set][col] = sum over parts of ws[set][part][col], in the weight's dtype. A block is
# 32 columns x 32 lanes of parts, for every set (LayerNorm's two sets in one block, not a
# block a set: at 8192 columns one wave of blocks, not two, 0.5-1.9 us less on the H200);
# each lane keeps four loads a set in flight (the sum is a few MB read once, and latency,
# not bandwidth, bounds a loop of dependent loads); then warp w sums column w's 32 lane
# sums of each set by shuffles. The partial sums are dead once read: where a warp's 32
# columns are one whole 128-byte line of the workspace (hidden a multiple of 32: the
# workspace is 512-byte aligned), lane 0 drops the lines it read from L2 without
# writing them back (`discard.global.L2`, sm_80+), after the barrier that follows every
# lane's last use of them, so the row kernel's partial sums cost no DRAM writes: the
# backward ran 1-1.5% faster at 2560-12800 columns on the H100 and the H200 (8192 rows),
# within 0.5% past them; at 1024 columns, where the sums are under 2 MB, 0.7-1% slower
# (the discards' issue), so rows narrower than 2048 columns keep the write-back.
COLUMN_REDUCE = r"""
static_assert(REDUCE_LANES == 32, "a warp sums a column's lanes");
dependent_launch_entry();
__shared__ float part_sums[SETS][REDUCE_LANES][33];
const int tx = threadIdx.x, ty = threadIdx.y;
const int col0 = blockIdx.x * 32, col = col0 + tx;
float s[SETS][4];
#pragma unroll
for (int a = 0; a < SETS; ++a) s[a][0] = s[a][1] = s[a][2] = s[a][3] = 0.f;
if (col < hidden) {
  const float* __restrict__ p = ws + col;
  int q = ty;
  for (; q + 3 * REDUCE_LANES < parts; q += 4 * REDUCE_LANES) {
#pragma unroll
    for (int a = 0; a < SETS; ++a) {
#pragma unroll
      for (int j = 0; j < 4; ++j) s[a][j] += p[(size_t)(a * parts + q + j * REDUCE_LANES) * hidden];
    }
  }
  for (; q < parts; q += REDUCE_LANES) {
#pragma unroll
    for (int a = 0; a < SETS; ++a) s[a][0] += p[(size_t)(a * parts + q) * hidden];
  }
}
#pragma unroll
for (int a = 0; a < SETS; ++a) part_sums[a][ty][tx] = (s[a][0] + s[a][1]) + (s[a][2] + s[a][3]);
__syncthreads();
#if __CUDA_ARCH__ >= 800
// (a discard is no write: the const, restrict promise on ws holds, and nothing reads the
// lines again)
if (tx == 0 && (hidden & 31) == 0 && hidden >= 2048 && ((size_t)ws & 127) == 0) {
  for (int q = ty; q < parts; q += REDUCE_LANES) {
#pragma unroll
    for (int a = 0; a < SETS; ++a) {
      const float* line = ws + col + (size_t)(a * parts + q) * hidden;
      asm volatile("discard.global.L2 [%0], 128;" :: "l"(line) : "memory");
    }
  }
}
#endif
#pragma unroll
for (int a = 0; a < SETS; ++a) {
  float v = part_sums[a][tx][ty];  // column ty, lane tx: 33 floats a row, no bank conflict
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (tx == 0 && col0 + ty < hidden) (a == 0 ? out0 : out1)[col0 + ty] = from_f(v);
}
"""

# Pointwise math of the elementwise ops: `in` holds the inputs' values of one element,
# `out` receives the outputs'. Sigmoids through __expf (GELU's tanh too, as
# 0.5 * (1 + tanh(u)) = sigmoid(2u)): they saturate correctly (exp to inf or 0) and their
# error is far below a 16-bit output's rounding.
POINTWISE = {
    "swiglu_forward": r"""
  const float g = in[0], u = in[1];
  out[0] = g / (1.f + __expf(-g)) * u;
""",
    "swiglu_backward": r"""
  const float d = in[0], g = in[1], u = in[2];
  const float sig = 1.f / (1.f + __expf(-g));
  const float silu = g * sig;
  out[0] = d * u * sig * (1.f + g * (1.f - sig));
  out[1] = d * silu;
""",
    "gelu_forward": r"""
  // 0.5 * (1 + tanh(u)) is sigmoid(2u): one exp and one fast divide (which gives 0 where
  // exp(-2u) is past 2^126, the right limit), with no IEEE division's slow path
  const float x = in[0];
  const float s = __fdividef(1.f, 1.f + __expf(-2.f * GELU_K0 * (x + GELU_K1 * x * x * x)));
  out[0] = x * s;
""",
    "gelu_backward": r"""
  const float d = in[0], x = in[1];
  const float s = __fdividef(1.f, 1.f + __expf(-2.f * GELU_K0 * (x + GELU_K1 * x * x * x)));
  // d/dx of x * sigmoid(2u) = s + 2 x s (1 - s) u'. Where the sigmoid has saturated its
  // derivative is 0: skip the product, whose x * x term overflows to inf (and 0 * inf to
  // nan) for |x| past 1e19, which bf16 can hold
  const float ds = s * (1.f - s);
  const float slope = ds == 0.f ? 0.f : 2.f * x * ds * GELU_K0 * (1.f + 3.f * GELU_K1 * x * x);
  out[0] = d * (s + slope);
""",
}

GELU_CONSTANTS = r"""
constexpr float GELU_K0 = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float GELU_K1 = 0.044715f;
"""

# n elements, NIN inputs and NOUT outputs, V a vector; grid-stride over the vectors, then
# the n % V elements past the last whole vector one by one (the scalar tail).
ELEMENTWISE = r"""
dependent_launch_entry();
const long long nvec = n / V;
const long long stride = (long long)gridDim.x * blockDim.x;
const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
// UNROLL vectors a thread per pass, all loaded before any is computed: a one-input op
// otherwise has a single 16-byte load in flight a thread, too few to fill the memory pipe
for (long long j0 = first; j0 < nvec; j0 += stride * UNROLL) {
  float a[UNROLL][NIN][V];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const long long j = j0 + u * stride;
    if (j < nvec) {
#pragma unroll
      for (int q = 0; q < NIN; ++q) load_vec<V>(ins[q] + j * V, a[u][q]);
    }
  }
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const long long j = j0 + u * stride;
    if (j < nvec) {
      float b[NOUT][V];
#pragma unroll
      for (int i = 0; i < V; ++i) {
        float in[NIN], out[NOUT];
#pragma unroll
        for (int q = 0; q < NIN; ++q) in[q] = a[u][q][i];
        pointwise(in, out);
#pragma unroll
        for (int q = 0; q < NOUT; ++q) b[q][i] = out[q];
      }
#pragma unroll
      for (int q = 0; q < NOUT; ++q) store_vec<V>(outs[q] + j * V, b[q]);
    }
  }
}
for (long long e = nvec * V + first; e < n; e += stride) {
  float in[NIN], out[NOUT];
#pragma unroll
  for (int q = 0; q < NIN; ++q) in[q] = to_f(ins[q][e]);
  pointwise(in, out);
#pragma unroll
  for (int q = 0; q < NOUT; ++q) outs[q][e] = from_f(out[q]);
}
"""

# The same over a [rows, width] region whose tensors each have a row pitch of their own
# (pitches and width in elements, every row start aligned like the vector): SwiGLU reads
# gate and up as the two column halves of the fused gate-up GEMM's output, and its
# backward writes dgate and dup straight into the halves of that output's gradient.
ELEMENTWISE_ROWS = r"""
dependent_launch_entry();
const long long per_row = width / V;
const long long nvec = rows * per_row;
const long long stride = (long long)gridDim.x * blockDim.x;
const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
for (long long j = first; j < nvec; j += stride) {
  const long long r = j / per_row, c = (j - r * per_row) * V;
  float a[NIN][V], b[NOUT][V];
#pragma unroll
  for (int q = 0; q < NIN; ++q) load_vec<V>(ins[q] + r * in_pitch[q] + c, a[q]);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    float in[NIN], out[NOUT];
#pragma unroll
    for (int q = 0; q < NIN; ++q) in[q] = a[q][i];
    pointwise(in, out);
#pragma unroll
    for (int q = 0; q < NOUT; ++q) b[q][i] = out[q];
  }
#pragma unroll
  for (int q = 0; q < NOUT; ++q) store_vec<V>(outs[q] + r * out_pitch[q] + c, b[q]);
}
const long long tail = width - per_row * V;
for (long long e = first; e < rows * tail; e += stride) {
  const long long r = e / tail, c = per_row * V + (e - r * tail);
  float in[NIN], out[NOUT];
#pragma unroll
  for (int q = 0; q < NIN; ++q) in[q] = to_f(ins[q][r * in_pitch[q] + c]);
  pointwise(in, out);
#pragma unroll
  for (int q = 0; q < NOUT; ++q) outs[q][r * out_pitch[q] + c] = from_f(out[q]);
}
"""
