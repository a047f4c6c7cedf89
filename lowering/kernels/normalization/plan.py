"""The launch plan of a normalization kernel, and the limits of the hardware it fits.

A `LaunchPlan` is a record: how a row maps onto threads and which kernel variant runs.
It knows what follows from its own fields (the block, the shared memory, the grid, the
block promise to ptxas) and nothing of how it was chosen (`planner`) or written out
(`renderer`).
"""

from __future__ import annotations

import dataclasses

# Hopper's limits (sm_90; sm_80 has the same per-thread and per-SM counts).
WARP = 32
MAX_THREADS_PER_BLOCK = 1024
MAX_THREADS_PER_SM = 2048
MAX_BLOCKS_PER_SM = 32
REGISTERS_PER_SM = 65536
MAX_REGISTERS_PER_THREAD = 255
# fp32 values a thread may hold for its part of a row. 32 keeps the whole kernel near
# 64-96 registers, so 700-1000 threads stay resident per SM with 32-64 bytes of loads
# each in flight: enough to cover DRAM latency on Hopper. Rows longer than
# 1024 threads x 32 values go to the shared-row family (`LaunchPlan.shared_row`).
MAX_VALUES_PER_THREAD = 32
MIN_THREADS_PER_BLOCK = 128

PARAM_CACHES = ("none", "registers", "shared", "global")
L2_HINTS = ("", "evict_first", "prefetch_256b")  # LaunchPlan.l2_hint
MAX_STAGES = 3  # rows of x a cp.async ring may hold ahead of the current one
DEFAULT_SM_COUNT = 132  # H100 SXM / H200; compile-time checks only, launches ask the device
SHARED_PER_SM = 228 * 1024  # Hopper: 228 KiB per SM, 227 KiB at most for one block
SHARED_PER_BLOCK = 227 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Hardware:
    """What the planner's model knows of a GPU: read from the device's properties at
    launch (`runtime.normalization.device_hardware`), `SM90` (an H100 SXM) without one.

    ``bandwidth`` (bytes/s of DRAM) and ``latency`` (seconds from a load's issue to its
    data under load) give, by Little's law, the bytes an SM must keep requested to
    stream at full bandwidth (`in_flight_per_sm`): H100 (3.35 TB/s, 132 SMs) about
    20 KiB, H200 (4.8 TB/s, 132 SMs) about 29 KiB."""

    sm_count: int = DEFAULT_SM_COUNT
    registers_per_sm: int = REGISTERS_PER_SM
    threads_per_sm: int = MAX_THREADS_PER_SM
    shared_per_sm: int = SHARED_PER_SM
    shared_per_block: int = SHARED_PER_BLOCK
    bandwidth: float = 3.35e12
    latency: float = 0.8e-6
    clusters: bool = True  # thread-block clusters (sm_90+): the envelope kernel's widest rows

    @property
    def in_flight_per_sm(self) -> int:
        return int(self.bandwidth * self.latency / self.sm_count)


SM90 = Hardware()


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
    1-D tensors then fit in registers beside it at 16384, where holding them in shared
    memory instead cost about a tenth of the bandwidth (a plain layer_norm with its two
    tensors in registers ran 0.91 of copy bandwidth there, the fusion's four in shared
    memory 0.81).

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

    The last three fields are switches of how the kernel is written and launched, not
    of its geometry; the planner leaves them at their defaults, and an experiment sets
    them on a copy of a plan (`renderer.render_normalization` takes it):

    ``packed_head``: the prologue's leading (+ b, 16-bit cast) pairs run as 16-bit pair
    adds (``add.rn.f16x2``; ``fma.rn.bf16x2`` by 1 for bf16): the same bits as the fp32
    add and the rounding cast, four instructions an element fewer. On: 3-9% faster at
    most bench sizes; one size (12288, its t512 b3 plan) ran 5% slower, no cause found.

    ``lean_addresses``: x and y addressed from one pointer a row (the row's start plus
    this thread's first vector, computed once a row), each batch slot a constant offset
    from it, rather than each access computing its own 64-bit address: the same
    accesses and bits, fewer instructions (the 5140 persistent kernel: a sixth fewer
    SASS instructions; its row-wise pick 1.2x faster). Ignored by ``param_cache=
    "global"`` plans, which address the 1-D tensors per slot anyway and whose register
    budget the row pointers overrun (they spill).

    ``shared_row``: the shared-row family, for rows that do not fit registers (wider than
    1024 threads x 32 values) and rows that are not 16-byte aligned. One row a block at
    a time; the row of x lives in shared memory as 16-byte chunks of its aligned
    envelope (the 16-byte granules the row touches, ``row_chunks`` at most), thread
    ``t`` owning chunks ``t, t + T, ...``: ``batch`` of them in shared memory, the rest
    (``register_slots``, rows past 227 KiB) in registers. Each thread reads only its
    own chunks, so the row needs no barrier but its reductions; the statistics are two
    exact passes over shared memory (layer norm: the mean, then the squares about it),
    and the output pass refills each chunk with the block's next row as soon as it has
    read it (cp.async), so that a whole row is in flight per block while the current
    one is reduced. The 1-D tensors are read through L1/L2 (``param_cache="global"``):
    beside a row in shared memory there is no room for them. Rows that are not 16-byte
    aligned keep the 16-byte copies of x and y (the partial first and last chunks are
    masked; their y stores go element by element) and read the 1-D tensors as two
    aligned vectors funnel-shifted into place. See docs/KERNELS.md.

    ``envelope`` (``param_cache="none"``): the row-wise kernel over the row's aligned
    envelope, for plain 16-bit norms (no prologue) whatever their alignment: each thread
    holds ``batch`` 16-byte chunks of the envelope (``row_chunks`` at most) as raw 16-bit
    values, converting a chunk again in each pass, and masks the envelope's ends as the
    shared-row kernel does (its 1-D tensors funnel-shifted into place, partial chunks
    stored element by element). Rows that are not 16-byte aligned keep 16-byte loads and
    stores, and the packed row takes half the registers of the fp32 one. See
    `planner._envelope_rowwise`.

    ``cluster`` (envelope, one row a block): the row's chunks split over this many CTAs
    of a thread-block cluster, CTA ``r`` holding chunks ``r*T*batch`` on; each CTA sums
    its slice and writes its sums into every CTA's shared memory (distributed shared
    memory) by asynchronous stores counted on its mbarrier, then waits for its own; the
    clusters stride over the rows (the grid: the clusters the GPU holds at once). Rows
    too wide for one CTA at two blocks an SM.

    ``balanced_grid``: the persistent kernel's grid is the fewest blocks that need no
    more rounds of the row loop than the resident ones (`grid`). Off: timed slower at
    most sizes; every block busy in the last round does not make up for fewer blocks
    keeping bytes in flight in all the other rounds.
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
    packed_head: bool = True  # the prologue's leading (+ b, cast) pairs as 16-bit pair adds
    lean_addresses: bool = True  # x and y by one pointer a row (not with "global")
    balanced_grid: bool = False  # `grid`'s default: the fewest blocks for as many rounds
    shared_row: bool = False  # the shared-row family (see below): the row of x in shared memory
    row_chunks: int = 0  # shared_row, envelope: 16-byte chunks a row may span (its bound)
    envelope: bool = False  # the envelope row-wise kernel (see below): batch is chunks a thread
    cluster: int = 1  # envelope: CTAs a row is split over (a thread-block cluster, see below)
    staged: int = 0  # envelope cluster, rows off 16 bytes: bytes a column of the 16-bit 1-D
    #                  tensors each CTA copies into shared memory once (its slice)

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
        need = round_up(self.register_estimate + 8, 8)
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
    def register_slots(self) -> int:
        """Shared-row plans: chunks a thread holds in registers (those past ``batch``)."""
        if not self.shared_row:
            return 0
        return -(-self.row_chunks // self.threads_per_row) - self.batch

    @property
    def envelope_line(self) -> int:
        """Bytes the envelope kernel aligns a row's envelope to: on a cluster 128 (a cache
        line: each warp's copies of x and stores of y then cover whole lines, not five
        lines for four; H200, rows 16 bytes off a line: 0.78-0.83 of copy bandwidth,
        0.89-0.93 when they start on one) where its CTAs have room for the up to seven
        more granules before the row that takes, else 16. (The renderer keeps 16 for rows
        of a multiple of 64 values, which start on a line wherever the tensor does.)"""
        if (self.envelope and self.cluster > 1
                and self.threads_per_row * self.batch * self.cluster >= self.row_chunks + 7):
            return 128
        return 16

    @property
    def warps_per_row(self) -> int:
        return self.threads_per_row // WARP

    @property
    def shared_bytes(self) -> int:
        # two reductions (mean, variance) use separate buffers: see the kernel's comment;
        # one pass: (count, mean, M2) a warp, two buffers by the parity of the row
        if self.shared_row:
            # partials[2][32]: a warp's partial sum by the parity of the reduction; one
            # pass: its (count, mean, M2)
            return 2 * 32 * 4 * (3 if self.one_pass else 1)
        per_warp = 3 if self.one_pass else 1
        return 0 if self.warps_per_row == 1 else 2 * 4 * per_warp * self.rows_per_block * self.warps_per_row

    @property
    def dynamic_shared_bytes(self) -> int:
        """The staged 1-D tensors (``param_cache == "shared"``: every batch slot of a row),
        then, with ``x_staged``, ``stages + 1`` buffers of x for each row of the block."""
        if self.shared_row:
            return self.threads_per_row * self.batch * 16
        if self.cluster > 1:  # the next row's chunks; two mbarriers, two rows' shares and
            # sums; a layer norm's (one pass) two rows' first granules, a copy a warp
            return (self.threads_per_row * self.batch * 16 + 2 * 8 + 2 * self.cluster * 8
                    + 2 * self.warps_per_row * (8 + 16 * self.one_pass)
                    # the staged tensors: the columns of the CTA's chunks at any shift
                    + (self.threads_per_row * self.batch + 1 + self.envelope_line // 16)
                    * 8 * self.staged)
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

        ``balanced`` (default ``balanced_grid``): the fewest blocks that still need no
        more rounds of the row loop than the resident ones would. 4096 groups on 396
        resident blocks take 11 rounds, the last with 136 blocks; 373 blocks take the
        same 11 rounds with every block busy in each, and fewer blocks share the
        bandwidth in the other ten. The kernel loops, so any grid is correct."""
        groups = max(1, -(-rows // self.rows_per_block))
        if self.cluster > 1:  # a cluster a row, at most (runtime.normalization.launch_grid)
            return max(1, min(groups, sm_count * (blocks_per_sm or self.min_blocks_per_sm)
                              // self.cluster)) * self.cluster
        if not self.persistent:
            return groups
        per_sm = blocks_per_sm or self.min_blocks_per_sm
        most = max(1, min(groups, sm_count * per_sm))
        if not (self.balanced_grid if balanced is None else balanced):
            return most
        rounds = -(-groups // most)
        return -(-groups // rounds)

    def describe(self) -> str:
        if self.shared_row:
            return (f"shared-row t{self.threads_per_row} b{self.batch}"
                    + (f"+r{self.register_slots}" if self.register_slots else "")
                    + f" c{self.row_chunks}" + (" 1pass" if self.one_pass else "")
                    + (f" x{self.blocks_per_sm}" if self.blocks_per_sm else ""))
        if self.envelope:
            return (f"envelope t{self.threads_per_row} k{self.batch} r{self.rows_per_block} "
                    f"c{self.row_chunks}" + (f" cluster{self.cluster}" if self.cluster > 1 else "")
                    + (" 1pass" if self.one_pass else "") + (" staged" if self.staged else "")
                    + (f" x{self.blocks_per_sm}" if self.blocks_per_sm else ""))
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
                + (f" x{self.blocks_per_sm}" if self.blocks_per_sm else "")
                + ("" if self.packed_head else " wide-head")
                + ("" if self.lean_addresses else " slot-addresses")
                + (" balanced" if self.balanced_grid else ""))


def register_budget(block_threads: int) -> int:
    # one block must fit an SM's register file; allocation goes by 8 registers a thread
    return min(MAX_REGISTERS_PER_THREAD, (REGISTERS_PER_SM // block_threads) // 8 * 8)


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def blocks_by_registers(block_threads: int, registers: int) -> int:
    """The most blocks of ``block_threads`` threads one SM holds at ``registers`` a thread
    (rounded up to 8), the way the hardware and ptxas count them: the SM's registers are
    four sub-partitions of a quarter each, every warp in one, the warps of all resident
    blocks spread over them; so B blocks of W warps fit where ceil(B x W / 4) warps fit
    a quarter. (Three blocks of 10 warps hold at 64 registers a thread, 30 warps in
    quarters of 8, where counting each block's warps rounded up to 4 allowed two.)"""
    warps = -(-block_threads // WARP)
    per_warp = WARP * round_up(registers, 8)
    blocks = 0
    while -(-(blocks + 1) * warps // 4) * per_warp <= REGISTERS_PER_SM // 4:
        blocks += 1
    return blocks
