"""Pick a matmul tile and split-K factor for a shape; list what the autotuner may sweep.

The choice comes from a small cost model rather than a decision tree, so each rule is a
term of the model (see `gpu_estimate_us`):

* A CTA's mainloop time is its tile's MMA work (tile_m * tile_n * its K-slice) divided
  by how efficiently that tile and feed keep the tensor cores busy (TILE_EFFICIENCY,
  measured: 128x256 above 256x128, the persistent TMA feed's mainloop above the plain
  TMA feed's), or the time its wave takes to stream A and B from DRAM if that is longer
  (skinny M: the product is a stream of B; the TMA feeds stream it slower there, the
  small-M rule). Rows of A and B off 128-byte lines (K not a multiple of 64) slow every
  feed but B's multicast (`UNALIGNED_ROWS_RATE`).
* CTAs run in waves of `sm_count * ctas_per_sm`; a partly filled last wave costs a whole
  wave. This is the "fill at least one wave" rule: a grid of 128 tiles on 132 SMs leaves
  SMs idle for the whole kernel, so splitting K (more, shorter CTAs) wins when M*N is
  small and K large. A grid that streams its operands at the device's DRAM rate (skinny
  M, about 100 CTAs or more) idles no bandwidth with its idle SMs: the rule leaves it be.
* Each CTA (a persistent kernel: each unit) pays what its mainloop does not hide: a
  non-persistent CTA its prologue and its C tile staged through shared memory, a
  persistent unit writing 16-bit C to shared memory for TMA stores that drain under the
  next unit (little), or its C stored from registers (fp32 C, ping-pong: more).
* A persistent grid whose last round is short after two whole ones splits that round's
  tiles in K (split_mode "tail", `tail_split`): the round shrinks to a slice's length
  plus the slices' serial chain.
* Splitting is not free: serial split-K chains (split-1) fp32 tile round trips through
  L2 per tile, in every wave; parallel split-K writes split fp32 planes, reads them back
  in a second kernel and pays a second launch (about 20 us on the lent VMs, GPU.md);
  cluster split-K (Hopper) reads its rows' partials from its peers' shared memory and
  waits on two cluster barriers, nothing through L2. So where K is long and the grid
  short, a cluster pair beats a serial chain of three over four waves.
* A call takes at least its host time (`estimate_us`): a tiny product is host-bound,
  and then the kernels without a tensor map to look up win.

`predicted_ratio` sets the model against a model of cuBLAS (`cublas_estimate_us`) for the
default path's fallback rule (`runtime.matmul.cublas_fallback`).

Example:
    >>> spec = choose(512, 1024, 50304, sm_count=132)
    >>> spec.split_k > 1 and spec.split_mode == "serial"
    True
"""

from __future__ import annotations

import dataclasses
import math

from lowering.kernels.matmul import (CLUSTER_SPLITS, DEFAULT_SM_COUNT, GROUP_M, MatmulSpec,
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

# Relative mainloop throughput of each tile config: MMA work a microsecond an SM, with
# the per-CTA (or per-unit) costs `estimate_us` charges separately taken out; 1.0 is the
# mma.sync 128x128x32 tile with 4 warps (385 TF/s on an H200 = MMA_FLOPS_PER_SM_US).
# The wgmma entries come from one run of benchmarks/gpu_wgmma_check.py on an H200
# (8192^3 bf16, every tile and feed; its time a wave less the modelled per-wave costs).
# What they say, beyond the feeds' order (TMA > all-thread cp.async > producer-warp
# cp.async, whose two warps cannot issue enough copies for two warpgroups):
# * 128x256 beats 256x128 on the same feed: a warpgroup's 64x256 block is one m64n256k16
#   a k-step, where 128x128 takes two m64n128k16 that read A's 64 rows and B's 128 rows
#   each: 384 operand rows from shared memory where 320 do for the same MMAs (the H100
#   agrees: 0.946 vs 0.869 of cuBLAS at 3392x4608x7488, 1.018 vs 1.001 at 8192^3).
# * The persistent feed ran about 2% faster than the TMA feed at 8192^3 (1532 vs 1562 us
#   for 128x256), though its mainloop is the same code: the figure carries that, and
#   REGISTER_STORE_BYTES_PER_SM_US what the persistent feed pays a unit instead.
# * Ping-pong (pptma) beats the plain persistent feed on the 128x128 tile; its 64x256
#   tile, faster in that H200 run, lost to it on the H100 (512x9920x5248, 2688x1984x10368).
# * The 2-CTA cluster feed (ctma, B multicast) ran within 5% of the TMA feed either way
#   on the three large shapes: the TMA feed's figures less 1%.
# The mma.sync entries (H200, 8192^3, the autotuner's timings) have their epilogue in.
# A config not listed gets 0.7. The autotuner measures the real thing per shape.
TILE_EFFICIENCY = {
    ("wgmma", 128, 256, 64, 8, 1, 4, "tma"): 1.98, ("wgmma", 256, 128, 64, 8, 1, 4, "tma"): 1.85,
    ("wgmma", 128, 128, 64, 8, 1, 6, "tma"): 1.67,
    ("wgmma", 128, 256, 64, 8, 1, 4, "ptma"): 2.02, ("wgmma", 256, 128, 64, 8, 1, 4, "ptma"): 1.98,
    ("wgmma", 128, 128, 64, 8, 1, 6, "ptma"): 1.65,
    ("wgmma", 128, 128, 64, 8, 1, 6, "pptma"): 1.88, ("wgmma", 64, 256, 64, 8, 1, 5, "pptma"): 1.85,
    ("wgmma", 128, 256, 64, 8, 1, 4, "ctma"): 1.96, ("wgmma", 256, 128, 64, 8, 1, 4, "ctma"): 1.83,
    ("wgmma", 128, 128, 64, 8, 1, 6, "ctma"): 1.65,
    ("wgmma", 128, 256, 64, 8, 1, 4, "sync"): 1.67, ("wgmma", 256, 128, 64, 8, 1, 4, "sync"): 1.63,
    ("wgmma", 128, 128, 64, 8, 1, 5, "sync"): 1.35,
    ("wgmma", 128, 256, 64, 8, 1, 4, "ws"): 0.93, ("wgmma", 256, 128, 64, 8, 1, 4, "ws"): 0.73,
    ("wgmma", 128, 128, 64, 8, 1, 6, "ws"): 0.56,
    (128, 128, 32, 2, 2, 4): 1.0, (128, 256, 64, 2, 4, 3): 0.85,
    (256, 128, 32, 4, 2, 3): 0.81, (128, 256, 32, 2, 4, 3): 0.77,
    (128, 128, 64, 2, 2, 3): 0.76, (64, 128, 64, 2, 2, 4): 0.73,
    (128, 128, 64, 4, 2, 4): 0.73, (64, 64, 64, 2, 2, 4): 0.65,
}

# Split factors the heuristics and the autotuner consider.
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
SPLIT_MODES = ("none", "serial", "parallel", "cluster", "tail")
# Feeds whose tiles the cluster split-K mode is generated for: the TMA feed is the fastest
# non-persistent one (the mode needs one tile a CTA and the fp32 C tile in shared memory).
CLUSTER_SPLIT_FEEDS = ("tma",)
# A K-slice shorter than this many K-tiles spends too much of its time filling the
# pipeline and in the epilogue.
MIN_KTILES_PER_SLICE = 8

# Model constants (H100/H200 figures; the choice depends on their ratios, the cuBLAS
# fallback on their scale too).
MMA_FLOPS_PER_SM_US = 2.92e6       # efficiency 1.0: 385 TF/s over 132 SMs
L2_BYTES_PER_SM_US = 40.0e3        # L2 bandwidth share of one SM, bytes per microsecond
DRAM_BYTES_PER_US = 3.5e6          # device bandwidth for the parallel reduction
# Operand bytes a GEMM streams from DRAM: what the grid as a whole gets (cuBLAS reached
# 1.9 TB/s at 19x3904x11456 on the H100, a pure stream of B), and what one SM's loads in
# flight get when few SMs stream.
STREAM_BYTES_PER_US = 2.0e6
STREAM_BYTES_PER_SM_US = 20.0e3
# The small-M rule: where most of a tile's rows lie past M, the TMA feeds streamed B
# measurably slower than the all-thread cp.async feed (H100, 19x3904x11456 side by side:
# cp.async 128x128 split 4 ways 0.92 of cuBLAS, the TMA feeds below 0.89; the cause, the
# TMA unit's zero fill of the rows past M or its one issuing thread, is not isolated):
# their stream rate, scaled by this.
SMALL_M_TMA_STREAM = 0.85
DSMEM_BYTES_PER_SM_US = 100.0e3    # one SM's reads of its cluster's shared memory
# The cluster split's two cluster barriers and its pairs' co-scheduling: fitted on the
# H200 (1024x2048x50304 and 256x4096x16384, one wave, cluster vs serial pairs side by side).
CLUSTER_SYNC_US = 3.0
LAUNCH_US = 20.0                   # one extra kernel launch on the lent VMs
CTA_FIXED_US = 2.0                 # a CTA's prologue (STAGES-1 tiles in flight)
# The fraction of the shorter of a wave's MMA time and its DRAM stream time that the
# pipeline does not hide (the two overlap, but not perfectly).
STREAM_OVERLAP_LOSS = 0.1
# Storing a CTA's fp32 C tile, staged through shared memory, while its tensor cores idle:
# a non-persistent wgmma CTA does it once a wave.
EPILOGUE_BYTES_PER_SM_US = 48.0e3
# The persistent feed stores each unit's C straight from registers in the accumulator
# layout (16 contiguous bytes a row and warp), while both warpgroups' tensor cores idle;
# its producer hides the next unit's prologue meanwhile. Fitted on the H100 (128x256,
# side by side): about 0.5 us a unit more than the TMA feed's prologue + staged store,
# which is what made the TMA feed win at K 1264-1616 (0.823 vs 0.745 of cuBLAS at
# 12288x6144x1264), and lose from K of about 4096 on. Ping-pong overlaps one
# warpgroup's store with the other's mainloop, yet its 128x128 times at two K on the
# H200 (8192^3, 16384x8192x4096) fit a per-unit cost no smaller: it is charged the same.
REGISTER_STORE_BYTES_PER_SM_US = 25.0e3
# The persistent feed with 16-bit C (`MatmulSpec.c_staged`) writes a unit's C to shared
# memory and leaves it to TMA stores that drain under the next unit's mainloop: what the
# tensor cores still wait for is the shared-memory write and the warpgroup's barriers.
# Fitted on the H200 (128x256, the same kernel storing one way or the other side by
# side): 0.925 -> 1.00 of cuBLAS at 8192^3, 0.87 -> 1.00 at 16384x8192x4096.
STAGED_STORE_BYTES_PER_SM_US = 250.0e3
# Rows of A and B (K-major) that do not start on 128-byte lines (K not a multiple of 64):
# each box or cp.async row spans two lines and the L2 requests double. Side by side on
# the H200 (4000x7000x5000, 8192x8192x8200, 4096x14336x4104): every feed that loads its
# own B ran 0.76-0.84 of its modelled speed; the 2-CTA cluster's B multicast (`ctma`),
# which halves B's requests, 0.97-1.01. The rate of the others, scaled by this, from
# UNALIGNED_ROWS_MIN_K on: at K of 1264 and 1616 (12288x6144, 6272x14976) the persistent
# feed ran 0.94-0.97 of its modelled speed (why short rows escape is not known).
UNALIGNED_ROWS_RATE = 0.8
UNALIGNED_ROWS_MIN_K = 2048
# split_mode "tail" (the persistent feed): where the tiles fill two rounds or more and
# leave a last round at most half full, each of its tiles is split into this many
# K-slices at most (as many as fill the round), summed serially in a tile-sized workspace
# slot. Side by side on the H200: 4096x5632x9152 0.936 -> 0.961 of cuBLAS (3 slices),
# 16192x3840x13440 0.966 -> 0.992; at short K it lost (12288x6144x1264, 2 slices of 10
# K-tiles: 0.941 -> 0.905), as with one round only (256x9536x4736: 0.46) and with 7-8
# slices (7104x576x8640: 0.50 against 0.63 for a cluster split). Besides the
# slices' serial chain, a tail pays TAIL_FIXED_US (the turns' semaphores, the running
# sum's round trips), fitted to the short-K loss.
MAX_TAIL_SPLIT = 4  # (8 slices of a 16-tile tail at 7104x576x8640 ran 0.50, 2 way: 0.55)
TAIL_FIXED_US = 5.0
# Host time of one generated-kernel call (Python dispatch, argument packing, launch on
# the lent VMs) and the extra of a TMA kernel (its tensor-map buffer looked up by
# pointers, shapes and strides): a tiny GEMM takes whichever is longer, GPU or host.
# Fitted on the H100 at 167x15296x712: producer-warp cp.async 35.5 us, persistent TMA
# 42.9 us, where the GPU needs about 15.
HOST_US = 34.0
TMA_HOST_US = 7.0
# cuBLAS, as the fallback rule models it (`cublas_estimate_us`): its mainloop rate an SM
# (about 700 TF/s, the median of matmul_shapes' large shapes on both parts), a small cost
# a 128x256 tile (it too slows at short K: 645 TF/s at 7616x16192x768 on the H100) and no
# wave quantization (it picks among many tiles and splits); host time of `torch.matmul`,
# one launch.
CUBLAS_FLOPS_PER_SM_US = 5.3e6
CUBLAS_TILE_US = 0.5
CUBLAS_HOST_US = 22.0
# A grid of at least this fraction of the SM count fills a wave (`fills_a_wave`): 128
# tiles on 132 SMs do, and so do 124 (the 4-way split of 31 tiles at 19x3904x11456,
# which a 6-way split's second, 40%-full wave made 1.8x slower on the H100).
WAVE_FILL = 0.93
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


def efficiency(spec: MatmulSpec) -> float:
    """The spec's relative mainloop throughput (TILE_EFFICIENCY; 0.7 if not listed)."""
    config = (spec.tile_m, spec.tile_n, spec.tile_k, spec.warps_m, spec.warps_n, spec.stages)
    if spec.instr != "mma":
        config = (spec.instr, *config, spec.feed)
    return TILE_EFFICIENCY.get(config, 0.7)


def first_group_rows(rows: int) -> int:
    """Tile rows in the first raster group of a grid of ``rows`` tile rows (the kernels'
    `group_tile`): GROUP_M, or all of them where a short last group joins the first."""
    if rows <= GROUP_M or (rows < 2 * GROUP_M and 2 * (rows % GROUP_M) < GROUP_M):
        return rows
    return GROUP_M


def _stream_bytes(spec: MatmulSpec, M: int, N: int, kslice: int, ctas: int) -> float:
    """DRAM bytes of A and B one CTA of a wave of `ctas` streams for its K-slice.

    Tiles are rastered in groups of GROUP_M tile rows, so a wave's CTAs share B columns
    with the others of their group's rows and A rows with the others of their columns;
    each CTA counts its share (the rest it finds in L2). A last group of fewer than
    GROUP_M / 2 rows joins the one before it (the kernels' `group_tile`), so grids of
    fewer than GROUP_M * 3 / 2 rows are one group. Rows past M cost nothing: the loads are
    predicated or out of the tensor map's bounds.
    """
    rows = -(-M // spec.tile_m)
    group_rows = max(1, min(first_group_rows(rows), ctas))
    per_row = max(1, ctas // group_rows)
    a_rows = min(spec.tile_m, M) / per_row
    b_rows = min(spec.tile_n, N) / group_rows
    return (a_rows + b_rows) * kslice * 2


def _grid(spec: MatmulSpec, M: int, N: int, K: int, sm_count: int):
    """``(kslice, units, slots, cta_us)``: a CTA's K-slice, the grid's CTAs (units), the
    CTAs a wave holds, and one CTA's MMA time (`occ` CTAs share one SM, so each runs at
    1/occ of its rate)."""
    kslice = math.ceil(math.ceil(K / spec.tile_k) / spec.split_k) * spec.tile_k
    occ = ctas_per_sm(spec)
    cta_us = 2.0 * spec.tile_m * spec.tile_n * kslice / _rate(spec, K) * occ
    return kslice, tiles(spec, M, N) * spec.split_k, sm_count * occ, cta_us


def _stream_us(spec: MatmulSpec, M: int, N: int, kslice: int, ctas: int,
               device_only: bool = False) -> float:
    """Time a wave of `ctas` CTAs takes to stream their operands' DRAM bytes: at the
    device's rate, and each CTA at no more than one SM's (``device_only``: the device's
    term alone); the TMA feeds slower where most of a tile's rows lie past M."""
    per_cta = _stream_bytes(spec, M, N, kslice, ctas)
    rate = SMALL_M_TMA_STREAM if spec.tma and 2 * M < spec.tile_m else 1.0
    device = ctas * per_cta / STREAM_BYTES_PER_US
    return (device if device_only else max(device, per_cta / STREAM_BYTES_PER_SM_US)) / rate


def streams_the_device(spec: MatmulSpec, M: int, N: int, K: int, sm_count: int) -> bool:
    """Whether the model finds the first wave bound by the device's DRAM stream: its
    CTAs together stream at the device's rate (not each at one SM's) for longer than
    their MMAs take. Such a grid idles no bandwidth where it idles SMs, so the wave rule
    does not hold it (`choose`)."""
    if spec.split_mode == "tail":
        return False
    kslice, units, slots, cta_us = _grid(spec, M, N, K, sm_count)
    ctas = min(units, slots)
    stream_us = _stream_us(spec, M, N, kslice, ctas)
    return stream_us > cta_us and _stream_us(spec, M, N, kslice, ctas, True) >= stream_us


def _rate(spec: MatmulSpec, K: int) -> float:
    """One CTA's MMA work a microsecond on its SM (alone there)."""
    rate = MMA_FLOPS_PER_SM_US * efficiency(spec)
    if (K * 2) % 128 and K >= UNALIGNED_ROWS_MIN_K and spec.cluster_m == 1:
        rate *= UNALIGNED_ROWS_RATE
    return rate


def tail_split(base: MatmulSpec, M: int, N: int, K: int, sm_count: int) -> int:
    """The K-slices of each tile of a persistent grid's last round (split_mode "tail"): as
    many as fill the round, up to MAX_TAIL_SPLIT, each slice at least MIN_KTILES_PER_SLICE
    K-tiles; 1 where the last round is full or more than half full, follows fewer than
    two whole rounds, or its slices would not take half the SMs."""
    rounds, tail = divmod(tiles(base, M, N), sm_count)
    if rounds < 2 or tail == 0 or 2 * tail > sm_count:
        return 1
    split = max(1, min(sm_count // tail, MAX_TAIL_SPLIT,
                       math.ceil(K / base.tile_k) // MIN_KTILES_PER_SLICE))
    # a split tail that leaves most SMs idle still gained nothing measurable (16384x8192x4096:
    # 4 tiles in 4 slices, 0.994 against 1.005 unsplit)
    return split if 2 * tail * split >= sm_count else 1


def gpu_estimate_us(spec: MatmulSpec, M: int, N: int, K: int, sm_count: int) -> float:
    """Model GPU time of `spec` on an M x N x K product (see the module docstring)."""
    if spec.split_mode == "tail":
        # the whole tiles' time, less what the last round's tiles save by running in
        # split_k slices side by side, plus their serial chain (each later slice reads
        # and writes one fp32 tile after its predecessor)
        whole = dataclasses.replace(spec, split_k=1, split_mode="none")
        tile_us = 2.0 * spec.tile_m * spec.tile_n * math.ceil(K / spec.tile_k) * spec.tile_k
        tile_us /= _rate(spec, K)
        chain = (spec.split_k - 1) * 2 * spec.tile_m * spec.tile_n * 4 / L2_BYTES_PER_SM_US
        return (gpu_estimate_us(whole, M, N, K, sm_count)
                - tile_us * (1 - 1 / spec.split_k) + chain + TAIL_FIXED_US)
    kslice, units, slots, cta_us = _grid(spec, M, N, K, sm_count)
    occ = slots // sm_count
    waves = math.ceil(units / slots)
    # The wave's CTAs stream their operands' DRAM bytes (`_stream_us`): a wave of skinny
    # tiles (M of a few rows) is bound by that, not by its MMAs. The pipeline overlaps
    # most of the shorter of the two, not all.
    def wave_us(ctas: int) -> float:
        stream_us = _stream_us(spec, M, N, kslice, ctas)
        return max(cta_us, stream_us) + STREAM_OVERLAP_LOSS * min(cta_us, stream_us)

    full, last = divmod(units, slots)
    total = full * wave_us(slots) + (wave_us(last) if last else 0.0)
    # Per-CTA costs the mainloop does not hide (a persistent kernel: per unit).
    tile_bytes = min(spec.tile_m, M) * min(spec.tile_n, N) * 4
    if spec.instr == "mma":  # (the mma.sync efficiencies were measured with these in)
        total += waves * CTA_FIXED_US * occ
    elif spec.persistent:
        staged = spec.c_staged and spec.split_mode == "none"
        total += CTA_FIXED_US + waves * tile_bytes / (
            STAGED_STORE_BYTES_PER_SM_US if staged else REGISTER_STORE_BYTES_PER_SM_US)
    else:
        # (a cluster split's CTA stores only its 1/split of the tile's rows)
        total += waves * (CTA_FIXED_US * occ
                          + tile_bytes / spec.cluster_k / EPILOGUE_BYTES_PER_SM_US)
    if spec.split_mode == "serial":
        # Each later slice reads and writes one fp32 tile after its predecessor did: the
        # chain of a tile's slices, in every wave (its slices run side by side).
        total += waves * (spec.split_k - 1) * 2 * tile_bytes / L2_BYTES_PER_SM_US
    elif spec.split_mode == "parallel":
        total += tile_bytes / L2_BYTES_PER_SM_US
        total += LAUNCH_US + (spec.split_k + 1) * M * N * 4 / DRAM_BYTES_PER_US
    elif spec.split_mode == "cluster":
        # Each CTA reads its rows' partials from its peers' shared memory.
        peers = (spec.split_k - 1) / spec.split_k
        total += waves * (tile_bytes * peers / DSMEM_BYTES_PER_SM_US + CLUSTER_SYNC_US)
    return total


def host_us(spec: MatmulSpec) -> float:
    """Host time of one call of `spec`'s kernel (HOST_US, TMA_HOST_US)."""
    return HOST_US + (TMA_HOST_US if spec.tma else 0.0)


def estimate_us(spec: MatmulSpec, M: int, N: int, K: int, sm_count: int) -> float:
    """Model time of one call: the GPU's (`gpu_estimate_us`) or the host's, the longer."""
    return max(gpu_estimate_us(spec, M, N, K, sm_count), host_us(spec))


def cublas_estimate_us(M: int, N: int, K: int, sm_count: int) -> float:
    """Model time of cuBLAS (through `torch.matmul`) on an M x N x K product.

    The same terms as `estimate_us` for an ideal kernel: a 128x256 tile's MMAs at cuBLAS's
    rate and CUBLAS_TILE_US each, in fractional waves (no quantization), or streaming A
    and B once from DRAM if that takes longer; or its host time if that is longer still.
    """
    tile_us = 2.0 * 128 * 256 * K / CUBLAS_FLOPS_PER_SM_US + CUBLAS_TILE_US
    compute_us = M * N / (128 * 256 * sm_count) * tile_us
    stream_us = 2.0 * (M + N) * K / STREAM_BYTES_PER_US
    return max(compute_us, stream_us, CUBLAS_HOST_US)


def predicted_ratio(spec: MatmulSpec, M: int, N: int, K: int, sm_count: int) -> float:
    """The model's cuBLAS time over `spec`'s: above 1, the generated kernel is predicted
    faster."""
    return cublas_estimate_us(M, N, K, sm_count) / estimate_us(spec, M, N, K, sm_count)


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
                if mode != "tail" and mode_fits(base, mode, split):
                    out.append(dataclasses.replace(base, split_k=split, split_mode=mode))
        if "tail" in modes and mode_fits(base, "tail", 2):
            split = tail_split(base, M, N, K, sm_count)
            if split > 1:
                out.append(dataclasses.replace(base, split_k=split, split_mode="tail"))
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
        raise ValueError(f"mode must be auto, none, serial, parallel, cluster or tail; got "
                         f"{mode!r}")
    hopper = configs_for(arch, layout, prefer=True) == WGMMA_CONFIGS
    if mode == "tail" and not hopper:
        raise ValueError(f"mode 'tail' needs an sm_90 part and layout TN (the persistent "
                         f"wgmma feed); got arch {arch!r}, layout {layout!r}")
    if mode == "cluster" and not hopper:
        raise ValueError(f"mode 'cluster' needs an sm_90 part and layout TN (thread-block "
                         f"clusters and wgmma); got arch {arch!r}, layout {layout!r}")
    specs = candidates(M, N, K, a_dtype=a_dtype, out_dtype=out_dtype, layout=layout,
                       bias=bias, modes=modes, sm_count=sm_count, arch=arch,
                       prefer_wgmma=True)
    if mode == "auto":
        specs = [s for s in specs if s.split_k == 1 or s.split_mode == "tail"
                 or not _fills(s, M, N, sm_count)]

    def cost(s):  # ties (a host-bound call) go to the shorter GPU time
        return (estimate_us(s, M, N, K, sm_count), gpu_estimate_us(s, M, N, K, sm_count))

    # The wave rule, as a hard constraint where it can be met: a grid much smaller than
    # the SM count leaves SMs idle for the whole kernel, whatever the model says; unless
    # the call is host-bound anyway (some spec's GPU time is under the host's a call), or
    # the grid streams its operands at the device's rate (`streams_the_device`: skinny
    # products; H200, the 18 shapes whose pick this changed: 3-34% faster, 82x9250x3832
    # 1.00 -> 1.15 of cuBLAS).
    # (Tiles that hold rows: a cluster pair's second tile past M stores nothing.)
    filling = [s for s in specs
               if fills_a_wave(-(-M // s.tile_m) * -(-N // s.tile_n) * s.split_k, sm_count)
               or streams_the_device(s, M, N, K, sm_count)]
    if filling and not any(cost(s)[1] <= HOST_US for s in specs):
        specs = filling
    if not specs:
        # A forced split mode on a K too short to split: split in two anyway.
        small = WGMMA_CONFIGS[-1] if hopper else TILE_CONFIGS[2]
        if mode == "cluster":
            small = next(c for c in WGMMA_CONFIGS if c[6] in CLUSTER_SPLIT_FEEDS)
        if mode == "tail":  # (every tile of a grid without whole rounds split)
            small = next(c for c in WGMMA_CONFIGS if c[6] == "ptma")
        specs = [dataclasses.replace(spec_for(small, a_dtype=a_dtype,
                                              b_dtype=a_dtype, out_dtype=out_dtype,
                                              layout=layout, bias=bias),
                                     split_k=2, split_mode=mode)]
    return min(specs, key=cost)


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
