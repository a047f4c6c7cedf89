"""The matmul kernel's spec: what determines one generated kernel, and how it launches.

`MatmulSpec` validates its fields against what the generated code supports; the
launch geometry (`launch_config`, `reduce_launch`, `tiles`) follows from a spec and a
shape alone.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from lowering.kernels.render import DTYPE_BYTES

IN_DTYPES = ("bf16", "fp16")
OUT_DTYPES = ("bf16", "fp16", "fp32")
LAYOUTS = ("TN", "NN")
SPLIT_MODES = ("none", "serial", "parallel", "cluster", "tail")
INSTRS = ("mma", "wgmma")
MODE_CODE = {"none": 0, "serial": 1, "parallel": 2, "cluster": 3, "tail": 4}
# Cluster split-K: the split factors (CTAs a cluster) it takes. Only pairs: clusters of 4
# CTAs of 200 KB shared memory each do not pack into the GPCs (at 1024x2048x50304 on the
# H200, 64 clusters of 4 ran 1.55x as long as 64 clusters of 2 doing the same work: three
# waves where two should do; 0.63-0.72 of cuBLAS on both split-K shapes).
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
# Bytes of one CUtensorMap (the driver's opaque TMA descriptor); A's and B's (and C's, in
# the persistent feed) are kernel arguments of a TMA kernel, by value.
TENSOR_MAP_BYTES = 128
# Kernel-name suffix (and body key) of each feed.
FEED_SUFFIX = {"sync": "", "ws": "_ws", "tma": "_tma", "ptma": "_ptma", "ctma": "_ctma",
               "pptma": "_pptma"}
# Alignment (bytes) of wgmma's shared-memory operands: one 128-byte swizzle atom (8 rows).
SWIZZLE_ALIGN = 1024
# The persistent feed's staged C store (`MatmulSpec.c_staged`): a warpgroup's C in boxes of
# C_BOX x C_BOX 16-bit elements (128-byte rows, the TMA's 128-byte swizzle), two buffers a
# warpgroup taking turns.
C_BOX = 64
C_BOX_BYTES = C_BOX * C_BOX * 2


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
        if self.split_mode == "tail":
            need(self.persistent and not self.pingpong,
                 "split_mode 'tail' (the last round's tiles split) needs the persistent feed "
                 "without ping-pong")
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
        "ptma" (TMA, persistent CTAs; C through shared memory by TMA stores where
        `c_staged`) or "pptma" (the same, ping-pong warpgroups, C stored from registers)."""
        if self.tma:
            if self.persistent:
                return "pptma" if self.pingpong else "ptma"
            return "ctma" if self.cluster_m > 1 else "tma"
        return "ws" if self.warp_specialized else "sync"

    @property
    def c_staged(self) -> bool:
        """The persistent (not ping-pong) wgmma feed with 16-bit C: each unit's C goes
        from registers to two 8 KiB shared buffers a warpgroup, and out by TMA stores that
        drain while the next unit's mainloop runs (the C store no longer idles the tensor
        cores). Units that sum split-K slices, and launches whose C the TMA cannot address
        (`runtime.tma.c_map_ok`), store from registers as before."""
        boxes = (self.tile_m // self.warpgroups // C_BOX) * (self.tile_n // C_BOX)
        # (an even number of boxes a unit: its last box's buffer is not the next unit's
        # first, which the store still being read would race)
        return (self.instr == "wgmma" and self.persistent and not self.pingpong
                and self.out_dtype != "fp32" and self.tile_n % C_BOX == 0
                and boxes % 2 == 0)

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
        # The persistent kernel stores C from registers, or through its own two 16-bit
        # boxes a warpgroup (`c_staged`): no shared fp32 C tile.
        ctile = 0 if self.persistent else self.tile_m * (self.tile_n + CPAD) * 4
        if self.c_staged:
            pipeline += 2 * self.warpgroups * C_BOX_BYTES
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
    if spec.split_mode == "tail":  # every SM: the kernel splits tiles % grid tiles
        grid = sm_count
    return LaunchConfig((grid, 1, 1), (spec.threads, 1, 1), spec.smem_bytes)


def tail_tiles(spec: MatmulSpec, M: int, N: int, sm_count: int) -> int:
    """split_mode "tail": the tiles of the last, partial round of a persistent grid of
    `sm_count` CTAs, which the kernel splits `split_k` ways (a BM x BN fp32 workspace slot
    each); 0 for other modes."""
    return tiles(spec, M, N) % sm_count if spec.split_mode == "tail" else 0


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
