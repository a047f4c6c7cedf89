"""Pick a matmul tile and split-K factor for a shape; list what the autotuner may sweep.

The choice comes from a small cost model rather than a decision tree, so each rule is a
term of the model (see `estimate_us`):

* A CTA's time is proportional to its tile's MMA work (tile_m * tile_n * its K-slice),
  divided by how efficiently that tile config feeds the tensor cores (TILE_EFFICIENCY,
  measured).
* CTAs run in waves of `sm_count * ctas_per_sm`; a partly filled last wave costs a whole
  wave. This is the "fill at least one wave" rule: a grid of 128 tiles on 132 SMs leaves
  SMs idle for the whole kernel, so splitting K (more, shorter CTAs) wins when M*N is
  small and K large.
* Splitting is not free: serial split-K chains (split-1) fp32 tile round trips through
  L2 per tile; parallel split-K writes split fp32 planes, reads them back in a second
  kernel and pays a second launch (about 20 us on the lent VMs, GPU.md); cluster split-K
  (Hopper) reads each CTA's tile once from the cluster's shared memory and waits on two
  cluster barriers, nothing through L2.

Example:
    >>> spec = choose(512, 1024, 50304, sm_count=132)
    >>> spec.split_k > 1 and spec.split_mode == "serial"
    True
"""

from __future__ import annotations

import dataclasses
import math

from lowering.kernels.matmul import (CLUSTER_SPLITS, DEFAULT_SM_COUNT, MatmulSpec,
                                     supports_wgmma, tiles)

# (tile_m, tile_n, tile_k, warps_m, warps_n, stages): the tile shapes we generate. Each
# warp computes a (tile_m/warps_m) x (tile_n/warps_n) sub-tile.
TILE_CONFIGS: tuple[tuple[int, int, int, int, int, int], ...] = (
    (128, 256, 32, 2, 4, 3),  # 8 warps of 64x64: the large-GEMM workhorse
    (256, 128, 32, 4, 2, 3),  # the same, tall
    (128, 128, 32, 2, 2, 4),  # 4 warps of 64x64, two CTAs per SM
    (128, 128, 64, 2, 2, 3),  # deeper K-tile: fewer barriers per FLOP
    (64, 128, 64, 2, 2, 4),   # 4 warps of 32x64 for small M
    (64, 64, 64, 2, 2, 4),    # 4 warps of 32x32 for tiny outputs
    (128, 128, 64, 4, 2, 4),  # 8 warps of 32x64, deep pipeline, one CTA per SM
    (128, 256, 64, 2, 4, 3),  # 8 warps of 64x64, deep K-tile, one CTA per SM
)

# wgmma.mma_async tiles (sm_90a, TN only): the same six fields plus the feed (see
# MatmulSpec.feed): "sync" (all threads cp.async, CTA barriers), "ws" (producer warps,
# cp.async, mbarriers), "tma" (one producer thread, TMA, mbarriers). warps_m = 4 x
# warpgroups stacked along M, each warpgroup issuing m64n{tile_n}k16 for its rows.
WGMMA_CONFIGS: tuple[tuple[int, int, int, int, int, int, str], ...] = (
    (128, 256, 64, 8, 1, 4, "sync"),  # 2 warpgroups of 64x256: 128 accumulators a thread
    (256, 128, 64, 8, 1, 4, "sync"),  # 2 warpgroups of 128x128 (two m64 per k-step)
    (128, 128, 64, 8, 1, 5, "sync"),  # 2 warpgroups of 64x128, deeper ring
    (128, 256, 64, 8, 1, 4, "ws"),    # the same tiles, producer warps + mbarrier ring
    (256, 128, 64, 8, 1, 4, "ws"),
    (128, 128, 64, 8, 1, 6, "ws"),
    (128, 256, 64, 8, 1, 4, "tma"),   # the same tiles, filled by TMA
    (256, 128, 64, 8, 1, 4, "tma"),
    (128, 128, 64, 8, 1, 6, "tma"),
    (128, 256, 64, 8, 1, 4, "ptma"),  # TMA, persistent CTAs, C stored from registers
    (256, 128, 64, 8, 1, 4, "ptma"),
    (128, 128, 64, 8, 1, 6, "ptma"),
    # Ping-pong persistent TMA (feed "pptma"): each warpgroup a whole unit tile, in turn,
    # so one's C store overlaps the other's mainloop. 128x128 (two m64n128 a k-step) and
    # 64x256 (one m64n256): 128 accumulators a thread either way. Timed by the autotuner;
    # no TILE_EFFICIENCY entry yet.
    (128, 128, 64, 8, 1, 6, "pptma"),
    (64, 256, 64, 8, 1, 5, "pptma"),
    # 2-CTA clusters multicasting B (feed "ctma"). Their remote slot releases are
    # CTA-scope arrives: .release.cluster ones (a cluster-scope fence per warp per K-tile)
    # ran at half the TMA feed's speed. The autotuner times them; the model does not know
    # them yet (no TILE_EFFICIENCY entry).
    (128, 256, 64, 8, 1, 4, "ctma"),
    (256, 128, 64, 8, 1, 4, "ctma"),
    (128, 128, 64, 8, 1, 6, "ctma"),
)
CLUSTER_CONFIGS = tuple(c for c in WGMMA_CONFIGS if c[6] == "ctma")
FEEDS = {"sync": {}, "ws": {"warp_specialized": True},
         "tma": {"warp_specialized": True, "tma": True},
         "ptma": {"warp_specialized": True, "tma": True, "persistent": True},
         "pptma": {"warp_specialized": True, "tma": True, "persistent": True, "pingpong": True},
         "ctma": {"warp_specialized": True, "tma": True, "cluster_m": 2}}

# Relative MMA throughput of each tile config: its measured unsplit TFLOP/s on an H200
# (8192x8192x8192 bf16 TN, from the autotuner's timings; 128x128x32 with 4 warps =
# 385 TF/s = 1.0). The 8-warp configs run one CTA per SM and hide latency worse than
# two 4-warp CTAs; 128x128x64 with 4 warps spills 8 bytes.
# A config not listed gets 0.7. The autotuner measures the real thing per shape.
# The wgmma entries are measured too (benchmarks/gpu_wgmma_check.py on an H200, 8192^3,
# the mma.sync 128x128x32 tile at 0.443 of cuBLAS = 1.0): the TMA feed is the
# fastest on every shape of the matmul benchmark (0.87-0.97 of cuBLAS), the all-thread
# cp.async feed next (0.80-0.86), and the producer-warp cp.async feed last (0.40-0.45:
# two warps cannot issue enough cp.async to keep two warpgroups fed).
TILE_EFFICIENCY = {
    ("wgmma", 128, 256, 64, 8, 1, 4, "tma"): 2.01, ("wgmma", 256, 128, 64, 8, 1, 4, "tma"): 2.03,
    ("wgmma", 128, 128, 64, 8, 1, 6, "tma"): 1.81,
    # Persistent TMA: the TMA feed's mainloop figures; what it gains is the C stores it
    # hides behind the next unit's loads (estimate_us, EPILOGUE_BYTES_PER_SM_US).
    ("wgmma", 128, 256, 64, 8, 1, 4, "ptma"): 2.01, ("wgmma", 256, 128, 64, 8, 1, 4, "ptma"): 2.03,
    ("wgmma", 128, 128, 64, 8, 1, 6, "ptma"): 1.81,
    ("wgmma", 128, 256, 64, 8, 1, 4, "sync"): 1.83, ("wgmma", 256, 128, 64, 8, 1, 4, "sync"): 1.66,
    ("wgmma", 128, 128, 64, 8, 1, 5, "sync"): 1.45,
    ("wgmma", 128, 256, 64, 8, 1, 4, "ws"): 0.95, ("wgmma", 256, 128, 64, 8, 1, 4, "ws"): 0.82,
    ("wgmma", 128, 128, 64, 8, 1, 6, "ws"): 0.60,
    (128, 128, 32, 2, 2, 4): 1.0, (128, 256, 64, 2, 4, 3): 0.85,
    (256, 128, 32, 4, 2, 3): 0.81, (128, 256, 32, 2, 4, 3): 0.77,
    (128, 128, 64, 2, 2, 3): 0.76, (64, 128, 64, 2, 2, 4): 0.73,
    (128, 128, 64, 4, 2, 4): 0.73, (64, 64, 64, 2, 2, 4): 0.65,
}

# Split factors the heuristics and the autotuner consider.
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
SPLIT_MODES = ("none", "serial", "parallel", "cluster")
# Feeds whose tiles the cluster split-K mode is generated for: the TMA feed is the fastest
# non-persistent one (the mode needs one tile a CTA and the fp32 C tile in shared memory).
CLUSTER_SPLIT_FEEDS = ("tma",)
# A K-slice shorter than this many K-tiles spends too much of its time filling the
# pipeline and in the epilogue.
MIN_KTILES_PER_SLICE = 8

# Model constants (rough H100/H200 figures, only their ratios matter).
MMA_FLOPS_PER_SM_US = 4.0e6        # mma.sync bf16 per SM per microsecond (about 530 TF/s)
L2_BYTES_PER_SM_US = 40.0e3        # L2 bandwidth share of one SM, bytes per microsecond
DRAM_BYTES_PER_US = 3.5e6          # device bandwidth for the parallel reduction
DSMEM_BYTES_PER_SM_US = 100.0e3    # one SM's reads of its cluster's shared memory
CLUSTER_SYNC_US = 1.0              # the cluster split's two barriers
LAUNCH_US = 20.0                   # one extra kernel launch on the lent VMs
CTA_FIXED_US = 2.0                 # prologue (STAGES-1 tiles in flight) + epilogue
# Storing a CTA's fp32 C tile while its tensor cores idle: a non-persistent wgmma CTA does
# it once a wave; a persistent one stores a unit's C while its producer loads the next
# unit, so only its last store shows. Fitted on the H200 (tma vs ptma 256x128, final
# rounds side by side: 61 us over 16 waves at 8192^3, 50 us over 32 waves at
# 16384x8192x4096: about 2.7 us a 128 KiB tile).
EPILOGUE_BYTES_PER_SM_US = 48.0e3
# A grid of at least this fraction of the SM count fills a wave (`fills_a_wave`): 128
# tiles on 132 SMs do.
WAVE_FILL = 0.95
# With this many waves unsplit, the last wave's idle SMs cost little: do not split (the
# workspace traffic of split-K then competes with the mainloop for DRAM).
NO_SPLIT_WAVES = 2
# The autotuner sweeps split factors only for grids under this many waves (of 1 CTA/SM).
SWEEP_SPLIT_WAVES = 4
SMEM_PER_SM = 227 * 1024
REGS_PER_SM = 65536


def spec_for(config: tuple, **fields) -> MatmulSpec:
    """The spec of a config tuple; a WGMMA_CONFIGS entry (7 fields) gets instr="wgmma"."""
    tm, tn, tk, wm, wn, st = config[:6]
    if len(config) == 7:
        fields.setdefault("instr", "wgmma")
        for name, value in FEEDS[config[6]].items():
            fields.setdefault(name, value)
    return MatmulSpec(tile_m=tm, tile_n=tn, tile_k=tk, warps_m=wm, warps_n=wn, stages=st,
                      **fields)


def configs_for(arch: str | None, layout: str = "TN", *, prefer: bool = False):
    """Tile configs usable on `arch` (None: any part, so mma.sync only).

    wgmma configs come first where the part runs them (sm_90) and the layout is TN;
    `prefer` then leaves out the mma.sync ones (the heuristics' choice on Hopper).
    """
    if supports_wgmma(arch) and layout == "TN":
        return WGMMA_CONFIGS if prefer else WGMMA_CONFIGS + TILE_CONFIGS
    return TILE_CONFIGS


def ctas_per_sm(spec: MatmulSpec) -> int:
    """Resident CTAs per SM, limited by shared memory and (estimated) registers."""
    regs = min(255, spec.accumulators_per_thread + 112)  # ptxas: 64x64 warp tile -> ~240
    by_regs = REGS_PER_SM // (regs * spec.threads)
    by_smem = SMEM_PER_SM // (spec.smem_bytes + 1024)
    return max(1, min(by_regs, by_smem, 64 // spec.warps))


def estimate_us(spec: MatmulSpec, M: int, N: int, K: int, sm_count: int) -> float:
    """Model time of `spec` on an M x N x K product (see the module docstring)."""
    t = tiles(spec, M, N)
    ktiles = math.ceil(K / spec.tile_k)
    kslice = math.ceil(ktiles / spec.split_k) * spec.tile_k
    occ = ctas_per_sm(spec)
    waves = math.ceil(t * spec.split_k / (sm_count * occ))
    config = (spec.tile_m, spec.tile_n, spec.tile_k, spec.warps_m, spec.warps_n, spec.stages)
    if spec.instr != "mma":
        config = (spec.instr, *config, spec.feed)
    eff = TILE_EFFICIENCY.get(config, 0.7)
    # `occ` CTAs share one SM, so each runs at 1/occ of its rate.
    cta_us = 2.0 * spec.tile_m * spec.tile_n * kslice / (MMA_FLOPS_PER_SM_US * eff) * occ
    # Pipeline fill and epilogue: a fixed cost per CTA, so many short CTAs are not free.
    total = waves * (cta_us + CTA_FIXED_US * occ)
    tile_bytes = spec.tile_m * spec.tile_n * 4
    if spec.instr == "wgmma":  # (the mma.sync efficiencies were measured with it in)
        total += (1 if spec.persistent else waves) * tile_bytes / EPILOGUE_BYTES_PER_SM_US
    if spec.split_mode == "serial":
        # Each step reads and writes one fp32 tile; steps of one tile are chained.
        total += (spec.split_k - 1) * 2 * tile_bytes / L2_BYTES_PER_SM_US
    elif spec.split_mode == "parallel":
        total += tile_bytes / L2_BYTES_PER_SM_US
        total += LAUNCH_US + (spec.split_k + 1) * M * N * 4 / DRAM_BYTES_PER_US
    elif spec.split_mode == "cluster":
        # Each wave's CTAs read a tile of partials (theirs and their peers' rows) once.
        total += waves * (tile_bytes / DSMEM_BYTES_PER_SM_US + CLUSTER_SYNC_US)
    return total


def fills_a_wave(ctas: int, sm_count: int) -> bool:
    """Whether a grid of `ctas` CTAs fills a wave of the SMs, to within WAVE_FILL.

    Splitting K until the grid passes the SM count only helps where it fills the SMs
    better: 128 CTAs on 132 SMs already keep 97% of them busy, and splitting further
    to 256 adds a second wave that is again 97% full, plus the cost of more slices.
    Measured at 1024x2048x50304 on the H200: two slices a tile in 128 CTAs, 1.10x
    cuBLAS; four in 256, 0.69-0.85x.
    """
    return ctas >= WAVE_FILL * sm_count


def _fills(spec: MatmulSpec, M: int, N: int, sm_count: int) -> bool:
    """Whether the unsplit grid of this tile already runs NO_SPLIT_WAVES waves."""
    return tiles(spec, M, N) >= NO_SPLIT_WAVES * sm_count * ctas_per_sm(spec)


def _splits_for(K: int, tile_k: int) -> list[int]:
    ktiles = math.ceil(K / tile_k)
    return [s for s in SPLITS if s == 1 or ktiles // s >= MIN_KTILES_PER_SLICE]


def mode_fits(base: MatmulSpec, mode: str, split: int) -> bool:
    """Whether `mode` with `split` is a variant generated for `base`'s tile and feed: a
    valid spec (`MatmulSpec` holds the rules) and, for the cluster mode, a feed it is
    generated for."""
    if mode == "cluster" and base.feed not in CLUSTER_SPLIT_FEEDS:
        return False
    try:
        dataclasses.replace(base, split_k=split, split_mode=mode)
    except ValueError:
        return False
    return True


def candidates(M: int, N: int, K: int, *, a_dtype: str = "bf16", out_dtype: str = "bf16",
               layout: str = "TN", bias: bool = False, modes=SPLIT_MODES,
               sm_count: int = DEFAULT_SM_COUNT, arch: str | None = None,
               prefer_wgmma: bool = False) -> list[MatmulSpec]:
    """Every spec the autotuner may time for this problem: tiles x split factors x modes.

    Split factors leave every slice at least MIN_KTILES_PER_SLICE K-tiles. `arch` (e.g.
    "sm_90"; None: any part) adds the wgmma tiles where it runs them.
    """
    out = []
    for config in configs_for(arch, layout, prefer=prefer_wgmma):
        base = spec_for(config, a_dtype=a_dtype, b_dtype=a_dtype, out_dtype=out_dtype,
                        layout=layout, bias=bias)
        # A grid of many waves gains nothing from more, shorter CTAs: do not sweep splits.
        many_waves = tiles(base, M, N) >= SWEEP_SPLIT_WAVES * sm_count
        for split in _splits_for(K, config[2]):
            if split > 1 and many_waves:
                continue
            for mode in modes:
                if mode_fits(base, mode, split):
                    out.append(dataclasses.replace(base, split_k=split, split_mode=mode))
    return out


def choose(M: int, N: int, K: int, *, a_dtype: str = "bf16", out_dtype: str = "bf16",
           layout: str = "TN", bias: bool = False, sm_count: int = DEFAULT_SM_COUNT,
           mode: str = "auto", arch: str | None = None) -> MatmulSpec:
    """The spec with the smallest model time; `mode` restricts the split mode.

    Ties go to the earlier (larger) tile and the smaller split: less workspace traffic.
    On a part that runs wgmma (`arch` "sm_90"/"sm_90a") and layout TN only wgmma tiles
    are considered; `arch=None` (any part) keeps to mma.sync. Mode "cluster" (split-K
    summed in a thread-block cluster) needs such a part.
    """
    modes = SPLIT_MODES if mode == "auto" else (mode,)
    if mode != "auto" and mode not in SPLIT_MODES:
        raise ValueError(f"mode must be auto, none, serial, parallel or cluster; got {mode!r}")
    hopper = configs_for(arch, layout, prefer=True) == WGMMA_CONFIGS
    if mode == "cluster" and not hopper:
        raise ValueError(f"mode 'cluster' needs an sm_90 part and layout TN (thread-block "
                         f"clusters and wgmma); got arch {arch!r}, layout {layout!r}")
    specs = candidates(M, N, K, a_dtype=a_dtype, out_dtype=out_dtype, layout=layout,
                       bias=bias, modes=modes, sm_count=sm_count, arch=arch,
                       prefer_wgmma=True)
    if mode == "auto":
        specs = [s for s in specs if s.split_k == 1 or not _fills(s, M, N, sm_count)]
    # The wave rule, as a hard constraint where it can be met: a grid much smaller than
    # the SM count leaves SMs idle for the whole kernel, whatever the model says.
    # (Tiles that hold rows: a cluster pair's second tile past M stores nothing.)
    filling = [s for s in specs
               if fills_a_wave(-(-M // s.tile_m) * -(-N // s.tile_n) * s.split_k, sm_count)]
    specs = filling or specs
    if not specs:
        # A forced split mode on a K too short to split: split in two anyway.
        small = WGMMA_CONFIGS[-1] if hopper else TILE_CONFIGS[2]
        if mode == "cluster":
            small = next(c for c in WGMMA_CONFIGS if c[6] in CLUSTER_SPLIT_FEEDS)
        specs = [dataclasses.replace(spec_for(small, a_dtype=a_dtype,
                                              b_dtype=a_dtype, out_dtype=out_dtype,
                                              layout=layout, bias=bias),
                                     split_k=2, split_mode=mode)]
    return min(specs, key=lambda s: estimate_us(s, M, N, K, sm_count))


def all_source_specs() -> list[MatmulSpec]:
    """One spec per distinct generated source: what CI must be able to compile.

    wgmma sources (TN only) compile for sm_90a; see `MatmulSpec.arch`.
    """
    out = []
    for config in TILE_CONFIGS + WGMMA_CONFIGS:
        for a in ("bf16", "fp16"):
            for o in ("bf16", "fp16", "fp32"):
                for layout in ("TN", "NN"):
                    if config in WGMMA_CONFIGS and layout != "TN":
                        continue
                    base = spec_for(config, a_dtype=a, b_dtype=a, out_dtype=o, layout=layout)
                    out.append(base)
                    # the cluster split's size is compiled in: one source per factor
                    out += [dataclasses.replace(base, split_k=k, split_mode="cluster")
                            for k in CLUSTER_SPLITS if mode_fits(base, "cluster", k)]
    return out
