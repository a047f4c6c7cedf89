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
  cluster:  (Hopper, the non-persistent wgmma feeds) the `split_k` slices of a tile are
            the CTAs of one thread-block cluster. Each stages its fp32 partial in its own
            shared memory; after a cluster barrier, CTA r sums rows r/split_k of the
            tile over every CTA's partial through distributed shared memory, applies the
            epilogue and writes C. One launch, no workspace, no semaphore: the partials
            never leave the GPC. The cluster size is compiled in (`__cluster_dims__`), so
            unlike the other modes split_k is part of the source.

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
SPLIT_MODES = ("none", "serial", "parallel", "cluster")
INSTRS = ("mma", "wgmma")
MODE_CODE = {"none": 0, "serial": 1, "parallel": 2, "cluster": 3}
# Cluster split-K: the split factors (CTAs a cluster) it takes. Only pairs: clusters of 4
# CTAs of 200 KB shared memory each do not pack into the GPCs (at 1024x2048x50304 on the
# H200, 64 clusters of 4 ran 1.55x as long as 64 clusters of 2 doing the same work: three
# waves where two should do; 0.63-0.72 of cuBLAS on both split-K shapes,
# benchmarks/results/split_k_probe_nvidia-h200_f579964.json).
CLUSTER_SPLITS = (2,)

# Shared memory per CTA that an sm_80 / sm_90 part can give a kernel (opt-in maximum).
MAX_SMEM_BYTES = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}
# SMs assumed where the caller does not pass the device's count (H100 / H200 SXM).
DEFAULT_SM_COUNT = 132
# Threads of the split-K reduction kernel (parallel mode).
REDUCE_THREADS = 256
# Tiles in a raster group: CTAs launched together share B columns and A rows in L2.
GROUP_M = 8
# Padding (floats) of each row of the fp32 C tile staged in shared memory for the epilogue.
CPAD = 8
# Warps that only load, in a warp-specialized wgmma kernel (they come after the
# warpgroups, so that warpgroups start at warp 0 and 4 as wgmma requires): two issue the
# cp.async copies; with TMA one thread of one warp issues two bulk tensor copies a stage.
PRODUCER_WARPS = 2
TMA_PRODUCER_WARPS = 1
# Bytes of one CUtensorMap (the driver's opaque TMA descriptor); A's then B's, in global
# memory, are the `tmaps` kernel argument of a TMA kernel.
TENSOR_MAP_BYTES = 128
# Kernel-name suffix (and body key) of each feed.
FEED_SUFFIX = {"sync": "", "ws": "_ws", "tma": "_tma", "ptma": "_ptma", "ctma": "_ctma",
               "pptma": "_pptma"}
# Alignment (bytes) of wgmma's shared-memory operands: one 128-byte swizzle atom (8 rows).
SWIZZLE_ALIGN = 1024


def supports_wgmma(arch: str | None) -> bool:
    """Whether NVRTC target / device arch `arch` ("sm_90", "sm_90a") runs wgmma.mma_async.

    Only sm_90a has it (Blackwell's sm_100 dropped it for tcgen05); the runtime compiles
    wgmma kernels for sm_90a and they run on any sm_90 part.
    """
    return arch in ("sm_90", "sm_90a")


@dataclasses.dataclass(frozen=True, slots=True)
class MatmulSpec:
    """Everything that determines one generated matmul kernel (plus its split factor).

    `split_k` is a launch parameter, not part of the source: specs that differ only in
    `split_k` share one compiled kernel, except in split_mode "cluster", whose cluster
    size is compiled in (`source_key`). Bias (if any) has `out_dtype` and shape [N].
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
    instr: str = "mma"  # "mma": mma.sync (sm_80+); "wgmma": wgmma.mma_async (sm_90a only)
    # wgmma only: PRODUCER_WARPS extra warps fill the smem ring (cp.async + mbarriers)
    # while the warpgroups only compute; no CTA-wide barrier in the mainloop.
    warp_specialized: bool = False
    # warp-specialized wgmma only: the producer fills the ring by TMA (cp.async.bulk.tensor,
    # 128-byte swizzle, zero fill out of bounds) from tensor maps the runtime builds.
    tma: bool = False
    # TMA only: at most one CTA per SM, each looping over work units (tile, K-slice); the
    # producer loads the next unit while the warpgroups store this one's C straight from
    # registers (no shared fp32 C tile, no CTA-wide barrier between units).
    persistent: bool = False
    # TMA, not persistent: CTAs in clusters of `cluster_m` along M (2: a pair of
    # vertically adjacent tiles); each loads 1/cluster_m of the B tile they share and
    # multicasts it to both, so B's L2-to-SM traffic halves.
    cluster_m: int = 1
    # persistent only (feed "pptma"): ping-pong. Each of the two warpgroups owns whole
    # units (tile_m x tile_n, every other unit of the CTA), so one stores its C while the
    # other runs its mainloop: the epilogue leaves the tensor cores' critical path.
    pingpong: bool = False

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
        need(self.tile_m % (16 * (4 if self.pingpong else self.warps_m)) == 0,
             "tile_m must be a multiple of 16 * warps_m (an m16 MMA per warp row; with "
             "pingpong, of the 4 warps of a warpgroup)")
        need(self.tile_n % (16 * self.warps_n) == 0,
             "tile_n must be a multiple of 16 * warps_n (ldmatrix.x4 loads two n8 tiles)")
        need(self.tile_n % 64 == 0 or self.layout == "TN",
             "NN layout needs tile_n a multiple of 64 (swizzled rows of 8 chunks)")
        need(2 <= self.stages <= 6, "stages must be in [2, 6]")
        need(self.split_k >= 1, "split_k must be >= 1")
        need((self.split_mode == "none") == (self.split_k == 1),
             "split_k == 1 exactly when split_mode == 'none'")
        if self.split_mode == "cluster":
            need(self.instr == "wgmma" and not self.persistent and self.cluster_m == 1,
                 "split_mode 'cluster' needs a non-persistent wgmma feed without B multicast "
                 "(instr 'wgmma', persistent False, cluster_m 1)")
            need(self.split_k in CLUSTER_SPLITS,
                 f"split_mode 'cluster' takes split_k in {CLUSTER_SPLITS} (CTAs a cluster)")
            need(self.tile_m % self.split_k == 0,
                 "split_mode 'cluster': tile_m must divide into split_k row bands")
        need(self.accumulators_per_thread <= 128,
             "warp tile too large: more than 128 fp32 accumulators per thread spill")
        loaders = 32 * self.producer_warps if self.warp_specialized else self.threads
        for rows in (self.tile_m, self.tile_n):
            need((rows * self.tile_k // 8) % loaders == 0,
                 "tile chunks (16 bytes) must divide evenly over the CTA's threads")
        need(self.instr in INSTRS, f"instr must be one of {INSTRS}")
        if self.instr == "wgmma":
            need(self.layout == "TN", "wgmma needs layout TN (both operands K-major)")
            need(self.tile_k == 64, "wgmma needs tile_k 64 (one 128-byte swizzle row)")
            need(self.warps_n == 1 and self.warps_m in (4, 8),
                 "wgmma: warps_n must be 1 and warps_m 4 or 8 (warpgroups stacked along M)")
            need(self.tile_m % 64 == 0 if self.pingpong else
                 (self.tile_m // self.warpgroups) % 64 == 0 and self.tile_m % self.warpgroups == 0,
                 "wgmma: each warpgroup's rows (tile_m / warpgroups; tile_m with pingpong) "
                 "must be a multiple of 64")
            need(self.tile_n % 64 == 0 and self.tile_n <= 256,
                 "wgmma: tile_n must be 64, 128, 192 or 256 (one m64nNk16 per 64 rows)")
            need(self.stages >= 3, "wgmma: stages must be >= 3 (one wgmma group in flight)")
        else:
            need(not self.warp_specialized, "warp_specialized needs instr 'wgmma'")
        need(not self.tma or self.warp_specialized, "tma needs warp_specialized (and wgmma)")
        need(not self.persistent or self.tma, "persistent needs tma")
        need(self.cluster_m in (1, 2), "cluster_m must be 1 or 2")
        need(self.cluster_m == 1 or (self.tma and not self.persistent),
             "cluster_m 2 needs the (non-persistent) tma feed")
        need(not self.pingpong or (self.persistent and self.warps_m == 8),
             "pingpong needs the persistent feed and two warpgroups (warps_m 8)")
        arch = 90 if self.instr == "wgmma" else 80
        need(self.smem_bytes <= MAX_SMEM_BYTES[arch],
             f"shared memory {self.smem_bytes} B exceeds {MAX_SMEM_BYTES[arch]} B (sm_{arch})")

    @property
    def warps(self) -> int:
        return self.warps_m * self.warps_n

    @property
    def threads(self) -> int:
        """Threads of the CTA: the compute warps, plus the producer warps if specialized."""
        return 32 * (self.warps + self.producer_warps)

    @property
    def producer_warps(self) -> int:
        if not self.warp_specialized:
            return 0
        return TMA_PRODUCER_WARPS if self.tma else PRODUCER_WARPS

    @property
    def feed(self) -> str:
        """How the smem ring is filled: "sync" (every thread, cp.async, CTA barriers),
        "ws" (producer warps, cp.async + mbarriers), "tma" (one producer thread, TMA) or
        "ptma" (TMA, persistent CTAs, C stored from registers) or "pptma" (the same,
        ping-pong warpgroups)."""
        if self.tma:
            if self.persistent:
                return "pptma" if self.pingpong else "ptma"
            return "ctma" if self.cluster_m > 1 else "tma"
        return "ws" if self.warp_specialized else "sync"

    @property
    def cluster_k(self) -> int:
        """CTAs of a cluster that share one tile's K (split_mode "cluster"), else 1."""
        return self.split_k if self.split_mode == "cluster" else 1

    @property
    def cluster_size(self) -> int:
        """CTAs of the compiled-in thread-block cluster along x (1: no cluster)."""
        return self.cluster_m * self.cluster_k

    @property
    def warpgroups(self) -> int:
        """wgmma: groups of 4 warps, each owning tile_m / warpgroups rows and all columns."""
        return max(1, self.warps // 4)

    @property
    def accumulators_per_thread(self) -> int:
        if self.pingpong:  # a warpgroup (128 threads) holds a whole unit tile
            return self.tile_m * self.tile_n // 128
        return (self.tile_m // self.warps_m) * (self.tile_n // self.warps_n) // 32

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory: the pipeline stages, later reused for the fp32 C tile."""
        pipeline = self.stages * (self.tile_m + self.tile_n) * self.tile_k * DTYPE_BYTES[self.a_dtype]
        # The persistent kernel stores C from registers: no shared fp32 C tile.
        ctile = 0 if self.persistent else self.tile_m * (self.tile_n + CPAD) * 4
        # wgmma's 128-byte swizzle repeats every 1024 bytes: the kernel rounds its base up.
        align = SWIZZLE_ALIGN if self.instr == "wgmma" else 0
        return max(pipeline, ctile) + align

    @property
    def tile(self) -> str:
        return f"{self.tile_m}x{self.tile_n}x{self.tile_k}"

    @property
    def kernel_name(self) -> str:
        prefix = "hostir_mm" if self.instr == "mma" else f"hostir_{self.instr}"
        ws = FEED_SUFFIX[self.feed]
        ck = f"_ck{self.cluster_k}" if self.cluster_k > 1 else ""
        return (f"{prefix}_{self.layout.lower()}_{self.a_dtype}_{self.out_dtype}_"
                f"{self.tile}_w{self.warps_m}x{self.warps_n}_s{self.stages}{ws}{ck}")

    @property
    def source_key(self) -> tuple:
        """The fields the generated source depends on (mode, split, bias are arguments,
        except a cluster split's factor: the cluster's size is compiled in)."""
        return (self.a_dtype, self.b_dtype, self.out_dtype, self.layout, self.tile_m,
                self.tile_n, self.tile_k, self.warps_m, self.warps_n, self.stages, self.instr,
                self.warp_specialized, self.tma, self.persistent, self.cluster_m, self.pingpong,
                self.cluster_k)

    def arch(self, major: int, minor: int) -> str:
        """The NVRTC target for a device of this compute capability: wgmma needs sm_90a."""
        return f"sm_{major}{minor}" + ("a" if self.instr == "wgmma" else "")

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
    launch: Callable[..., LaunchConfig]  # (M, N, K[, sm_count])
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
__device__ __forceinline__ void sem_spin(const int* sem, int value) {
  int v;
  while (true) {
    asm volatile("ld.global.acquire.gpu.b32 %0, [%1];\n" : "=r"(v) : "l"(sem) : "memory");
    if (v == value) break;
    __nanosleep(40);
  }
}
__device__ __forceinline__ void sem_post(int* sem, int value) {
  asm volatile("st.global.release.gpu.b32 [%0], %1;\n" :: "l"(sem), "r"(value) : "memory");
}
__device__ __forceinline__ void sem_wait(const int* sem, int value) {
  if (threadIdx.x == 0) sem_spin(sem, value);
  __syncthreads();
}
__device__ __forceinline__ void sem_release(int* sem, int value) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) sem_post(sem, value);
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
// Issue the cp.async copies of one K-tile of A and B into one pipeline stage; threads
// 0..NT-1 (`tid`) share the copies.
template <int NT = THREADS>
__device__ __forceinline__ void load_stage(in_t* sA, in_t* sB, const in_t* A, const in_t* B,
                                           int m0, int n0, int k0, int M, int N, int K,
                                           int lda, int ldb, int tid) {
  constexpr int KCH = BK / 8;
#pragma unroll
  for (int it = 0; it < BM * KCH / NT; ++it) {
    int i = tid + it * NT;
    int r = i / KCH, c = i % KCH;
    int gm = m0 + r, gk = k0 + c * 8;
    bool p = gm < M && gk < K;
    cp_async16(smem_addr(sA + swz<KCH>(r, c)), p ? A + (size_t)gm * lda + gk : A, p);
  }
  if constexpr (B_KMAJOR) {
#pragma unroll
    for (int it = 0; it < BN * KCH / NT; ++it) {
      int i = tid + it * NT;
      int r = i / KCH, c = i % KCH;
      int gn = n0 + r, gk = k0 + c * 8;
      bool p = gn < N && gk < K;
      cp_async16(smem_addr(sB + swz<KCH>(r, c)), p ? B + (size_t)gn * ldb + gk : B, p);
    }
  } else {
    constexpr int NCH = BN / 8;
#pragma unroll
    for (int it = 0; it < BK * NCH / NT; ++it) {
      int i = tid + it * NT;
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
__device__ __forceinline__ float4 load_partial4(const float* W, int row, int col, int N,
                                               bool vec) {
  const float* p = W + (size_t)row * N + col;
  if (vec) return __ldcg(reinterpret_cast<const float4*>(p));
  float x[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (col + j < N) x[j] = __ldcg(p + j);
  return make_float4(x[0], x[1], x[2], x[3]);
}
__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}
__device__ __forceinline__ float4 add_partial4(const float* W, int row, int col, int N,
                                              bool vec, float4 v) {
  return add4(v, load_partial4(W, row, col, N, vec));
}
""",
    "wgmma_ptx": r"""
// Shared-memory matrix descriptor of a K-major operand in the 128-byte swizzle layout:
// rows of 64 16-bit elements (128 bytes), 16-byte chunk c of row r stored at chunk
// c ^ (r % 8) (what swz<8> does), 8-row atoms of 1024 bytes stacked along M (or N).
// Fields (PTX ISA, "matrix descriptor"): bits 0-13 start address >> 4; 16-29 leading
// byte offset >> 4 (unused by swizzled K-major layouts, 1 by convention); 32-45 stride
// byte offset >> 4 (1024 bytes from one 8-row atom to the next); 49-51 base offset (0:
// atoms start 1024-byte aligned); 62-63 swizzle mode (1 = 128-byte). A k16 step inside
// the 128-byte row is +32 bytes on the start address: the hardware swizzles the address.
__device__ __forceinline__ unsigned long long sw128_desc(unsigned addr) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) |
         ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
// cp.async fills shared memory through the generic proxy; wgmma reads it through the
// async proxy: each thread fences its landed copies before the barrier.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving accumulator reads or writes across wgmma fences/waits.
template <int A, int B> __device__ __forceinline__ void fence_acc(float (&d)[A][B]) {
#pragma unroll
  for (int i = 0; i < A; ++i)
#pragma unroll
    for (int j = 0; j < B; ++j) asm volatile("" : "+f"(d[i][j]) :: "memory");
}
""",
    "unit_coords": r"""
// Work unit u of a matmul (u = tile * split + slice): its output tile, rastered in groups
// of GROUP_M tile rows (CTAs running together share A rows and B columns in L2), and the
// K-tiles [kt0, kt0 + nk) of its slice.
__device__ __forceinline__ void unit_coords(int u, int tiles_m, int tiles_n, int ktiles,
                                            int split, int& tile, int& slice, int& m0,
                                            int& n0, int& kt0, int& nk) {
  slice = u % split;
  tile = u / split;
  const int per_group = GROUP_M * tiles_n;
  const int first_m = (tile / per_group) * GROUP_M;
  const int group_rows = imin(tiles_m - first_m, GROUP_M);
  m0 = (first_m + (tile % per_group) % group_rows) * BM;
  n0 = ((tile % per_group) / group_rows) * BN;
  const int per_slice = (ktiles + split - 1) / split;
  kt0 = imin(slice * per_slice, ktiles);
  nk = imin(ktiles, kt0 + per_slice) - kt0;
}
// The compute warps' own barrier (named barrier 1): the producer warp never joins.
__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;\n" :: "n"(CONSUMER_WARPS * 32) : "memory");
}
// PINGPONG turns: the warpgroup whose turn it is waits (bar.sync) on named barrier
// `id` until the other, done with its mainloop, arrives (bar.arrive): 256 threads.
__device__ __forceinline__ void turn_wait(int id) {
  asm volatile("bar.sync %0, 256;\n" :: "r"(id) : "memory");
}
__device__ __forceinline__ void turn_pass(int id) {
  asm volatile("bar.arrive %0, 256;\n" :: "r"(id) : "memory");
}
// The barrier of the threads that store one unit: every compute warp, or (PINGPONG) the
// 4 warps of warpgroup wg (named barrier 2 + wg).
__device__ __forceinline__ void group_sync(int wg) {
  if constexpr (PINGPONG) asm volatile("bar.sync %0, 128;\n" :: "r"(2 + wg) : "memory");
  else consumer_sync();
}
""",
    "issue_stage": r"""
// The wgmmas of one K-tile in shared memory (A at a0, this warpgroup's rows; B at b0),
// committed as one group. Accumulators are fenced first: wgmma reads them asynchronously.
__device__ __forceinline__ void issue_stage(float (&acc)[MI][NACC], unsigned a0, unsigned b0) {
  fence_acc(acc);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < BK / 16; ++kk)
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
      wgmma_tile(acc[mi], sw128_desc(a0 + mi * 64 * BK * 2 + kk * 32), sw128_desc(b0 + kk * 32));
  wgmma_commit();
}
""",
    "consume_stage": r"""
// A compute warp's step of the warp-specialized ring: wait until slot s holds its K-tile
// (phase parity `parity`), issue the tile's wgmmas on it, and return once the previous
// K-tile's group retired (one group stays in flight): that slot may go back.
__device__ __forceinline__ void consume_stage(float (&acc)[MI][NACC], unsigned a_base,
                                              const in_t* smem, int s, unsigned full,
                                              unsigned parity) {
  mbar_wait(full, parity);
  // cp.async copies are generic-proxy writes: fence them before wgmma reads them
  // (TMA writes through the async proxy already).
  if constexpr (!USE_TMA) fence_proxy_async();
  issue_stage(acc, a_base + s * STAGE_ELEMS * 2, smem_addr(smem + s * STAGE_ELEMS + BM * BK));
  wgmma_wait<1>();
  fence_acc(acc);
}
""",
    "mbarrier": r"""
// mbarriers of the warp-specialized ring (PTX ISA, "mbarrier"): `full[s]` completes a
// phase when every producer thread's copies into slot s have landed (cp.async's own
// arrive, counted in the init count: .noinc); `empty[s]` when every compute warp has
// retired the wgmma group that read slot s. Waits are on the phase's parity.
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_cp_async(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(bar) : "memory");
}
// The ring's barriers, by thread 0: `full[s]` completes on FULL_ARRIVALS arrivals (and
// its transaction bytes), `empty[s]` on `empty_arrivals` (the compute warps that read s).
__device__ __forceinline__ void init_ring_barriers(unsigned long long* full_bar,
                                                   unsigned long long* empty_bar,
                                                   unsigned empty_arrivals) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(smem_addr(&full_bar[s]), FULL_ARRIVALS);
      mbar_init(smem_addr(&empty_bar[s]), empty_arrivals);
    }
    mbar_fence_init();
  }
}
// A compute warp is done with a ring slot: tell this CTA's producer and, in a cluster,
// the peer's (it multicasts into this CTA's slot too; CLUSTER_M is 1 or 2).
__device__ __forceinline__ void release_slot(unsigned bar) {
  mbar_arrive(bar);
  if constexpr (CLUSTER_M > 1) {
    unsigned remote;
    const unsigned peer = (blockIdx.x % CLUSTER_M) ^ 1u;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(peer));
    // Release at CTA scope (the default), as CUTLASS's cluster barrier does: the slot's
    // readers are this CTA's wgmmas, retired by wgmma.wait_group before the arrive. A
    // .release.cluster arrive (a cluster-scope fence for every warp at every K-tile) ran
    // the kernel at 0.62-0.65 of the unclustered one (benchmarks/cluster_probe.py).
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" :: "r"(remote) : "memory");
  }
}
// Every thread of every CTA of the cluster (release/acquire at cluster scope).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n"
               "barrier.cluster.wait.acquire;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" :: "r"(bar), "r"(parity) : "memory");
}
""",
    "tma": r"""
// TMA (PTX ISA, cp.async.bulk.tensor): the producer announces a stage's bytes on its
// full barrier, then each bulk copy completes its share of that transaction. `tmap` is
// the generic address of a CUtensorMap in global memory.
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tma_load_2d(unsigned dst, unsigned long long tmap, int c0,
                                            int c1, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n"
      :: "r"(dst), "l"(tmap), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
// The same box to offset `dst` of every CTA in `mask` (cluster ranks), completing bytes
// on the barrier at offset `bar` of each.
__device__ __forceinline__ void tma_load_2d_multicast(unsigned dst, unsigned long long tmap,
                                                      int c0, int c1, unsigned bar,
                                                      unsigned short mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n"
      :: "r"(dst), "l"(tmap), "r"(c0), "r"(c1), "r"(bar), "h"(mask) : "memory");
}
// The TMA producer's step: the `count`-th K-tile it loads (at K offset k0) goes to slot
// count % STAGES once the compute warps released the tile that slot held. The box of A
// is BK x BM at (k0, m0), of B BK x BN at (k0, n0); out-of-bounds rows and the K tail
// arrive as zeros, and the bytes of whole boxes count towards the stage's transaction.
__device__ __forceinline__ void produce_stage(const in_t* smem, unsigned long long* full_bar,
                                              unsigned long long* empty_bar, int count,
                                              int k0, int m0, int n0,
                                              unsigned long long tmap_a,
                                              unsigned long long tmap_b) {
  const int s = count % STAGES;
  if (count >= STAGES) mbar_wait(smem_addr(&empty_bar[s]), ((count / STAGES) + 1) & 1);
  const unsigned bar = smem_addr(&full_bar[s]);
  mbar_expect_tx(bar, STAGE_ELEMS * 2);
  tma_load_2d(smem_addr(smem + s * STAGE_ELEMS), tmap_a, k0, m0, bar);
  if constexpr (CLUSTER_M > 1) {
    // This CTA's share of the B tile, to the same slot of every CTA of the cluster
    // (each one's full barrier expects the whole tile).
    constexpr int B_ROWS = BN / CLUSTER_M;
    const int cl_rank = blockIdx.x % CLUSTER_M;
    tma_load_2d_multicast(smem_addr(smem + s * STAGE_ELEMS + BM * BK + cl_rank * B_ROWS * BK),
                          tmap_b, k0, n0 + cl_rank * B_ROWS, bar,
                          (unsigned short)((1u << CLUSTER_M) - 1));
  } else {
    tma_load_2d(smem_addr(smem + s * STAGE_ELEMS + BM * BK), tmap_b, k0, n0, bar);
  }
}
""",
    "dsmem": r"""
// Four floats at shared-memory offset `addr` of the cluster's CTA `rank` (distributed
// shared memory, sm_90): mapa turns this CTA's offset into the peer's window.
__device__ __forceinline__ float4 ld_cluster4(unsigned addr, unsigned rank) {
  unsigned remote;
  float4 v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(remote) : "memory");
  return v;
}
""",
    # Rendered per tile_n by `_wgmma_instr`: @N@, @REGS@, @OPERANDS@, @IDX_*@, @TYPE@.
    "wgmma_instr": r"""
// D[64 x @N@] += A[64 x 16] * B[@N@ x 16]^T, both operands K-major in shared memory.
// Thread t of the warpgroup holds, for each 8-column block i, d[4i..4i+3] = D[r][c],
// D[r][c+1], D[r+8][c], D[r+8][c+1] with r = 16 * (t / 32) + (t % 32) / 4 and
// c = 8i + 2 * (t % 4) (the mma.sync m16n8 accumulator layout, repeated).
__device__ __forceinline__ void wgmma_tile(float (&d)[@N@ / 2], unsigned long long da,
                                           unsigned long long db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %@IDX_SCALE@, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n@N@k16.f32.@TYPE@.@TYPE@ {@REGS@}, %@IDX_A@, %@IDX_B@, p, 1, 1, 0, 0;\n}\n"
      : @OPERANDS@
      : "l"(da), "l"(db), "r"(1));
}
""",
}

WGMMA_SETUP = r"""
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // Swizzle atoms start on SWIZZLE_ALIGN-byte boundaries (smem_bytes carries the slack).
  unsigned char* smem_base =
      smem_raw + ((SWIZZLE_ALIGN - (smem_addr(smem_raw) & (SWIZZLE_ALIGN - 1))) & (SWIZZLE_ALIGN - 1));
  in_t* smem = reinterpret_cast<in_t*>(smem_base);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp / 4, wq = warp % 4;  // warpgroup (WG_ROWS rows of C), warp in it
"""

# The wgmma accumulators of a warpgroup to the fp32 C tile in shared memory (rows padded
# by CPAD floats), as for mma.sync: m64nNk16's fragment layout, one place for every feed.
WGMMA_ACC_TO_SMEM = r"""#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wg * WG_ROWS + mi * 64 + wq * 16 + h * 8 + (lane >> 2);
        const int c = i * 8 + (lane & 3) * 2;
        *reinterpret_cast<float2*>(sC + r * CLD + c) =
            make_float2(acc[mi][4 * i + 2 * h], acc[mi][4 * i + 2 * h + 1]);
      }
"""


def _indent_code(text: str, pad: str) -> str:
    """``text`` with ``pad`` before every line but the preprocessor's (which stay in
    column 0)."""
    return "".join(line if line.startswith("#") else pad + line
                   for line in text.splitlines(keepends=True))


WGMMA_MAINLOOP = r"""
  float acc[MI][NACC];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int j = 0; j < NACC; ++j) acc[mi][j] = 0.f;

  // STAGES-2 K-tiles in flight ahead of the one computed, and one wgmma group in flight
  // behind it: the slot a load overwrites at step kt held K-tile kt-2, whose wgmma group
  // every warpgroup retired (wait_group 1 at step kt-1) before this step's barrier.
#pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) {
    if (s < nk)
      load_stage(smem + s * STAGE_ELEMS, smem + s * STAGE_ELEMS + BM * BK, A, B, m0, n0,
                 (kt0 + s) * BK, M, N, K, lda, ldb, tid);
    cp_async_commit();
  }
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<STAGES - 3>();
    fence_proxy_async();
    __syncthreads();  // K-tile kt landed for everyone; K-tile kt-2's slot is free
    const int cs = kt % STAGES;
    issue_stage(acc, smem_addr(smem + cs * STAGE_ELEMS) + wg * WG_ROWS * BK * 2,
                smem_addr(smem + cs * STAGE_ELEMS + BM * BK));
    // The copies of K-tile kt+STAGES-2 overlap the tensor cores' work on K-tile kt.
    const int pre = kt + STAGES - 2;
    if (pre < nk) {
      const int ps = pre % STAGES;
      load_stage(smem + ps * STAGE_ELEMS, smem + ps * STAGE_ELEMS + BM * BK, A, B, m0, n0,
                 (kt0 + pre) * BK, M, N, K, lda, ldb, tid);
    }
    cp_async_commit();
    wgmma_wait<1>();
    fence_acc(acc);
  }
  wgmma_wait<0>();
  fence_acc(acc);
  cp_async_wait<0>();
  __syncthreads();  // the pipeline's shared memory becomes the fp32 C tile

  // Registers -> shared fp32 tile (rows padded by CPAD floats), as for mma.sync.
  float* sC = reinterpret_cast<float*>(smem_base);
""" + WGMMA_ACC_TO_SMEM

WS_PROLOGUE = r"""
  // Warp-specialized: warps 0..CONSUMER_WARPS-1 (the warpgroups) compute, the
  // PRODUCER_WARPS after them fill the ring. No CTA-wide barrier until the epilogue.
  __shared__ __align__(8) unsigned long long full_bar[STAGES], empty_bar[STAGES];
  init_ring_barriers(full_bar, empty_bar, CONSUMER_WARPS * CLUSTER_M);
  // A cluster's peer multicasts into this CTA's ring: both CTAs' barriers must be
  // initialized before either producer starts.
  if constexpr (CLUSTER_M > 1) cluster_sync(); else __syncthreads();

  float acc[MI][NACC];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int j = 0; j < NACC; ++j) acc[mi][j] = 0.f;

  if (warp >= CONSUMER_WARPS) {
"""

PRODUCER_CP_ASYNC = r"""
    // Producer: K-tile kt goes to slot kt % STAGES once the compute warps released the
    // tile that slot held (use kt / STAGES - 1 of empty[slot]).
    const int ptid = tid - CONSUMER_WARPS * 32;
    for (int kt = 0; kt < nk; ++kt) {
      const int s = kt % STAGES;
      if (kt >= STAGES) mbar_wait(smem_addr(&empty_bar[s]), ((kt / STAGES) + 1) & 1);
      load_stage<PRODUCER_WARPS * 32>(smem + s * STAGE_ELEMS, smem + s * STAGE_ELEMS + BM * BK,
                                      A, B, m0, n0, (kt0 + kt) * BK, M, N, K, lda, ldb, ptid);
      mbar_arrive_cp_async(smem_addr(&full_bar[s]));
    }
    cp_async_wait<0>();
"""

PRODUCER_TMA = r"""
    // Producer: one thread (see produce_stage).
    if (tid == CONSUMER_WARPS * 32) {
      const unsigned long long tmap_a = reinterpret_cast<unsigned long long>(tmaps);
      const unsigned long long tmap_b = tmap_a + TENSOR_MAP_BYTES;
      for (int kt = 0; kt < nk; ++kt)
        produce_stage(smem, full_bar, empty_bar, kt, (kt0 + kt) * BK, m0, n0, tmap_a, tmap_b);
    }
"""

WS_CONSUMER = r"""
  } else {
    const unsigned base = smem_addr(smem) + wg * WG_ROWS * BK * 2;
    for (int kt = 0; kt < nk; ++kt) {
      const int s = kt % STAGES;
      consume_stage(acc, base, smem, s, smem_addr(&full_bar[s]), (kt / STAGES) & 1);
      // K-tile kt-1's group retired: its slot goes back to the producer(s)
      if (kt > 0 && lane == 0) release_slot(smem_addr(&empty_bar[(kt - 1) % STAGES]));
    }
    wgmma_wait<0>();
    fence_acc(acc);
  }
  // The ring's shared memory becomes the fp32 C tile. In a cluster, also wait for the
  // peer: its compute warps still arrive on this CTA's empty barriers.
  if constexpr (CLUSTER_M > 1) cluster_sync(); else __syncthreads();

  float* sC = reinterpret_cast<float*>(smem_base);
  if (warp < CONSUMER_WARPS) {
""" + _indent_code(WGMMA_ACC_TO_SMEM, "  ") + "  }\n"

PTMA_BODY = r"""
  // Persistent: at most one CTA per SM; CTA b takes work units b, b + gridDim.x, ... in
  // the order of the non-persistent grid (unit = tile * split + slice), so a serial slice
  // still only waits for a unit that a resident CTA took before it. The producer thread
  // runs ahead across units: it loads the next unit's first K-tiles while the warpgroups
  // store this unit's C from registers. Ring slot and phase follow a running K-tile
  // count `it`, the same sequence on both sides.
  // PINGPONG: the warpgroups take the CTA's units in turn (local index j: warpgroup j % 2),
  // each the whole unit tile. The ring holds the units' K-tiles in order, so the
  // mainloops follow one another and a warpgroup's C store overlaps the other's
  // mainloop. A warpgroup counts the K-tiles of the units it skips into `it`; each slot
  // is released by the 4 warps of one warpgroup, and a warpgroup's turn-taking (serial
  // split-K) runs on its own leader thread and named barrier.
  __shared__ __align__(8) unsigned long long full_bar[STAGES], empty_bar[STAGES];
  init_ring_barriers(full_bar, empty_bar, PINGPONG ? 4 : CONSUMER_WARPS);
  __syncthreads();  // the last CTA-wide barrier: the producer warp leaves early
  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  const int ktiles = (K + BK - 1) / BK;
  const int units = tiles_m * tiles_n * split;
  int tile, slice, m0, n0, kt0, nk;

  if (warp >= CONSUMER_WARPS) {
    if (tid == CONSUMER_WARPS * 32) {
      const unsigned long long tmap_a = reinterpret_cast<unsigned long long>(tmaps);
      const unsigned long long tmap_b = tmap_a + TENSOR_MAP_BYTES;
      int it = 0;
      for (int u = blockIdx.x; u < units; u += gridDim.x) {
        unit_coords(u, tiles_m, tiles_n, ktiles, split, tile, slice, m0, n0, kt0, nk);
        for (int kt = 0; kt < nk; ++kt, ++it)
          produce_stage(smem, full_bar, empty_bar, it, (kt0 + kt) * BK, m0, n0, tmap_a, tmap_b);
      }
    }
    return;
  }

  const unsigned base = smem_addr(smem) + (PINGPONG ? 0 : wg * WG_ROWS * BK * 2);
  const int leader = PINGPONG ? wg * 128 : 0;  // the thread that takes the turns
  float acc[MI][NACC];
  int it = 0, j = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x, ++j) {
    unit_coords(u, tiles_m, tiles_n, ktiles, split, tile, slice, m0, n0, kt0, nk);
    if (PINGPONG && (j & 1) != wg) {  // the other warpgroup's unit
      it += nk;
      continue;
    }
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int j = 0; j < NACC; ++j) acc[mi][j] = 0.f;
    // PINGPONG: a warpgroup waits for the other to have passed every wait of its
    // previous unit's mainloop before it waits on its own first K-tile: a full barrier's
    // parity tells only one phase from the next, and this unit's slots are several
    // phases ahead of the ring until then (named barrier 4 + wg: 128 arrive, 128 sync).
    if (PINGPONG && j > 0) turn_wait(4 + wg);
    for (int kt = 0; kt < nk; ++kt, ++it) {
      const int s = it % STAGES;
      consume_stage(acc, base, smem, s, smem_addr(&full_bar[s]), (it / STAGES) & 1);
      // K-tile it-1's group retired: its slot goes back to the producer
      if (kt > 0 && lane == 0) mbar_arrive(smem_addr(&empty_bar[(it - 1) % STAGES]));
    }
    if (PINGPONG && u + gridDim.x < units) turn_pass(4 + (1 - wg));
    wgmma_wait<0>();
    fence_acc(acc);
    if (nk > 0 && lane == 0) mbar_arrive(smem_addr(&empty_bar[(it - 1) % STAGES]));

    // C from registers. Thread t of warpgroup wg holds, in m64 block mi, rows
    // r + {0, 8} (r = 16 * warp-in-group + lane / 4) and the column pairs 8i + 2 (lane % 4):
    // the wgmma accumulator layout. A later serial slice first waits its turn, then loads
    // the running sum for all its elements before it stores any (the loads batch).
    int* sem = sems + tile;
    const bool last = slice == split - 1;
    const bool add_earlier = mode == MODE_SERIAL && slice > 0;
    const bool to_workspace = mode == MODE_PARALLEL || (mode == MODE_SERIAL && !last);
    float* W = ws + (mode == MODE_PARALLEL ? (size_t)slice * M * N : 0);
    const bool pairs_ws = (N % 2) == 0;
    const bool pairs_out = pairs_ws && (ldc % 2) == 0 &&
                           (reinterpret_cast<size_t>(C) % (2 * sizeof(out_t))) == 0;
    const int row0 = m0 + (PINGPONG ? 0 : wg * WG_ROWS) + wq * 16 + (lane >> 2);
    const int col0 = n0 + (lane & 3) * 2;
    if (add_earlier) {
      if (tid == leader) sem_spin(sem, slice);
      group_sync(wg);
    }
    // EPI_PAIRS column pairs at a time: their running-sum loads are issued together
    // (one round trip for the group), then the group is stored. A 9-warp CTA gets 168
    // registers a thread (3 warps share a quarter of the register file) and the 128
    // accumulators of a 128x256 tile leave room for 4 pairs in flight: 8 spilled.
    constexpr int EPI_PAIRS = 4;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + mi * 64 + h * 8;
#pragma unroll
        for (int i0 = 0; i0 < BN / 8; i0 += EPI_PAIRS) {
          float2 w[EPI_PAIRS];
#pragma unroll
          for (int j = 0; j < EPI_PAIRS; ++j) {
            const int col = col0 + (i0 + j) * 8;
            w[j] = make_float2(0.f, 0.f);
            if (!add_earlier || row >= M || col >= N) continue;
            const float* p = W + (size_t)row * N + col;
            if (pairs_ws) {
              w[j] = __ldcg(reinterpret_cast<const float2*>(p));
            } else {
              w[j].x = __ldcg(p);
              if (col + 1 < N) w[j].y = __ldcg(p + 1);
            }
          }
#pragma unroll
          for (int j = 0; j < EPI_PAIRS; ++j) {
            const int i = i0 + j, col = col0 + i * 8;
            if (row >= M || col >= N) continue;
            float x0 = acc[mi][4 * i + 2 * h] + w[j].x;
            float x1 = acc[mi][4 * i + 2 * h + 1] + w[j].y;
            const bool two = col + 1 < N;
            if (to_workspace) {
              float* p = W + (size_t)row * N + col;
              if (pairs_ws) {
                __stcg(reinterpret_cast<float2*>(p), make_float2(x0, x1));
              } else {
                __stcg(p, x0);
                if (two) __stcg(p + 1, x1);
              }
              continue;
            }
            if (bias != nullptr) {
              x0 += TO_FLOAT_OUT(bias[col]);
              if (two) x1 += TO_FLOAT_OUT(bias[col + 1]);
            }
            out_t* q = C + (size_t)row * ldc + col;
            if (pairs_out) {
              if constexpr (OUT_IS_F32) {
                *reinterpret_cast<float2*>(q) = make_float2(x0, x1);
              } else {
                *reinterpret_cast<unsigned*>(q) = PACK2_OUT(x0, x1);
              }
            } else {
              q[0] = FROM_FLOAT_OUT(x0);
              if (two) q[1] = FROM_FLOAT_OUT(x1);
            }
          }
          asm volatile("" ::: "memory");
        }
      }
    if (mode == MODE_SERIAL) {
      if (last) {
        group_sync(wg);               // every compute thread has read the workspace
        if (tid == leader) *sem = 0;  // back to zero for the next matmul on this stream
      } else {
        __threadfence();
        group_sync(wg);
        if (tid == leader) sem_post(sem, slice + 1);
      }
    }
  }
"""

# The kernel body in parts: setup, which tile and slice, mainloop + staging of the fp32
# C tile in shared memory (per instruction), then the split-K epilogue (shared).
MMA_SETUP = r"""
  extern __shared__ __align__(128) unsigned char smem_raw[];
  in_t* smem = reinterpret_cast<in_t*>(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;

"""

TILE_HEAD = r"""
  // Which tile and K-slice: slices of a tile are consecutive CTAs (or clusters), so a
  // slice only ever waits for a CTA launched before it; tiles are rastered in groups of
  // GROUP_M rows (of clusters). A cluster's CTAs take CLUSTER_M vertically adjacent
  // tiles (same columns, same slice): the B tile they share is multicast.
  const int cl_rank = blockIdx.x % CLUSTER_M, cl_id = blockIdx.x / CLUSTER_M;
  const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  const int tiles_mc = (tiles_m + CLUSTER_M - 1) / CLUSTER_M;
  const int slice = cl_id % split, ctile = cl_id / split;
  const int tile = ctile * CLUSTER_M + cl_rank;
  const int per_group = GROUP_M * tiles_n;
  const int first_m = (ctile / per_group) * GROUP_M;
  const int group_rows = imin(tiles_mc - first_m, GROUP_M);
  const int tm = (first_m + (ctile % per_group) % group_rows) * CLUSTER_M + cl_rank;
  const int tn = (ctile % per_group) / group_rows;
  const int m0 = tm * BM, n0 = tn * BN;

  const int ktiles = (K + BK - 1) / BK;
  const int per_slice = (ktiles + split - 1) / split;
  const int kt0 = imin(slice * per_slice, ktiles);
  const int nk = imin(ktiles, kt0 + per_slice) - kt0;

"""

MMA_MAINLOOP = r"""
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

"""

EPILOGUE = r"""
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
  // A later serial slice reads the running sum while the slices after it wait: its
  // loads are the critical path of the whole tile. Each thread issues EPI_BATCH of them
  // before it uses any (one round trip per batch instead of one per quad).
  constexpr int QUADS = BN / 4, ITEMS = BM * QUADS, EPI_BATCH = 8;
  const bool add_earlier = mode == MODE_SERIAL && slice > 0;
  const bool to_workspace = mode == MODE_PARALLEL || (mode == MODE_SERIAL && !last);
  for (int base = tid; base < ITEMS; base += EPI_BATCH * THREADS) {
    float4 w[EPI_BATCH];
#pragma unroll
    for (int u = 0; u < EPI_BATCH; ++u) {
      const int i = base + u * THREADS;
      const int r = i / QUADS, c = (i % QUADS) * 4;
      const int row = m0 + r, col = n0 + c;
      w[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (add_earlier && i < ITEMS && row < M && col < N)
        w[u] = load_partial4(W, row, col, N, vec_ws && col + 4 <= N);
    }
#pragma unroll
    for (int u = 0; u < EPI_BATCH; ++u) {
      const int i = base + u * THREADS;
      const int r = i / QUADS, c = (i % QUADS) * 4;
      const int row = m0 + r, col = n0 + c;
      if (i >= ITEMS || row >= M || col >= N) continue;
      const float4 v = add4(*reinterpret_cast<const float4*>(sC + r * CLD + c), w[u]);
      const bool in_bounds = col + 4 <= N;
      if (to_workspace)
        store_partial4(W, row, col, N, vec_ws && in_bounds, v);
      else
        store_out4(C, bias, row, col, N, ldc, vec_out && in_bounds, v);
    }
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

# split_mode "cluster": replaces EPILOGUE. Every CTA of the cluster holds its slice's fp32
# partial of the same tile in sC; CTA `slice` owns the tile's rows
# [slice * BM / CLUSTER_K, (slice + 1) * BM / CLUSTER_K) and sums them over the cluster's
# partials in K order (the same order on every run: deterministic).
CLUSTER_EPILOGUE = r"""
  // Every slice's partial is in its CTA's shared memory (release/acquire at cluster
  // scope makes the sC stores visible to the peers' loads).
  cluster_sync();
  {
    constexpr int QUADS = BN / 4, ROWS = BM / CLUSTER_K, ITEMS = ROWS * QUADS;
    const bool vec_out = (N % 4 == 0) && (ldc % 4 == 0) &&
                         ((reinterpret_cast<size_t>(C) & 15) == 0);
    const unsigned sc = smem_addr(sC);
    // Four items a thread in flight: a remote load's round trip crosses the GPC.
#pragma unroll 4
    for (int i = tid; i < ITEMS; i += THREADS) {
      const int r = slice * ROWS + i / QUADS, c = (i % QUADS) * 4;
      const int row = m0 + r, col = n0 + c;
      const unsigned off = sc + (unsigned)(r * CLD + c) * 4u;
      float4 v = ld_cluster4(off, 0);
#pragma unroll
      for (int s = 1; s < CLUSTER_K; ++s) v = add4(v, ld_cluster4(off, s));
      if (row < M && col < N) store_out4(C, bias, row, col, N, ldc, vec_out && col + 4 <= N, v);
    }
  }
  // A CTA's shared memory must outlive its peers' reads of it.
  cluster_sync();
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
# PTX type of each input dtype in wgmma.mma_async.
WGMMA_TYPE = {"bf16": "bf16", "fp16": "f16"}

# Per instruction: the kernel body's parts and the snippets it needs, in order.
BODIES: dict[str, tuple[str, ...]] = {
    "mma": (MMA_SETUP, TILE_HEAD, MMA_MAINLOOP, EPILOGUE),
    "wgmma": (WGMMA_SETUP, TILE_HEAD, WGMMA_MAINLOOP, EPILOGUE),
    "wgmma_ws": (WGMMA_SETUP, TILE_HEAD, WS_PROLOGUE, PRODUCER_CP_ASYNC, WS_CONSUMER, EPILOGUE),
    "wgmma_tma": (WGMMA_SETUP, TILE_HEAD, WS_PROLOGUE, PRODUCER_TMA, WS_CONSUMER, EPILOGUE),
    "wgmma_ptma": (WGMMA_SETUP, PTMA_BODY),
    "wgmma_pptma": (WGMMA_SETUP, PTMA_BODY),
    "wgmma_ctma": (WGMMA_SETUP, TILE_HEAD, WS_PROLOGUE, PRODUCER_TMA, WS_CONSUMER, EPILOGUE),
}
SNIPPET_NAMES: dict[str, tuple[str, ...]] = {
    "mma": ("convert", "min_max", "ptx", "semaphore", "swizzle", "load_stage",
            "compute_stage", "store_out"),
    "wgmma": ("convert", "min_max", "ptx", "semaphore", "swizzle", "load_stage",
              "wgmma_ptx", "wgmma_instr", "issue_stage", "store_out"),
    "wgmma_ws": ("convert", "min_max", "ptx", "semaphore", "swizzle", "load_stage",
                 "wgmma_ptx", "wgmma_instr", "issue_stage", "mbarrier", "consume_stage",
                 "store_out"),
    "wgmma_tma": ("convert", "min_max", "ptx", "semaphore", "wgmma_ptx", "wgmma_instr",
                  "issue_stage", "mbarrier", "consume_stage", "tma", "store_out"),
    "wgmma_ptma": ("convert", "min_max", "ptx", "semaphore", "wgmma_ptx", "wgmma_instr",
                   "issue_stage", "unit_coords", "mbarrier", "consume_stage", "tma", "store_out"),
    "wgmma_pptma": ("convert", "min_max", "ptx", "semaphore", "wgmma_ptx", "wgmma_instr",
                    "issue_stage", "unit_coords", "mbarrier", "consume_stage", "tma",
                    "store_out"),
    "wgmma_ctma": ("convert", "min_max", "ptx", "semaphore", "wgmma_ptx", "wgmma_instr",
                   "issue_stage", "mbarrier", "consume_stage", "tma", "store_out"),
}

RENDERER = Renderer(extra=MATMUL_SNIPPETS)


def _prelude(spec: MatmulSpec) -> str:
    """Type aliases, the spec's constants and the dtype-specific macros."""
    wtm, wtn = spec.tile_m // spec.warps_m, spec.tile_n // spec.warps_n
    if spec.instr == "wgmma":
        # Each warpgroup: WG_ROWS rows = MI stacked m64 wgmmas of the CTA's full BN.
        wg_rows = spec.tile_m if spec.pingpong else spec.tile_m // spec.warpgroups
        tiling = {"WG_ROWS": wg_rows, "MI": wg_rows // 64, "NACC": spec.tile_n // 2,
                  "PINGPONG": spec.pingpong,
                  "SWIZZLE_ALIGN": SWIZZLE_ALIGN, "CONSUMER_WARPS": spec.warps,
                  "PRODUCER_WARPS": spec.producer_warps, "USE_TMA": spec.tma,
                  "FULL_ARRIVALS": 1 if spec.tma else spec.producer_warps * 32,
                  "TENSOR_MAP_BYTES": TENSOR_MAP_BYTES}
    else:
        tiling = {"WTM": wtm, "WTN": wtn, "MI": wtm // 16, "NI": wtn // 8}
    consts = {
        "BM": spec.tile_m, "BN": spec.tile_n, "BK": spec.tile_k,
        "WARPS_M": spec.warps_m, "WARPS_N": spec.warps_n, "THREADS": spec.threads,
        "STAGES": spec.stages, **tiling,
        "STAGE_ELEMS": (spec.tile_m + spec.tile_n) * spec.tile_k, "CLD": spec.tile_n + CPAD,
        "GROUP_M": GROUP_M, "CLUSTER_M": spec.cluster_m, "CLUSTER_K": spec.cluster_k,
        "MODE_NONE": MODE_CODE["none"],
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


def _snippet(name: str, spec: MatmulSpec) -> str:
    """A snippet of the table, with the wgmma instruction's operand list filled in."""
    text = RENDERER.snippet(name)
    if name != "wgmma_instr":
        return text
    n = spec.tile_n
    regs = n // 2
    fields = {"N": str(n), "TYPE": WGMMA_TYPE[spec.a_dtype],
              "REGS": ", ".join(f"%{i}" for i in range(regs)),
              "OPERANDS": ", ".join(f'"+f"(d[{i}])' for i in range(regs)),
              "IDX_A": str(regs), "IDX_B": str(regs + 1), "IDX_SCALE": str(regs + 2)}
    for key, value in fields.items():
        text = text.replace(f"@{key}@", value)
    return text


def _params(spec: MatmulSpec) -> list[tuple[str, str]]:
    return [("const in_t* __restrict__", "A"), ("const in_t* __restrict__", "B"),
            ("out_t* __restrict__", "C"), ("const out_t* __restrict__", "bias"),
            ("float*", "ws"), ("int*", "sems"), ("int", "M"), ("int", "N"), ("int", "K"),
            ("int", "lda"), ("int", "ldb"), ("int", "ldc"), ("int", "split"),
            ("int", "mode")] + ([("const void*", "tmaps")] if spec.tma else [])


def _reduce_params() -> list[tuple[str, str]]:
    return [("const float* __restrict__", "ws"), ("out_t* __restrict__", "C"),
            ("const out_t* __restrict__", "bias"), ("int", "M"), ("int", "N"),
            ("int", "ldc"), ("int", "split")]


def render(spec: MatmulSpec) -> KernelSource:
    """CUDA C++ for `spec`: the matmul kernel and its split-K reduction kernel.

    The source depends only on `spec.source_key` (dtypes, layout, tile, warps, stages,
    instruction; wgmma sources compile for sm_90a only, see `MatmulSpec.arch`):
    split mode, split factor and bias are kernel arguments, so one compiled module serves
    every mode and CI can compile every variant.

    Matmul kernel parameters, in order: A, B, C, bias (null: none), ws (fp32 workspace,
    split-K only), sems (zeroed ints, one per output tile, serial only), M, N, K, lda,
    ldb, ldc, split, mode (0 none, 1 serial, 2 parallel, 3 cluster); TMA kernels add tmaps (the
    CUtensorMaps of A then B, TENSOR_MAP_BYTES each, in global memory).
    Reduction kernel: ws, C, bias, M, N, ldc, split.
    """
    name = spec.kernel_name
    reduce_name = name + "_reduce"
    kind = spec.instr + FEED_SUFFIX[spec.feed]
    parts, snippets = BODIES[kind], SNIPPET_NAMES[kind]
    if spec.cluster_k > 1:  # the tile's slices sum in the cluster, not through memory
        parts = tuple(CLUSTER_EPILOGUE if p is EPILOGUE else p for p in parts)
        # cluster_sync lives in the mbarrier snippet, which the plain wgmma feed lacks
        snippets += tuple(n for n in ("mbarrier", "dsmem") if n not in snippets)
    body = "".join(parts)
    source = RENDERER.source(
        [], _prelude(spec),
        *[_snippet(s, spec) for s in snippets],
        RENDERER.kernel(name, _params(spec), body, threads=spec.threads,
                        cluster=spec.cluster_size),
        RENDERER.kernel(reduce_name, _reduce_params(), REDUCE_BODY, threads=REDUCE_THREADS))

    return KernelSource(spec=spec, source=source, kernel_name=name, reduce_name=reduce_name,
                        launch=lambda M, N, K, sms=DEFAULT_SM_COUNT: launch_config(spec, M, N, K, sms),
                        reduce_launch=reduce_launch)


def launch_config(spec: MatmulSpec, M: int, N: int, K: int,
                  sm_count: int = DEFAULT_SM_COUNT) -> LaunchConfig:
    """Grid of the matmul kernel: one CTA per (tile, K-slice) of *this* spec, or for a
    persistent kernel one per SM at most (`sm_count`: the device's; its CTAs loop over
    the units).

    Take it from the spec being launched, not from the KernelSource a module was loaded
    with: specs that share a source differ in split_k.
    """
    units = tiles(spec, M, N) * spec.split_k
    grid = min(units, sm_count) if spec.persistent else units
    return LaunchConfig((grid, 1, 1), (spec.threads, 1, 1), spec.smem_bytes)


def reduce_launch(M: int, N: int, sm_count: int = 132) -> LaunchConfig:
    """Grid of the parallel split-K reduction: enough CTAs to cover the SMs many times."""
    quads = M * ((N + 3) // 4)
    blocks = max(1, min(-(-quads // REDUCE_THREADS), sm_count * 16))
    return LaunchConfig((blocks, 1, 1), (REDUCE_THREADS, 1, 1), 0)


def tiles(spec: MatmulSpec, M: int, N: int) -> int:
    """Output tiles of an M x N product (one serial-split-K semaphore each); with clusters
    the tile rows round up to whole clusters (a CTA past the last row stores nothing)."""
    rows = -(-M // (spec.tile_m * spec.cluster_m)) * spec.cluster_m
    return rows * -(-N // spec.tile_n)
