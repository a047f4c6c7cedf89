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
        return self.stages * (self.tile_m + self.tile_n) * self.tile_k * DTYPE_BYTES[self.a_dtype]

    @property
    def tile(self) -> str:
        return f"{self.tile_m}x{self.tile_n}x{self.tile_k}"

    @property
    def kernel_name(self) -> str:
        bias = "_bias" if self.bias else ""
        return (f"hostir_mm_{self.layout.lower()}_{self.a_dtype}_{self.out_dtype}_"
                f"{self.tile}_w{self.warps_m}x{self.warps_n}_s{self.stages}_"
                f"{self.split_mode}{bias}")

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
    reduce_name: str | None  # parallel split-K only
    launch: Callable[[int, int, int], LaunchConfig]
    reduce_launch: Callable[[int, int], LaunchConfig] | None

    @property
    def names(self) -> tuple[str, ...]:
        return (self.kernel_name,) + ((self.reduce_name,) if self.reduce_name else ())


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
// Epilogue for two horizontally adjacent elements (col is even): bias, cast, store.
__device__ __forceinline__ void store_out2(out_t* C, const out_t* bias, int row, int col,
                                          int M, int N, int ldc, bool vec, float x, float y) {
  if (row >= M || col >= N) return;
  if constexpr (HAS_BIAS) {
    x += TO_FLOAT_OUT(bias[col]);
    if (col + 1 < N) y += TO_FLOAT_OUT(bias[col + 1]);
  }
  out_t* p = C + (size_t)row * ldc + col;
  if (vec && col + 1 < N) {
    if constexpr (OUT_IS_F32) {
      *reinterpret_cast<float2*>(p) = make_float2(x, y);
    } else {
      *reinterpret_cast<unsigned*>(p) = PACK2_OUT(x, y);
    }
  } else {
    p[0] = FROM_FLOAT_OUT(x);
    if (col + 1 < N) p[1] = FROM_FLOAT_OUT(y);
  }
}
// fp32 partials in a row-major [M, N] workspace (ld = N), through L2 only.
__device__ __forceinline__ void store_partial2(float* W, int row, int col, int M, int N,
                                              bool vec, float x, float y) {
  if (row >= M || col >= N) return;
  float* p = W + (size_t)row * N + col;
  if (vec) { __stcg(reinterpret_cast<float2*>(p), make_float2(x, y)); }
  else { __stcg(p, x); if (col + 1 < N) __stcg(p + 1, y); }
}
__device__ __forceinline__ void add_partial2(const float* W, int row, int col, int M, int N,
                                            bool vec, float& x, float& y) {
  if (row >= M || col >= N) return;
  const float* p = W + (size_t)row * N + col;
  if (vec) { float2 v = __ldcg(reinterpret_cast<const float2*>(p)); x += v.x; y += v.y; }
  else { x += __ldcg(p); if (col + 1 < N) y += __ldcg(p + 1); }
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

  // Fragment (mi, ni, j) of this thread sits at row r0 + mi*16 + (j/2)*8, col c0 + ni*8.
  const int r0 = m0 + wm * WTM + (lane >> 2);
  const int c0 = n0 + wn * WTN + (lane & 3) * 2;
  const bool vec_out = (ldc % 2 == 0) && (N % 2 == 0);
  const bool vec_ws = (N % 2 == 0);

  if constexpr (MODE == 0) {
    EPILOGUE_OUT;
  } else if constexpr (MODE == 2) {
    float* W = ws + (size_t)slice * M * N;
    FOR_FRAGMENTS(store_partial2(W, row, col, M, N, vec_ws, acc[mi][ni][h * 2],
                                 acc[mi][ni][h * 2 + 1]));
  } else {
    int* sem = sems + tile;
    if (slice > 0) {
      sem_wait(sem, slice);
      FOR_FRAGMENTS(add_partial2(ws, row, col, M, N, vec_ws, acc[mi][ni][h * 2],
                                 acc[mi][ni][h * 2 + 1]));
    }
    if (slice == split - 1) {
      EPILOGUE_OUT;
      __syncthreads();  // every thread has read the workspace before the tile is handed on
      if (tid == 0) *sem = 0;  // back to zero for the next matmul on this stream
    } else {
      FOR_FRAGMENTS(store_partial2(ws, row, col, M, N, vec_ws, acc[mi][ni][h * 2],
                                   acc[mi][ni][h * 2 + 1]));
      sem_release(sem, slice + 1);
    }
  }
"""

MACROS = r"""
#define FOR_FRAGMENTS(STMT)                                              \
  _Pragma("unroll") for (int mi = 0; mi < MI; ++mi)                      \
  _Pragma("unroll") for (int ni = 0; ni < NI; ++ni)                      \
  _Pragma("unroll") for (int h = 0; h < 2; ++h) {                        \
    const int row = r0 + mi * 16 + h * 8, col = c0 + ni * 8;             \
    STMT;                                                                \
  }
#define EPILOGUE_OUT FOR_FRAGMENTS(store_out2(C, bias, row, col, M, N, ldc, vec_out, \
                                   acc[mi][ni][h * 2], acc[mi][ni][h * 2 + 1]))
"""

REDUCE_BODY = r"""
  // Sum the split fp32 partials of each element, apply bias and cast. Pairs of columns
  // per thread (vectorised when rows are even), grid-stride over the [M, N] output.
  const long long pairs_per_row = (N + 1) / 2;
  const long long total = (long long)M * pairs_per_row;
  const size_t plane = (size_t)M * N;
  const bool vec_out = (ldc % 2 == 0) && (N % 2 == 0);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const int row = (int)(i / pairs_per_row), col = (int)(i % pairs_per_row) * 2;
    float x = 0.f, y = 0.f;
    for (int s = 0; s < split; ++s) add_partial2(ws + s * plane, row, col, M, N, N % 2 == 0, x, y);
    store_out2(C, bias, row, col, M, N, ldc, vec_out, x, y);
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
        "STAGE_ELEMS": (spec.tile_m + spec.tile_n) * spec.tile_k,
        "GROUP_M": GROUP_M, "MODE": MODE_CODE[spec.split_mode],
        "B_KMAJOR": spec.layout == "TN", "HAS_BIAS": spec.bias,
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
            ("int", "lda"), ("int", "ldb"), ("int", "ldc"), ("int", "split")]


def _reduce_params() -> list[tuple[str, str]]:
    return [("const float* __restrict__", "ws"), ("out_t* __restrict__", "C"),
            ("const out_t* __restrict__", "bias"), ("int", "M"), ("int", "N"),
            ("int", "ldc"), ("int", "split")]


def render(spec: MatmulSpec) -> KernelSource:
    """CUDA C++ for `spec`: the matmul kernel (and the reduction kernel in parallel mode).

    The kernel's parameters, in order: A, B, C, bias (may be null), ws (fp32 workspace,
    split-K only), sems (zeroed ints, serial only, one per output tile), M, N, K, lda,
    ldb, ldc, split.
    """
    name = spec.kernel_name
    parts = [_prelude(spec), MACROS,
             RENDERER.kernel(name, _params(spec), MAIN_BODY, threads=spec.threads)]
    reduce_name = None
    if spec.split_mode == "parallel":
        reduce_name = name + "_reduce"
        parts.append(RENDERER.kernel(reduce_name, _reduce_params(), REDUCE_BODY,
                                     threads=REDUCE_THREADS))
    snippets = ["convert", "min_max", "ptx", "semaphore", "swizzle"]
    # The prelude (types, constants) must precede the snippets that use them.
    source = RENDERER.source([], parts[0],
                             *[RENDERER.snippet(s) for s in snippets],
                             RENDERER.snippet("load_stage"), RENDERER.snippet("compute_stage"),
                             RENDERER.snippet("store_out"), *parts[1:])

    def launch(M: int, N: int, K: int) -> LaunchConfig:
        tiles = -(-M // spec.tile_m) * -(-N // spec.tile_n)
        return LaunchConfig((tiles * spec.split_k, 1, 1), (spec.threads, 1, 1), spec.smem_bytes)

    def reduce_launch(M: int, N: int) -> LaunchConfig:
        pairs = M * ((N + 1) // 2)
        blocks = max(1, min(-(-pairs // REDUCE_THREADS), 132 * 16))
        return LaunchConfig((blocks, 1, 1), (REDUCE_THREADS, 1, 1), 0)

    return KernelSource(spec=spec, source=source, kernel_name=name, reduce_name=reduce_name,
                        launch=launch,
                        reduce_launch=reduce_launch if reduce_name else None)


def tiles(spec: MatmulSpec, M: int, N: int) -> int:
    """Output tiles of an M x N product (one serial-split-K semaphore each)."""
    return -(-M // spec.tile_m) * -(-N // spec.tile_n)
