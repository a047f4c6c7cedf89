"""Generated kernels at the transformer seams: residual add + norm, SwiGLU, GELU.

Spec records say what a kernel computes and how it is laid out; `plan_row` (and
`vector_width` for the elementwise ops) pick the layout from the width and the tensors'
alignment; `render` turns a spec into CUDA C++ (the snippets are in
`lowering.kernels.seams_templates`).
`runtime.fused` builds the specs of a call, compiles through `runtime.jit` and launches.

Kernels (one fused kernel per op; the norm backward adds a small column reduce):

- `AddNormForwardSpec`: h = x + residual (stored), y = norm(h) * w (+ b), mean / rstd
  saved. Row-wise and persistent: TPR threads per row, RPB rows per CTA, a grid of a few
  CTAs per SM striding over the rows. A row's V-wide vectors stay in registers (K per
  thread) up to `FORWARD_CACHE_FLOATS` floats a thread; wider rows are streamed (each pass
  reads the row again, through L2).
- `AddNormBackwardSpec`: dx (+ dh) in one pass over dy and the saved h, mean, rstd, and
  the weight (and bias) gradient. Persistent, one CTA an SM, its tiles of rows copied by
  cp.async into shared-memory stages a few tiles ahead (`plan_backward` sizes them from a
  `Hardware` model: shared memory, SMs, bandwidth x latency; as few as keep twice bandwidth
  x latency in flight, as deeper ran slower); rows wider than a CTA holds
  are split over a thread-block cluster: each warp pushes its share of a row's sums into
  every CTA's shared memory by asynchronous stores counted on that CTA's mbarrier
  (`st.async`), which a CTA waits on a row later, when it finishes the row. Each thread
  sums its columns' dweight (and dbias) terms in registers over all rows its CTA visits
  and each CTA (cluster) writes them once to a row of an fp32 workspace ``[sets, teams,
  hidden]``; `ColumnReduceSpec` then sums the rows into the weight's dtype (and drops
  the workspace's lines from L2 unwritten). No atomics: deterministic for a given grid.
  A cluster left with one tile in flight spreads over the next cluster size where its
  threads still hold enough of a row (`_spread_if_one_in_flight`).
- `ElementwiseSpec`: SwiGLU / GELU (tanh) forward and backward, 16-byte vectors,
  grid-stride, then a scalar tail for the elements past the last whole vector.

Vector width: 16 bytes (8 values) where the width and every base address allow, else
the largest of 4, 2, 1 values that divides both (a row kernel's rows must stay aligned,
so a width of 5140 runs with 8-byte vectors and a width of 7 with single values).

Example:
    >>> spec = AddNormForwardSpec("rms_norm", "bf16", 4096, residual=True, bias=False)
    >>> spec.plan.cached, spec.plan.threads_per_row, spec.plan.vectors_per_thread
    (True, 128, 4)
    >>> "seam_add_rms_norm_fwd" in render(spec)
    True
"""

from __future__ import annotations

import dataclasses
import functools
import math

from hostir.errors import LoweringError
from lowering.kernels import seams_templates as T
from lowering.kernels.render import FROM_FLOAT, PACK2, TO_FLOAT, Renderer

DTYPES = ("bf16", "fp16")
NORM_KINDS = ("rms_norm", "layer_norm")
ELEMENTWISE_OPS = {  # op -> (inputs, outputs)
    "swiglu_forward": (2, 1),
    "swiglu_backward": (3, 2),
    "gelu_forward": (1, 1),
    "gelu_backward": (2, 1),
}

# Threads of the forward's persistent row grid an SM at most, by default (runtime.fused
# launches it so; a program's LaunchKernel prints the grid this gives on 132 SMs).
FORWARD_THREADS_PER_SM = 2048
# Floats of a row a forward thread may hold in registers (its K vectors of V values);
# past this the kernel streams the row.
FORWARD_CACHE_FLOATS = 32
# Threads per row at most: 512 leaves 128 registers a thread to the backward.
MAX_THREADS_PER_ROW = 512
# Threads a row CTA should have at least (narrow rows share a CTA, one row a warp or two).
MIN_BLOCK_THREADS = 128
# Threads per SM the forward promises ptxas (`__launch_bounds__`' second argument): 1024
# leave it 64 registers a thread.
FORWARD_PROMISED_THREADS_PER_SM = 1024
ELEMENTWISE_THREADS = 256
# Vector loads a thread of an elementwise kernel issues before it computes: at 2048
# threads an SM, one 16-byte load each (GELU forward's one input) left it at ~0.85 of
# copy bandwidth on an H100, where ops of 2-3 inputs reached ~1.0.
ELEMENTWISE_LOADS_IN_FLIGHT = 4
REDUCE_BLOCK = (32, 32, 1)  # columns x lanes of parts


def vector_width(hidden: int, alignment: int = 16) -> int:
    """Values a vector access carries: 8 (16 bytes) at most, dividing ``hidden`` (every
    row then starts aligned) and fitting the base addresses' ``alignment`` in bytes."""
    v = 8
    while v > 1 and (hidden % v or alignment < 2 * v):
        v //= 2
    return v


class _RowBlock:
    """The CTA of a row kernel's plan: ``threads_per_row`` x ``rows_per_block`` threads."""

    __slots__ = ()

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.threads_per_row, self.rows_per_block, 1)

    @property
    def block_threads(self) -> int:
        return self.threads_per_row * self.rows_per_block


@dataclasses.dataclass(frozen=True, slots=True)
class RowPlan(_RowBlock):
    """Layout of a row kernel: V-wide vectors, TPR threads a row, RPB rows a CTA, K
    vectors a thread when the row is held in registers (``cached``)."""

    vector: int
    threads_per_row: int
    rows_per_block: int
    vectors_per_thread: int
    cached: bool

    def min_blocks(self, threads_per_sm: int) -> int:
        return max(1, threads_per_sm // self.block_threads)

    def describe(self) -> str:
        how = f"k{self.vectors_per_thread} in registers" if self.cached else "streamed"
        return f"v{self.vector} t{self.threads_per_row}x{self.rows_per_block} {how}"


@functools.lru_cache(maxsize=1024)
def plan_row(hidden: int, alignment: int, cache_floats: int) -> RowPlan:
    """The fewest threads a row (a warp at least, ``MAX_THREADS_PER_ROW`` at most) that
    keep a thread's share of the row within ``cache_floats`` floats; streamed at
    ``MAX_THREADS_PER_ROW`` when even that cannot."""
    if hidden < 1:
        raise LoweringError(f"seam kernel: hidden {hidden}: expected >= 1")
    v = vector_width(hidden, alignment)
    nvec = hidden // v
    tpr = 32
    while tpr < MAX_THREADS_PER_ROW and -(-nvec // tpr) * v > cache_floats:
        tpr *= 2
    k = -(-nvec // tpr)
    cached = k * v <= cache_floats
    rpb = max(1, MIN_BLOCK_THREADS // tpr)
    return RowPlan(v, tpr, rpb, k if cached else 0, cached)


@dataclasses.dataclass(frozen=True, slots=True)
class Hardware:
    """What the backward's plan depends on: shared memory a block may opt into and an SM
    holds, registers and threads an SM holds, whether thread-block clusters (and bulk
    copies) exist (sm_90+), and the DRAM bandwidth a SM's share of which, times
    `LOAD_LATENCY_S`, is the bytes an SM must keep in flight. `runtime.fused` reads them
    off the device."""

    sm_count: int = 132
    smem_per_block: int = 232448
    smem_per_sm: int = 233472
    regs_per_sm: int = 65536
    threads_per_sm: int = 2048
    clusters: bool = True
    dram_bytes_per_s: float = 3.35e12

    @property
    def in_flight_target(self) -> int:
        """Bytes an SM keeps in flight: twice bandwidth x latency of its share."""
        return self.in_flight(LOAD_LATENCY_S)

    def in_flight(self, latency_s: float) -> int:
        """Twice bandwidth x ``latency_s`` of an SM's share, in bytes."""
        return int(2 * self.dram_bytes_per_s / self.sm_count * latency_s)


SM90 = Hardware()  # an H100 SXM (an H200 differs in bandwidth only)
SM80 = Hardware(108, 166912, 167936, 65536, 2048, False, 2.0e12)  # an A100
# A loaded DRAM access's latency, about: with the bandwidth, the bytes in flight needed.
LOAD_LATENCY_S = 1.0e-6
# The latency the stage rule takes for bulk copies into 128-byte lines (`STAGE_LINE`):
# they land sooner, so fewer bytes in flight keep the bandwidth busy, and more held the
# pipeline back. On the H200 (8192 rows, bf16, side by side, three allocations of the
# buffers), layer norm 6656 on lines with three tiles in flight (the 1 us target) ran at
# 0.84, 0.90 and 0.84 of copy bandwidth, with two at 0.87 each time.
BULK_LINE_LATENCY_S = 0.8e-6
# The backward's block: one CTA an SM (padded to half its shared memory at least), 512
# threads, each holding at most `BACKWARD_HELD_FLOATS` of a row's columns (their dweight / dbias
# sums, and the row's n and g between its two phases) or up to twice that without the
# held n and g where a cluster of 8 cannot split the row finer; fewer threads, fitted to
# the slice, where that lets a layer norm hold three vectors a thread (`_hold_if_fitted`).
BACKWARD_THREADS = 512
BACKWARD_HELD_FLOATS = 16
BACKWARD_HELDS = (BACKWARD_HELD_FLOATS, 2 * BACKWARD_HELD_FLOATS)  # tried in this order
BACKWARD_MAX_STAGES = 8
MAX_CLUSTER = 8  # portable cluster size
BACKWARD_CLUSTERS = (1, 2, 4, 8)  # the cluster sizes a row may be split over, tried in order
# Columns of a row each thread of a cluster's CTA holds at least, where a row is spread
# over more CTAs to keep two tiles in flight (`_spread_if_one_in_flight`): 3/4 of
# `BACKWARD_HELD_FLOATS`.
BACKWARD_SPREAD_COLUMNS = 12
# Rows a cluster's CTA may run ahead of its partners' shares of a row's sums (each row's
# stage is held that many iterations longer, so as many tiles fewer are in flight). On
# the H200 one row was as fast as two or faster at every width timed (16896-65536;
# LayerNorm 49664: 0.90 of copy against 0.82-0.83) and none was 2-8% slower at 16896,
# 33280 and 65536.
CLUSTER_SLACK = 1
# The backward's tiles copied by one bulk copy a stream (sm_90+), issued by one thread,
# rather than by every thread's 16-byte cp.asyncs, which filled the load queue ahead of
# the row's own loads and stores: tiles of one row (rows aligned, on the H200: 0.6-1.5%
# faster at 5120-16384 columns, 3-9% at 24576-65536; 0.5-1.3% slower on tiles of 4-8
# rows, which keep the cp.asyncs), and tiles of several rows off 16 bytes from 4 KB a
# stream, where the cp.asyncs' loop over the cover's chunks cost more still (LayerNorm
# 513-2050 columns, H200: +4-13%; under 4 KB, width 100, H100: RMS norm 0.46 of copy
# bandwidth with cp.asyncs, 0.36 in bulk). `BackwardPlan.bulk`, where the hardware has
# them (`Hardware.clusters`: sm_90+); the kernel also takes the cp.asyncs below sm_90.
BULK_COPIES = True
BULK_MIN_SPAN = 4096  # bytes a stream of a tile of several rows off 16 bytes, in bulk
# Tiles of 16-byte rows stage each stream on a 128-byte line: a stream's stage is a
# multiple of 128 bytes, not of 16 (`_backward_layout`). On an H200 (8192 rows, bf16, side
# by side): tiles of several rows (up to 4096 columns, every thread's cp.asyncs) 2-9%
# faster at 512-4096 columns (layer norm 2560: 0.81 -> 0.85 of copy bandwidth); one-row
# tiles and cluster slices (bulk copies, at `BULK_LINE_LATENCY_S`) layer norm -2.6% to
# +8.7% at 4608-65536 (30720: 0.89 -> 0.96, 65536: 0.89 -> 0.97), RMS norm -3.6% to +8.5%
# (57344: 0.91 -> 0.98), the losses on one CTA past 11264 and on two CTAs (RMS norm 20480
# 0.885 -> 0.853). A bare read through such stages ran 4-8% faster (docs/EXPERIMENTS.md).
STAGE_LINE = 128
# One CTA's one-row span of 16-byte rows off a 128-byte line bulk-copied from that line
# (up to 112 bytes of the row before it too) rather than from its first byte. Side by
# side on an H200 (8192 rows, bf16), rows 16 bytes off a line: 8200 columns RMS norm
# 0.80 -> 0.85 of copy bandwidth, layer norm 0.80 -> 0.86; 12296 0.81 -> 0.88 and
# 0.80 -> 0.87 (rows padded onto lines ran 0.83-0.90). Clusters, their slices made
# multiples of 64 columns so that each starts at the row's phase of a line: 20488-50008
# within 1%, 60008 +3%, 30008 -2% and -4%: they copy from the span's start.
BACKWARD_LINES = True


@dataclasses.dataclass(frozen=True, slots=True)
class BackwardPlan(_RowBlock):
    """Layout of the staged norm backward: VS-value accesses (`vector_width`: every row
    start is aligned to them), TPR threads a row, RPB rows a tile (a CTA of TPR x RPB),
    K accesses a thread a row; a row split over CLUSTER CTAs of SL columns each; STAGES
    shared-memory stages of STREAM_BYTES a stream; HOLD: n and g kept in registers
    between the row's two phases (else read again from the stage)."""

    vector: int
    threads_per_row: int
    rows_per_block: int
    vectors_per_thread: int
    slice: int
    cluster: int
    stages: int
    streams: int
    stream_bytes: int
    hold: bool
    # stats, weight, row-sum scratch, cluster share slots, their mbarriers, the stages'
    offsets: tuple[int, int, int, int, int, int]
    smem_bytes: int
    slack: int = 0  # a cluster's rows of slack (`CLUSTER_SLACK`, as the stages allow)
    # rows off 16 bytes on 16-byte accesses at their phase (`plan_backward`'s ``phased``)
    phased: bool = False
    # rows on 16 bytes but not all on a 128-byte line (a width off 64 values): each span
    # bulk-copied from its line (`BACKWARD_LINES`), its stream's stage that much longer
    line: bool = False
    # each stream's span of a tile copied by one bulk copy (`BULK_COPIES`), else by
    # every thread's 16-byte cp.asyncs
    bulk: bool = False

    @property
    def tile_bytes(self) -> int:
        return self.streams * self.stream_bytes

    @property
    def deferred(self) -> bool:
        """A row's second phase runs after the next row's first, so that what it waits
        for (its partners' shares, in a cluster; in one CTA, the next tile's block
        barrier) completes meanwhile; its stage is held one more iteration, so a tile
        fewer is in flight. A cluster defers from three stages (``slack``); one CTA from
        four, as its block barrier is cheap and a second tile in flight is not (at three
        stages, not deferring ran 15-32% faster at 9216-16384 columns on the H200).
        Measured on the H200 and H100 only; the A100 model (`SM80`) follows the rule."""
        return _deferred(self.stages, self.cluster, self.slack)

    @property
    def slots(self) -> int:
        """A cluster's share slots (each row's in slot ``row % slots``): a CTA writes a
        partner's slot of row r + slots only after that partner's shares of row
        r + slots - slack reached it, which that partner pushed after it finished row
        r + slots - 2 * slack, so 2 * slack slots (2 at least) are never overwritten
        unread."""
        return max(2, 2 * self.slack)

    @property
    def lookahead(self) -> int:
        """Tiles a team has in flight while it reduces one."""
        return _lookahead(self.stages, self.cluster, self.slack)

    def describe(self) -> str:
        return (f"v{self.vector} t{self.threads_per_row}x{self.rows_per_block} k"
                f"{self.vectors_per_thread} c{self.cluster} s{self.stages}"
                + (" hold" if self.hold else "") + (" phased" if self.phased else "")
                + (" line" if self.line else ""))


def _deferred(stages: int, cluster: int, slack: int) -> bool:
    return slack > 0 if cluster > 1 else stages >= 4


def _lookahead(stages: int, cluster: int, slack: int) -> int:
    if cluster > 1:
        return stages - 1 - slack
    return stages - (2 if _deferred(stages, cluster, slack) else 1)


def _enough_stages(most: int, tile: int, cluster: int, slack: int, hw: Hardware,
                   latency_s: float = LOAD_LATENCY_S) -> int:
    """The stages of a layout: of the counts up to ``most`` (what fits), those whose
    tiles in flight come nearest `Hardware.in_flight` bytes of ``latency_s`` (the
    target: `LOAD_LATENCY_S`, or `BULK_LINE_LATENCY_S` for bulk copies), two tiles at least,
    and of those the most (one CTA defers its rows from four stages at no cost in
    lookahead); ``most`` where none does. Deeper ran slower on the H200: LayerNorm at
    1024-4608 columns 0.65-0.84 of copy bandwidth at eight stages against 0.68-0.86 at
    five or six, 16896-33280 in clusters 2% slower at six than at four; one tile in
    flight (three stages in a cluster) 7% slower at 41472. The nearest count, not the
    fewest at or above the target: side by side on the H200 (8192 rows, bf16), rows of
    33 KB tiles (two tiles in flight, not three, where the target is 74 KB) ran 0-4%
    faster at 512-4096, 7680-8704 and 15360-16896 columns (RMS norm 8704: 0.88 -> 0.90,
    33280 on four CTAs 0.90 -> 0.92), within 0.5% at 35328 and 59904-63488 and 1.6%
    slower at 30720. Where the target lies past the halfway point between two counts
    (6144: 2.95 tiles) the rule keeps three, and two ran 4% slower there."""
    need = max(2, (2 * hw.in_flight(latency_s) + tile) // (2 * tile))
    enough = [s for s in range(2, most + 1) if _lookahead(s, cluster, slack) >= need]
    if not enough:
        return most
    fewest = min(_lookahead(s, cluster, slack) for s in enough)
    return max(s for s in enough if _lookahead(s, cluster, slack) == fewest)


def _lined_rows(vector: int, phased: bool) -> bool:
    """Rows whose stages go on 128-byte lines where they fit: 16-byte rows, but not rows
    at their phase (not measured on lines)."""
    return vector == 8 and not phased


def stage_latency(vector: int, bulk: bool, phased: bool = False) -> float:
    """The latency the stage rule takes for a plan's copies: `BULK_LINE_LATENCY_S` for
    bulk copies of rows staged on lines (`_lined_rows`), else `LOAD_LATENCY_S`."""
    return BULK_LINE_LATENCY_S if bulk and _lined_rows(vector, phased) else LOAD_LATENCY_S


def _ceil(a: int, b: int) -> int:
    return -(-a // b) * b


def _fitted_threads(sl: int, vs: int, held: int, cluster: int) -> tuple[int, int] | None:
    """``(threads a row, vectors a thread)`` whose slots the slice's vectors fill best,
    then with the most threads a block (rows of a tile: one in a cluster), then the most
    vectors a thread; None where no row fits `BACKWARD_THREADS` at ``held`` columns."""
    vectors = -(-sl // vs)
    best = None
    for k in range(1, held // vs + 1):
        tpr = _ceil(-(-vectors // k), 32)
        if tpr > BACKWARD_THREADS:
            continue
        threads = tpr if cluster > 1 else BACKWARD_THREADS // tpr * tpr
        key = (round(vectors / (tpr * k), 2), threads, k)
        if best is None or key > best[0]:
            best = (key, tpr, k)
    return None if best is None else best[1:]


def _backward_layout(hidden, vs, cluster, streams, layer, hw, held, fit=False, phased=False):
    """The plan of one cluster size, or None where its stages do not fit. ``fit``: threads
    sized to the slice (`_fitted_threads`), else a power of two a row (all of the block's
    in a cluster). ``phased``: 16-byte accesses over each slice's 16-byte cover (up to 7
    positions before it), one row a tile, or None."""
    sl = hidden if cluster == 1 else _ceil(-(-hidden // cluster), 8)
    if cluster > 1 and (cluster - 1) * sl >= hidden:
        return None
    if phased:
        if fit or vs == 8:
            return None
        vs, span = 8, sl + 7
        if cluster == 1 and -(-span // (BACKWARD_THREADS // 2 * vs)) * vs <= held:
            return None  # half the threads hold a row: rows of other phases would share a tile
        tpr = BACKWARD_THREADS
        k = -(-span // (tpr * vs))
        if k * vs > held or span - (k - 1) * tpr * vs < tpr:
            # (or the cover's last pass a sliver of the others: on the H200 LayerNorm of
            # 4097 and 16385 columns ran 6-17% slower so than on 2-byte accesses)
            return None
    elif fit:
        fitted = _fitted_threads(sl, vs, held, cluster)
        if fitted is None:
            return None
        tpr, k = fitted
    else:
        tpr = 32
        while tpr < BACKWARD_THREADS and -(-sl // (tpr * vs)) * vs > held:
            tpr *= 2
        if cluster > 1:
            tpr = BACKWARD_THREADS
        k = -(-sl // (tpr * vs))
        if k * vs > held:
            return None
    rpb = 1 if cluster > 1 or phased else BACKWARD_THREADS // tpr  # a cluster's tile: one row
    # a span's 16-byte cover, or (``line``) its cover from the line it starts in
    line = (BACKWARD_LINES and vs == 8 and rpb == 1 and cluster == 1 and not phased
            and hidden % 64 != 0)
    bulk = (BULK_COPIES and hw.clusters
            and (rpb == 1 or (vs < 8 and 2 * rpb * sl >= BULK_MIN_SPAN)))
    cover = 2 * rpb * sl + (126 if line else 14)
    weight_bytes = _ceil(2 * sl + 14, 16)  # the slice's 16-byte cover, as a stream's
    red_bytes = _ceil(2 * rpb * (tpr // 32) * 8, 16)  # two alternating row-sum slots
    latency = stage_latency(vs, bulk, phased)

    def staged(stream_bytes):
        """(slack, stages, the most that fit, share-slot bytes, their mbarriers' bytes)
        of stages of ``stream_bytes`` a stream, or None where two do not fit. A
        cluster's share slots ([slots][cluster x warps][2 sums] floats, an mbarrier a
        slot) are sized for the most slack that leaves a tile in flight, `CLUSTER_SLACK`
        at most."""
        tile = streams * stream_bytes
        for slack in range(CLUSTER_SLACK if cluster > 1 else 0, -1, -1):
            slots = max(2, 2 * slack) if cluster > 1 else 0
            cslot_bytes = _ceil(slots * cluster * (tpr // 32) * 8, 16)
            sbar_bytes = _ceil(8 * slots, 16)
            fixed = weight_bytes + red_bytes + cslot_bytes + sbar_bytes + 8 * BACKWARD_MAX_STAGES
            most = min((hw.smem_per_block - fixed - 16) // (tile + 8 * rpb),
                       BACKWARD_MAX_STAGES)
            if most >= slack + 2:
                return (slack, _enough_stages(most, tile, cluster, slack, hw, latency), most,
                        cslot_bytes, sbar_bytes)
        return None

    # 16-byte rows' stages on 128-byte lines (`STAGE_LINE`), but where lines would cost
    # slack, or stages that fit on 16 bytes (at the edges of what fits: 12808-12864
    # columns, 23032-23144 with the residual's gradient, 131016-131072 and others)
    stream_bytes = _ceil(cover, 16)
    plan = staged(stream_bytes)
    if plan is not None and _lined_rows(vs, phased):
        lined = staged(_ceil(cover, STAGE_LINE))
        if lined is not None:
            (slack16, stages16, *_), (slack, stages, most, *_) = plan, lined
            if slack == slack16 and not (stages < stages16 and stages == most):
                stream_bytes, plan = _ceil(cover, STAGE_LINE), lined
    if plan is None:
        return None
    slack, stages, _, cslot_bytes, sbar_bytes = plan
    tile = streams * stream_bytes
    stats = stages * tile
    weight = _ceil(stats + stages * 8 * rpb, 16)
    red = weight + weight_bytes
    cslot = red + red_bytes
    sbar = cslot + cslot_bytes
    # a row's n and g held in registers till its second phase: across one row at most
    # (the registers of `BACKWARD_THREADS` threads, whatever ``fit`` gave: `_hold_if_fitted`
    # takes fewer threads' larger budget for layer norm)
    hold = _held_floats(k, vs, layer) <= _hold_budget(BACKWARD_THREADS, hw) and slack <= 1
    # One CTA an SM (a grid of one a SM): a block that takes less than half an SM's shared
    # memory is padded to it, else the block scheduler may place two on one SM and leave
    # another idle (RMSNorm at 4097 columns on the H100, 107 KB and 59 registers a thread:
    # 0.59 of copy bandwidth against 0.85 at 140 KB).
    smem = max(sbar + sbar_bytes + 8 * stages, min(hw.smem_per_sm // 2, hw.smem_per_block))
    return BackwardPlan(vs, tpr, rpb, k, sl, cluster, stages, streams, stream_bytes, hold,
                        (stats, weight, red, cslot, sbar, sbar + sbar_bytes), smem, slack,
                        phased, line, bulk)


def _pair_if_undeferred(p, hidden, vs, clusters, streams, layer, hw, phased=False):
    """``p``, or where it is one CTA of 16-byte vectors that cannot defer its rows (three
    stages or fewer: a row wider than four stages of shared memory hold) a cluster of two
    that can. Side by side on the H200 (13312-16384 columns, and 9216-15000 with the
    residual's gradient): two CTAs ran 0-10% faster (LayerNorm 15000: 0.77 -> 0.85 of copy
    bandwidth, RMSNorm 0.82 -> 0.87), on the H100 0-3%. Where one CTA defers (8704-12800
    without the residual: four or five stages) two ran up to 21% slower on the H200, and
    on rows of 2-byte vectors (a LayerNorm of 14001 columns) 7% slower."""
    if p.cluster != 1 or p.deferred or p.vector < 8 or 2 not in clusters:
        return p
    for held in BACKWARD_HELDS:
        q = _backward_layout(hidden, vs, 2, streams, layer, hw, held, phased=phased)
        if q is not None:
            return q if q.deferred else p
    return p


def _fewest_clusters(hidden, vs, clusters, streams, layer, hw, least: int = 1,
                     phased: bool = False):
    """The plan of the smallest cluster of at least ``least`` CTAs whose stages fit at up
    to twice `BACKWARD_HELD_FLOATS` columns a thread, or None."""
    for c in clusters:
        if c >= least:
            for held in BACKWARD_HELDS:
                p = _backward_layout(hidden, vs, c, streams, layer, hw, held, phased=phased)
                if p is not None:
                    return p
    return None


def _spread_if_one_in_flight(p, hidden, vs, clusters, streams, layer, hw, phased=False):
    """``p``, or where it is a cluster of 16-byte vectors with one tile in flight while it
    reduces one (three stages, or two with the residual's gradient: rows wider than four
    stages of its CTAs hold) the next cluster size's plan, where that keeps two or more in
    flight and still gives each thread `BACKWARD_SPREAD_COLUMNS` of a row or more: two
    CTAs become four at 25720-32768 columns and four eight at 51304-65536 (with the
    residual's gradient from 24552 and 49096). Side by side (8192 rows, bf16): four CTAs
    in place of two at 26112-31232 columns and eight in place of four at 51712-65536 ran
    H100 +1-3% (LayerNorm 55808 0.899 -> 0.926 of copy bandwidth), H200 LayerNorm
    +3-8.5% (55808 0.841 -> 0.913), RMSNorm +2-4% on eight CTAs and -1% on four; with
    the residual's gradient the same at 27136-31232 and 49664-61952. Slices of
    4672-5760 columns (9-11 columns a thread: 18944-23040 with the residual's gradient
    on four CTAs, 37376-45568 on eight) ran up to 9% slower on the H200. Rows of 2-byte
    vectors (widths off 4 bytes: 28001-65535) ran 5-14% slower so spread (H200).

    An RMS norm's pair (without the residual's gradient) that cannot hold its rows (three
    or four vectors a thread) spreads so too, with two tiles in flight: from 24552
    columns, where four CTAs still give each thread 12 columns. Side by side on the H200
    (8192 rows, bf16), four CTAs of 512 threads, held: 24576 0.89 -> 0.95 of copy, 25600
    0.88 -> 0.95; 22528-23552 (11-11.5 columns a thread) +6-7%, 18432-21504 (9-10.5) -9%
    to +2.5%; layer norm lost 3-29% so at 18432-25600."""
    unheld_rms_pair = (not layer and streams == 2 and p.cluster == 2 and not p.hold)
    if p.cluster == 1 or p.vector < 8 or (p.lookahead >= 2 and not unheld_rms_pair):
        return p
    q = _fewest_clusters(hidden, vs, clusters, streams, layer, hw, least=p.cluster + 1,
                         phased=phased)
    if q is None or q.lookahead < 2 or q.slice < BACKWARD_SPREAD_COLUMNS * q.threads_per_row:
        return p
    return q


# Registers a backward thread keeps beside the n, g and weight values it holds (`HOLD`): at
# 512 threads an SM (128 registers each) this leaves 64 floats (`_hold_budget`); fewer
# threads a CTA leave more (`_hold_if_fitted`). Compiled for sm_90, layer norm
# held 64 floats in 126 registers a thread (k2, 512 threads), 96 in 145-164 (k3, 352-384
# threads); 96 at 416 threads and 128 at 320 spilled (128 and 168 registers at most).
HOLD_SPARE_REGISTERS = 64
SM_SCHEDULERS = 4  # an SM's warp schedulers, each with a quarter of its register file


def _thread_registers(threads: int, hw: Hardware) -> int:
    """Registers each of a CTA's ``threads`` may have where one CTA is an SM's: its warps
    are dealt round-robin to the SM's schedulers, so the busiest holds ceil(warps / 4)
    of them in a quarter of the register file (in steps of 8 registers; 255 at most).
    512 threads: 128; 288-384: 168; 416: 128."""
    warps = -(-threads // 32)
    per_scheduler = hw.regs_per_sm // SM_SCHEDULERS
    return min(per_scheduler // (-(-warps // SM_SCHEDULERS) * 32) // 8 * 8, 255)


def _hold_budget(threads: int, hw: Hardware) -> int:
    """Floats a thread of a CTA of ``threads`` may hold: its registers
    (`_thread_registers`) but `HOLD_SPARE_REGISTERS`; 64 at 512 threads."""
    return _thread_registers(threads, hw) - HOLD_SPARE_REGISTERS


def _held_floats(k: int, vs: int, layer: bool) -> int:
    """Floats a thread holds where a row's n and g and the weight stay in registers
    between its two phases (and layer norm's dbias beside dweight)."""
    return k * vs * (4 if layer else 3)


def _hold_if_fitted(p, hidden, vs, streams, layer, hw, phased=False):
    """``p``, or where it is a layer norm of 16-byte vectors without the residual's
    gradient, on one CTA or on four or more, that cannot hold a row's n and g in registers
    (three vectors a thread on 512 threads: 96 floats where 64 fit) the plan of the same
    cluster with threads fitted to the slice (`_fitted_threads`) that holds them, where
    its fewer threads leave the registers (`_hold_budget`) and it keeps as many tiles in
    flight: rows of 8200-9216 columns, 33280-36864 (four CTAs), 65544-73728 (eight).
    Side by side on the H200 (8192 rows, bf16), held on 352-384 threads against 512 that
    read the stage again: four CTAs +7% to +22% (33280: 0.79 -> 0.97 of copy bandwidth, 36864:
    0.87 -> 0.93), eight +12% to +23% (66560: 0.79 -> 0.97), one +1% to +5% (8200: 0.86
    -> 0.91). On two CTAs (16896-18432) it ran -5% to +1%, so they keep 512 threads; RMS
    norm so held lost 4-5% (33792-39936), its second phase recomputes less; with the
    residual's gradient (a fourth stream: rows at 0.94-0.98 without the hold) -4% to 0."""
    if not layer or streams > 2 or p.hold or p.slack > 1 or p.vector < 8 or p.cluster == 2:
        return p
    q = _backward_layout(hidden, vs, p.cluster, streams, layer, hw, 2 * BACKWARD_HELD_FLOATS,
                         fit=True, phased=phased)
    if q is None or q.lookahead < p.lookahead:
        return p
    if _held_floats(q.vectors_per_thread, q.vector, layer) > _hold_budget(q.block_threads, hw):
        return p
    return dataclasses.replace(q, hold=True)


def _two_rows_if_sparse(p, hidden, vs, streams, layer, hw, phased=False):
    """``p``, or where it is one CTA of 16-byte vectors without the residual's gradient
    that takes a row a tile on all `BACKWARD_THREADS` threads at two vectors a thread,
    with at least a quarter of the second vectors' slots empty (4104-6144 columns), the
    plan of two rows a tile at three vectors a thread on half the threads. Side by side
    on the H200 (8192 rows, bf16, two runs): layer norm 4104 +11% (0.75 -> 0.84 of copy
    bandwidth), 4608 +6%, 6144 +4-8%, 5120 and 5632 -0.5% to +1%; RMS norm 4104 +5.5%,
    4608 +2%, the others -0.4% to 0. At 2056-3072 columns (a row a tile of 256 threads
    at two vectors, against four rows of three on 128) the same trade lost 0-3.5%."""
    if (p.cluster != 1 or p.rows_per_block != 1 or p.threads_per_row != BACKWARD_THREADS
            or p.vectors_per_thread != 2 or p.vector < 8 or streams > 2 or phased):
        return p
    if 4 * (hidden // p.vector) > 3 * p.threads_per_row * p.vectors_per_thread:
        return p
    q = _backward_layout(hidden, vs, 1, streams, layer, hw, 3 * vs)
    return p if q is None or q.rows_per_block != 2 else q


# How `plan_backward` trades a row's cluster barriers against bytes in flight:
# ``fewest_clusters`` (the default) takes the smallest cluster that holds the row at up to
# twice `BACKWARD_HELD_FLOATS` columns a thread, whatever it keeps in flight (fewer CTAs
# share a row, so each thread has more of it and a row pays fewer barriers).
# ``in_flight`` takes the smallest cluster that keeps `Hardware.in_flight_target` bytes in
# flight at `BACKWARD_HELD_FLOATS` columns a thread: past 8192 columns it splits rows so
# that each CTA's threads are about half full (8704: two CTAs of 4352 columns on 512
# threads of 16), and it ran 1.1-1.4x slower than ``fewest_clusters`` on the H100 at every
# width in 12800-65536 (seams_bench --sweep; they plan alike up to 8192).
# ``fitted`` chooses clusters by ``in_flight``'s test but sizes a row's threads (any
# multiple of 32) and their vectors so that the slice fills their slots: 4% faster at
# 2560 on the H100, no faster or slower past 8192.
BACKWARD_RULES = ("fewest_clusters", "in_flight", "fitted")
DEFAULT_BACKWARD_RULE = BACKWARD_RULES[0]


@functools.lru_cache(maxsize=1024)
def plan_backward(hidden: int, alignment: int, dh: bool, layer: bool,
                  hw: Hardware = SM90, rule: str = DEFAULT_BACKWARD_RULE,
                  phased: bool = False) -> BackwardPlan:
    """``fewest_clusters`` (the default, see `BACKWARD_RULES`): the smallest cluster (1
    where the whole row fits a CTA) whose stages fit shared memory at up to twice
    `BACKWARD_HELD_FLOATS` columns a thread, but two where one CTA could not defer its
    rows (`_pair_if_undeferred`), and the next size where a cluster would have one tile
    in flight (`_spread_if_one_in_flight`); with ``phased`` (rows off 16 bytes whose
    streams share each row's phase), the same rules over 16-byte accesses at the rows'
    phase where a row is a tile (`_backward_layout`), else the plan of ``vector_width``'s
    narrower accesses. ``in_flight``: the smallest cluster whose
    CTAs hold at most `BACKWARD_HELD_FLOATS` columns a thread, whose stages fit shared
    memory and keep `Hardware.in_flight_target` bytes in flight (else the one that keeps
    the most); where none holds the row so, twice the columns a thread. ``fitted``: as
    ``in_flight``, with each slice's threads fitted to it. A LoweringError where none fits
    (a width the GPU cannot hold: runtime.fused then takes the torch path)."""
    if hidden < 1:
        raise LoweringError(f"seam kernel: hidden {hidden}: expected >= 1")
    if rule not in BACKWARD_RULES:
        raise LoweringError(f"seam kernel: norm backward rule {rule!r}: expected one of "
                            f"{BACKWARD_RULES}")
    vs = vector_width(hidden, alignment)
    streams = 3 if dh else 2
    clusters = [c for c in BACKWARD_CLUSTERS if c == 1 or (hw.clusters and c <= MAX_CLUSTER)]
    fit = rule == "fitted"
    if rule == "fewest_clusters":
        p = _fewest_clusters(hidden, vs, clusters, streams, layer, hw)
        if phased and vs < 8:  # at the rows' phase, on no more CTAs a row
            q = _fewest_clusters(hidden, vs, clusters, streams, layer, hw, phased=True)
            phased = q is not None and (p is None or q.cluster <= p.cluster)
            p = q if phased else p
        if p is not None:
            p = _pair_if_undeferred(p, hidden, vs, clusters, streams, layer, hw, phased)
            p = _spread_if_one_in_flight(p, hidden, vs, clusters, streams, layer, hw, phased)
            p = _hold_if_fitted(p, hidden, vs, streams, layer, hw, phased)
            return _two_rows_if_sparse(p, hidden, vs, streams, layer, hw, phased)
    for held in BACKWARD_HELDS:
        plans = [p for p in (_backward_layout(hidden, vs, c, streams, layer, hw, held, fit)
                             for c in clusters) if p is not None]
        for p in plans:  # the smallest cluster that keeps the bandwidth's bytes in flight
            if p.lookahead * p.tile_bytes >= hw.in_flight_target:
                return p
        if plans:  # none does: the most in flight
            return max(plans, key=lambda p: p.lookahead * p.tile_bytes)
    raise LoweringError(f"seam kernel: norm backward of width {hidden}: no plan fits "
                        f"{hw.smem_per_block} bytes of shared memory a block")


def phase_period(hidden: int) -> int:
    """Rows r and r + this start at one 16-byte phase (16-bit values): the classes of rows
    a phased backward's teams take (its `PERIOD`), one team each at least."""
    return 8 // math.gcd(hidden, 8)


def _check_common(dtype: str, hidden: int) -> None:
    if dtype not in DTYPES:
        raise LoweringError(f"seam kernel: dtype {dtype!r}: expected one of {DTYPES}")
    if not isinstance(hidden, int) or hidden < 1 or hidden >= 2**31 // 16:
        raise LoweringError(f"seam kernel: hidden {hidden!r}: expected an int in [1, 2^27)")


@dataclasses.dataclass(frozen=True, slots=True)
class AddNormForwardSpec:
    kind: str
    dtype: str
    hidden: int
    residual: bool
    bias: bool
    alignment: int = 16

    def __post_init__(self):
        _check_common(self.dtype, self.hidden)
        if self.kind not in NORM_KINDS:
            raise LoweringError(f"seam kernel: norm kind {self.kind!r}: expected {NORM_KINDS}")
        if self.bias and self.kind != "layer_norm":
            raise LoweringError("seam kernel: a bias belongs to layer_norm only")

    @property
    def plan(self) -> RowPlan:
        return plan_row(self.hidden, self.alignment, FORWARD_CACHE_FLOATS)

    @property
    def kernel_name(self) -> str:
        add = "add_" if self.residual else ""
        bias = "_bias" if self.bias else ""
        return f"seam_{add}{self.kind}_fwd_{self.dtype}_h{self.hidden}{bias}"

    def params(self) -> list[tuple[str, str]]:
        u, cu = "unsigned short* __restrict__", "const unsigned short* __restrict__"
        # h is read back (through `src`) after it is written: no __restrict__ on it, so
        # that the compiler cannot route those reads through the read-only cache
        return [(cu, "x"), (cu, "residual"), (cu, "weight"), (cu, "bias"), ("unsigned short*", "h"),
                (u, "y"), ("float* __restrict__", "mean_out"),
                ("float* __restrict__", "rstd_out"), ("float", "eps"), ("int", "rows")]

    def bytes_moved(self, rows: int) -> int:
        """Bytes a call must move at least: x (+ residual) in, h (when added) and y out,
        the weights once, mean / rstd."""
        streams = 2 + (2 if self.residual else 0)
        params = 1 + int(self.bias)
        return 2 * self.hidden * (rows * streams + params) + 4 * rows * (
            2 if self.kind == "layer_norm" else 1)


@dataclasses.dataclass(frozen=True, slots=True)
class AddNormBackwardSpec:
    kind: str
    dtype: str
    hidden: int
    dh: bool
    alignment: int = 16  # of dy, h, dh, dx and weight's base addresses, in bytes
    hardware: Hardware = SM90
    rule: str = DEFAULT_BACKWARD_RULE  # `BACKWARD_RULES`
    # dy, h, dh and dx at one 16-byte phase (`plan_backward`'s ``phased``)
    phased: bool = False

    def __post_init__(self):
        _check_common(self.dtype, self.hidden)
        if self.kind not in NORM_KINDS:
            raise LoweringError(f"seam kernel: norm kind {self.kind!r}: expected {NORM_KINDS}")
        if self.rule not in BACKWARD_RULES:
            raise LoweringError(f"seam kernel: norm backward rule {self.rule!r}: expected "
                                f"one of {BACKWARD_RULES}")

    @property
    def plan(self) -> BackwardPlan:
        return plan_backward(self.hidden, self.alignment, self.dh, self.kind == "layer_norm",
                             self.hardware, self.rule, self.phased)

    @property
    def sets(self) -> int:
        """Weight-gradient arrays: dweight, and dbias for layer_norm."""
        return 2 if self.kind == "layer_norm" else 1

    @property
    def kernel_name(self) -> str:
        p = self.plan
        return (f"seam_{self.kind}_bwd_{self.dtype}_h{self.hidden}_v{p.vector}_c{p.cluster}"
                f"_s{p.stages}_k{p.vectors_per_thread}_t{p.threads_per_row}x{p.rows_per_block}"
                + ("_dh" if self.dh else "") + ("_p" if p.phased else ""))

    def params(self) -> list[tuple[str, str]]:
        u, cu = "unsigned short* __restrict__", "const unsigned short* __restrict__"
        cf = "const float* __restrict__"
        return [(cu, "dy"), (cu, "h"), (cu, "weight"), (cf, "mean"), (cf, "rstd"), (cu, "dh"),
                (u, "dx"), ("float* __restrict__", "ws"), ("int", "rows")]

    def bytes_moved(self, rows: int) -> int:
        """dy and h in (and dh), dx out, mean / rstd in, the weight in and its gradients
        out once; the workspace is overhead, not counted."""
        streams = 3 + int(self.dh)
        return 2 * self.hidden * (rows * streams + 1 + self.sets) + 4 * rows * (
            2 if self.kind == "layer_norm" else 1)


@dataclasses.dataclass(frozen=True, slots=True)
class ColumnReduceSpec:
    dtype: str
    sets: int

    def __post_init__(self):
        _check_common(self.dtype, 1)
        if self.sets not in (1, 2):
            raise LoweringError(f"seam kernel: column reduce of {self.sets} sets: expected 1 or 2")

    @property
    def kernel_name(self) -> str:
        return f"seam_column_reduce_{self.dtype}_s{self.sets}"

    def grid(self, hidden: int) -> tuple[int, int, int]:
        """One CTA of `REDUCE_BLOCK` per 32 columns (each sums every set)."""
        return (-(-hidden // REDUCE_BLOCK[0]), 1, 1)

    def params(self) -> list[tuple[str, str]]:
        return [("const float* __restrict__", "ws"), ("unsigned short*", "out0"),
                ("unsigned short*", "out1"), ("int", "parts"), ("int", "hidden")]


@dataclasses.dataclass(frozen=True, slots=True)
class ElementwiseSpec:
    """``rows``: the op runs over a ``[rows, width]`` region whose tensors each have a row
    pitch (``alignment`` then also divides every pitch and the width, in bytes); else
    over ``n`` contiguous elements."""

    op: str
    dtype: str
    alignment: int = 16  # of every base address and of the element count, in bytes
    rows: bool = False

    def __post_init__(self):
        _check_common(self.dtype, 1)
        if self.op not in ELEMENTWISE_OPS:
            raise LoweringError(f"seam kernel: op {self.op!r}: expected one of "
                                f"{sorted(ELEMENTWISE_OPS)}")

    @property
    def vector(self) -> int:
        return vector_width(8, self.alignment)

    @property
    def arity(self) -> tuple[int, int]:
        return ELEMENTWISE_OPS[self.op]

    @property
    def unroll(self) -> int:
        """Vectors a thread loads before computing any: enough that each thread has about
        `ELEMENTWISE_LOADS_IN_FLIGHT` loads outstanding, whatever the op's inputs."""
        return max(1, ELEMENTWISE_LOADS_IN_FLIGHT // self.arity[0])

    @property
    def kernel_name(self) -> str:
        return f"seam_{self.op}_{self.dtype}_v{self.vector}" + ("_rows" if self.rows else "")

    def params(self) -> list[tuple[str, str]]:
        nin, nout = self.arity
        tensors = ([("const unsigned short* __restrict__", f"in{i}") for i in range(nin)]
                   + [("unsigned short* __restrict__", f"out{i}") for i in range(nout)])
        if not self.rows:
            return tensors + [("long long", "n")]
        return (tensors + [("long long", "rows"), ("long long", "width")]
                + [("long long", f"in_pitch{i}") for i in range(nin)]
                + [("long long", f"out_pitch{i}") for i in range(nout)])

    def bytes_moved(self, n: int) -> int:
        return 2 * n * sum(self.arity)


Spec = AddNormForwardSpec | AddNormBackwardSpec | ColumnReduceSpec | ElementwiseSpec


def _dtype_functions(dtype: str) -> str:
    """to_f / from_f / pack2 / unpack2 of the spec's dtype (the kernels' only view of it)."""
    return (T.DTYPE_FUNCTIONS.replace("@TO@", TO_FLOAT[dtype]).replace("@FROM@", FROM_FLOAT[dtype])
            .replace("@PACK@", PACK2[dtype]).replace("@UNPACK@", T.UNPACK2[dtype]))


_RENDERER = Renderer()


def _row_constants(spec, plan: RowPlan, layer: bool) -> str:
    nvec = spec.hidden // plan.vector
    return _RENDERER.constants({
        "HIDDEN": spec.hidden, "V": plan.vector, "NVEC": nvec,
        "TPR": plan.threads_per_row, "RPB": plan.rows_per_block,
        "WARPS": plan.threads_per_row // 32, "K": -(-nvec // plan.threads_per_row),
        "LAYER": layer}) + f"\n#define SEAM_CACHED {int(plan.cached)}"


def _bounded_kernel(name, params, body, threads: int, min_blocks: int) -> str:
    """`Renderer.kernel` with both `__launch_bounds__` arguments (it writes the first only)."""
    text = _RENDERER.kernel(name, params, body)
    head = '__global__ void '
    assert text.count(head) == 1
    return text.replace(head, f"{head}__launch_bounds__({threads}, {min_blocks}) ")


def render(spec: Spec) -> str:
    """The whole CUDA C++ translation unit of ``spec``'s kernel."""
    r = _RENDERER
    if isinstance(spec, AddNormForwardSpec):
        plan = spec.plan
        consts = _row_constants(spec, plan, spec.kind == "layer_norm") + "\n" + r.constants(
            {"RESIDUAL": spec.residual, "BIAS": spec.bias})
        return r.source(["convert"], _dtype_functions(spec.dtype), consts, T.DEPENDENT_ENTRY,
                        T.VEC_IO, T.ROW_SUM,
                        _bounded_kernel(spec.kernel_name, spec.params(), T.ADD_NORM_FORWARD,
                                        plan.block_threads,
                                        plan.min_blocks(FORWARD_PROMISED_THREADS_PER_SM)))
    if isinstance(spec, AddNormBackwardSpec):
        p = spec.plan
        stats, weight, red, cslot, sbar, bars = p.offsets
        consts = r.constants({
            "HIDDEN": spec.hidden, "LAYER": spec.kind == "layer_norm", "HAS_DH": spec.dh,
            "VS": p.vector, "TPR": p.threads_per_row, "RPB": p.rows_per_block,
            "WARPS": p.threads_per_row // 32, "THREADS": p.block_threads,
            "K": p.vectors_per_thread, "SL": p.slice, "CLUSTER": p.cluster,
            "STAGES": p.stages, "NSTREAM": p.streams, "STREAM_BYTES": p.stream_bytes,
            "HOLD": p.hold, "DEFER": p.deferred, "LOOKAHEAD": p.lookahead,
            "STATS_OFF": stats, "W_OFF": weight, "RED_OFF": red,
            "CSLOT_OFF": cslot, "SBAR_OFF": sbar, "BAR_OFF": bars, "BULK": p.bulk,
            "SLACK": p.slack, "NSLOT": p.slots, "PHASED": p.phased,
            "PERIOD": phase_period(spec.hidden) if p.phased else 1, "LINE": p.line})
        text = _bounded_kernel(spec.kernel_name, spec.params(), T.ADD_NORM_BACKWARD,
                               p.block_threads, 1)
        if p.cluster > 1:
            text = text.replace("__global__ void ",
                                f"__global__ void __cluster_dims__({p.cluster}, 1, 1) ", 1)
        return r.source(["convert"], _dtype_functions(spec.dtype), consts, T.DEPENDENT_ENTRY,
                        T.VEC_IO, T.ROW_SUM, T.STAGING, text)
    if isinstance(spec, ColumnReduceSpec):
        return r.source(["convert"], _dtype_functions(spec.dtype),
                        r.constants({"SETS": spec.sets, "REDUCE_LANES": REDUCE_BLOCK[1]}),
                        T.DEPENDENT_ENTRY,
                        r.kernel(spec.kernel_name, spec.params(), T.COLUMN_REDUCE,
                                 threads=REDUCE_BLOCK[0] * REDUCE_BLOCK[1]))
    if isinstance(spec, ElementwiseSpec):
        nin, nout = spec.arity
        ins = ", ".join(f"in{i}" for i in range(nin))
        outs = ", ".join(f"out{i}" for i in range(nout))
        prelude = (f"const unsigned short* ins[NIN] = {{{ins}}};\n"
                   f"unsigned short* outs[NOUT] = {{{outs}}};\n")
        if spec.rows:
            prelude += ("const long long in_pitch[NIN] = {"
                        + ", ".join(f"in_pitch{i}" for i in range(nin)) + "};\n"
                        "const long long out_pitch[NOUT] = {"
                        + ", ".join(f"out_pitch{i}" for i in range(nout)) + "};\n")
        pointwise = (f"__device__ __forceinline__ void pointwise(const float* in, float* out) {{"
                     f"{T.POINTWISE[spec.op]}}}")
        return r.source(["convert"], _dtype_functions(spec.dtype),
                        r.constants({"V": spec.vector, "NIN": nin, "NOUT": nout,
                                     "UNROLL": spec.unroll}),
                        T.GELU_CONSTANTS, T.DEPENDENT_ENTRY, T.VEC_IO, pointwise,
                        r.kernel(spec.kernel_name, spec.params(),
                                 prelude + (T.ELEMENTWISE_ROWS if spec.rows else T.ELEMENTWISE),
                                 threads=ELEMENTWISE_THREADS))
    raise LoweringError(f"seam kernel: no renderer for {type(spec).__name__}")


def every_variant(hidden: int, dtype: str = "bf16", alignment: int = 16,
                  hw: Hardware = SM90) -> list[Spec]:
    """Every kernel a width needs (both norms, with and without residual / bias / dh),
    the column reduces and the elementwise ops: what the unit tests compile. ``hw``: the
    GPU model the backward's plans follow (its stages depend on the bandwidth)."""
    specs: list[Spec] = []
    for kind in NORM_KINDS:
        for residual in (False, True):
            for bias in ((False, True) if kind == "layer_norm" else (False,)):
                specs.append(AddNormForwardSpec(kind, dtype, hidden, residual, bias, alignment))
        for dh in (False, True):
            specs.append(AddNormBackwardSpec(kind, dtype, hidden, dh, alignment, hw))
            # where the row's streams share their phase (what `runtime.fused` allocates)
            phased = AddNormBackwardSpec(kind, dtype, hidden, dh, alignment, hw, phased=True)
            if phased.plan.phased:
                specs.append(phased)
    specs += [ColumnReduceSpec(dtype, s) for s in (1, 2)]
    specs += [ElementwiseSpec(op, dtype, alignment, rows) for op in ELEMENTWISE_OPS
              for rows in (False, True)]
    return specs
