"""Row-wise normalization (layer norm, RMS norm) with fused pointwise ops -> CUDA C++.

A `NormalizationSpec` describes one fusion over ``x[rows, hidden]``:

    prologue ops (adds of 1-D tensors broadcast over rows, casts that round)
    -> layer_norm (weight, bias, eps) or rms_norm (weight, eps), in fp32
    -> epilogue ops (same kinds) -> cast to the output dtype

and `render_normalization(spec)` turns it into one **persistent** kernel: each thread
keeps its slice of a row in registers (the "persistent batch"), so the input is read
once and the output written once, whatever the prologue. The mean and the variance
are computed in two passes over those registers (exact enough for rows with a large
mean, unlike E[x^2] - E[x]^2), each reduced by warp shuffles and, when a row spans
several warps, one shared-memory exchange.

The kernel is persistent in the launch sense too: its grid is the blocks resident on
the device at once (SMs x blocks per SM), each block loops over groups of rows, and
each thread loads its slice of the 1-D tensors once, before that loop, into packed
registers (or its block stages them in shared memory: where they do not fit, and where
the registers they free are worth more, see `choose_persistent`), so the
row loop reads only x and writes only y; the next row's x is prefetched while the
current one is reduced. `LaunchPlan` says which variant; ``param_cache="none"`` is
the earlier row-wise kernel (a block per group of rows, tensors re-read every row), which
the heuristic keeps for rows one warp covers (768 and 1024 at fp16: measured as fast).

Example (the fusion of the nvFuser report):
    >>> spec = NormalizationSpec.reference_fusion(rows=8192, hidden=5140)
    >>> plan = spec.plan
    >>> (plan.vector_width, plan.threads_per_row % 32)
    (4, 0)
    >>> source = render_normalization(spec)
    >>> "#pragma unroll 1" in source
    True

The heuristics live in `plan_launch`; each one says why in a comment.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import math
from typing import Union

from hostir.errors import LoweringError
from lowering.kernels import render

WARP = 32
MAX_THREADS_PER_BLOCK = 1024
MAX_THREADS_PER_SM = 2048
MAX_BLOCKS_PER_SM = 32
REGISTERS_PER_SM = 65536
MAX_REGISTERS_PER_THREAD = 255
# fp32 values a thread may hold for its part of a row. 32 keeps the whole kernel near
# 64-96 registers, so 700-1000 threads stay resident per SM with 32-64 bytes of loads
# each in flight: enough to cover DRAM latency on Hopper. Rows longer than
# 1024 threads x 32 values are not a persistent-kernel case.
MAX_VALUES_PER_THREAD = 32
MIN_THREADS_PER_BLOCK = 128

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
HALF_DTYPES = ("float16", "bfloat16")


# --------------------------------------------------------------------------- ops


@dataclasses.dataclass(frozen=True, slots=True)
class AddBroadcast:
    """``v = v + float(p[col])``: a 1-D tensor of ``hidden`` elements broadcast over rows."""

    dtype: str = "float16"
    name: str = "bias"

    def __post_init__(self):
        _check_dtype("AddBroadcast.dtype", self.dtype, tuple(DTYPE_BYTES))
        if not self.name.isidentifier():
            raise LoweringError(f"AddBroadcast.name: expected an identifier, got {self.name!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class Cast:
    """``v = float(dtype(v))``: rounds to nearest-even in ``dtype``, math stays fp32.

    This is what ``half(float(x) + float(b0))`` means inside a fusion: the rounding
    is part of the function and a fused kernel must keep it.
    """

    dtype: str

    def __post_init__(self):
        _check_dtype("Cast.dtype", self.dtype, HALF_DTYPES + ("float32",))


PointwiseOp = Union[AddBroadcast, Cast]


@dataclasses.dataclass(frozen=True, slots=True)
class LayerNorm:
    """``(v - mean) / sqrt(var + eps) * weight + bias`` over a row, biased variance."""

    eps: float = 1e-5
    weight: bool = True
    bias: bool = True
    weight_dtype: str = "float16"
    bias_dtype: str = "float16"

    def __post_init__(self):
        _check_eps(self.eps)
        _check_dtype("LayerNorm.weight_dtype", self.weight_dtype, tuple(DTYPE_BYTES))
        _check_dtype("LayerNorm.bias_dtype", self.bias_dtype, tuple(DTYPE_BYTES))


@dataclasses.dataclass(frozen=True, slots=True)
class RmsNorm:
    """``v / sqrt(mean(v^2) + eps) * weight`` over a row."""

    eps: float = 1e-6
    weight: bool = True
    weight_dtype: str = "float16"

    def __post_init__(self):
        _check_eps(self.eps)
        _check_dtype("RmsNorm.weight_dtype", self.weight_dtype, tuple(DTYPE_BYTES))


def _check_dtype(what: str, dtype: str, allowed: tuple[str, ...]) -> None:
    if dtype not in allowed:
        raise LoweringError(f"{what}: expected one of {list(allowed)}, got {dtype!r}")


def _check_eps(eps: float) -> None:
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise LoweringError(f"eps: expected a finite number > 0, got {eps!r}")


# --------------------------------------------------------------------------- plan


PARAM_CACHES = ("none", "registers", "shared", "global")
L2_HINTS = ("", "evict_first", "prefetch_256b")  # LaunchPlan.l2_hint
MAX_STAGES = 3  # rows of x a cp.async ring may hold ahead of the current one
# the depths `persistent_candidates` offers: two rows ahead already doubles the bytes in
# flight of a one-block-per-SM plan (see LaunchPlan.stages); 3 stays a manual override
CANDIDATE_STAGES = (1, 2)
DEFAULT_SM_COUNT = 132  # H100 SXM / H200; compile-time checks only, launches ask the device
SHARED_PER_SM = 228 * 1024  # Hopper: 228 KiB per SM, 227 KiB at most for one block
SHARED_PER_BLOCK = 227 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class LaunchPlan:
    """How the kernel maps a row onto threads; fixed at code generation.

    ``param_cache`` picks the kernel:

    - ``"none"``: the row-wise kernel. One block per group of rows (grid = groups), the
      1-D tensors re-read from L1/L2 for every row.
    - ``"registers"``: the persistent kernel. grid = SMs x resident blocks, each block
      loops over groups of rows (grid-stride); each thread loads its slice of every 1-D
      tensor once, before the row loop, and keeps it packed (two 16-bit values a 32-bit
      register), so the row loop reads only x and writes only y.
    - ``"shared"``: the same loop, with the 1-D tensors staged once per block in shared
      memory: for rows whose slices do not fit the registers beside the row, with x
      prefetched into registers where a ring of x would not fit beside the tensors
      (20480 at fp16: 160 KiB of tensors; see `choose_persistent`).
    - ``"global"``: the same loop, the 1-D tensors re-read every row through the
      read-only data path (``__ldg``: L1, then L2), neither registers nor shared memory
      held for them, leaving the shared memory to a ring of x (``stages``); L2 serves
      them at many times DRAM bandwidth. Taken where no prefetch fits beside the
      tensors in shared memory (none of the bench sizes: 20480 took it, 0.853 of copy
      bandwidth, until its shared plan fitted, 0.904).

    ``prefetch`` (persistent kernels): the next row's x is loaded before the current row
    is reduced, so DRAM stays busy through the reductions and the stores. Into packed
    registers, or with ``x_staged`` into shared memory by cp.async (two buffers a row:
    the next row's copy lands in one while the current row is read from the other),
    which costs no registers across the row: the prefetch of the longest rows.

    ``stages`` (with ``x_staged``): rows of x in flight ahead of the current one, a ring
    of ``stages + 1`` shared buffers a row. One row ahead leaves DRAM idle between the
    arrival of the next row and the issue of the one after (the prologue, the
    reductions and the stores of a whole row): with one block of 384-640 threads an SM
    (12288+ at fp16) that is one 24-40 KiB row in flight, about what Little's law asks
    for (`bytes_in_flight`) with no slack. Two or three rows ahead keep 2-3x that queued.

    ``one_pass``: the layer norm's mean and variance from one reduction with a single
    block barrier a row instead of two: each thread reduces its own slice exactly (its
    mean, then the sum of squares about it, in registers), and the row combines the
    (count, mean, M2) triples pairwise (Chan et al.), which has none of the
    cancellation of E[x^2] - E[x]^2 on rows with a large mean. Rows spanning several
    warps only (a one-warp row has no barrier to save).

    ``packed`` (``x_staged``, 16-bit x): the row slice stays in registers as 16-bit
    values, two to a register, instead of fp32 ones: the value after the prologue's last
    cast to a 16-bit type (x itself if there is none), exact in 16 bits; the ops after it
    (the reference fusion's ``+ b1``) are recomputed in each pass over the row, a
    conversion and an add. Half the registers of the row: the reference fusion's four
    1-D tensors then fit in registers beside it at 16384 (measured without it,
    benchmarks/results/norm_params_probe_nvidia-h200.json: layer_norm, two tensors in
    registers, 0.91 of copy bandwidth at 16384; the fusion's four in shared memory 0.81).

    ``shared_param_bytes`` (``param_cache="global"``): the first 1-D tensors, as many as
    make up this many bytes a column, staged in shared memory after all; only the rest
    is read through L2 every row (20480 at fp16: two of the four tensors, 80 KiB, fit
    beside a ring of x two rows deep, 80 KiB; the L2 traffic of the tensors halves).

    ``x_bulk`` (``x_staged``, rows a multiple of 16 bytes, 16-byte vectors): each row of x
    lands in its shared buffer by one bulk copy (``cp.async.bulk``, the TMA engine's 1-D
    form, no tensor map) that the row's first thread issues and an mbarrier completes,
    instead of one cp.async a vector by every thread: the load instructions of a row
    drop from its vectors to one.

    ``l2_hint`` (``x_staged``; "" none): an L2 hint on the cp.async
    of x, which is read once. ``"evict_first"``: an L2::evict_first cache policy
    (``createpolicy``), so the lines of x go before the 1-D tensors (re-read every row
    through L2 with ``param_cache="global"``) and before y's lines waiting to be written
    back. ``"prefetch_256b"``: ``.L2::256B``, the L2 fetches the whole 256-byte block
    around each request, so a warp's 512 contiguous bytes arrive as two DRAM
    bursts the row needs anyway rather than sector by sector. The y stores are
    ``__stcs`` (evict-first) in every plan.
    """

    vector_width: int  # elements per global access (16 bytes when alignment allows)
    threads_per_row: int  # a multiple of the warp
    batch: int  # vectors each thread keeps in registers (the persistent batch)
    rows_per_block: int
    register_estimate: int
    param_cache: str = "none"
    prefetch: bool = False
    param_bytes: int = 0  # bytes of all cached 1-D tensors for one column
    x_staged: bool = False  # the prefetch goes through shared memory (cp.async)
    x_bytes: int = 2  # bytes of an element of x
    stages: int = 1  # rows of x prefetched ahead (x_staged: a ring of stages + 1 buffers)
    one_pass: bool = False  # mean and variance in one reduction, one barrier a row
    l2_hint: str = ""  # x_staged: an L2 hint on the cp.async of x (L2_HINTS)
    packed: bool = False  # x_staged: the row slice held as 16-bit values (see above)
    x_bulk: bool = False  # x_staged: each row by one bulk copy (see above)
    shared_param_bytes: int = 0  # "global": the leading tensors' bytes staged in shared
    blocks_per_sm: int = 0  # the block promise to ptxas; 0: from the register estimate

    @property
    def persistent(self) -> bool:
        return self.param_cache != "none"

    @property
    def block_threads(self) -> int:
        return self.threads_per_row * self.rows_per_block

    @property
    def min_blocks_per_sm(self) -> int:
        """Blocks per SM promised to ptxas through __launch_bounds__.

        Without it ptxas guesses an occupancy target itself and was seen squeezing an
        rms_norm to 32 registers with 16 bytes of spills; with it, the register cap
        is 65536 / (blocks x threads), at least our estimate plus a margin of 8 (the
        estimate is a fit, not a bound), so nothing spills. Shared memory for the
        1-D tensors limits the blocks too.

        ``blocks_per_sm`` pins the promise instead (a tuner candidate, `tune_plans`:
        ptxas then caps the registers at 65536 / (blocks x threads), and the tuner drops
        the plan if that spills). The estimate is a fit with a margin: the row-wise
        kernel at 4096 (t128 b4), estimated at 96 registers and promised 4 blocks,
        compiles without spills down to 56 registers, 9 blocks an SM.

        The count divides the SM's 65536 registers; ptxas allots them per sub-partition
        (four of 16384, a warp in one), so where a block's warps do not split evenly the
        cap it derives is lower: three blocks of 192 threads (18 warps, 5 on some
        partitions) get 96 registers, not 112. Some picks promise past their estimate so
        (plain layer_norm at 2560 and 5140: 92-96 registers as compiled, no spills; the
        unit tests compile every variant and check), and so do some tuner candidates,
        which are dropped where they spill (`runtime.normalization.spill_report`).
        """
        if self.blocks_per_sm:
            return self.blocks_per_sm
        need = _round_up(self.register_estimate + 8, 8)
        by_registers = REGISTERS_PER_SM // (self.block_threads * need)
        blocks = max(1, min(MAX_THREADS_PER_SM // self.block_threads, by_registers,
                            MAX_BLOCKS_PER_SM))
        smem = self.dynamic_shared_bytes + self.shared_bytes
        if smem:
            blocks = max(1, min(blocks, SHARED_PER_SM // (smem + 1024)))
        return blocks

    def sm_holds(self, blocks: int) -> bool:
        """Whether one SM holds ``blocks`` blocks of this plan, registers aside: at most
        `MAX_BLOCKS_PER_SM` blocks and `MAX_THREADS_PER_SM` threads, and their shared
        memory (1 KiB a block reserved) within `SHARED_PER_SM`."""
        smem = self.dynamic_shared_bytes + self.shared_bytes
        return (1 <= blocks <= MAX_BLOCKS_PER_SM
                and blocks * self.block_threads <= MAX_THREADS_PER_SM
                and (not smem or blocks * (smem + 1024) <= SHARED_PER_SM))

    @property
    def warps_per_row(self) -> int:
        return self.threads_per_row // WARP

    @property
    def shared_bytes(self) -> int:
        # two reductions (mean, variance) use separate buffers: see the kernel's comment;
        # one pass: (count, mean, M2) a warp, two buffers by the parity of the row
        per_warp = 3 if self.one_pass else 1
        return 0 if self.warps_per_row == 1 else 2 * 4 * per_warp * self.rows_per_block * self.warps_per_row

    @property
    def dynamic_shared_bytes(self) -> int:
        """The staged 1-D tensors (``param_cache == "shared"``: every batch slot of a row),
        then, with ``x_staged``, ``stages + 1`` buffers of x for each row of the block."""
        slots = self.threads_per_row * self.batch * self.vector_width
        params = (self.param_bytes if self.param_cache == "shared"
                  else self.shared_param_bytes) * slots
        x = (self.stages + 1) * self.rows_per_block * slots * self.x_bytes if self.x_staged else 0
        return params + x

    def grid(self, rows: int, sm_count: int = DEFAULT_SM_COUNT,
             blocks_per_sm: int | None = None, balanced: bool | None = None) -> int:
        """Blocks to launch: one per group of rows for the row-wise kernel; for the
        persistent one, as many as are resident at once on ``sm_count`` SMs (read from
        the device at launch; the default is for compile-time checks), never more than
        there are groups. ``blocks_per_sm``: what the driver says of the compiled kernel
        (runtime.normalization.resident_blocks); by default the plan's promise to ptxas.

        ``balanced`` (default `BALANCED_GRID`): the fewest blocks that still need no
        more rounds of the row loop than the resident ones would. 4096 groups on 396
        resident blocks take 11 rounds, the last with 136 blocks; 373 blocks take the
        same 11 rounds with every block busy in each, and fewer blocks share the
        bandwidth in the other ten. The kernel loops, so any grid is correct."""
        groups = max(1, -(-rows // self.rows_per_block))
        if not self.persistent:
            return groups
        per_sm = blocks_per_sm or self.min_blocks_per_sm
        most = max(1, min(groups, sm_count * per_sm))
        if not (BALANCED_GRID if balanced is None else balanced):
            return most
        rounds = -(-groups // most)
        return -(-groups // rounds)

    def describe(self) -> str:
        kind = "rowwise" if not self.persistent else f"persistent/{self.param_cache}"
        if self.shared_param_bytes:
            kind += f"+s{self.shared_param_bytes}"
        return (f"{kind} t{self.threads_per_row} b{self.batch} v{self.vector_width} "
                f"r{self.rows_per_block}"
                + (" prefetch" + ("/smem" if self.x_staged else "") if self.prefetch else "")
                + (str(self.stages) if self.x_staged and self.stages > 1 else "")
                + (" 1pass" if self.one_pass else "")
                + (" packed" if self.packed else "")
                + (" bulk" if self.x_bulk else "")
                + (f" {self.l2_hint}" if self.l2_hint else "")
                + (f" x{self.blocks_per_sm}" if self.blocks_per_sm else ""))


def vector_width_for(hidden: int, dtype_bytes: tuple[int, ...], alignment: int) -> int:
    """Widest vector (elements) such that every row of every tensor starts aligned.

    Row ``r`` starts at ``r * hidden * bytes``: a 16-byte access needs that, and the base
    pointers (``alignment``), to be multiples of 16. 16 bytes is the widest load a thread
    can issue (LDG.128): it quarters the load instructions of a 4-byte access and keeps
    more bytes in flight per instruction slot. Every tensor of the fusion must agree,
    so the narrowest element type sets the count.
    """
    best = 1
    elem = max(dtype_bytes)
    for width in (8, 4, 2, 1):
        fits = all(width * b <= 16 and (hidden * b) % (width * b) == 0 for b in dtype_bytes)
        if fits and alignment % (width * elem) == 0:
            best = width
            break
    return best


def register_estimate(values_per_thread: int, vector_width: int, value_bytes: int) -> int:
    """Registers one thread needs, fitted to ptxas (sm_80, sm_90) over every candidate
    plan of the benchmark sizes and a few odd ones: about two per fp32 value of the row
    slice (the value, and the packed input plus the centred value or the converted
    output while it is live), an address and a predicate per batch slot when vectors
    are narrow (with 16-byte vectors they share registers), and 32 for indices, the
    reduction and the prologue's tensors (ptxas converts those as they arrive). The
    unit tests check it against what ptxas reports."""
    packed = values_per_thread * value_bytes // 2
    slots = values_per_thread // vector_width
    per_slot = {1: 2, 2: 2, 4: 1}.get(vector_width, 0)
    return values_per_thread + packed + per_slot * slots + 32


def _row_geometries(hidden: int, vector_width: int):
    """(batch, threads a row, rows a block) of every warp-multiple covering of a row of
    ``hidden`` values by ``vector_width`` vectors: a batch is kept only if no batch slot
    is empty for every thread, and short rows share a block (MIN_THREADS_PER_BLOCK)."""
    vectors = -(-hidden // vector_width)
    for b in range(1, MAX_VALUES_PER_THREAD // vector_width + 1):
        t = _round_up(-(-vectors // b), WARP)
        if t > MAX_THREADS_PER_BLOCK or (b - 1) * t >= vectors:
            continue
        yield b, t, -(-MIN_THREADS_PER_BLOCK // t)


def candidate_plans(hidden: int, vector_width: int, value_bytes: int) -> list[LaunchPlan]:
    """Every plan that covers a row with warp-multiple threads and fits the registers.

    - Block sizes are warp multiples: a partial warp wastes its lanes on every
      instruction and breaks the warp-shuffle reduction.
    - A batch B (vectors a thread keeps in registers) is kept only if no batch slot is
      empty for every thread, and only if its register estimate fits what the block
      may use: then ptxas has no reason to spill.
    - Short rows (fewer than MIN_THREADS_PER_BLOCK threads) share a block, several rows
      each on its own warps, so a block has enough warps to hide latency while each
      row's reduction stays inside its warps.
    """
    plans = []
    for b, t, rows_per_block in _row_geometries(hidden, vector_width):
        estimate = register_estimate(b * vector_width, vector_width, value_bytes)
        if estimate <= _register_budget(t * rows_per_block):
            plans.append(LaunchPlan(vector_width, t, b, rows_per_block, estimate))
    return plans


def padding(plan: LaunchPlan, hidden: int) -> float:
    """Fraction of a row's batch slots that are predicated off."""
    slots = plan.threads_per_row * plan.batch * plan.vector_width
    return (slots - hidden) / slots


def persistent_register_estimate(values_per_thread: int, vector_width: int, value_bytes: int,
                                 cached_param_bytes: int, prefetch: bool,
                                 shared: bool = False, x_staged: bool = False,
                                 bf16: bool = False, one_pass: bool = False,
                                 packed: bool = False, one_warp: bool = False) -> int:
    """Registers of one thread of the persistent kernel, fitted to ptxas (sm_90) over the
    candidate plans of the benchmark sizes: the fp32 row slice (one a value), the cached
    1-D tensors (``cached_param_bytes`` per column, packed: 16-bit values two to a
    register), the prefetched next row of x (packed too), and a constant for indices,
    the reduction and the conversions. The unit tests check it against ptxas.
    ``shared`` also stands for tensors read through L1/L2 every row (``"global"``): the
    same loads, from another space. ``one_pass`` keeps a (count, mean, M2) triple and
    its shuffled partner live through the reduction: a few registers more. ``packed``
    (with ``x_staged``): the row slice two 16-bit values a register instead of one fp32
    value each. ``one_warp``: the row on one warp (its reduction all shuffles), where
    ptxas keeps more of the staged tensors live beside a prefetch in registers."""
    v = values_per_thread
    extra = 4 if one_pass else 0
    packed_x = -(-v * value_bytes // 4)
    cached = -(-v * cached_param_bytes // 4)
    # an address a slot when vectors are narrow (16-byte ones share them); with 8-byte
    # vectors the prefetch's addresses stay live across the row too
    narrow = (v // vector_width) * (2 if vector_width < 4 else int(prefetch and vector_width == 4))
    # staged tensors: ptxas issues the shared-memory loads early, packed. With the
    # prefetch in registers and the row on several warps it keeps few of them live: the
    # least -maxrregcount without spills (the reference fusion, fp16 and bf16, every
    # such candidate of the bench sizes) is 72-88 at 32 values a thread, 64 at 24, 48 at
    # 16, 40-48 at 8. The term was 3v/2 there, which kept 20480's t640 b4 plan (95
    # registers as shipped) out of the candidates, the fastest plan there side by side
    # (benchmarks/results/norm_shared_prefetch_probe_nvidia-h200.json). One-warp rows
    # still need it: 96 at 24 values (768), 120 at 32 (1024).
    if not shared:
        staged = 0
    elif prefetch and not x_staged:
        staged = 3 * v // 2 if one_warp else v // 4
    else:
        staged = v // 2
    if x_staged:  # the next row waits in shared memory: only its buffer's addresses
        # packed: two values a register; with vectors under 16 bytes ptxas also keeps an
        # address a slot (5140, v4: 28 bytes of spills at the cap without them)
        row = packed_x + (v // vector_width if vector_width < 8 else 0) if packed else v
        return row + cached + staged + 4 + extra + PERSISTENT_OVERHEAD
    # bf16 converts by integer shifts that ptxas schedules early: with cached tensors and
    # the prefetch live too, half a register more a value (seen as spills without it)
    wide = v // 2 if bf16 and cached and prefetch else 0
    return v + cached + (packed_x if prefetch else 0) + narrow + staged + wide + extra + PERSISTENT_OVERHEAD


PERSISTENT_OVERHEAD = 30


def persistent_candidates(hidden: int, vector_width: int, value_bytes: int,
                          param_bytes: int, bf16: bool = False,
                          param_sizes: tuple[int, ...] = ()) -> list[LaunchPlan]:
    """Every persistent plan that covers a row with warp-multiple threads, keeps every
    batch slot used by some thread, and fits: registers within what one block may use,
    shared memory within a block's 227 KiB. Short rows share a block as in
    `candidate_plans`. For each row geometry:

    - ``param_cache`` shared: no prefetch, the prefetch in registers, and the prefetch
      through shared memory (``x_staged``) `CANDIDATE_STAGES` rows ahead;
    - ``param_cache`` registers: the same but without prefetch (the sweep at 342d088
      and 8f4eff6: never within 3% of the best at any size, behind the shared variant);
    - ``param_cache`` global: only with ``x_staged``: what it is for is leaving
      registers and shared memory to the prefetch;
    - ``param_cache`` global with the leading tensors staged in shared memory after all
      (``shared_param_bytes``, each prefix of ``param_sizes``, the bytes a column of each
      1-D tensor in kernel order; none without them);
    - with ``x_staged``, and a row on several warps, the one-pass reduction too
      (``one_pass``: one block barrier a row instead of two; with x staged the
      registers it adds do not cost occupancy the way they would beside a row
      prefetched into registers).
    """
    plans = []
    for b, t, r in _row_geometries(hidden, vector_width):
        for cache in ("registers", "shared", "global"):
            if cache in ("registers", "global") and param_bytes == 0:
                continue  # nothing to cache: the shared variant stages nothing either
            # cp.async moves 4, 8 or 16 bytes: x_staged needs vectors of 4 bytes or more
            modes = {"global": [], "registers": [(True, False, 1)],
                     "shared": [(True, False, 1), (False, False, 1)]}[cache]
            if vector_width * value_bytes >= 4:
                modes[1:1] = [(True, True, k) for k in CANDIDATE_STAGES]
            for prefetch, x_staged, stages in modes:
                for one_pass, packed in _pass_and_packing(x_staged, t, value_bytes):
                    if packed and cache != "registers":
                        # the tail ops re-read their tensors in every pass: from shared
                        # memory 0.75-0.99x the unpacked twin's speed at every size of the
                        # f274ee2 sweep; from L2 not even tried
                        continue
                    est = persistent_register_estimate(
                        b * vector_width, vector_width, value_bytes,
                        param_bytes if cache == "registers" else 0, prefetch, cache != "registers",
                        x_staged, bf16, one_pass, packed, t == WARP)
                    plan = LaunchPlan(vector_width, t, b, r, est, cache, prefetch, param_bytes,
                                      x_staged, value_bytes, stages, one_pass, "", packed)
                    if est + 8 > _register_budget(t * r):  # the margin of min_blocks_per_sm
                        continue
                    if plan.dynamic_shared_bytes + plan.shared_bytes > SHARED_PER_BLOCK:
                        continue
                    plans.append(plan)
                    if x_staged and bulk_ok(hidden, vector_width, value_bytes) and not one_pass:
                        plans.append(dataclasses.replace(plan, x_bulk=True))
                    if cache == "global" and not one_pass:
                        for staged in itertools.accumulate(param_sizes[:-1]):
                            split = dataclasses.replace(plan, shared_param_bytes=staged)
                            if split.dynamic_shared_bytes + split.shared_bytes <= SHARED_PER_BLOCK:
                                plans.append(split)
    return plans


def bulk_ok(hidden: int, vector_width: int, value_bytes: int) -> bool:
    """Whether a row of x can come by one bulk copy: 16-byte vectors (so every row starts
    16-byte aligned) and a row a multiple of 16 bytes (the copy's granule)."""
    return vector_width * value_bytes == 16 and hidden * value_bytes % 16 == 0


def _pass_and_packing(x_staged: bool, threads_per_row: int, value_bytes: int):
    """(one_pass, packed) of the persistent candidates of one placement: the one-pass
    reduction for staged rows on several warps; the packed row slice for staged 16-bit
    x (two-pass only: the one-pass reduction was never picked)."""
    yield False, False
    if x_staged and threads_per_row > WARP:
        yield True, False
    if x_staged and value_bytes == 2:
        yield False, True


def bytes_in_flight(plan: LaunchPlan, value_bytes: int) -> int:
    """Bytes of x one SM has requested at once when every resident thread has issued its
    row slice: the memory-level parallelism the plan offers (Little's law: an H200 needs
    about 4.8 TB/s x ~0.7 us / 132 SMs, some 25 KiB an SM, to stay at bandwidth)."""
    return plan.min_blocks_per_sm * plan.block_threads * plan.batch * plan.vector_width * value_bytes


IN_FLIGHT_TARGET = 32 * 1024
MAX_EXTRA_PADDING = 0.2
# Rule 4 of `choose_persistent`: the fewest values a thread for which the cp.async ring
# pays for its shared-memory round trip.
STAGED_MIN_VALUES = 16
# Rule 6: where the 1-D tensors go, best first.
CACHE_ORDER = ("registers", "shared", "global")
# Rule 7: bytes in flight compared in steps of this (the block counts are estimates).
FLIGHT_STEP = 4 * 1024

# The measurements the rules below cite: benchmarks/results/
# layer_norm_nvidia-h200_sweep_75f9994.json, "sweep" (H200, commit 75f9994, 8192 rows,
# fp16, the reference fusion: 600 plans, the cp.async ring, the one-pass reduction and
# the L2 tensors among them). A ratio "1.03x" is that plan's time over the best time
# measured at its size; "regs" are what ptxas reported for it. benchmarks/sweep_rules.py
# prints the table; tests/unit/test_normalization_sweep.py holds the planner to it.


@dataclasses.dataclass(frozen=True, slots=True)
class PlannerRules:
    """The switches of `choose_persistent` for the plan dimensions added after the
    8f4eff6 sweep (``stages``, ``one_pass``, ``param_cache="global"``). Each is a general
    rule with a threshold; ``python benchmarks/sweep_rules.py --fit RESULTS.json``
    scores every combination of the values in `RULE_GRID` against a sweep and prints
    the one to set `RULES` to. The defaults here keep the dimensions out; `RULES` is
    what the 75f9994 sweep fits (worst 1.009x; the next, ``deep_below`` always, 1.032x).

    - ``deep_below``: a deeper cp.async ring (``stages`` 2) where one row ahead leaves
      fewer than this many bytes of x in flight an SM (`bytes_in_flight` x 2): Little's
      law with room to spare. 0: never. Fitted: 64 KiB. Two rows ahead is the best at
      every size up to 12288 (one block of 512 threads, 24 KiB a row: 1.000x against
      1.119x one row ahead); from 16384 (32 KiB a row and up) one row ahead holds enough
      and the third buffer only takes shared memory (16384 1.004x/1.000x, 20480
      1.000x/1.032x).
    - ``one_pass_warps``: the one-pass reduction (one block barrier a row) for rows on
      at least this many warps (a barrier waits for the slowest warp of the row: the
      more warps, the more it costs). 0: never. Fitted: never; every one-pass plan of
      the 75f9994 sweep is 1.16-2.7x its two-pass twin (its per-thread exact mean and
      the pairwise Chan combine cost more than the barrier they save).
    - ``global_params``: read the 1-D tensors through L1/L2 every row (``"global"``)
      rather than staging them in shared memory, where staging them leaves no room
      for the prefetch of x (no shared-cache plan with the prefetch fits). Fitted: on
      (20480: 1.000x, where the shared tensors without the prefetch were 1.198x). Since
      the refitted register estimate (see `persistent_register_estimate`) the shared
      tensors with x prefetched into registers fit at 20480, so no bench size reads
      its tensors through L2 any more: that plan ran 0.904 of copy bandwidth side by
      side with ``global+s4``'s 0.853 (norm_shared_prefetch_probe_nvidia-h200.json).
    - (Tried and reverted, 3b6da53: packing the row slice wherever it lets an SM hold
      one more block, with the deep ring below 80 KiB. Fitted on the 0344c81 and
      ffa45e6 sweeps it promised 1600 and 4096 a few percent, but the bench run after it
      (layer_norm_nvidia-h200_refit_3b6da53.json) gave 1600 0.875 of copy against 0.866,
      4096 0.861 against 0.862, and lost 16384 to the deeper ring: 0.876 against 0.899.)
    - ``packed_row``: hold the staged row slice as 16-bit values (``LaunchPlan.packed``)
      where the 1-D tensors fit registers only so: no unpacked plan with the prefetch
      caches them in registers. Fitted: on (f274ee2 sweep: 16384, t512 b4 in registers,
      0.881 of copy bandwidth against 0.818 for the best unpacked plan, tensors in L2).
      Where the tensors fit beside the fp32 row the recomputed tail costs more than the
      registers save (packed twins 0.93-0.99x, a few 1.02-1.14x).
    - ``bulk_x``: stage x by one bulk copy a row (``LaunchPlan.x_bulk``) wherever the row
      allows it. Fitted: off. In the 626bc24 sweep (760 plans) the bulk twin of a plan
      ran 0.88-1.13x its cp.async twin's speed: the best plan at 1600 (0.810 of copy
      bandwidth against 0.787), 2048 (0.885/0.871), 2560 (0.876/0.855) and 16384 (t512 b4
      packed, ring of 2: 0.905/0.875), slower at 768-1536, 4096, 12288 and 20480; no
      threshold on the plan's dimensions separates the two groups, and on always the
      worst size falls behind (`benchmarks/sweep_rules.py --fit`).
    - ``split_params``: where the tensors go through L2, stage the leading ones in shared
      memory up to half of their bytes a column (``shared_param_bytes``: the largest
      prefix within half), the rest staying in L2 with the L1 left beside the ring to
      cache them. Only 20480 had such plans (tensors through L2 there, until the
      shared tensors with the prefetch in registers fitted: `global_params`). Its t640 b4
      prefetch plan with two of the four tensors staged (``+s4``) against none, in
      three runs: 0.845 against 0.810 of copy bandwidth (the 8b82399 sweep), 0.849
      against 0.821 (0344c81), 0.851 against 0.823 (side by side,
      norm_stage_probe_nvidia-h200.json); one staged (``+s2``, 0.787) or three
      (``+s6``, 0.794, 200 KiB of shared memory with the ring, little L1 left for the
      last tensor) are slower. On.
    - ``l2_hint``: the `L2_HINTS` hint the chosen plan puts on the cp.async of x when it
      stages x. Not yet timed (the sweep after 75f9994 times each
      hint on the planner's first two plans a size): "" until a sweep says otherwise.
    """

    deep_below: int = 0
    one_pass_warps: int = 0
    global_params: bool = False
    l2_hint: str = ""
    packed_row: bool = False
    bulk_x: bool = False
    split_params: bool = False


# Whether the persistent kernel's grid is balanced (`LaunchPlan.grid`). Measured off:
# benchmarks/grid_balance_probe.py at ec73902 (grid_balance_probe_nvidia-h200_ec73902.json;
# now `norm_flag_probe.py --flag BALANCED_GRID`: 1600 0.965x again at 804fd45) timed the
# balanced grid slower at 10 of 12 sizes (1600: 373 blocks 0.942x the speed of 396; 2560:
# 512 blocks 0.968x of 528), even at 12288 (1.007x). Every block busy in the last round
# does not make up for fewer blocks keeping bytes in flight in all the others.
BALANCED_GRID = False

# Whether the kernels run the prologue's leading (+ b, 16-bit cast) pairs as 16-bit pair
# adds (`NormalizationRenderer._packed_lead`: the same bits, four instructions an element
# fewer). Measured on (norm_flag_PACKED_HEAD_nvidia-h200_3da0822.json, every output the
# same bits): 1280 1.089x, 1600 1.092x, 2560 1.051x, 5140 1.071x, 16384 1.031x, 1536-4096
# and 20480 1.005-1.012x, but 12288 0.952x (its t512 b3 plan; no cause found).
PACKED_HEAD = True

# Whether x and y are addressed from one pointer a row (``x_row``/``y_row``: the row's
# start plus this thread's first vector, computed once a row) with each batch slot at a
# constant offset from it, rather than each access computing its own 64-bit address from
# the row and the vector index: the same accesses and bits, fewer instructions. Not in
# plans with ``param_cache="global"``, which address the 1-D tensors per slot anyway and
# whose register budget the row pointers overrun (spills at 768, 5140 and 20480).
# Measured on (norm_flag_LEAN_ADDRESSES_nvidia-h200_eaea0d6.json, every output the same
# bits), the heuristic's plans: 1600 1.044x, 1280-1536 1.011x, 16384-20480 1.006-1.009x,
# 768-2560 0.997-1.003x, 4096 0.992x, 5140 0.993x, 12288 0.996x; the row-wise kernel
# t192 b7 x5 at 5140 1.211x (norm_flag_LEAN_ADDRESSES_rowwise_5140_nvidia-h200_add9f1e.json;
# now its pick: 0.904-0.905 of copy in three benches, 0.891-0.897 before), 4096's t128 b4
# x7 1.000x. SASS of 5140's persistent kernel: 768 -> 640 (benchmarks/sass_count.py).
LEAN_ADDRESSES = True

RULES = PlannerRules(deep_below=64 * 1024, one_pass_warps=0, global_params=True, packed_row=True,
                     split_params=True)
RULE_GRID = {"deep_below": (0, 32 * 1024, 48 * 1024, 64 * 1024, 1 << 30),
             "one_pass_warps": (0, 2, 4, 8, 16),
             "global_params": (False, True),
             "l2_hint": L2_HINTS,
             "packed_row": (False, True),
             "bulk_x": (False, True),
             "split_params": (False, True)}


def choose_persistent(plans: list[LaunchPlan], hidden: int, value_bytes: int,
                      rules: PlannerRules | None = None) -> LaunchPlan:
    """The persistent plan the heuristic runs: the first of ``plans`` by these rules in
    order (the note above says where the numbers come from; "1.007x" is a plan's time
    over the best measured at its size):

    0. The plan dimensions of `PlannerRules` (``rules``, default `RULES`): a plan that
       breaks one (a ring depth, a reduction or a tensor placement the rules do not ask
       for) ranks after every plan that keeps them.
    1. Enough bytes of x requested an SM (`bytes_in_flight`, times the rows a prefetch
       keeps ahead, >= 32 KiB): below it DRAM latency is exposed whatever else the plan
       does.
    2. Padding within 20% of the least: idle lanes cost issue slots, not bandwidth, so
       some padding is worth more values a thread (1280: t64 b3, 17% padding, 1.007x,
       where t160 b1 with none pays 1.131x for its 8 values a thread).
    3. Prefetch on: it keeps DRAM busy through the barriers of the reduction and the
       stores (without it, the best plan of every size from 1280 up: 1.02-1.20x).
    4. At least 16 values a thread (`STAGED_MIN_VALUES`): the cp.async copy lands in
       shared memory and every value is read back once, a round trip that a thread
       with 8 values has too little work to hide: every 8-value plan with x staged is
       1.10-1.28x (768-4096).
    5. The prefetch through shared memory (cp.async, ``x_staged``) rather than into
       registers: the next row costs no registers, so the row slice keeps its
       occupancy, and the copy needs no thread to wait on it. Same geometry, staged
       (ring of 2) vs in registers: 1536 1.000x/1.052x, 2560 1.000x/1.064x, 4096
       1.000x/1.031x, 5140 1.000x/1.089x, 12288 1.000x/1.111x.
    6. The 1-D tensors in registers, else staged in shared memory, else through L2
       (`CACHE_ORDER`): in registers they cost no instruction a row; with x staged the
       registers are free for them (4096 t128 b4 with the ring: registers 1.000x,
       shared 1.023x). Shared memory where they do not fit the registers (16384: t512
       x 32 values x 8 bytes a column is 128 registers on top of the row), L2 where
       staging them leaves no room for a prefetch (none at the bench sizes since the
      refitted register estimate; 20480's 160 KiB of tensors sit in shared memory
      beside a prefetch of x into registers).
    7. More bytes of x in flight an SM (`bytes_in_flight` in 4 KiB steps, from the
       blocks the register estimate lets an SM hold): the plans that pass rule 1 still
       differ by up to a third in what they keep queued at DRAM, and the one that keeps
       more wins: 1536 t64 b3 (4 blocks of 128, 24 KiB) 1.000x against t96 b2 (3 of
       192, 18 KiB) 1.094x; 1600 t64 b4 (24 KiB) 1.002x against t128 b2 (20 KiB)
       1.085x; 4096 t128 b4 (24 KiB) 1.000x against t256 b2 (16 KiB) 1.028x and t192
       b3 (18 KiB) 1.054x; 2560 t128 b3 (24 KiB, 17% padding) 1.000x against t160 b2
       (20 KiB, none) 1.107x.
    8. Less padding (to 1%).
    9. With several blocks an SM, smaller blocks: blocks drift out of phase, so one
       block's barriers and stores overlap the others' loads, and a smaller block has
       fewer warps to wait for at each barrier (2560 t128 b3 r1 1.000x against t96 b4
       r2, a 192-thread block with the same 24 KiB in flight, 1.096x; 5140 t192 b7 v4
       against t224 b6, 1.080x). With one block an SM (the longest rows) nothing
       overlaps the block's barriers and its reduction and stores, so the larger block
       wins: the same work spread over more warps finishes each row sooner (12288 t512
       b3 1.000x against t384 b4 1.065x, both one block and 24 KiB a row).
    10. Fewer registers.

    Against the 0344c81 sweep (999 plans, every kernel with the 16-bit pair adds of
    `PACKED_HEAD`; what the sweep test holds the planner to) the picks are within 1.050x
    of the best: 1.000-1.023x but at 1600 1.045, 4096 1.050 (the packed twin, one row
    ahead) and 12288 1.041 (t384 b4, tensors in shared memory, bulk rows); 20480 was
    1.035 until `split_params` staged half the tensors' bytes (now its best plan). Against the f274ee2 sweep (584 plans with the packed row) the picks were
    within 1.021x of the best at every size (768 1.015,
    1024 1.019, 1280 1.020, 1600 1.013, 4096 1.021, 16384 1.012: the packed row, the
    rest 1.000-1.009). Against the 75f9994 sweep (benchmarks/sweep_rules.py) the picks were the best plan or
    within 1%: 1.007x at 1280, 1.000 at 1536, 1.002 at 1600, 1.009 at 2048, 1.000 at
    2560, 4096, 5140, 12288, 1.004 at 16384 (the ring one row deep, `PlannerRules`),
    1.000 at 20480. Rows one warp covers never get here by default: `plan_launch` gives
    them the row-wise kernel (its rule 0: 1.008x at 768, 1.000x at 1024).
    """
    rules = rules or RULES
    staged_fits = any(p.prefetch and p.param_cache != "global" for p in plans)
    registers_fit = any(p.prefetch and p.param_cache == "registers" and not p.packed
                        for p in plans)
    half_staged = max((p.shared_param_bytes for p in plans
                       if 2 * p.shared_param_bytes <= p.param_bytes), default=0)

    def breaks_rules(p: LaunchPlan) -> int:
        broken = 0
        if p.param_cache == "global":
            broken += not (rules.global_params and not staged_fits)
        elif rules.global_params and not staged_fits and p.prefetch:
            broken += 1
        if p.x_staged:
            # judged at one row ahead (a deeper ring may hold fewer blocks an SM)
            one_ahead = bytes_in_flight(dataclasses.replace(p, stages=1), value_bytes) * 2
            deep = 0 < rules.deep_below and one_ahead < rules.deep_below
            broken += p.stages != (2 if deep else 1)
        elif p.stages != 1:
            broken += 1
        if p.warps_per_row > 1 and p.x_staged:
            want = 0 < rules.one_pass_warps <= p.warps_per_row
            broken += p.one_pass != want
        elif p.one_pass:
            broken += 1
        broken += p.packed != (rules.packed_row and p.x_staged and value_bytes == 2
                               and p.param_cache == "registers" and not registers_fit)
        broken += p.x_bulk != (rules.bulk_x and p.x_staged and not p.one_pass
                               and bulk_ok(hidden, p.vector_width, value_bytes))
        if p.param_cache == "global":
            broken += p.shared_param_bytes != (half_staged if rules.split_params else 0)
        return broken

    plans = [p for p in plans if breaks_rules(p) == min(map(breaks_rules, plans))]
    least = min(padding(p, hidden) for p in plans)

    def key(p: LaunchPlan):
        flight = bytes_in_flight(p, value_bytes)
        ahead = flight * ((1 + p.stages) if p.prefetch else 1)
        one_block = p.min_blocks_per_sm == 1
        return (ahead < IN_FLIGHT_TARGET,                                  # rule 1
                padding(p, hidden) > least + MAX_EXTRA_PADDING,            # rule 2
                not p.prefetch,                                            # rule 3
                p.batch * p.vector_width < STAGED_MIN_VALUES,              # rule 4
                not p.x_staged,                                            # rule 5
                CACHE_ORDER.index(p.param_cache),                          # rule 6
                -(flight // FLIGHT_STEP),                                  # rule 7
                round(padding(p, hidden), 2),                              # rule 8
                -p.block_threads if one_block else p.block_threads,        # rule 9
                p.register_estimate)

    best = min(plans, key=key)
    if rules.l2_hint and best.x_staged:
        best = dataclasses.replace(best, l2_hint=rules.l2_hint)
    return best


def hint_variants(plans: list[LaunchPlan], hidden: int, value_bytes: int,
                  base: int = 2) -> list[LaunchPlan]:
    """The plans a sweep times with each `L2_HINTS` hint: the first ``base`` plans of
    ``plans`` by `choose_persistent`'s order that can take one (x staged), not the cross product of every candidate with every hint."""
    fit = [p for p in plans if p.x_staged and not p.l2_hint and not p.x_bulk]
    picked: list[LaunchPlan] = []
    rules = dataclasses.replace(RULES, l2_hint="")
    while fit and len(picked) < base:
        best = choose_persistent(fit, hidden, value_bytes, rules)
        picked.append(best)
        fit = [p for p in fit if p != best]
    return [dataclasses.replace(p, l2_hint=h) for p in picked for h in L2_HINTS if h]


def plan_launch(
    hidden: int,
    vector_width: int,
    value_bytes: int,
    threads_per_row: int | None = None,
    batch: int | None = None,
    rows_per_block: int | None = None,
    param_cache: str | None = None,
    prefetch: bool | None = None,
    param_bytes: int = 0,
    x_staged: bool | None = None,
    bf16: bool = False,
    stages: int | None = None,
    one_pass: bool | None = None,
    l2_hint: str | None = None,
    packed: bool | None = None,
    x_bulk: bool | None = None,
    shared_param_bytes: int | None = None,
    param_sizes: tuple[int, ...] = (),
    blocks_per_sm: int | None = None,
) -> LaunchPlan:
    """Pick the kernel (row-wise or persistent), threads per row, the persistent batch
    and rows per block for ``hidden``.

    Default: the row-wise kernel for rows one warp covers (rule 0, below), else the
    persistent kernel (`choose_persistent`). Its grid is the SMs x resident
    blocks, so no block pays a launch or a tail of its own and the 1-D tensors are read
    once a block rather than once a row: at fp16 the four tensors of the reference
    fusion are twice a row's own traffic, which at 12288+ fell out of L1 and made L2
    bandwidth the limit of the row-wise kernel (0.53-0.65 of copy bandwidth).

    ``param_cache="none"`` pins the row-wise kernel and its rule, from a sweep of every
    candidate plan on an H200 (fp16, 8192 rows, benchmarks/results/
    layer_norm_nvidia-h200.json, "sweep"):

    - Short rows (at most 128 vectors): the fewest threads per row, i.e. the largest
      batch (up to 32 values), several rows to a 128-thread block.
    - Medium rows (one row fits 128 threads x 32 values): a 128-thread block, either
      one row on 128 threads or two rows on 64; least padding, ties to 128 threads.
    - Long rows: least padding, then about 24 values a thread, ties to fewer values.

    We never unroll the row loop on top of the batch: a second row in flight would
    double the registers (the nvFuser spill at 16384); the prefetch holds the next
    row's x packed, half the registers of its fp32 values. The overrides pin a plan.
    """
    if blocks_per_sm is not None:
        # the block promise pinned (`LaunchPlan.blocks_per_sm`) on the plan otherwise chosen
        best = plan_launch(hidden, vector_width, value_bytes, threads_per_row, batch,
                           rows_per_block, param_cache, prefetch, param_bytes, x_staged, bf16,
                           stages, one_pass, l2_hint, packed, x_bulk, shared_param_bytes,
                           param_sizes)
        if (not isinstance(blocks_per_sm, int) or isinstance(blocks_per_sm, bool)
                or not best.sm_holds(blocks_per_sm)):
            smem = best.dynamic_shared_bytes + best.shared_bytes
            raise LoweringError(
                f"normalization plan: blocks_per_sm {blocks_per_sm!r}: expected 1..{MAX_BLOCKS_PER_SM} "
                f"blocks of {best.block_threads} threads and {smem} bytes of shared memory that "
                f"one SM holds ({MAX_THREADS_PER_SM} threads, {SHARED_PER_SM} bytes)")
        return dataclasses.replace(best, blocks_per_sm=blocks_per_sm)
    if param_cache is not None and param_cache not in PARAM_CACHES:
        raise LoweringError(f"normalization plan: param_cache {param_cache!r}: expected one of "
                            f"{list(PARAM_CACHES)}")
    vectors = -(-hidden // vector_width)
    if param_cache == "none" and (prefetch or x_staged):
        raise LoweringError("normalization plan: prefetch needs the persistent kernel "
                            "(param_cache registers or shared)")
    if x_staged and (prefetch is False or vector_width * value_bytes < 4):
        raise LoweringError("normalization plan: x_staged is a prefetch through cp.async, "
                            "which needs prefetch and vectors of 4 bytes or more")
    if stages is not None and not (isinstance(stages, int) and 1 <= stages <= MAX_STAGES):
        raise LoweringError(f"normalization plan: stages {stages!r}: expected 1..{MAX_STAGES}")
    if stages not in (None, 1) and x_staged is False:
        raise LoweringError("normalization plan: stages > 1 is a deeper cp.async ring: it "
                            "needs x_staged")
    if one_pass and param_cache == "none":
        raise LoweringError("normalization plan: one_pass needs the persistent kernel")
    if l2_hint is not None and l2_hint not in L2_HINTS:
        raise LoweringError(f"normalization plan: l2_hint {l2_hint!r}: expected one of {list(L2_HINTS)}")
    if x_bulk and (x_staged is False or not bulk_ok(hidden, vector_width, value_bytes)):
        raise LoweringError("normalization plan: x_bulk copies each row of x whole: it needs "
                            "x_staged, 16-byte vectors and rows a multiple of 16 bytes")
    if packed and (x_staged is False or value_bytes != 2):
        raise LoweringError("normalization plan: packed holds the staged row slice as 16-bit "
                            "values: it needs x_staged and a 16-bit x")
    if l2_hint:
        best = plan_launch(hidden, vector_width, value_bytes, threads_per_row, batch,
                           rows_per_block, param_cache, prefetch, param_bytes, x_staged,
                           bf16, stages, one_pass, None, packed, x_bulk, shared_param_bytes,
                           param_sizes)
        if not best.x_staged or best.x_bulk:
            raise LoweringError(f"normalization plan: l2_hint {l2_hint!r} is a hint on the "
                                "cp.async of x: it needs x_staged")
        return dataclasses.replace(best, l2_hint=l2_hint)
    if threads_per_row is not None or batch is not None:
        t = threads_per_row or _round_up(-(-vectors // batch), WARP)
        b = batch or -(-vectors // t)
        if t % WARP or t > MAX_THREADS_PER_BLOCK or b * t < vectors:
            raise LoweringError(
                f"normalization plan: threads_per_row={t}, batch={b} do not cover "
                f"{vectors} vectors of {vector_width} with warp-multiple threads <= 1024"
            )
        r = rows_per_block or -(-MIN_THREADS_PER_BLOCK // t)
        cache = param_cache or ("registers" if param_bytes else "shared")
        pre = bool(prefetch) if prefetch is not None else cache != "none"
        staged_x = (bool(x_staged) or (stages or 1) > 1) and pre
        if staged_x and vector_width * value_bytes < 4:
            raise LoweringError("normalization plan: x_staged needs vectors of 4 bytes or more")
        depth = (stages or 1) if staged_x else 1
        single = bool(one_pass) and cache != "none"
        if packed and not (staged_x and value_bytes == 2):
            raise LoweringError("normalization plan: packed needs x staged (x_staged) and a "
                                "16-bit x")
        if packed and cache == "global":
            raise LoweringError("normalization plan: packed recomputes the prologue's tail "
                                "from its 1-D tensors in every pass: cache them in registers "
                                "or shared memory, not global")
        pack = bool(packed) and staged_x
        if cache == "none":
            estimate = register_estimate(b * vector_width, vector_width, value_bytes)
        else:
            estimate = persistent_register_estimate(
                b * vector_width, vector_width, value_bytes,
                param_bytes if cache == "registers" else 0, pre, cache != "registers", staged_x,
                bf16, single, pack, t == WARP)
        margin = 8 if cache != "none" else 0  # the persistent kernel keeps min_blocks_per_sm's
        if estimate + margin > _register_budget(t * r):
            raise LoweringError(
                f"normalization plan: {t} threads x {b * vector_width} values needs ~{estimate} "
                f"registers a thread (+{margin} margin), over the {_register_budget(t * r)} a "
                f"{t * r}-thread block may use"
            )
        if x_bulk and not staged_x:
            raise LoweringError("normalization plan: x_bulk needs x staged (x_staged)")
        split = shared_param_bytes or 0
        if split and (cache != "global" or split not in itertools.accumulate(param_sizes[:-1])):
            raise LoweringError(
                f"normalization plan: shared_param_bytes={split} stages the leading 1-D tensors "
                f"of param_cache global: expected a sum of the first tensors' bytes "
                f"{list(itertools.accumulate(param_sizes[:-1]))}")
        plan = LaunchPlan(vector_width, t, b, r, estimate, cache, pre,
                          param_bytes if cache != "none" else 0, staged_x, value_bytes,
                          depth, single, "", pack, bool(x_bulk), split)
        if plan.dynamic_shared_bytes + plan.shared_bytes > SHARED_PER_BLOCK:
            raise LoweringError(
                f"normalization plan: {plan.dynamic_shared_bytes} bytes of staged 1-D tensors "
                f"exceed the {SHARED_PER_BLOCK} bytes of shared memory a block may have")
        return plan
    one_warp = [p for p in candidate_plans(hidden, vector_width, value_bytes)
                if p.threads_per_row == WARP]
    if (param_cache is None and prefetch is None and x_staged is None and stages is None
            and one_pass is None and packed is None and x_bulk is None
            and shared_param_bytes is None and one_warp):
        # Rule 0: a row one warp covers (<= 32 values a thread) runs the row-wise kernel,
        # one warp a row, four rows a block. Neither kernel has a block barrier then;
        # the row-wise kernel re-reads the 1-D tensors every row, but a column's are 8
        # bytes (a few KiB a row) and stay in L1, and it needs the fewest registers:
        # 70 at 768 and 92 at 1024 against 95-152 for the persistent kernel with the
        # tensors or the prefetched row in registers. Measured (the 342d088 sweep):
        # rowwise t32 b3 r4 the best at 768 (0.904 of copy bandwidth; the best
        # persistent plan then, 1.031x), rowwise t32 b4 r4 1.001x at 1024. The 75f9994
        # sweep (the one cited at `choose_persistent`), with the cp.async ring: 1.008x
        # at 768 against the tensors in registers with a ring of two rows of x (the
        # best, 0.910; 105 registers, 4 blocks of 128), 1.000x at 1024 (tied with it).
        best = min(one_warp, key=lambda p: p.batch)
    elif param_cache == "none":
        best = _plan_rowwise(hidden, vector_width, value_bytes)
    else:
        plans = [p for p in persistent_candidates(hidden, vector_width, value_bytes, param_bytes,
                                                  bf16, param_sizes)
                 if param_cache is None or p.param_cache == param_cache]
        if prefetch is not None:
            plans = [p for p in plans if p.prefetch == prefetch]
        if x_staged is not None:
            plans = [p for p in plans if p.x_staged == x_staged]
        if stages is not None:
            plans = [p for p in plans if p.stages == stages]
        if one_pass is not None:
            plans = [p for p in plans if p.one_pass == one_pass]
        if packed is not None:
            plans = [p for p in plans if p.packed == packed]
        if x_bulk is not None:
            plans = [p for p in plans if p.x_bulk == x_bulk]
        if shared_param_bytes is not None:
            plans = [p for p in plans if p.shared_param_bytes == shared_param_bytes]
        if not plans:
            raise LoweringError(
                f"normalization: hidden={hidden} needs more than {MAX_THREADS_PER_BLOCK} threads x "
                f"{MAX_VALUES_PER_THREAD} values per row within the register budget; "
                "not a persistent-kernel size"
            )
        best = choose_persistent(plans, hidden, value_bytes)
    if rows_per_block is not None:
        best = dataclasses.replace(best, rows_per_block=rows_per_block)
    return best


def _plan_rowwise(hidden: int, vector_width: int, value_bytes: int) -> LaunchPlan:
    plans = candidate_plans(hidden, vector_width, value_bytes)
    if not plans:
        raise LoweringError(
            f"normalization: hidden={hidden} needs more than {MAX_THREADS_PER_BLOCK} threads x "
            f"{MAX_VALUES_PER_THREAD} values per row within the register budget; "
            "not a persistent-kernel size"
        )
    vectors = -(-hidden // vector_width)
    block128 = [p for p in plans if p.threads_per_row in (64, 128)]
    if vectors <= MIN_THREADS_PER_BLOCK:
        return min(plans, key=lambda p: p.threads_per_row)
    if block128 and vectors <= MIN_THREADS_PER_BLOCK * max(p.batch for p in block128):
        return min(block128, key=lambda p: (round(padding(p, hidden), 3), -p.threads_per_row))
    least = min(padding(p, hidden) for p in plans)
    near = [p for p in plans if padding(p, hidden) <= least + 0.02]
    return min(near, key=lambda p: (abs(p.batch * vector_width - 24), p.batch))


def _register_budget(block_threads: int) -> int:
    # one block must fit an SM's register file; allocation goes by 8 registers a thread
    return min(MAX_REGISTERS_PER_THREAD, (REGISTERS_PER_SM // block_threads) // 8 * 8)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


# --------------------------------------------------------------------------- spec


@dataclasses.dataclass(frozen=True, slots=True)
class NormalizationSpec:
    """One row-wise normalization fusion over ``x[rows, hidden]``.

    The kernel's arguments, in order: ``x``, one tensor per `AddBroadcast` of the
    prologue, ``weight`` and ``bias`` of the norm (when present), one per `AddBroadcast`
    of the epilogue, the output ``y``, and ``rows`` (int32). `parameter_names` lists
    the tensors. ``alignment`` is the byte alignment every base pointer is known to
    have (torch allocations: 256; a slice: less). The last fourteen fields override the
    heuristic plan (benchmark sweeps, tests): ``param_cache="none"`` is the row-wise
    kernel, ``"registers"``/``"shared"`` the persistent one (see `LaunchPlan`).
    """

    rows: int
    hidden: int
    norm: Union[LayerNorm, RmsNorm]
    input_dtype: str = "float16"
    output_dtype: str = "float16"
    prologue: tuple[PointwiseOp, ...] = ()
    epilogue: tuple[PointwiseOp, ...] = ()
    alignment: int = 16
    threads_per_row: int | None = None
    batch: int | None = None
    rows_per_block: int | None = None
    param_cache: str | None = None
    prefetch: bool | None = None
    x_staged: bool | None = None
    stages: int | None = None
    one_pass: bool | None = None
    l2_hint: str | None = None
    packed: bool | None = None
    x_bulk: bool | None = None
    shared_param_bytes: int | None = None
    vector_width: int | None = None
    blocks_per_sm: int | None = None

    def __post_init__(self):
        for what, n in (("rows", self.rows), ("hidden", self.hidden)):
            if not isinstance(n, int) or n < 1:
                raise LoweringError(f"NormalizationSpec.{what}: expected an int >= 1, got {n!r}")
        if self.rows >= 2**31:
            # row indices are int; element offsets are size_t (row * hidden may pass 2^31)
            raise LoweringError(f"NormalizationSpec.rows: expected < 2**31, got {self.rows}")
        _check_dtype("NormalizationSpec.input_dtype", self.input_dtype, HALF_DTYPES)
        _check_dtype("NormalizationSpec.output_dtype", self.output_dtype, tuple(DTYPE_BYTES))
        if not isinstance(self.norm, (LayerNorm, RmsNorm)):
            raise LoweringError(
                f"NormalizationSpec.norm: expected LayerNorm or RmsNorm, got {type(self.norm).__name__}"
            )
        for where in ("prologue", "epilogue"):
            ops = getattr(self, where)
            if not isinstance(ops, tuple):
                raise LoweringError(f"NormalizationSpec.{where}: expected a tuple of ops, got {type(ops).__name__}")
            for op in ops:
                if not isinstance(op, (AddBroadcast, Cast)):
                    raise LoweringError(
                        f"NormalizationSpec.{where}: expected AddBroadcast or Cast, got {op!r}"
                    )
        names = self.parameter_names()
        if len(set(names)) != len(names):
            raise LoweringError(f"NormalizationSpec: parameter names repeat: {names}")
        if self.alignment < 1 or self.alignment & (self.alignment - 1):
            raise LoweringError(f"NormalizationSpec.alignment: expected a power of two, got {self.alignment}")
        self.plan  # noqa: B018 -- validate the launch plan now, not at first launch

    # -- what the kernel reads and writes

    def parameter_names(self) -> tuple[str, ...]:
        """Names of the tensors the kernel takes, in argument order (``rows`` follows)."""
        names = ["x"]
        names += [op.name for op in self.prologue if isinstance(op, AddBroadcast)]
        if self.norm.weight:
            names.append("weight")
        if isinstance(self.norm, LayerNorm) and self.norm.bias:
            names.append("bias")
        names += [op.name for op in self.epilogue if isinstance(op, AddBroadcast)]
        names.append("y")
        return tuple(names)

    def parameter_dtypes(self) -> tuple[str, ...]:
        dtypes = [self.input_dtype]
        dtypes += [op.dtype for op in self.prologue if isinstance(op, AddBroadcast)]
        if self.norm.weight:
            dtypes.append(self.norm.weight_dtype)
        if isinstance(self.norm, LayerNorm) and self.norm.bias:
            dtypes.append(self.norm.bias_dtype)
        dtypes += [op.dtype for op in self.epilogue if isinstance(op, AddBroadcast)]
        dtypes.append(self.output_dtype)
        return tuple(dtypes)

    def bytes_moved(self) -> int:
        """Bytes the fusion must read and write once: x, y and each 1-D tensor."""
        dtypes = self.parameter_dtypes()
        big = (DTYPE_BYTES[dtypes[0]] + DTYPE_BYTES[dtypes[-1]]) * self.rows * self.hidden
        return big + sum(DTYPE_BYTES[d] for d in dtypes[1:-1]) * self.hidden

    @property
    def plan(self) -> LaunchPlan:
        return _plan_of(self)

    def _make_plan(self) -> LaunchPlan:
        dtypes = self.parameter_dtypes()
        width = vector_width_for(self.hidden, tuple(DTYPE_BYTES[d] for d in dtypes), self.alignment)
        if self.vector_width is not None:
            # narrower vectors than the widest: every row still starts aligned to them
            if self.vector_width not in (1, 2, 4, 8) or self.vector_width > width:
                raise LoweringError(
                    f"NormalizationSpec.vector_width: expected a power of two up to {width} "
                    f"(the widest these rows and this alignment allow), got {self.vector_width!r}")
            width = self.vector_width
        return plan_launch(
            self.hidden,
            width,
            value_bytes=DTYPE_BYTES[self.input_dtype],
            threads_per_row=self.threads_per_row,
            batch=self.batch,
            rows_per_block=self.rows_per_block,
            param_cache=self.param_cache,
            prefetch=self.prefetch,
            param_bytes=sum(DTYPE_BYTES[d] for d in dtypes[1:-1]),
            x_staged=self.x_staged,
            bf16="bfloat16" in dtypes,
            stages=self.stages,
            one_pass=self.one_pass,
            l2_hint=self.l2_hint,
            packed=self.packed,
            x_bulk=self.x_bulk,
            shared_param_bytes=self.shared_param_bytes,
            param_sizes=tuple(DTYPE_BYTES[d] for d in dtypes[1:-1]),
            blocks_per_sm=self.blocks_per_sm,
        )

    @property
    def kernel_name(self) -> str:
        digest = hashlib.sha1(repr(dataclasses.replace(self, rows=1)).encode()).hexdigest()[:10]
        kind = "layer_norm" if isinstance(self.norm, LayerNorm) else "rms_norm"
        return f"hostir_{kind}_{self.hidden}_{digest}"

    # -- the common fusions

    @staticmethod
    def reference_fusion(rows: int, hidden: int, eps: float = 1e-5, dtype: str = "float16", **kw):
        """``t9 = half(x + b0); t13 = float(t9) + b1; y = half(layer_norm(t13) * w + b2)``."""
        return NormalizationSpec(
            rows,
            hidden,
            LayerNorm(eps, weight_dtype=dtype, bias_dtype=dtype),
            input_dtype=dtype,
            output_dtype=dtype,
            prologue=(AddBroadcast(dtype, "b0"), Cast(dtype), AddBroadcast(dtype, "b1")),
            **kw,
        )

    @staticmethod
    def layer_norm(rows: int, hidden: int, eps: float = 1e-5, dtype: str = "float16", **kw):
        return NormalizationSpec(
            rows, hidden, LayerNorm(eps, weight_dtype=dtype, bias_dtype=dtype),
            input_dtype=dtype, output_dtype=dtype, **kw,
        )

    @staticmethod
    def rms_norm(rows: int, hidden: int, eps: float = 1e-6, dtype: str = "float16", **kw):
        return NormalizationSpec(
            rows, hidden, RmsNorm(eps, weight_dtype=dtype),
            input_dtype=dtype, output_dtype=dtype, **kw,
        )


# The fields of NormalizationSpec that pin its plan (the rest say what it computes).
PLAN_FIELDS = ("threads_per_row", "batch", "rows_per_block", "param_cache", "prefetch",
               "x_staged", "stages", "one_pass", "l2_hint", "packed", "x_bulk",
               "shared_param_bytes", "vector_width", "blocks_per_sm")


def spec_with_plan(spec: NormalizationSpec, plan: LaunchPlan) -> NormalizationSpec:
    """``spec`` with every plan field pinned to ``plan`` (a plan of the same row)."""
    return dataclasses.replace(
        spec, threads_per_row=plan.threads_per_row, batch=plan.batch,
        rows_per_block=plan.rows_per_block, param_cache=plan.param_cache,
        prefetch=plan.prefetch if plan.persistent else None, x_staged=plan.x_staged or None,
        stages=plan.stages if plan.x_staged else None, one_pass=plan.one_pass or None,
        l2_hint=plan.l2_hint or None, packed=plan.packed or None, x_bulk=plan.x_bulk or None,
        shared_param_bytes=plan.shared_param_bytes or None, vector_width=plan.vector_width,
        blocks_per_sm=plan.blocks_per_sm or None)


def tune_plans(spec: NormalizationSpec, geometries: int = 2) -> list[LaunchPlan]:
    """The plans the autotuner (`runtime.normalization.tune`) times for ``spec``, the
    heuristic's pick first, then:

    - its twins: every persistent plan of the same row geometry (threads, batch, rows a
      block) and the same home for the 1-D tensors (registers when the pick is the
      row-wise kernel), which differ in the ring of x (in registers; one or two rows
      ahead), the packed row and the bulk copy. Timed side by side these beat the pick
      by 1-3% at 1024, 1600, 2048 and 4096 (benchmarks/results/
      norm_plan_probe_nvidia-h200.json). Not the L2 hints on x: at 5140 the
      evict-first twin won the tuner's round by 1.1% and lost the bench's by 1.4%, in
      two runs each (raw/layer_norm_tune_1a2ff58.log, layer_norm_tune_6981e1d.log), a
      difference that follows where the buffers were allocated, not the plan;
    - for the next ``geometries`` row geometries in the heuristic's order, its pick
      with the tensors in each home (registers, shared memory, L2), and that pick's
      bulk-copy and packed twins: at 12288 the fastest plan side by side was t384 with
      the tensors in shared memory and x by bulk copies (0.903 of copy), where the
      heuristic takes t512 with them in registers (0.885; norm_plan_probe);
    - the row-wise kernel, its heuristic's plan and every other row geometry of it
      (`candidate_plans`): with dependent launches (`runtime.normalization.
      dependent_launch`) the row-wise kernel won the tuner's rounds at 2048 and 4096
      (t128, raw/layer_norm_tune_run1_a77468d.log), where only its heuristic's plan was
      a candidate (and with vectors half as wide, below, too);
    - with vectors half as wide (8 bytes at least), the heuristic's pick and its twins:
      more vectors a thread, less padding (1280: none on t64 b5 against 17% on t64 b3).
      Side by side these were 2-4.6% faster than the heuristic's 16-byte plan at 1280,
      1536, 1600, 2560 and 4096 (norm_vector_probe_nvidia-h200.json).

    Never the one-pass reduction (1.16-2.7x its twin, `PlannerRules`). Nor, with the
    tensors in registers, the leading ones staged in shared memory instead to hold one
    more block an SM (tried at ce6180d, tuned side by side at 1280-5140: every such twin
    slower than its all-registers plan; 5140, t192 b7 with two or three of the four
    tensors staged, three blocks an SM: 52.3-53.0 us against 46.2 us with two blocks;
    raw/layer_norm_tune_hybrid_ce6180d.log).
    """
    chosen = spec.plan
    dtypes = spec.parameter_dtypes()
    value_bytes = DTYPE_BYTES[spec.input_dtype]
    sizes = tuple(DTYPE_BYTES[d] for d in dtypes[1:-1])
    plans = [p for p in persistent_candidates(spec.hidden, chosen.vector_width, value_bytes,
                                              sum(sizes), "bfloat16" in dtypes, sizes)
             if not p.one_pass]

    def geometry(p: LaunchPlan):
        return (p.threads_per_row, p.batch, p.rows_per_block)

    def twins(pick: LaunchPlan, family: list[LaunchPlan]) -> list[LaunchPlan]:
        home = pick.param_cache if pick.persistent else "registers"
        return [p for p in family if geometry(p) == geometry(pick) and p.param_cache == home]

    out = [chosen, *twins(chosen, plans)]
    rest = [p for p in plans if geometry(p) != geometry(chosen)]
    for _ in range(geometries):
        if not rest:
            break
        g = geometry(choose_persistent(rest, spec.hidden, value_bytes))
        same = [p for p in rest if geometry(p) == g]
        for cache in CACHE_ORDER:
            home = [p for p in same if p.param_cache == cache]
            if home:
                pick = choose_persistent(home, spec.hidden, value_bytes)
                # and its bulk-copy and packed twins at its ring depth
                out += [pick, *(p for p in home if p.stages == pick.stages
                                and p.prefetch == pick.prefetch and p.x_staged == pick.x_staged
                                and (p.x_bulk, p.packed) != (pick.x_bulk, pick.packed))]
        rest = [p for p in rest if geometry(p) != g]
    # the row-wise kernel at the spec's vectors (a pinned width stays): its heuristic's
    # plan, then its other row geometries
    unpinned = {f: None for f in PLAN_FIELDS if f != "vector_width"}
    out.append(chosen if not chosen.persistent
               else dataclasses.replace(spec, **{**unpinned, "param_cache": "none"}).plan)
    out += [dataclasses.replace(p, param_cache="none")
            for p in candidate_plans(spec.hidden, chosen.vector_width, value_bytes)]
    half = chosen.vector_width // 2
    narrow_pick = None
    if half * value_bytes >= 8:
        narrow = dataclasses.replace(spec, vector_width=half)
        try:
            narrow_pick = narrow.plan
        except LoweringError:
            narrow_pick = None
        if narrow_pick is not None:
            out += [narrow_pick, *twins(narrow_pick, [
                p for p in persistent_candidates(spec.hidden, half, value_bytes, sum(sizes),
                                                 "bfloat16" in dtypes, sizes)
                if not p.one_pass])]
            out += [dataclasses.replace(p, param_cache="none")
                    for p in candidate_plans(spec.hidden, half, value_bytes)]
    # a higher block promise (`LaunchPlan.blocks_per_sm`) on the heuristic's pick, the
    # half-width one and the row-wise geometries: the register estimate leaves a margin,
    # and where ptxas fits the kernel in fewer registers an SM holds more blocks (the
    # tuner drops the twins that spill)
    promised = [chosen] + ([narrow_pick] if narrow_pick is not None else [])
    promised += [p for p in out if not p.persistent and p.vector_width == chosen.vector_width]
    for p in promised:
        for extra in range(1, PROMISE_STEPS + 1):
            blocks = p.min_blocks_per_sm + extra
            if not p.sm_holds(blocks):
                break
            out.append(dataclasses.replace(p, blocks_per_sm=blocks))
    unique: list[LaunchPlan] = []
    for p in out:
        if p not in unique:
            unique.append(p)
    return unique


# How many more blocks an SM than its estimate gives `tune_plans` promises a plan: the
# row-wise kernel at 4096 (t128 b4) fits 9 blocks without spills where it promises 4.
PROMISE_STEPS = 5


@functools.lru_cache(maxsize=4096)
def _plan_of(spec: NormalizationSpec) -> LaunchPlan:
    # specs are frozen and hashable: each plan is worked out once per process
    return spec._make_plan()


# --------------------------------------------------------------------------- render

# The shared renderer's names for our dtypes: its "convert" snippet carries 16-bit floats
# as raw bits and converts them with one PTX instruction (no headers, see render.py).
_SHORT = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
CUDA_TYPES = {d: render.C_TYPES[s] for d, s in _SHORT.items()}
TO_FLOAT = {d: render.TO_FLOAT[s] + "({})" for d, s in _SHORT.items()}
FROM_FLOAT = {d: render.FROM_FLOAT[s] + "({})" for d, s in _SHORT.items()}

# This kernel's own snippets, one table, filled by NormalizationRenderer below.

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
    # LEAN_ADDRESSES: slot i at a constant offset from the row's pointers
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


class NormalizationRenderer:
    """Fills `SNIPPETS` for one spec; the only place that knows the kernel's text."""

    def __init__(self, spec: NormalizationSpec):
        self.spec = spec
        self.plan = spec.plan
        self.out: list[str] = []

    @property
    def lean(self) -> bool:
        """Whether x and y are addressed from per-row pointers (`LEAN_ADDRESSES`)."""
        return LEAN_ADDRESSES and self.plan.param_cache != "global"

    def emit(self, key: str, **fields) -> None:
        self.out.append(SNIPPETS[key].format(**fields))

    def _row_sum_and_params(self) -> list[str]:
        """Emit the row-sum helper the plan needs; the kernel's parameter declarations."""
        s, p = self.spec, self.plan
        if p.warps_per_row == 1:
            self.emit("row_sum_warp")
        else:
            self.emit("row_sum_block", threads_per_row=p.threads_per_row, warps_per_row=p.warps_per_row)
        names, dtypes = s.parameter_names(), s.parameter_dtypes()
        # in_/out_/v_ prefixes keep tensor names apart from the kernel's own locals
        params = [f"const {CUDA_TYPES[d]}* __restrict__ in_{n}" for n, d in zip(names[:-1], dtypes[:-1])]
        params.append(f"{CUDA_TYPES[dtypes[-1]]}* __restrict__ out_y")
        return params

    def render(self) -> str:
        s, p = self.spec, self.plan
        params = self._row_sum_and_params()
        shared = ""
        if p.warps_per_row > 1:
            # Two buffers, one per reduction: the variance's partials may be written while
            # a slower warp still reads the mean's, and the next row's mean only after
            # every warp has passed the variance barrier, so no third barrier is needed.
            shared = f"__shared__ float partials[2][{p.rows_per_block}][{p.warps_per_row}];"
        vectors = -(-s.hidden // p.vector_width)
        self.emit(
            "kernel_open", name=s.kernel_name, params=", ".join(params), block_threads=p.block_threads,
            min_blocks=p.min_blocks_per_sm,
            vec=p.vector_width, batch=p.batch, threads_per_row=p.threads_per_row,
            rows_per_block=p.rows_per_block, hidden=s.hidden, vectors=vectors,
            full_batches=vectors // p.threads_per_row, shared=shared,
            row_pointers=(SNIPPETS["x_row"].format(t=CUDA_TYPES[s.input_dtype])
                          + SNIPPETS["y_row"].format(t=CUDA_TYPES[s.output_dtype])
                          if self.lean else ""),
        )
        self._load_and_prologue()
        self._statistics()
        self._normalize_and_store()
        self.emit("kernel_close")
        # __launch_bounds__ carries a min-blocks count here (see LaunchPlan), so the
        # signature is our snippet, not Renderer.kernel's.
        return render.Renderer().source(["convert"], SNIPPETS["preamble"].format(),
                                        "#define VAL(i, e) v[i][e]\n", "".join(self.out))

    def _packed_lead(self) -> int:
        """How many leading (AddBroadcast, Cast) pairs of the prologue run on 16-bit
        pairs (`PACKED_HEAD`): each adds a tensor of x's 16-bit dtype and casts back to
        it, so the 16-bit add gives the same bits; x in 16 bits, two lanes at least."""
        s = self.spec
        if not PACKED_HEAD or DTYPE_BYTES[s.input_dtype] != 2 or self.plan.vector_width < 2:
            return 0
        ops, lead = s.prologue, 0
        while (2 * lead + 1 < len(ops) and isinstance(ops[2 * lead], AddBroadcast)
               and isinstance(ops[2 * lead + 1], Cast)
               and ops[2 * lead].dtype == ops[2 * lead + 1].dtype == s.input_dtype):
            lead += 1
        return lead

    def _packed_head(self, x: str) -> tuple[int, str]:
        """Emit the `_packed_lead` pairs as 16-bit pair adds on ``h``, a copy of the
        vector ``x`` (padded slots: 0 + 0); (the pairs done, what holds x after them)."""
        s = self.spec
        lead = self._packed_lead()
        if not lead:
            return 0, x
        self.out.append(f"      Vec<{CUDA_TYPES[s.input_dtype]}, kVec> h = {x};\n")
        for op in s.prologue[:2 * lead:2]:
            self.out.append(f"      add2_{_SHORT[s.input_dtype]}(h.raw, v_{op.name}.raw);\n")
        return lead, "h"

    def _load_and_prologue(self) -> None:
        s = self.spec
        self.emit("batch_loop_open")
        self.emit("load_x_lean" if self.lean else "load_x", t=CUDA_TYPES[s.input_dtype])
        adds = [op for op in s.prologue if isinstance(op, AddBroadcast)]
        for op in adds:
            self.emit("load_param", t=CUDA_TYPES[op.dtype], name=op.name)
        lead, x = self._packed_head("v_x")
        self.emit("element_loop_open")
        self.emit("first_value", value=TO_FLOAT[s.input_dtype].format(x + ".e[e]"))
        for op in s.prologue[2 * lead:]:
            self._pointwise(op, guard="ok")
        self.emit("keep")
        self.emit("loop_close")
        self.emit("batch_loop_close")

    def _pointwise(self, op: PointwiseOp, guard: str | None = None) -> None:
        if isinstance(op, AddBroadcast):
            value = TO_FLOAT[op.dtype].format(f"v_{op.name}.e[e]")
            # padded slots must stay exactly 0 for the sums: add only where loaded
            self.emit("add", value=f"({guard} ? {value} : 0.f)" if guard else value)
        else:
            self.emit("cast", value=TO_FLOAT[op.dtype].format(FROM_FLOAT[op.dtype].format("a")))

    def _statistics(self) -> None:
        s, p = self.spec, self.plan
        part = ["partials[0][row_in_block]", "partials[1][row_in_block]"] if p.warps_per_row > 1 else ["nullptr", "nullptr"]
        self.emit("sum_open")
        eps = repr(float(s.norm.eps))
        if isinstance(s.norm, LayerNorm):
            self.emit("sum_value")
            self.emit(
                "layer_norm_stats", partials0=part[0], partials1=part[1], eps=eps,
                sum_centered=SNIPPETS["sum_centered"].format(),
            )
        else:
            self.emit("sum_squares")
            self.emit("rms_norm_stats", partials0=part[0], eps=eps)

    def _normalize_and_store_tail(self) -> None:
        """Per element: normalize, weight, bias, the epilogue ops, then store the vector
        (the 1-D tensors' vectors ``v_<name>`` are in scope, however they were loaded)."""
        s = self.spec
        self.emit("out_decl", t=CUDA_TYPES[s.output_dtype])
        self.emit("element_loop_open")
        self.emit("normalize")
        if s.norm.weight:
            self.emit("mul", value=TO_FLOAT[s.norm.weight_dtype].format("v_weight.e[e]"))
        if isinstance(s.norm, LayerNorm) and s.norm.bias:
            self.emit("add", value=TO_FLOAT[s.norm.bias_dtype].format("v_bias.e[e]"))
        for op in s.epilogue:
            self._pointwise(op)
        self.emit("out_assign", value=FROM_FLOAT[s.output_dtype].format("a"))
        self.emit("loop_close")
        self.emit("store_y_lean" if self.lean else "store_y", t=CUDA_TYPES[s.output_dtype])
        self.emit("batch_loop_close")

    def _normalize_and_store(self) -> None:
        s = self.spec
        # weight, bias and epilogue tensors are read here, after the reductions, so they
        # do not hold registers across them; they are small and stay in L1/L2.
        loads = []
        if s.norm.weight:
            loads.append(("weight", s.norm.weight_dtype))
        if isinstance(s.norm, LayerNorm) and s.norm.bias:
            loads.append(("bias", s.norm.bias_dtype))
        loads += [(op.name, op.dtype) for op in s.epilogue if isinstance(op, AddBroadcast)]
        self.emit("store_x_loop_open")
        for name, dtype in loads:
            self.emit("load_param", t=CUDA_TYPES[dtype], name=name)
        self._normalize_and_store_tail()


# The loops of load_row_t and stage_row_t (PersistentRenderer), by LEAN_ADDRESSES. Lean:
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


class PersistentRenderer(NormalizationRenderer):
    """The persistent kernel (``plan.param_cache`` registers or shared): grid-stride over
    groups of rows, 1-D tensors loaded once per thread (registers) or block (shared)
    before the row loop, the next row's x prefetched before the current one is reduced.
    Statistics and reductions are the row-wise kernel's snippets."""

    def render(self) -> str:
        s, p = self.spec, self.plan
        params = self._row_sum_and_params()
        names, dtypes = s.parameter_names(), s.parameter_dtypes()
        self.tensors = dict(zip(names[1:-1], dtypes[1:-1]))  # the 1-D tensors
        vectors = -(-s.hidden // p.vector_width)
        tx = CUDA_TYPES[s.input_dtype]
        out = self.out
        out.append(f"""\
extern "C" __global__ void __launch_bounds__({p.block_threads}, {p.min_blocks_per_sm})
{s.kernel_name}({", ".join(params)}, const int rows) {{
  dependent_launch_entry();
  constexpr int kVec = {p.vector_width}, kBatch = {p.batch}, kThreadsPerRow = {p.threads_per_row};
  constexpr int kRowsPerBlock = {p.rows_per_block}, kHidden = {s.hidden};
  constexpr int kVectors = {vectors};      // vectors in a row
  constexpr int kFullBatches = {vectors // p.threads_per_row};  // batch slots every thread fills
  const int lane = threadIdx.x % kThreadsPerRow;
  const int row_in_block = threadIdx.x / kThreadsPerRow;
  const int groups = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
""")
        if p.warps_per_row > 1 and self._one_barrier():
            # one barrier a row (rms_norm, or the one-pass layer norm): the buffer
            # alternates with the parity of the row, so a warp writing row n+2's partials
            # has passed row n+1's barrier, which every warp reaches only after reading
            # row n's (with one buffer a fast warp would overwrite what a slow one reads)
            triple = "[3]" if p.one_pass and isinstance(s.norm, LayerNorm) else ""
            out.append(f"  __shared__ float partials[2][{p.rows_per_block}][{p.warps_per_row}]{triple};\n"
                       "  int parity = 0;\n")
        elif p.warps_per_row > 1:
            # as in the row-wise kernel: two buffers, so no third barrier a row
            out.append(f"  __shared__ float partials[2][{p.rows_per_block}][{p.warps_per_row}];\n")
        self._cache_params()
        # x of the block's first row; in the loop, the next row's is issued before the
        # current row is reduced (prefetch), or each row's at the top of the loop.
        out.append(f"  Vec<{tx}, kVec> xr[kBatch];\n")
        if p.x_staged:
            out.append(f"""\
  // x through shared memory: a ring of kStages + 1 buffers for each row of the block,
  // one being read while the copies of the next kStages rows land in the others (one
  // cp.async group a row, so waiting for all but the newest kStages - 1 groups is
  // waiting for the current row)
  constexpr int kStages = {p.stages}, kSlotsPerRow = kThreadsPerRow * kBatch;
  Vec<{tx}, kVec>* s_xbuf = reinterpret_cast<Vec<{tx}, kVec>*>(staged + {self.x_offset})
                         + row_in_block * (kStages + 1) * kSlotsPerRow;
  int buf = 0;
""")
            if p.x_bulk:
                out.append(f"""  // x_bulk: each row by one bulk copy that the row's first thread issues; buffer b's
  // mbarrier completes a phase when its row landed. The block's n-th row (n from 0) is
  // in buffer n % (kStages + 1), on that buffer's phase n / (kStages + 1).
  constexpr unsigned kRowBytes = kHidden * sizeof({tx});
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
""")
            else:
                out.append("""#pragma unroll
  for (int k = 0; k < kStages; ++k)
    stage_row(s_xbuf + k * kSlotsPerRow, in_x,
              (blockIdx.x + k * gridDim.x) * kRowsPerBlock + row_in_block, rows, lane);
""")
        elif p.prefetch:
            out.append("  load_row(xr, in_x, blockIdx.x * kRowsPerBlock + row_in_block, rows, lane);\n")
        out.append("""\
  // The row loop: grid-stride, no unroll (a second row's fp32 values would double the
  // registers; the prefetch holds only the next row's packed x).
#pragma unroll 1
  for (int group = blockIdx.x; group < groups; group += gridDim.x) {
    const int row = group * kRowsPerBlock + row_in_block;
    // Rows past the end still join the barriers of the reduction; they only skip memory.
    const bool row_ok = row < rows;
    const size_t row_base = (size_t)row * kHidden;
""")
        if self.lean:
            out.append(SNIPPETS["y_row"].format(t=CUDA_TYPES[s.output_dtype]))
        if p.param_cache == "registers" and self.tensors:
            out.append("#pragma unroll\n    for (int i = 0; i < kBatch; ++i) {\n")
            for name in self.tensors:
                out.append(f"      opaque(c_{name}[i].raw);\n")
            out.append("    }\n")
        elif self.tensors:
            out.append("    int slot = lane;\n    opaque(slot);\n")
        if not p.prefetch:
            out.append("    load_row(xr, in_x, row, rows, lane);\n")
        if p.x_staged and p.x_bulk:
            # the whole row's copy: wait for its buffer's phase; the buffer read one row
            # ago takes the row kStages ahead, issued by the row's first thread once every
            # thread of the row has read it (the last row's reduction barriers)
            out.append("""\
    bulk_wait(&xbar[row_in_block][buf], (nrow / (kStages + 1)) & 1);
#pragma unroll
    for (int i = 0; i < kBatch; ++i) xr[i] = s_xbuf[buf * kSlotsPerRow + i * kThreadsPerRow + lane];
    const int ahead = buf == 0 ? kStages : buf - 1;
    buf = buf == kStages ? 0 : buf + 1;
    ++nrow;
    if (lane == 0) {
      const int r = (group + kStages * gridDim.x) * kRowsPerBlock + row_in_block;
      bulk_row(s_xbuf + ahead * kSlotsPerRow, in_x + (size_t)r * kHidden, kRowBytes,
               &xbar[row_in_block][ahead], r < rows);
    }
""")
        elif p.x_staged:
            # this thread's own copies: waiting for its group is enough, no barrier
            out.append("""\
    cp_async_wait_group<kStages - 1>();
#pragma unroll
    for (int i = 0; i < kBatch; ++i) xr[i] = s_xbuf[buf * kSlotsPerRow + i * kThreadsPerRow + lane];
    // the buffer read one row ago (this thread's own slots, read into registers then)
    // takes the row kStages ahead
    const int ahead = buf == 0 ? kStages : buf - 1;
    buf = buf == kStages ? 0 : buf + 1;
    stage_row(s_xbuf + ahead * kSlotsPerRow, in_x,
              (group + kStages * gridDim.x) * kRowsPerBlock + row_in_block, rows, lane);
""")
        if p.packed:
            out.append(f"    Vec<{CUDA_TYPES[self._carrier()]}, kVec> pv[kBatch];\n")
        else:
            out.append("    float v[kBatch][kVec];\n")
        self._prologue()
        if p.prefetch and not p.x_staged:
            out.append("    load_row(xr, in_x, (group + gridDim.x) * kRowsPerBlock + row_in_block, rows, lane);\n")
        self._statistics()
        self._store()
        out.append("  }\n")
        if p.x_staged and not p.x_bulk:
            out.append("  cp_async_wait_all();  // no copy outlives the block (the last one only zero-fills)\n")
        out.append("}\n")
        load_row_body, stage_row_body = ROW_COPY_BODIES[self.lean]
        helper = f"""\
// One row's x slice into packed registers, streaming (__ldcs: read once); slots past the
// row or rows past the end read nothing and hold 0.
template <typename T, int kVec, int kBatch, int kThreadsPerRow, int kVectors, int kFullBatches>
__device__ __forceinline__ void load_row_t(Vec<T, kVec> (&xr)[kBatch], const T* __restrict__ x,
                                         int row, int rows, int lane, int hidden) {{
{load_row_body}
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
  load_row_t<{tx}, kVec, kBatch, kThreadsPerRow, kVectors, kFullBatches>(xr, x, row, rows, lane, kHidden)
"""
        if p.param_cache == "global":
            helper += """\
// A vector of a 1-D tensor through the read-only path (L1, then L2); 0 where !ok.
template <typename T, int kVec>
__device__ __forceinline__ Vec<T, kVec> ldg_vec(const T* __restrict__ p, int vec, bool ok) {
  Vec<T, kVec> r;
  r.raw = {};
  if (ok) r.raw = __ldg(&(reinterpret_cast<const Vec<T, kVec>*>(p) + vec)->raw);
  return r;
}
"""
        if p.one_pass and isinstance(s.norm, LayerNorm):
            helper += self._row_stats_helper()
        if p.x_staged:
            # .cg (L2 only) takes 16 bytes; narrower copies go .ca. The hint is the same.
            level = {"": "", "evict_first": ".L2::cache_hint", "prefetch_256b": ".L2::256B"}[p.l2_hint]
            policy = ""
            if p.l2_hint == "evict_first":
                # x is read once: its lines are the first the L2 evicts
                policy = ('  unsigned long long policy;\n'
                          '  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\\n" : "=l"(policy));\n')
            pol_arg, pol_op = (', %3', ', "l"(policy)') if p.l2_hint == "evict_first" else ("", "")
            pol_arg_ca = ', %4' if p.l2_hint == "evict_first" else ""
            cp16 = (f'    asm volatile("cp.async.cg.shared.global{level} [%0], [%1], 16, %2{pol_arg};\\n" '
                    f':: "r"(d), "l"(src), "r"(n){pol_op} : "memory");')
            cpn = (f'    asm volatile("cp.async.ca.shared.global{level} [%0], [%1], %2, %3{pol_arg_ca};\\n" '
                   f':: "r"(d), "l"(src), "n"(Bytes), "r"(n){pol_op} : "memory");')
            helper += f"""\
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
{stage_row_body}
  asm volatile("cp.async.commit_group;\\n" ::: "memory");
}}
#define stage_row(buf, x, row, rows, lane) \\
  stage_row_t<{tx}, kVec, kBatch, kThreadsPerRow, kVectors, kFullBatches>(buf, x, row, rows, lane, kHidden)
"""
        if p.x_bulk:
            helper += """\
// x_bulk (PTX ISA: cp.async.bulk, mbarrier): one row of x, `bytes` long, into a shared
// buffer by the TMA engine, completing its bytes on mbarrier `bar` (expected first);
// a row past the end copies nothing and only arrives, so the phase still completes.
__device__ __forceinline__ void bulk_bar_init(unsigned long long* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\\n"
               :: "r"((unsigned)__cvta_generic_to_shared(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");
}
__device__ __forceinline__ void bulk_row(void* dst, const void* src, unsigned bytes,
                                         unsigned long long* bar, bool ok) {
  const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
  if (!ok) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\\n" :: "r"(b) : "memory");
    return;
  }
  // the buffer was last read by ordinary loads: order them before the async-proxy write
  asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n"
               :: "r"(b), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1], %2, [%3];\\n"
               :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "r"(bytes), "r"(b)
               : "memory");
}
__device__ __forceinline__ void bulk_wait(unsigned long long* bar, unsigned parity) {
  asm volatile("{\\n.reg .pred done;\\nWAIT:\\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\\n"
               "@!done bra WAIT;\\n}\\n"
               :: "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(parity) : "memory");
}
"""
        return render.Renderer().source(["convert"], SNIPPETS["preamble"].format(), helper,
                                        self._value_macro(), "".join(self.out))

    def _split_prologue(self):
        """(head, tail) of the prologue at its last cast to a 16-bit type (``packed``: the
        head's result is held in 16 bits, the tail recomputed in every pass)."""
        ops = self.spec.prologue
        last = max((k for k, op in enumerate(ops) if isinstance(op, Cast)
                    and DTYPE_BYTES[op.dtype] == 2), default=-1)
        return ops[:last + 1], ops[last + 1:]

    def _carrier(self) -> str:
        """The 16-bit dtype the packed row slice holds: the last cast's, else x's."""
        head, _ = self._split_prologue()
        return head[-1].dtype if head else self.spec.input_dtype

    def _value_macro(self) -> str:
        """``VAL(i, e)``, the fp32 value of slot (i, e) of the row slice the statistics and
        the normalization read: the fp32 array, or (``packed``) the 16-bit value with the
        prologue's tail ops applied again (their tensors are in scope: registers, shared
        memory)."""
        if not self.plan.packed:
            return "#define VAL(i, e) v[i][e]\n"
        _, tail = self._split_prologue()
        expr = TO_FLOAT[self._carrier()].format("pv[i].e[e]")
        for op in tail:
            if isinstance(op, AddBroadcast):
                vec = self._param(op.name, "(i)")
                expr = f"({expr} + {TO_FLOAT[op.dtype].format(f'{vec}.e[e]')})"
            else:
                expr = TO_FLOAT[op.dtype].format(FROM_FLOAT[op.dtype].format(expr))
        return f"#define VAL(i, e) {expr}\n"

    def _one_barrier(self) -> bool:
        return self.plan.one_pass or not isinstance(self.spec.norm, LayerNorm)

    def _statistics(self) -> None:
        s, p, out = self.spec, self.plan, self.out
        if p.warps_per_row > 1 and self._one_barrier():
            parts = "partials[parity][row_in_block]"
            flip = "    parity ^= 1;\n"
        else:
            parts, flip = "nullptr", ""
        if not (p.one_pass and isinstance(s.norm, LayerNorm)):
            if flip:  # rms_norm: its one reduction, on the buffer of this row's parity
                self.emit("sum_open")
                self.emit("sum_squares")
                self.emit("rms_norm_stats", partials0=parts, eps=repr(float(s.norm.eps)))
                out.append(flip)
            else:
                super()._statistics()
            return
        # One pass: this thread's slice exactly (count, mean, then the squares about that
        # mean, all in registers), then the row's (count, mean, M2) triples merged
        # pairwise, one barrier: no E[x^2] - E[x]^2 cancellation on rows with a large mean.
        out.append(f"""\
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
    const float rstd = rsqrtf(q * (1.f / kHidden) + {float(s.norm.eps)!r}f);
    const float center = mean;
""")

    def _param(self, name: str, i: str = "i") -> str:
        """Expression of vector slot ``i`` of a cached 1-D tensor (``"global"``: read
        here, through L1/L2; the predicate ``ok`` of the slot is in scope)."""
        if self.plan.param_cache == "registers":
            return f"c_{name}[{i}]"
        if self.plan.param_cache == "global" and name not in self._staged_names():
            t = CUDA_TYPES[self.tensors[name]]
            return f"ldg_vec<{t}, kVec>(in_{name}, {i} * kThreadsPerRow + slot, ok)"
        return f"s_{name}[{i} * kThreadsPerRow + slot]"

    def _staged_names(self) -> list[str]:
        """The 1-D tensors staged in shared memory: all of them (``"shared"``), or with
        ``"global"`` the leading ones that make up ``shared_param_bytes`` a column."""
        p = self.plan
        if p.param_cache == "shared":
            return list(self.tensors)
        if p.param_cache != "global" or not p.shared_param_bytes:
            return []
        names, total = [], 0
        for name, d in self.tensors.items():
            if total == p.shared_param_bytes:
                break
            names.append(name)
            total += DTYPE_BYTES[d]
        if total != p.shared_param_bytes:
            raise LoweringError(f"normalization kernel: shared_param_bytes="
                                f"{p.shared_param_bytes} is no sum of leading tensors' bytes")
        return names

    def _cache_params(self) -> None:
        p, out = self.plan, self.out
        self.x_offset = 0
        staged_names = self._staged_names()
        if p.x_staged or staged_names:
            out.append("  extern __shared__ __align__(16) unsigned char staged[];\n")
        if staged_names:
            slots = p.threads_per_row * p.batch * p.vector_width
            self.x_offset = sum(slots * DTYPE_BYTES[self.tensors[n]] for n in staged_names)
        if not self.tensors or (p.param_cache == "global" and not staged_names):
            return
        if p.param_cache == "registers":
            out.append("  // Each thread's slice of the 1-D tensors, loaded once; 16-bit values stay packed.\n")
            for name, d in self.tensors.items():
                out.append(f"  Vec<{CUDA_TYPES[d]}, kVec> c_{name}[kBatch];\n")
            out.append("""\
#pragma unroll
  for (int i = 0; i < kBatch; ++i) {
    const int vec = i * kThreadsPerRow + lane;
    const bool ok = i < kFullBatches || vec < kVectors;
""")
            for name, d in self.tensors.items():
                t = CUDA_TYPES[d]
                out.append(f"    c_{name}[i].raw = {{}};\n")
                out.append(f"    if (ok) c_{name}[i].raw = (reinterpret_cast<const Vec<{t}, kVec>*>(in_{name}) + vec)->raw;\n")
            out.append("  }\n")
            return
        # shared: every slot of a row (padded ones hold 0), staged once by the whole block
        out.append("  // The 1-D tensors staged once per block; each row reads them from shared memory.\n")
        offset = 0
        slots = p.threads_per_row * p.batch
        staged = {n: self.tensors[n] for n in staged_names}
        for name, d in staged.items():
            t = CUDA_TYPES[d]
            out.append(f"  Vec<{t}, kVec>* s_{name} = reinterpret_cast<Vec<{t}, kVec>*>(staged + {offset});\n")
            offset += slots * p.vector_width * DTYPE_BYTES[d]
        out.append(f"  for (int j = threadIdx.x; j < {slots}; j += {p.block_threads}) {{\n")
        for name, d in staged.items():
            t = CUDA_TYPES[d]
            out.append(f"    s_{name}[j].raw = {{}};\n")
            out.append(f"    if (j < kVectors) s_{name}[j].raw = (reinterpret_cast<const Vec<{t}, kVec>*>(in_{name}) + j)->raw;\n")
        out.append("  }\n  __syncthreads();\n")

    def _prologue(self) -> None:
        s, out = self.spec, self.out
        out.append("""\
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const bool ok = i < kFullBatches || i * kThreadsPerRow + lane < kVectors;
""")
        adds = [op for op in s.prologue if isinstance(op, AddBroadcast)]
        for op in adds:
            out.append(f"      const Vec<{CUDA_TYPES[op.dtype]}, kVec> v_{op.name} = {self._param(op.name)};\n")
        lead, x = self._packed_head("xr[i]")
        head, _ = self._split_prologue()
        if self.plan.packed and lead and len(head) == 2 * lead:
            # the whole head done in 16 bits: it is the slice; padded slots must be 0 for
            # the sums (x staged by a bulk copy leaves them unwritten)
            out.append("      if (!ok) h.raw = {};\n      pv[i] = h;\n    }\n")
            return
        out.append("#pragma unroll\n      for (int e = 0; e < kVec; ++e) {\n")
        out.append(f"        float a = {TO_FLOAT[s.input_dtype].format(x + '.e[e]')};\n")
        if self.plan.packed:
            # the head of the prologue, held in 16 bits (exact: it ends with a 16-bit cast
            # or is x itself); padded slots hold 0, and the tail's tensors hold 0 there too
            for op in head[2 * lead:]:
                self._pointwise(op)
            carrier = self._carrier()
            out.append(f"        pv[i].e[e] = {FROM_FLOAT[carrier].format('ok ? a : 0.f')};\n"
                       "      }\n    }\n")
            return
        for op in s.prologue[2 * lead:]:
            self._pointwise(op)
        # padded slots must be exactly 0 for the sums (their tensors hold 0, but a cast
        # or a later op need not keep it so)
        out.append("        v[i][e] = ok ? a : 0.f;\n      }\n    }\n")

    def _store(self) -> None:
        s, out = self.spec, self.out
        out.append("""\
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int vec = i * kThreadsPerRow + lane;
      const bool ok = row_ok && (i < kFullBatches || vec < kVectors);
      if (!ok) continue;
""")
        loads = []
        if s.norm.weight:
            loads.append(("weight", s.norm.weight_dtype))
        if isinstance(s.norm, LayerNorm) and s.norm.bias:
            loads.append(("bias", s.norm.bias_dtype))
        loads += [(op.name, op.dtype) for op in s.epilogue if isinstance(op, AddBroadcast)]
        for name, d in loads:
            out.append(f"      const Vec<{CUDA_TYPES[d]}, kVec> v_{name} = {self._param(name)};\n")
        self._normalize_and_store_tail()


    def _row_stats_helper(self) -> str:
        p = self.plan
        text = """\
// (count, mean, M2) of a set merged with another's (Chan, Golub, LeVeque): exact in
// the way a two-pass variance is, the mean difference is small against the values.
__device__ __forceinline__ void chan_merge(float& n, float& m, float& q, float n2, float m2, float q2) {
  const float nn = n + n2;
  if (nn > 0.f) {
    const float d = m2 - m, f = n2 / nn;
    m += d * f;
    q += q2 + d * d * n * f;
    n = nn;
  }
}
__device__ __forceinline__ void warp_stats(float& n, float& m, float& q) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    chan_merge(n, m, q, __shfl_xor_sync(0xffffffffu, n, offset),
               __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, q, offset));
}
"""
        if p.warps_per_row == 1:
            return text + """\
__device__ __forceinline__ void row_stats(float& n, float& m, float& q, void*) { warp_stats(n, m, q); }
"""
        return text + f"""\
// Several warps a row: each warp's lane 0 writes its triple, one barrier, then every
// warp merges all of them itself (the same order in every warp).
__device__ __forceinline__ void row_stats(float& n, float& m, float& q, float (*partials)[3]) {{
  const int lane = threadIdx.x & 31;
  const int warp = (threadIdx.x % {p.threads_per_row}) >> 5;
  warp_stats(n, m, q);
  if (lane == 0) {{ partials[warp][0] = n; partials[warp][1] = m; partials[warp][2] = q; }}
  __syncthreads();
  const bool mine = lane < {p.warps_per_row};
  n = mine ? partials[lane][0] : 0.f;
  m = mine ? partials[lane][1] : 0.f;
  q = mine ? partials[lane][2] : 0.f;
  warp_stats(n, m, q);
}}
"""


def render_normalization(spec: NormalizationSpec) -> str:
    """CUDA C++ source of ``spec``'s kernel (entry: ``spec.kernel_name``): the persistent
    kernel, or the row-wise one when the plan says ``param_cache="none"``."""
    if spec.plan.persistent:
        return PersistentRenderer(spec).render()
    return NormalizationRenderer(spec).render()


def nvrtc_options(arch: str = "sm_90") -> tuple[str, ...]:
    """Compile options the kernel is written for (fast math stays off: rsqrtf is enough)."""
    return (f"-arch={arch}", "-std=c++17", "--ptxas-options=-v")


# --------------------------------------------------------------------------- text form

def _ops_to_text(ops) -> str:
    """``add:float16:b0|cast:float16`` — the ops of a prologue or epilogue as one string."""
    parts = []
    for op in ops:
        parts.append(f"add:{op.dtype}:{op.name}" if isinstance(op, AddBroadcast)
                     else f"cast:{op.dtype}")
    return "|".join(parts)


def _ops_from_text(text: str, where: str) -> tuple:
    ops = []
    for part in filter(None, text.split("|")):
        fields = part.split(":")
        if fields[0] == "add" and len(fields) == 3:
            ops.append(AddBroadcast(fields[1], fields[2]))
        elif fields[0] == "cast" and len(fields) == 2:
            ops.append(Cast(fields[1]))
        else:
            raise LoweringError(f"{where}: cannot read op {part!r}: expected add:<dtype>:<name> "
                                "or cast:<dtype>")
    return tuple(ops)


def spec_params(spec: NormalizationSpec) -> tuple[tuple[str, object], ...]:
    """The spec as plain (key, value) pairs: the parameters of a host program's
    ``KernelDef`` (``generator=normalization``). ``spec_from_params`` reverses it."""
    n = spec.norm
    params = [("rows", spec.rows), ("hidden", spec.hidden),
              ("norm", "layer_norm" if isinstance(n, LayerNorm) else "rms_norm"),
              ("eps", float(n.eps)), ("weight", n.weight), ("weight_dtype", n.weight_dtype)]
    if isinstance(n, LayerNorm):
        params += [("bias", n.bias), ("bias_dtype", n.bias_dtype)]
    params += [("input_dtype", spec.input_dtype), ("output_dtype", spec.output_dtype),
               ("prologue", _ops_to_text(spec.prologue)),
               ("epilogue", _ops_to_text(spec.epilogue)), ("alignment", spec.alignment)]
    for key in PLAN_FIELDS:
        if getattr(spec, key) is not None:
            params.append((key, getattr(spec, key)))
    return tuple(params)


def spec_from_params(params) -> NormalizationSpec:
    p = dict(params)
    try:
        if p["norm"] == "layer_norm":
            norm = LayerNorm(p["eps"], p["weight"], p["bias"], p["weight_dtype"], p["bias_dtype"])
        elif p["norm"] == "rms_norm":
            norm = RmsNorm(p["eps"], p["weight"], p["weight_dtype"])
        else:
            raise LoweringError(f"normalization kernel: norm {p['norm']!r} is not layer_norm "
                                "or rms_norm")
        return NormalizationSpec(
            p["rows"], p["hidden"], norm, p["input_dtype"], p["output_dtype"],
            _ops_from_text(p["prologue"], "prologue"), _ops_from_text(p["epilogue"], "epilogue"),
            p["alignment"], p.get("threads_per_row"), p.get("batch"), p.get("rows_per_block"),
            p.get("param_cache"), p.get("prefetch"), p.get("x_staged"), p.get("stages"),
            p.get("one_pass"), p.get("l2_hint"), p.get("packed"), p.get("x_bulk"),
            p.get("shared_param_bytes"), p.get("vector_width"), p.get("blocks_per_sm"))
    except KeyError as e:
        raise LoweringError(f"normalization kernel: parameter {e.args[0]!r} is missing") from None
