"""Matmul specs -> CUDA C++ for tensor cores (mma.sync m16n8k16, ldmatrix, cp.async).

A CTA computes a BM x BN tile of C over a range of K ("slice"). Warps split the tile
into WARPS_M x WARPS_N warp tiles; shared memory holds STAGES tiles of A and B fed by
cp.async so that loads of stage k+STAGES-1 overlap the MMAs of stage k. Shared memory
rows are XOR-swizzled by 16-byte chunk so that ldmatrix over 8 rows hits 8 distinct bank
groups.

Layouts:
  TN: C[M,N] = A[M,K] @ B[N,K]^T  (both K-contiguous, like torch.nn.functional.linear)
  NN: C[M,N] = A[M,K] @ B[K,N]    (B row-major, N-contiguous; ldmatrix.trans reads it)

Split-K modes:
  none:     one CTA per tile, epilogue straight from registers.
  serial:   the `split_k` slices of a tile run as consecutive CTAs and take turns through
            an int semaphore (from the zeroed arena, runtime/workspace.py): slice s waits
            until the semaphore reads s, adds the fp32 partial of slices < s from the
            workspace, and either stores the running sum and releases s+1, or (the last
            slice) applies the epilogue, writes C and puts the semaphore back to 0. One
            launch, no memset: the arena is zero before and after.
  parallel: every slice stores its fp32 partial to workspace[slice]; a second kernel sums
            the slices and applies the epilogue. Two launches, nothing to zero.

Example:
    >>> spec = MatmulSpec(a_dtype="bf16", b_dtype="bf16", out_dtype="bf16", layout="TN")
    >>> src = render(spec)
    >>> src.launch(1024, 2048, 4096).grid
    (128, 1, 1)
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from lowering.kernels.render import DTYPE_BYTES, FROM_FLOAT, PACK2, TO_FLOAT, Renderer

IN_DTYPES = ("bf16", "fp16")
OUT_DTYPES = ("bf16", "fp16", "fp32")
LAYOUTS = ("TN", "NN")
SPLIT_MODES = ("none", "serial", "parallel")
MODE_CODE = {"none": 0, "serial": 1, "parallel": 2}

# Shared memory per CTA that an sm_80 / sm_90 part can give a kernel (opt-in maximum).
MAX_SMEM_BYTES = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}
# Threads of the split-K reduction kernel (parallel mode).
REDUCE_THREADS = 256
# Tiles in a raster group: CTAs launched together share B columns and A rows in L2.
GROUP_M = 8
# Padding (floats) of each row of the fp32 C tile staged in shared memory for the epilogue.
CPAD = 8


@dataclasses.dataclass(frozen=True, slots=True)
class MatmulSpec:
    """Everything that determines one generated matmul kernel (plus its split factor).

    `split_k` is a launch parameter, not part of the source: specs that differ only in
    `split_k` share one compiled kernel. Bias (if any) has `out_dtype` and shape [N].
    """

    a_dtype: str = "bf16"
    b_dtype: str = "bf16"
    out_dtype: str = "bf16"
    layout: str = "TN"
    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 32
    warps_m: int = 2
    warps_n: int = 2
    stages: int = 4
    split_k: int = 1
    split_mode: str = "none"
    bias: bool = False
    acc_dtype: str = "fp32"

    def __post_init__(self):
        def need(cond: bool, what: str):
            if not cond:
                raise ValueError(f"MatmulSpec: {what} (got {self})")

        need(self.a_dtype in IN_DTYPES, f"a_dtype must be one of {IN_DTYPES}")
        need(self.b_dtype in IN_DTYPES, f"b_dtype must be one of {IN_DTYPES}")
        need(self.a_dtype == self.b_dtype, "a_dtype and b_dtype must match (one mma flavour)")
        need(self.acc_dtype == "fp32", "acc_dtype must be fp32")
        need(self.out_dtype in OUT_DTYPES, f"out_dtype must be one of {OUT_DTYPES}")
        need(self.layout in LAYOUTS, f"layout must be one of {LAYOUTS}")
        need(self.split_mode in SPLIT_MODES, f"split_mode must be one of {SPLIT_MODES}")
        need(self.tile_k in (32, 64), "tile_k must be 32 or 64")
        need(self.warps_m >= 1 and self.warps_n >= 1 and self.warps in (2, 4, 8),
             "warps_m * warps_n must be 2, 4 or 8")
        need(self.tile_m % (16 * self.warps_m) == 0,
             "tile_m must be a multiple of 16 * warps_m (an m16 MMA per warp row)")
        need(self.tile_n % (16 * self.warps_n) == 0,
             "tile_n must be a multiple of 16 * warps_n (ldmatrix.x4 loads two n8 tiles)")
        need(self.tile_n % 64 == 0 or self.layout == "TN",
             "NN layout needs tile_n a multiple of 64 (swizzled rows of 8 chunks)")
        need(2 <= self.stages <= 6, "stages must be in [2, 6]")
        need(self.split_k >= 1, "split_k must be >= 1")
        need((self.split_mode == "none") == (self.split_k == 1),
             "split_k == 1 exactly when split_mode == 'none'")
        need(self.accumulators_per_thread <= 128,
             "warp tile too large: more than 128 fp32 accumulators per thread spill")
        for rows in (self.tile_m, self.tile_n):
            need((rows * self.tile_k // 8) % self.threads == 0,
                 "tile chunks (16 bytes) must divide evenly over the CTA's threads")
        need(self.smem_bytes <= MAX_SMEM_BYTES[80],
             f"shared memory {self.smem_bytes} B exceeds {MAX_SMEM_BYTES[80]} B (sm_80)")

    @property
    def warps(self) -> int:
        return self.warps_m * self.warps_n

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def accumulators_per_thread(self) -> int:
        return (self.tile_m // self.warps_m) * (self.tile_n // self.warps_n) // 32

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: the pipeline stages, later reused for the fp32 C tile."""
        pipeline = self.stages * (self.tile_m + self.tile_n) * self.tile_k * DTYPE_BYTES[self.a_dtype]
        return max(pipeline, self.tile_m * (self.tile_n + CPAD) * 4)

    @property
    def tile(self) -> str:
        return f"{self.tile_m}x{self.tile_n}x{self.tile_k}"

    @property
    def kernel_name(self) -> str:
        return (f"hostir_mm_{self.layout.lower()}_{self.a_dtype}_{self.out_dtype}_"
                f"{self.tile}_w{self.warps_m}x{self.warps_n}_s{self.stages}")

    @property
    def source_key(self) -> tuple:
        """The fields the generated source depends on (mode, split, bias are arguments)."""
        return (self.a_dtype, self.b_dtype, self.out_dtype, self.layout, self.tile_m,
                self.tile_n, self.tile_k, self.warps_m, self.warps_n, self.stages)

    def check_shape(self, M: int, N: int, K: int) -> None:
        """Refuse shapes the kernel cannot take, naming the axis (M, N any size >= 1)."""
        if min(M, N, K) < 1:
            raise ValueError(f"matmul: M, N, K must be >= 1, got M={M} N={N} K={K}")
        if K % 8:
            raise ValueError(f"matmul: K must be a multiple of 8 (16-byte cp.async), got K={K}")
        if self.layout == "NN" and N % 8:
            raise ValueError(f"matmul NN: N must be a multiple of 8 (B rows are copied in "
                             f"16-byte chunks), got N={N}")


@dataclasses.dataclass(frozen=True, slots=True)
class LaunchConfig:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class KernelSource:
    """The rendered translation unit and how to launch what it defines."""

    spec: MatmulSpec
    source: str
    kernel_name: str
    reduce_name: str  # the parallel split-K reduction
    launch: Callable[[int, int, int], LaunchConfig]
    reduce_launch: Callable[..., LaunchConfig]

    @property
    def names(self) -> tuple[str, ...]:
        return (self.kernel_name, self.reduce_name)


# ---------------------------------------------------------------------------------------
# Snippets: PTX wrappers, the mainloop and the epilogues. Every kernel is assembled from
# these and a block of constexprs derived from the spec.

MATMUL_SNIPPETS: dict[str, str] = {
    "ptx": r"""
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
// 16 bytes global -> shared, bypassing L1; zero-filled when pred is false (the source
// address is then never read).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool pred) {
  int n = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4],
                                          const unsigned (&b)[2]) {
  asm volatile(MMA_INSTR
      " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
""",
    "semaphore": r"""
// Cross-CTA turn-taking. Thread 0 spins with acquire loads; the barrier then publishes
// what it saw to the CTA. Release: every thread fences its partial stores, the barrier
// orders them before thread 0's release store.
__device__ __forceinline__ void sem_wait(const int* sem, int value) {
  if (threadIdx.x == 0) {
    int v;
    while (true) {
      asm volatile("ld.global.acquire.gpu.b32 %0, [%1];\n" : "=r"(v) : "l"(sem) : "memory");
      if (v == value) break;
      __nanosleep(40);
    }
  }
  __syncthreads();
}
__device__ __forceinline__ void sem_release(int* sem, int value) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("st.global.release.gpu.b32 [%0], %1;\n" :: "l"(sem), "r"(value) : "memory");
  }
}
""",
    "swizzle": r"""
// Element offset of 16-byte chunk `chunk` of row `row` in a tile whose rows hold CHUNKS
// chunks. The chunk index is XORed with the row so that 8 consecutive rows at the same
// logical chunk land in 8 distinct 16-byte bank groups (conflict-free ldmatrix).
template <int CHUNKS> __device__ __forceinline__ int swz(int row, int chunk) {
  constexpr int ROWS_PER_LINE = CHUNKS >= 8 ? 1 : 8 / CHUNKS;
  constexpr int MASK = CHUNKS >= 8 ? 7 : CHUNKS - 1;
  return (row * CHUNKS + (chunk ^ ((row / ROWS_PER_LINE) & MASK))) * 8;
}
""",
    "load_stage": r"""
// Issue the cp.async copies of one K-tile of A and B into one pipeline stage.
__device__ __forceinline__ void load_stage(in_t* sA, in_t* sB, const in_t* A, const in_t* B,
                                           int m0, int n0, int k0, int M, int N, int K,
                                           int lda, int ldb, int tid) {
  constexpr int KCH = BK / 8;
#pragma unroll
  for (int it = 0; it < BM * KCH / THREADS; ++it) {
    int i = tid + it * THREADS;
    int r = i / KCH, c = i % KCH;
    int gm = m0 + r, gk = k0 + c * 8;
    bool p = gm < M && gk < K;
    cp_async16(smem_addr(sA + swz<KCH>(r, c)), p ? A + (size_t)gm * lda + gk : A, p);
  }
  if constexpr (B_KMAJOR) {
#pragma unroll
    for (int it = 0; it < BN * KCH / THREADS; ++it) {
      int i = tid + it * THREADS;
      int r = i / KCH, c = i % KCH;
      int gn = n0 + r, gk = k0 + c * 8;
      bool p = gn < N && gk < K;
      cp_async16(smem_addr(sB + swz<KCH>(r, c)), p ? B + (size_t)gn * ldb + gk : B, p);
    }
  } else {
    constexpr int NCH = BN / 8;
#pragma unroll
    for (int it = 0; it < BK * NCH / THREADS; ++it) {
      int i = tid + it * THREADS;
      int r = i / NCH, c = i % NCH;
      int gk = k0 + r, gn = n0 + c * 8;
      bool p = gk < K && gn < N;
      cp_async16(smem_addr(sB + swz<NCH>(r, c)), p ? B + (size_t)gk * ldb + gn : B, p);
    }
  }
}
""",
    "compute_stage": r"""
// All MMAs of one K-tile held in shared memory, for this warp's WTM x WTN sub-tile.
__device__ __forceinline__ void compute_stage(const in_t* sA, const in_t* sB,
                                              float (&acc)[MI][NI][4], int wm, int wn,
                                              int lane) {
  constexpr int KCH = BK / 8;
#pragma unroll
  for (int kk = 0; kk < BK / 16; ++kk) {
    unsigned af[MI][4];
    unsigned bf[NI][2];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
      int row = wm * WTM + mi * 16 + (lane & 15);
      ldmatrix_x4(af[mi], smem_addr(sA + swz<KCH>(row, kk * 2 + (lane >> 4))));
    }
#pragma unroll
    for (int nj = 0; nj < NI / 2; ++nj) {
      unsigned t[4];
      if constexpr (B_KMAJOR) {
        int row = wn * WTN + nj * 16 + ((lane >> 4) << 3) + (lane & 7);
        ldmatrix_x4(t, smem_addr(sB + swz<KCH>(row, kk * 2 + ((lane >> 3) & 1))));
      } else {
        int row = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
        int chunk = (wn * WTN + nj * 16) / 8 + (lane >> 4);
        ldmatrix_x4_trans(t, smem_addr(sB + swz<BN / 8>(row, chunk)));
      }
      bf[2 * nj][0] = t[0]; bf[2 * nj][1] = t[1];
      bf[2 * nj + 1][0] = t[2]; bf[2 * nj + 1][1] = t[3];
    }
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) mma_16816(acc[mi][ni], af[mi], bf[ni]);
  }
}
""",
    "store_out": r"""
// Epilogue for four horizontally adjacent elements (col % 4 == 0): bias, cast, store.
// `vec`: the four are in bounds and 8/16-byte aligned, so one vector store does.
__device__ __forceinline__ void store_out4(out_t* C, const out_t* bias, int row, int col,
                                          int N, int ldc, bool vec, float4 v) {
  float x[4] = {v.x, v.y, v.z, v.w};
  if (bias != nullptr) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (col + j < N) x[j] += TO_FLOAT_OUT(bias[col + j]);
  }
  out_t* p = C + (size_t)row * ldc + col;
  if (vec) {
    if constexpr (OUT_IS_F32) {
      *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
    } else {
      *reinterpret_cast<uint2*>(p) = make_uint2(PACK2_OUT(x[0], x[1]), PACK2_OUT(x[2], x[3]));
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (col + j < N) p[j] = FROM_FLOAT_OUT(x[j]);
  }
}
// fp32 partials in a row-major [M, N] workspace (ld = N), through L2 only.
__device__ __forceinline__ void store_partial4(float* W, int row, int col, int N, bool vec,
                                              float4 v) {
  float* p = W + (size_t)row * N + col;
  if (vec) { __stcg(reinterpret_cast<float4*>(p), v); return; }
  float x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (col + j < N) __stcg(p + j, x[j]);
}
__device__ __forceinline__ float4 add_partial4(const float* W, int row, int col, int N,
                                              bool vec, float4 v) {
  const float* p = W + (size_t)row * N + col;
  if (vec) {
    float4 w = __ldcg(reinterpret_cast<const float4*>(p));
    return make_float4(v.x + w.x, v.y + w.y, v.z + w.z, v.w + w.w);
  }
  float x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (col + j < N) x[j] += __ldcg(p + j);
  return make_float4(x[0], x[1], x[2], x[3]);
}
""",
}

MAIN_BODY = r"""
  extern __shared__ __align__(128) unsigned char smem_raw[];
  in_t* smem = reinterpret_cast<in_t*>(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;

  // Which tile and K-slice: slices of a tile are consecutive CTAs (so a slice only ever
  // waits for a CTA launched before it), tiles are rastered in groups of GROUP_M rows.
  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  const int slice = blockIdx.x % split, tile = blockIdx.x / split;
  const int per_group = GROUP_M * tiles_n;
  const int first_m = (tile / per_group) * GROUP_M;
  const int group_rows = imin(tiles_m - first_m, GROUP_M);
  const int tm = first_m + (tile % per_group) % group_rows;
  const int tn = (tile % per_group) / group_rows;
  const int m0 = tm * BM, n0 = tn * BN;

  const int ktiles = (K + BK - 1) / BK;
  const int per_slice = (ktiles + split - 1) / split;
  const int kt0 = imin(slice * per_slice, ktiles);
  const int nk = imin(ktiles, kt0 + per_slice) - kt0;

  float acc[MI][NI][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[mi][ni][j] = 0.f;

  // Multistage pipeline: STAGES-1 K-tiles in flight while one is computed.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nk)
      load_stage(smem + s * STAGE_ELEMS, smem + s * STAGE_ELEMS + BM * BK, A, B, m0, n0,
                 (kt0 + s) * BK, M, N, K, lda, ldb, tid);
    cp_async_commit();
  }
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt landed for everyone; stage kt-1 is free to overwrite
    const int pre = kt + STAGES - 1;
    if (pre < nk) {
      const int ps = pre % STAGES;
      load_stage(smem + ps * STAGE_ELEMS, smem + ps * STAGE_ELEMS + BM * BK, A, B, m0, n0,
                 (kt0 + pre) * BK, M, N, K, lda, ldb, tid);
    }
    cp_async_commit();
    const int cs = kt % STAGES;
    compute_stage(smem + cs * STAGE_ELEMS, smem + cs * STAGE_ELEMS + BM * BK, acc, wm, wn,
                  lane);
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline's shared memory becomes the fp32 C tile

  // Registers -> shared fp32 tile (rows padded by CPAD floats: conflict-free float2
  // stores), so that the epilogue reads whole rows and stores 16 bytes per thread.
  float* sC = reinterpret_cast<float*>(smem_raw);
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wm * WTM + mi * 16 + h * 8 + (lane >> 2);
        const int c = wn * WTN + ni * 8 + (lane & 3) * 2;
        *reinterpret_cast<float2*>(sC + r * CLD + c) =
            make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
      }

  int* sem = sems + tile;
  const bool last = slice == split - 1;
  if (mode == MODE_SERIAL && slice > 0) sem_wait(sem, slice);  // includes a barrier
  else __syncthreads();

  // The tile, four columns per thread: add earlier slices, then either hand the running
  // sum on (fp32 workspace) or apply the epilogue.
  const bool vec_ws = (N % 4 == 0);
  const bool vec_out = (N % 4 == 0) && (ldc % 4 == 0) &&
                       ((reinterpret_cast<size_t>(C) & 15) == 0);
  float* W = ws + (mode == MODE_PARALLEL ? (size_t)slice * M * N : 0);
  constexpr int QUADS = BN / 4;
  for (int i = tid; i < BM * QUADS; i += THREADS) {
    const int r = i / QUADS, c = (i % QUADS) * 4;
    const int row = m0 + r, col = n0 + c;
    if (row >= M || col >= N) continue;
    float4 v = *reinterpret_cast<const float4*>(sC + r * CLD + c);
    const bool in_bounds = col + 4 <= N;
    if (mode == MODE_SERIAL && slice > 0) v = add_partial4(W, row, col, N, vec_ws && in_bounds, v);
    if (mode == MODE_PARALLEL || (mode == MODE_SERIAL && !last))
      store_partial4(W, row, col, N, vec_ws && in_bounds, v);
    else
      store_out4(C, bias, row, col, N, ldc, vec_out && in_bounds, v);
  }

  if (mode == MODE_SERIAL) {
    if (last) {
      __syncthreads();         // every thread has read the workspace
      if (tid == 0) *sem = 0;  // back to zero for the next matmul on this stream
    } else {
      sem_release(sem, slice + 1);
    }
  }
"""

REDUCE_BODY = r"""
  // Sum the split fp32 partials of each element, apply bias and cast; four columns per
  // thread, grid-stride over the [M, N] output.
  const long long quads_per_row = (N + 3) / 4;
  const long long total = (long long)M * quads_per_row;
  const size_t plane = (size_t)M * N;
  const bool vec_ws = (N % 4 == 0);
  const bool vec_out = vec_ws && (ldc % 4 == 0) && ((reinterpret_cast<size_t>(C) & 15) == 0);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const int row = (int)(i / quads_per_row), col = (int)(i % quads_per_row) * 4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < split; ++s) v = add_partial4(ws + s * plane, row, col, N, vec_ws, v);
    store_out4(C, bias, row, col, N, ldc, vec_out, v);
  }
"""

MMA_INSTR = {
    "bf16": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    "fp16": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
}

RENDERER = Renderer(extra=MATMUL_SNIPPETS)


def _prelude(spec: MatmulSpec) -> str:
    """Type aliases, the spec's constants and the dtype-specific macros."""
    wtm, wtn = spec.tile_m // spec.warps_m, spec.tile_n // spec.warps_n
    consts = {
        "BM": spec.tile_m, "BN": spec.tile_n, "BK": spec.tile_k,
        "WARPS_M": spec.warps_m, "WARPS_N": spec.warps_n, "THREADS": spec.threads,
        "STAGES": spec.stages, "WTM": wtm, "WTN": wtn, "MI": wtm // 16, "NI": wtn // 8,
        "STAGE_ELEMS": (spec.tile_m + spec.tile_n) * spec.tile_k, "CLD": spec.tile_n + CPAD,
        "GROUP_M": GROUP_M, "MODE_NONE": MODE_CODE["none"],
        "MODE_SERIAL": MODE_CODE["serial"], "MODE_PARALLEL": MODE_CODE["parallel"],
        "B_KMAJOR": spec.layout == "TN",
        "OUT_IS_F32": spec.out_dtype == "fp32",
    }
    out = spec.out_dtype
    macros = [
        f'#define MMA_INSTR "{MMA_INSTR[spec.a_dtype]}"',
        f"#define TO_FLOAT_OUT {TO_FLOAT[out]}",
        f"#define FROM_FLOAT_OUT {FROM_FLOAT[out]}",
        # fp32 output never packs; the name only has to compile in the discarded branch.
        f"#define PACK2_OUT {PACK2.get(out, 'pack_bf16x2')}",
    ]
    return "\n".join([RENDERER.typedefs({"in_t": spec.a_dtype, "out_t": out}),
                      RENDERER.constants(consts), *macros])


def _params(spec: MatmulSpec) -> list[tuple[str, str]]:
    return [("const in_t* __restrict__", "A"), ("const in_t* __restrict__", "B"),
            ("out_t* __restrict__", "C"), ("const out_t* __restrict__", "bias"),
            ("float*", "ws"), ("int*", "sems"), ("int", "M"), ("int", "N"), ("int", "K"),
            ("int", "lda"), ("int", "ldb"), ("int", "ldc"), ("int", "split"),
            ("int", "mode")]


def _reduce_params() -> list[tuple[str, str]]:
    return [("const float* __restrict__", "ws"), ("out_t* __restrict__", "C"),
            ("const out_t* __restrict__", "bias"), ("int", "M"), ("int", "N"),
            ("int", "ldc"), ("int", "split")]


def render(spec: MatmulSpec) -> KernelSource:
    """CUDA C++ for `spec`: the matmul kernel and its split-K reduction kernel.

    The source depends only on `spec.source_key` (dtypes, layout, tile, warps, stages):
    split mode, split factor and bias are kernel arguments, so one compiled module serves
    every mode and CI can compile every variant.

    Matmul kernel parameters, in order: A, B, C, bias (null: none), ws (fp32 workspace,
    split-K only), sems (zeroed ints, one per output tile, serial only), M, N, K, lda,
    ldb, ldc, split, mode (0 none, 1 serial, 2 parallel).
    Reduction kernel: ws, C, bias, M, N, ldc, split.
    """
    name = spec.kernel_name
    reduce_name = name + "_reduce"
    source = RENDERER.source(
        [], _prelude(spec),
        *[RENDERER.snippet(s) for s in ("convert", "min_max", "ptx", "semaphore", "swizzle",
                                        "load_stage", "compute_stage", "store_out")],
        RENDERER.kernel(name, _params(spec), MAIN_BODY, threads=spec.threads),
        RENDERER.kernel(reduce_name, _reduce_params(), REDUCE_BODY, threads=REDUCE_THREADS))

    return KernelSource(spec=spec, source=source, kernel_name=name, reduce_name=reduce_name,
                        launch=lambda M, N, K: launch_config(spec, M, N, K),
                        reduce_launch=reduce_launch)


def launch_config(spec: MatmulSpec, M: int, N: int, K: int) -> LaunchConfig:
    """Grid of the matmul kernel: one CTA per (tile, K-slice) of *this* spec.

    Take it from the spec being launched, not from the KernelSource a module was loaded
    with: specs that share a source differ in split_k.
    """
    return LaunchConfig((tiles(spec, M, N) * spec.split_k, 1, 1), (spec.threads, 1, 1),
                        spec.smem_bytes)


def reduce_launch(M: int, N: int, sm_count: int = 132) -> LaunchConfig:
    """Grid of the parallel split-K reduction: enough CTAs to cover the SMs many times."""
    quads = M * ((N + 3) // 4)
    blocks = max(1, min(-(-quads // REDUCE_THREADS), sm_count * 16))
    return LaunchConfig((blocks, 1, 1), (REDUCE_THREADS, 1, 1), 0)


def tiles(spec: MatmulSpec, M: int, N: int) -> int:
    """Output tiles of an M x N product (one serial-split-K semaphore each)."""
    return -(-M // spec.tile_m) * -(-N // spec.tile_n)
