"""The heuristic: which plan a normalization runs, by rules measured on an H200.

`plan_launch` is the entry: the overrides of a spec pin a plan (checked here), the rest
is the heuristic's, `choose_persistent` over the candidates of `candidates`. Each rule
says why in a comment, with the measurement behind it.

The measurements the rules cite come from plan sweeps on an H200 (8192 rows, fp16, the
reference fusion; every candidate plan timed one after another, the cp.async ring, the
one-pass reduction and the tensors through L2 among them). A ratio "1.03x" is a plan's
time over the best time measured at its size; "regs" are what ptxas reported for it.
tests/unit/test_normalization_sweep.py holds the planner to the latest sweep.
"""

from __future__ import annotations

import dataclasses
import itertools

from hostir.errors import LoweringError
from lowering.kernels.normalization.candidates import (
    bulk_ok, bytes_in_flight, candidate_plans, padding, persistent_candidates,
    persistent_register_estimate, register_estimate, row_chunks, shared_row_blocks,
    shared_row_candidates,
)
from lowering.kernels.normalization.plan import (
    L2_HINTS, MAX_BLOCKS_PER_SM, MAX_STAGES, MAX_THREADS_PER_BLOCK, MAX_THREADS_PER_SM,
    MAX_VALUES_PER_THREAD, MIN_THREADS_PER_BLOCK, PARAM_CACHES, REGISTERS_PER_SM,
    SHARED_PER_BLOCK, SHARED_PER_SM,
    SM90, WARP, Hardware, LaunchPlan, blocks_by_registers, register_budget, round_up,
)

# Rule 1 of `choose_persistent`: bytes of x an SM must have requested at once.
IN_FLIGHT_TARGET = 32 * 1024
# Rule 2: padding (a fraction of the row's slots) allowed beyond the least.
MAX_EXTRA_PADDING = 0.2
# Rule 4: the fewest values a thread for which the cp.async ring pays for its
# shared-memory round trip.
STAGED_MIN_VALUES = 16
# Rule 6: where the 1-D tensors go, best first.
CACHE_ORDER = ("registers", "shared", "global")
# Rule 7: bytes in flight compared in steps of this (the block counts are estimates).
FLIGHT_STEP = 4 * 1024
# The envelope kernel's chunks a thread at most (its passes are unrolled over them), and
# on a plain norm's two-CTA cluster held at two blocks (`ENVELOPE_LAYER_CLUSTER_HELD`)
# where six do not cover the row: side by side on an H200 (bf16, 8192 rows), seven chunks
# on 576-640 threads ran 0.905-0.918 of copy bandwidth at 61952-65536 against 0.884-0.888
# for four CTAs of six at three blocks; where six fit (57856, 59904) they ran 1% faster
# than seven or eight, so past six a plan ranks last (`rank_envelope`).
MAX_ENVELOPE_CHUNKS = 6
MAX_HELD_ENVELOPE_CHUNKS = 7


@dataclasses.dataclass(frozen=True, slots=True)
class PlannerRules:
    """The switches of `choose_persistent` for the plan dimensions whose worth depends
    on the row (``stages``, ``one_pass``, ``param_cache="global"``, the packed row, the
    bulk copy, the split tensors, the L2 hint). Each is a general rule with a threshold,
    fitted by scoring every combination of the values in `RULE_GRID` against a plan
    sweep (the worst size's ratio to its best plan). The defaults here keep the
    dimensions out; `RULES` is the fit (worst 1.009x; the next, ``deep_below`` always,
    1.032x).

    - ``deep_below``: a deeper cp.async ring (``stages`` 2) where one row ahead leaves
      fewer than this many bytes of x in flight an SM (`bytes_in_flight` x 2): Little's
      law with room to spare. 0: never. Fitted: 64 KiB. Two rows ahead is the best at
      every size up to 12288 (one block of 512 threads, 24 KiB a row: 1.000x against
      1.119x one row ahead); from 16384 (32 KiB a row and up) one row ahead holds enough
      and the third buffer only takes shared memory (16384 1.004x/1.000x, 20480
      1.000x/1.032x).
    - ``one_pass_warps``: the one-pass reduction (one block barrier a row) for rows on
      at least this many warps (a barrier waits for the slowest warp of the row: the
      more warps, the more it costs). 0: never. Fitted: never; every one-pass plan
      swept is 1.16-2.7x its two-pass twin (its per-thread exact mean and the pairwise
      Chan combine cost more than the barrier they save).
    - ``global_params``: read the 1-D tensors through L1/L2 every row (``"global"``)
      rather than staging them in shared memory, where staging them leaves no room
      for the prefetch of x (no shared-cache plan with the prefetch fits). Fitted: on
      (20480: 1.000x, where the shared tensors without the prefetch were 1.198x). With
      the register estimate of `persistent_register_estimate` the shared tensors with x
      prefetched into registers fit at 20480, so no bench size reads its tensors
      through L2: that plan ran 0.904 of copy bandwidth side by side with ``global+s4``'s
      0.853.
    - Not a rule: packing the row slice wherever it lets an SM hold one more block,
      with the deep ring below 80 KiB. Fitted on two sweeps it promised 1600 and 4096 a
      few percent, but benched it gave 1600 0.875 of copy against 0.866, 4096 0.861
      against 0.862, and lost 16384 to the deeper ring: 0.876 against 0.899.
    - ``packed_row``: hold the staged row slice as 16-bit values (``LaunchPlan.packed``)
      where the 1-D tensors fit registers only so: no unpacked plan with the prefetch
      caches them in registers. Fitted: on (16384, t512 b4 in registers, 0.881 of copy
      bandwidth against 0.818 for the best unpacked plan, tensors in L2). Where the
      tensors fit beside the fp32 row the recomputed tail costs more than the registers
      save (packed twins 0.93-0.99x, a few 1.02-1.14x).
    - ``bulk_x``: stage x by one bulk copy a row (``LaunchPlan.x_bulk``) wherever the row
      allows it. Fitted: off. In a sweep of 760 plans the bulk twin of a plan ran
      0.88-1.13x its cp.async twin's speed: the best plan at 1600 (0.810 of copy
      bandwidth against 0.787), 2048 (0.885/0.871), 2560 (0.876/0.855) and 16384 (t512 b4
      packed, ring of 2: 0.905/0.875), slower at 768-1536, 4096, 12288 and 20480; no
      threshold on the plan's dimensions separates the two groups, and on always the
      worst size falls behind.
    - ``split_params``: where the tensors go through L2, stage the leading ones in shared
      memory up to half of their bytes a column (``shared_param_bytes``: the largest
      prefix within half), the rest staying in L2 with the L1 left beside the ring to
      cache them. Only 20480 had such plans (tensors through L2 there, until the
      shared tensors with the prefetch in registers fitted: `global_params`). Its t640 b4
      prefetch plan with two of the four tensors staged (``+s4``) against none, in
      three runs: 0.845 against 0.810 of copy bandwidth, 0.849 against 0.821, 0.851
      against 0.823 (side by side); one staged (``+s2``, 0.787) or three (``+s6``, 0.794,
      200 KiB of shared memory with the ring, little L1 left for the last tensor) are
      slower. On.
    - ``l2_hint``: the `L2_HINTS` hint the chosen plan puts on the cp.async of x when it
      stages x. "" until a sweep shows a hint gaining more than two timings of one plan
      differ (`hint_variants` lists what a sweep times).
    """

    deep_below: int = 0
    one_pass_warps: int = 0
    global_params: bool = False
    l2_hint: str = ""
    packed_row: bool = False
    bulk_x: bool = False
    split_params: bool = False


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

    Against the latest sweep (999 plans, every kernel with the 16-bit pair adds of
    ``LaunchPlan.packed_head``; what the sweep test holds the planner to) the picks are
    within 1.050x of the best: 1.000-1.023x but at 1600 1.045, 4096 1.050 (the packed
    twin, one row ahead) and 12288 1.041 (t384 b4, tensors in shared memory, bulk rows);
    20480 was 1.035 until `split_params` staged half the tensors' bytes (now its best
    plan). Two timings of one plan in two sweeps differ by a few percent, so the rules
    are judged across sweeps: in the two before, the picks were within 1.021x and 1.009x
    of the best at every size. Rows one warp covers never get here by default:
    `plan_launch` gives them the row-wise kernel (its rule 0: 1.008x at 768, 1.000x at
    1024).
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


# The shortest rows the shared-row family takes when they are not 16-byte aligned: below,
# a row is a few chunks and the register kernels' narrow vectors serve (correct, slower).
SHARED_ROW_MIN_HIDDEN = 512
# Threads an SM should hold for the shared-row kernel's passes over shared memory to
# keep its load pipe busy (LDS.128: 4 cycles a warp; a few warps a scheduler).
SHARED_ROW_THREADS_PER_SM = 1024
# `choose_shared_row`: blocks an SM (rows in flight) worth more than resident threads.
SHARED_ROW_BLOCKS = 4
# `prefers_shared_row`: resident threads an SM below which a register plan's barriers
# and stores go uncovered (see there).
REGISTER_PLAN_MIN_THREADS = 768
# `prefers_shared_row` on: aligned rows whose register plan starves the SM take the
# shared-row family (off: only rows the register kernels cannot take well, unaligned or
# too wide, do).
SHARED_ROW_FOR_STARVED_ROWS = True


def choose_shared_row(plans: list[LaunchPlan], hardware: Hardware = SM90) -> LaunchPlan:
    """The shared-row plan by the model of the SM:

    1. Bytes requested an SM (Little's law): each resident block asks for a whole row
       while it writes the one before, so blocks x the row's bytes must reach
       ``hardware.in_flight_per_sm`` (bandwidth x latency / SMs).
    2. More blocks an SM, up to `SHARED_ROW_BLOCKS`, where shared memory allows: a block
       waits for the end of its row to land, then makes a pass over it and a barrier (two
       of each for a layer norm) before its stores; the other blocks' streams cover those
       phases (with one block, DRAM idles through them).
    3. Threads an SM up to `SHARED_ROW_THREADS_PER_SM`: enough warps to keep the shared
       memory pipe and the DRAM queue busy.
    4. Less padding (idle lanes in the last slot), then larger blocks (fewer slots:
       shorter unrolled passes)."""
    def key(p: LaunchPlan):
        blocks = shared_row_blocks(p, hardware)
        flight = blocks * p.row_chunks * 16
        slots = -(-p.row_chunks // p.threads_per_row)
        pad = 1 - p.row_chunks / (slots * p.threads_per_row)
        return (flight < hardware.in_flight_per_sm, -min(blocks, SHARED_ROW_BLOCKS),
                -min(blocks * p.block_threads, SHARED_ROW_THREADS_PER_SM),
                round(pad, 1), -p.threads_per_row)

    return min(plans, key=key)


def prefers_shared_row(register_plan: LaunchPlan, shared_plan: LaunchPlan, hidden: int,
                       value_bytes: int, out_bytes: int, prologue_bytes: int, param_bytes: int,
                       passes: int, hardware: Hardware = SM90) -> bool:
    """Whether the shared-row plan beats the register plan of an aligned row, by the model:

    - A register plan with one block an SM has nothing to cover its row's reductions,
      barriers and stores (the DRAM queue drains at each), and one with fewer than
      `REGISTER_PLAN_MIN_THREADS` threads an SM too few warps; a shared-row plan holding
      two or more rows an SM, on more threads, does. Measured with the register plans
      (bf16, 8192 rows, H100 / H200): one block an SM at 10752-25088, 0.81-0.89 of copy
      bandwidth at most widths; 448-640 threads an SM (2560 and 4608 layer_norm, 4608
      and 8704 rms_norm) 0.81-0.88; 768+ threads in three or more blocks (2560 and 6656
      rms_norm) 0.92-0.95.
    - But the shared-row kernel reads its 1-D tensors from L2 on every row, the
      prologue's once a pass: it takes them only while that L2 traffic stays within the
      row's own DRAM traffic (x and y), which L2 serves beside it at its several times
      DRAM bandwidth. The reference fusion's four tensors (b0 and b1 in each of three
      passes) are four times the row's bytes: its register plan stays."""
    if not SHARED_ROW_FOR_STARVED_ROWS or not register_plan.persistent:
        return False  # rows one warp covers: the row-wise kernel, 0.95-1.04 of copy measured
    blocks = shared_row_blocks(shared_plan, hardware)
    threads = register_plan.min_blocks_per_sm * register_plan.block_threads
    starved = register_plan.min_blocks_per_sm == 1 or threads < REGISTER_PLAN_MIN_THREADS
    if not starved or blocks < 2 or blocks * shared_plan.block_threads <= threads:
        return False
    l2 = passes * prologue_bytes + (param_bytes - prologue_bytes)
    return l2 <= value_bytes + out_bytes


def hint_variants(plans: list[LaunchPlan], hidden: int, value_bytes: int,
                  base: int = 2) -> list[LaunchPlan]:
    """The plans a sweep times with each `L2_HINTS` hint: the first ``base`` plans of
    ``plans`` by `choose_persistent`'s order that can take one (x staged), not the cross
    product of every candidate with every hint."""
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
    shared_row: bool | None = None,
    rows_aligned: bool = True,
    out_bytes: int = 2,
    prologue_bytes: int = 0,
    passes: int = 3,
    layer_norm: bool = True,
    hardware: Hardware = SM90,
    envelope: bool | None = None,
    prologue: bool = False,
    cluster: int | None = None,
    base_aligned: bool = True,
) -> LaunchPlan:
    """Pick the kernel (row-wise or persistent), threads per row, the persistent batch
    and rows per block for ``hidden``.

    Default: the row-wise kernel for rows one warp covers (rule 0, below) and for plain
    norms' rows `_plain_rowwise` takes, the shared-row kernel where `_route` says, else
    the persistent kernel (`choose_persistent`). Its grid is the SMs x resident
    blocks, so no block pays a launch or a tail of its own and the 1-D tensors are read
    once a block rather than once a row: at fp16 the four tensors of the reference
    fusion are twice a row's own traffic, which at 12288+ fell out of L1 and made L2
    bandwidth the limit of the row-wise kernel (0.53-0.65 of copy bandwidth).

    ``param_cache="none"`` pins the row-wise kernel and its rule, from a sweep of every
    candidate plan on an H200 (fp16, 8192 rows):

    - Short rows (at most 128 vectors): the fewest threads per row, i.e. the largest
      batch (up to 32 values), several rows to a 128-thread block.
    - Medium rows (one row fits 128 threads x 32 values): a 128-thread block, either
      one row on 128 threads or two rows on 64; least padding, ties to 128 threads.
    - Long rows: least padding, then about 24 values a thread, ties to fewer values.

    We never unroll the row loop on top of the batch: a second row in flight would
    double the registers (the nvFuser spill at 16384); the prefetch holds the next
    row's x packed, half the registers of its fp32 values. The overrides pin a plan.
    """
    wide = dict(shared_row=shared_row, rows_aligned=rows_aligned, out_bytes=out_bytes,
                prologue_bytes=prologue_bytes, passes=passes, layer_norm=layer_norm,
                hardware=hardware, prologue=prologue, base_aligned=base_aligned)
    if blocks_per_sm is not None:
        # the block promise pinned (`LaunchPlan.blocks_per_sm`) on the plan otherwise chosen
        best = plan_launch(hidden, vector_width, value_bytes, threads_per_row, batch,
                           rows_per_block, param_cache, prefetch, param_bytes, x_staged, bf16,
                           stages, one_pass, l2_hint, packed, x_bulk, shared_param_bytes,
                           param_sizes, envelope=envelope, cluster=cluster, **wide)
        if (not isinstance(blocks_per_sm, int) or isinstance(blocks_per_sm, bool)
                or not best.sm_holds(blocks_per_sm)):
            smem = best.dynamic_shared_bytes + best.shared_bytes
            raise LoweringError(
                f"normalization plan: blocks_per_sm {blocks_per_sm!r}: expected 1..{MAX_BLOCKS_PER_SM} "
                f"blocks of {best.block_threads} threads and {smem} bytes of shared memory that "
                f"one SM holds ({MAX_THREADS_PER_SM} threads, {SHARED_PER_SM} bytes)")
        return dataclasses.replace(best, blocks_per_sm=blocks_per_sm)
    register_pins = (param_cache, prefetch, x_staged, stages, one_pass, l2_hint, packed, x_bulk,
                     shared_param_bytes)
    if cluster not in (None, 1) and not envelope:
        raise LoweringError("normalization plan: cluster splits the envelope kernel's rows: "
                            "pin envelope=True with it")
    if envelope:
        others = (param_cache, prefetch, x_staged, stages, l2_hint, packed, x_bulk,
                  shared_param_bytes)  # register_pins less one_pass, which it takes
        if shared_row or any(v is not None for v in others):
            raise LoweringError("normalization plan: envelope is its own kernel: pin only "
                                "threads_per_row, batch (chunks a thread), rows_per_block, "
                                "one_pass (and blocks_per_sm) with it")
        if value_bytes != 2 or prologue_bytes or prologue:
            raise LoweringError("normalization plan: envelope takes plain norms of 16-bit x "
                                "(no prologue tensors)")
        if rows_per_block is not None and (not isinstance(rows_per_block, int)
                                           or rows_per_block < 1):
            raise LoweringError(f"normalization plan: rows_per_block {rows_per_block!r}: "
                                "expected an int >= 1")
        most = MAX_CLUSTER if hardware.clusters else 1
        if cluster is not None and (not isinstance(cluster, int) or isinstance(cluster, bool)
                                    or not 1 <= cluster <= most):
            raise LoweringError(f"normalization plan: cluster {cluster!r}: expected an int in "
                                f"1..{most} (CTAs a row; 1 where the GPU has no clusters)")
        sizes = [cluster] if cluster is not None else range(1, most + 1)
        best = fallback = None
        for size in sizes:  # the smallest cluster with a plan the default allows
            plans = envelope_candidates(hidden, layer_norm, rows_per_block, size, bf16,
                                        base_aligned, plain_tensors(param_sizes, layer_norm,
                                                                    out_bytes),
                                        staged_columns(rows_aligned, param_sizes))
            pinned = [p for p in plans if threads_per_row in (None, p.threads_per_row)
                      and batch in (None, p.batch)]
            fallback = fallback or (pinned[0] if pinned else None)
            best = _choose_envelope(pinned, most_chunks=rows_aligned)
            if best is not None:
                break
        best = best or fallback
        if best is None:
            raise LoweringError(
                f"normalization plan: no envelope plan covers hidden={hidden}"
                + (f" with threads_per_row={threads_per_row}" if threads_per_row else "")
                + (f" and batch={batch}" if batch else "")
                + (f" and rows_per_block={rows_per_block}" if rows_per_block else "")
                + (f" and cluster={cluster}" if cluster else "")
                + f" (warp-multiple rows, blocks of up to {MAX_THREADS_PER_BLOCK} threads, "
                  f"at most {MAX_ENVELOPE_CHUNKS} chunks of 16 bytes each, clusters of up "
                  f"to {MAX_CLUSTER} CTAs one row a block)")
        if layer_norm and best.cluster > 1:  # one exchange a row: the one-pass statistics
            if one_pass is False:
                raise LoweringError("normalization plan: a layer norm on a cluster takes its "
                                    "statistics in one pass: pin no one_pass=False with it")
            one_pass = True
        return dataclasses.replace(best, one_pass=True) if one_pass and layer_norm else best
    if shared_row:
        if any(v is not None for v in register_pins):
            raise LoweringError("normalization plan: shared_row is its own kernel: pin only "
                                "threads_per_row (and blocks_per_sm) with it")
        plans = shared_row_candidates(hidden, value_bytes, param_bytes, rows_aligned, hardware,
                                      prologue_bytes, layer_norm)
        if threads_per_row is not None:
            plans = [p for p in plans if p.threads_per_row == threads_per_row]
        if batch is not None or rows_per_block not in (None, 1):
            raise LoweringError("normalization plan: shared_row takes its chunks a thread "
                                "from threads_per_row: pin no batch or rows_per_block")
        if not plans:
            raise LoweringError(
                f"normalization plan: no shared-row plan covers hidden={hidden}"
                + (f" with threads_per_row={threads_per_row}" if threads_per_row else "")
                + f" (warp-multiple blocks of {MIN_THREADS_PER_BLOCK}..{MAX_THREADS_PER_BLOCK} "
                  "threads, at most 16 chunks of 16 bytes each)")
        return choose_shared_row(plans, hardware)
    if (shared_row is None and threads_per_row is None and batch is None
            and rows_per_block is None and all(v is None for v in register_pins)):
        plain = _plain_rowwise(hidden, vector_width, value_bytes, wide)
        if envelope is None and (plain is None or _envelope_over(plain, hidden, wide)):
            plain = (_envelope_rowwise(hidden, vector_width, value_bytes, param_sizes, wide,
                                       bf16, over=plain is not None) or plain)
        if plain is not None:
            return plain
        routed = _route(hidden, vector_width, value_bytes, param_bytes, bf16, param_sizes, wide)
        if routed is not None:
            return routed
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
                           param_sizes, shared_row=False)
        if not best.x_staged or best.x_bulk:
            raise LoweringError(f"normalization plan: l2_hint {l2_hint!r} is a hint on the "
                                "cp.async of x: it needs x_staged")
        return dataclasses.replace(best, l2_hint=l2_hint)
    if threads_per_row is not None or batch is not None:
        t = threads_per_row or round_up(-(-vectors // batch), WARP)
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
        if estimate + margin > register_budget(t * r):
            raise LoweringError(
                f"normalization plan: {t} threads x {b * vector_width} values needs ~{estimate} "
                f"registers a thread (+{margin} margin), over the {register_budget(t * r)} a "
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
        # tensors or the prefetched row in registers. Measured: rowwise t32 b3 r4 the
        # best at 768 (0.904 of copy bandwidth; the best persistent plan without the
        # cp.async ring 1.031x), rowwise t32 b4 r4 1.001x at 1024. With the ring among
        # the candidates: 1.008x at 768 against the tensors in registers with a ring of
        # two rows of x (the best, 0.910; 105 registers, 4 blocks of 128), 1.000x at
        # 1024 (tied with it).
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
                + ("" if shared_row is False else
                   "; nor does a shared-row plan fit (its row in 227 KiB of shared memory "
                   "and up to three 16-byte chunks a thread in registers, fewer with a "
                   "prologue's 1-D tensors)"))
        best = choose_persistent(plans, hidden, value_bytes)
    if rows_per_block is not None:
        best = dataclasses.replace(best, rows_per_block=rows_per_block)
    return best


# `_plain_rowwise`: on (the default), plain 16-bit norms' aligned rows longer than a
# warp's take the row-wise kernel at about `PLAIN_ROWWISE_VALUES` values a thread, its
# block promise from `PLAIN_ROWWISE_REGISTERS`, wherever an SM holds two blocks of it.
PLAIN_ROWWISE = True
PLAIN_ROWWISE_VALUES = 24
PLAIN_ROWWISE_MAX_PADDING = 0.1
# Threads an SM the plan must hold: side by side on an H200, the row-wise plans with
# 1024-1280 won by 4-17% over the persistent ones, those with 832-960 lost 3-9%
# (7680 layer_norm t320 x3, 9728 t416 x2, 10752 t448 x2).
PLAIN_ROWWISE_THREADS = 1024
# Registers of the row-wise kernel of a plain norm besides one a value (ptxas, sm_90:
# layer_norm t192 b3 v8 fits 56 at a promise of six blocks, rms_norm 46-56 unpromised).
PLAIN_ROWWISE_REGISTERS = 32


def _plain_rowwise(hidden: int, vector_width: int, value_bytes: int, wide: dict):
    """The row-wise plan of a plain norm (its only 1-D tensors the weight and bias, read
    in the epilogue: no prologue), or None where the other rules decide.

    The persistent kernel exists for the fusions whose prologue tensors would fall out of
    L1 when re-read every row; a plain norm's weight and bias are a few bytes a column,
    which L1/L2 serve beside the row's own traffic. Its row-wise kernel then needs no
    ring, no prefetch and no block barrier between rows, and many blocks an SM keep DRAM
    busy while each reduces its row: the autotuner's winners side by side on an H200
    (bf16, 8192 rows) were row-wise plans of 16-24 values a thread, four to nine blocks
    an SM, at 0.94-0.97 of copy bandwidth where the persistent default ran 0.81-0.89
    (layer_norm 2560-5632, rms_norm 4608-16896). The geometry: 24 values a thread
    (`PLAIN_ROWWISE_VALUES`) where that pads a row by at most
    `PLAIN_ROWWISE_MAX_PADDING`, else the least padding; one row a block; the promise the
    most blocks an SM whose threads each have their values plus
    `PLAIN_ROWWISE_REGISTERS` registers (the estimate of `register_estimate`, fitted to
    the fusions, leaves plain norms at two or three blocks)."""
    if (not PLAIN_ROWWISE or wide["prologue_bytes"] or not wide["rows_aligned"]
            or value_bytes != 2 or vector_width != 8):
        return None

    def blocks(p: LaunchPlan) -> int:
        need = round_up(p.batch * vector_width + PLAIN_ROWWISE_REGISTERS, 8)
        return min(MAX_THREADS_PER_SM // p.block_threads,
                   REGISTERS_PER_SM // (p.block_threads * need), MAX_BLOCKS_PER_SM)

    # rows one warp covers keep rule 0; one block an SM, or fewer than
    # `PLAIN_ROWWISE_THREADS` threads, leave each block's reduction and stores uncovered;
    # a layer norm's 32 values a thread spilled at the promise (t480 b4 x2: 16 bytes)
    most = PLAIN_ROWWISE_VALUES if wide["layer_norm"] else 32
    candidates = candidate_plans(hidden, vector_width, value_bytes)
    if any(p.threads_per_row == WARP for p in candidates):
        return None
    plans = [p for p in candidates if 16 <= p.batch * vector_width <= most
             and blocks(p) >= 2 and blocks(p) * p.block_threads >= PLAIN_ROWWISE_THREADS]
    if not plans:
        return None
    fit = [p for p in plans if p.batch * vector_width == PLAIN_ROWWISE_VALUES
           and padding(p, hidden) <= PLAIN_ROWWISE_MAX_PADDING]
    pick = fit[0] if fit else min(plans, key=lambda p: (
        round(padding(p, hidden), 2), abs(p.batch * vector_width - PLAIN_ROWWISE_VALUES)))
    return dataclasses.replace(pick, param_cache="none", blocks_per_sm=blocks(pick))


# `_envelope_rowwise`: on (the default), plain 16-bit norms' rows that are not 16-byte
# aligned, and aligned rows `_plain_rowwise` declines or `_envelope_over` takes from it,
# get the envelope row-wise kernel wherever an SM holds two blocks of it at
# `ENVELOPE_CHUNKS` or more chunks a thread (`_choose_envelope`).
ENVELOPE_ROWWISE = True
ENVELOPE_CHUNKS = 3  # chunks a thread at least
ENVELOPE_PADDING_STEP = 0.1  # padding compared in steps of this
ENVELOPE_ROW_THREADS = 160  # threads a row preferred where the row allows
# A one-CTA row takes 4 or 5 chunks a thread on fewer threads (below the tier of
# `ENVELOPE_ROW_THREADS`) rather than 3 where an SM holds as many threads of them. Side by
# side on an H200 (bf16, 8192 rows, after `edge_output`): 1537 on 64 threads x 4 (two
# rows a block) 0.81 of copy bandwidth against 0.74 on 96 x 3 (RMS 0.86 against 0.85),
# 3002 on 96 x 4 0.89 against 0.78 on 160 x 3 (RMS 0.90 against 0.89), layer norms of
# 1601, 2001, 3501 and 3801 5-8% faster (RMS norms -0.9% to +2%); where the SM would hold
# fewer threads, 2050 on 64 x 5 0.78 against 0.83 on 96 x 3: not taken.
ENVELOPE_FEWER_THREADS = True
ENVELOPE_ALIGNED_MIN = 8192  # aligned RMS norms' rows from this many values
ENVELOPE_LAYER_ALIGNED_MIN = 2048  # aligned layer norms' rows from this many values
ENVELOPE_LAYER_MIN = 512  # unaligned layer norms from this many values (2- or 4-byte vectors)
ENVELOPE_OVER_BLOCKS = 3  # aligned RMS norms' row-wise plans of fewer blocks an SM yield
# Registers of the envelope kernel besides 4 a chunk, fitted to ptxas (sm_90, no
# promise: rms_norm 32-62 at 1-6 chunks). The block promise leaves ptxas at least the
# estimate rounded up to 8 (`blocks_by_registers`); held 4-8 registers lower it spilled
# 8-42 bytes. The unit tests compile the default plans of a sweep and check.
ENVELOPE_REGISTERS = 40
# A layer norm takes 8 more on a cluster, or with other tensors or output than a plain
# norm's (`plain_tensors`). On one block, a plain layer norm holds as few as an RMS norm:
# at 56 registers (4 chunks), 64 (5 and 6) none of its default plans spilled, bf16 or
# fp16 (7001-16385), where ptxas left alone took 64-78. Held to them, more blocks an SM
# fit, which the layer norm's longer arithmetic a row needs: side by side on an H200,
# 7001 (5 blocks of 224 threads, not 4) ran 0.885 of copy bandwidth against 0.815, 12345
# (3 of 320, not 2) 0.893 against 0.732.
ENVELOPE_LAYER_REGISTERS = 8
# Registers a cluster's CTA takes beyond them (its rank and slice offset, the exchange).
ENVELOPE_CLUSTER_REGISTERS = 4
# And a layer norm's, for base pointers off 16 bytes (the tensors' general shifts), and a
# cluster's again for fp16 values: at the bf16 estimate ptxas spilled 8-16 bytes there
# (one block: 12288 and 14336 two bytes off; clusters: six chunks a thread at 92K-131K
# fp16 values, 54272-110592 bf16 two bytes off; five at fp16 two bytes off; an RMS
# norm's five at 40001 fp16).
ENVELOPE_CLUSTER_SPARE = 8
# A plain layer norm on a cluster (16-bit, every row on 16 bytes) held to the most
# registers, from _LEAST to _HELD, that fit three blocks an SM (56 on rows of up to 384
# threads, 48 on 416; 448 fit two): side by side on an H200 at 25088-64000 columns, three
# blocks ran 1-7% faster than two on 320-384 threads (37376 0.82 -> 0.88 of copy
# bandwidth; ptxas kept 55-62 registers, no spills). On 416 threads at 48 registers they
# ran 4% slower while the row's shift was loaded from global memory a row ahead (ptxas
# waited on that load at once); with the shift copied with the ring, 2-10% faster (H200:
# 39424 0.83 -> 0.92, 61952 0.83 -> 0.86, and two-CTA clusters of six chunks a thread
# where three CTAs of four or five had been chosen; H100 within 1%, 39424 +4%). Rows too
# long for three blocks of a two-CTA cluster are held so at two blocks (448-640 threads,
# 48-56 registers: ptxas kept 48-64, no spills) rather than split over three CTAs of three
# blocks: H200 41472-57856 0.91-0.92 of copy bandwidth against 0.88-0.89. Three or four
# CTAs a row at two blocks ran slower than at three (0.78-0.89), so they keep three.
# fp16 values take the same held plans (ptxas kept them without spills at 24576-131072):
# on an H200 at 33280-57856, 0.91-0.93 of copy bandwidth against 0.83-0.88 on fp16's own
# estimate (`ENVELOPE_CLUSTER_SPARE`: three or four CTAs of five chunks at two blocks).
# A plain RMS norm's clusters take the same held plans (ptxas kept 47-54 registers on
# them, none spilled): on an H200 at 46080-65536 columns, two CTAs of six or seven chunks
# at two blocks ran 0.92-0.94 of copy bandwidth where three or four CTAs of five on its
# own estimate ran 0.89-0.92 (bf16 46080 0.89 -> 0.93, 65536 0.89 -> 0.93; fp16 46080
# 0.89 -> 0.93, 49664 0.90 -> 0.93), 22528-45056 within -0.7% to +1.5%.
ENVELOPE_LAYER_CLUSTER_HELD = 56
ENVELOPE_LAYER_CLUSTER_LEAST = 48
# CTAs a row at most: the portable cluster size.
MAX_CLUSTER = 8


def _envelope_over(rowwise: LaunchPlan, hidden: int, wide: dict) -> bool:
    """Whether the envelope kernel takes an aligned row from `_plain_rowwise`.

    - A layer norm's (its one-pass statistics) from `ENVELOPE_LAYER_ALIGNED_MIN` values,
      and shorter ones where the row-wise plan leaves slots empty (`_plain_rowwise`
      plans rows past 1024 values: from 1032). Side by side on an H200 (8192 rows, bf16
      / fp16), row-wise against the envelope: 2056 0.87 / 0.89 against 0.91 / 0.92, 4096
      0.88 / 0.92 against 0.93 / 0.93, 5632 0.88 / 0.91 against 0.94 / 0.94, 7168 0.84 /
      0.87 against 0.93 / 0.94; 2048-7680 otherwise -0.8% to +4%. Shorter rows the
      row-wise plan pads: 1032 0.78 / 0.82 against 0.86 / 0.84, 1544 0.75 / 0.80 against
      0.88 / 0.90, 1800 and 2000 +2-9%, but fp16 1192 -2% and 1288 -6% (bf16 +5%, +2%).
      Rows of up to 1024 values keep their one-warp row-wise plans (`_plan_rowwise`): on
      the envelope 512 and 1024 ran 1-2% slower in fp16 (bf16 within 0.4%). At
      8192-13824 (bf16): 0.75-0.90 row-wise against 0.92-0.95.
    - An RMS norm's from `ENVELOPE_ALIGNED_MIN` values where the row-wise plan holds fewer
      than `ENVELOPE_OVER_BLOCKS` blocks an SM. Side by side on an H200 (bf16, 8192 rows)
      at 8192-13824: on two blocks 0.83-0.92 of copy bandwidth row-wise against
      0.93-0.94, on three 0.95-0.97 against 0.94."""
    if wide["layer_norm"]:
        return hidden >= ENVELOPE_LAYER_ALIGNED_MIN or (
            hidden >= ENVELOPE_LAYER_MIN and padding(rowwise, hidden) > 0)
    return hidden >= ENVELOPE_ALIGNED_MIN and rowwise.blocks_per_sm < ENVELOPE_OVER_BLOCKS


def plain_tensors(param_sizes: tuple[int, ...], layer_norm: bool, out_bytes: int) -> bool:
    """Whether a norm's 1-D tensors are its weight (and a layer norm's bias) alone, 16-bit,
    and its output 16-bit: what the envelope kernel's register estimate counts."""
    return (len(param_sizes) <= (2 if layer_norm else 1)
            and all(size == 2 for size in param_sizes) and out_bytes == 2)


def staged_columns(rows_aligned: bool, param_sizes: tuple[int, ...]) -> int:
    """`LaunchPlan.staged` of a cluster's plan: on rows off 16 bytes, the bytes a column
    of its 16-bit 1-D tensors. Read from global memory at each row's shift, two loads a
    chunk a tensor, they held an unaligned layer norm's clusters at two blocks an SM to
    0.65-0.72 of copy bandwidth on the H200 (without those loads, a bound, 0.81-0.84);
    copied once into shared memory: 24575 0.68 -> 0.82, 40001 0.66 -> 0.77."""
    return 0 if rows_aligned else sum(size for size in param_sizes if size == 2)


def envelope_candidates(hidden: int, layer_norm: bool, rows_per_block: int | None = None,
                        cluster: int = 1, bf16: bool = True,
                        base_aligned: bool = True, plain: bool = True,
                        staged: int = 0) -> list[LaunchPlan]:
    """Every envelope plan of a row on ``cluster`` CTAs: T threads a CTA's slice (a warp
    multiple; several rows a block below `MIN_THREADS_PER_BLOCK`, or ``rows_per_block``,
    where the row is one CTA's) and K chunks a thread, no slot empty for every thread, up
    to `MAX_ENVELOPE_CHUNKS` (`MAX_HELD_ENVELOPE_CHUNKS` on a held norm's two-CTA
    row); in a cluster, one row a block and every CTA's slice holding
    chunks of every row. The block promise: the most blocks an SM holds at the register
    estimate (a cluster of fp16 values, and a layer norm on base pointers off 16 bytes,
    counts `ENVELOPE_CLUSTER_SPARE` more for each: ``bf16``, ``base_aligned``; a layer
    norm `ENVELOPE_LAYER_REGISTERS` more on a cluster, or where its tensors or output are
    not ``plain``, `plain_tensors`; a plain norm on a cluster, its rows aligned,
    `ENVELOPE_LAYER_CLUSTER_HELD` where that fits three blocks). ``staged``: a
    cluster's `LaunchPlan.staged` (`staged_columns`), in its shared memory."""
    chunks = row_chunks(hidden, 2, False)
    least = -(-hidden // 8)  # the chunks of the row whose envelope starts aligned
    share = -(-chunks // cluster)  # a CTA's chunks at most
    most = MAX_HELD_ENVELOPE_CHUNKS if cluster == 2 else MAX_ENVELOPE_CHUNKS
    plans = []
    for t in range(WARP, MAX_THREADS_PER_BLOCK + 1, WARP):
        k = -(-share // t)
        if k > most or (k - 1) * t >= share or (cluster - 1) * t * k >= least:
            continue
        r = rows_per_block or (max(1, MIN_THREADS_PER_BLOCK // t) if cluster == 1 else 1)
        if t * r > MAX_THREADS_PER_BLOCK or (cluster > 1 and r != 1):
            continue
        est = ENVELOPE_REGISTERS + 4 * k
        if layer_norm:
            est += ENVELOPE_CLUSTER_SPARE * (not base_aligned)
            est += ENVELOPE_LAYER_REGISTERS * (cluster > 1 or not plain)
        if cluster > 1:
            est += ENVELOPE_CLUSTER_REGISTERS + ENVELOPE_CLUSTER_SPARE * (not bf16)
            # three blocks an SM where the held registers fit them, else, on a cluster
            # of two, two (`ENVELOPE_LAYER_CLUSTER_HELD`)
            for want in ((3, 2) if cluster == 2 else (3,)):
                held = min(est, max((regs for regs in range(ENVELOPE_LAYER_CLUSTER_LEAST,
                                                            ENVELOPE_LAYER_CLUSTER_HELD + 1, 8)
                                     if blocks_by_registers(t, regs) >= want), default=0))
                if held and MAX_THREADS_PER_SM // t >= want:
                    break
            if (plain and base_aligned and hidden % 8 == 0
                    and held and MAX_THREADS_PER_SM // t >= want):
                est = held
            elif k > MAX_ENVELOPE_CHUNKS:  # past six only on a held norm's row
                continue
        blocks = min(MAX_THREADS_PER_SM // (t * r), blocks_by_registers(t * r, est),
                     MAX_BLOCKS_PER_SM)
        plan = LaunchPlan(8, t, k, r, est, "none", row_chunks=chunks, envelope=True,
                          cluster=cluster, staged=staged if cluster > 1 else 0)
        if cluster > 1:  # its shared memory (a layer norm's: the one-pass kernel's)
            smem = dataclasses.replace(plan, one_pass=layer_norm).dynamic_shared_bytes
            blocks = min(blocks, SHARED_PER_SM // (smem + 1024))
        if blocks < 1:
            continue
        plans.append(dataclasses.replace(plan, blocks_per_sm=blocks))
    return plans


def _choose_envelope(plans: list[LaunchPlan], most_chunks: bool = False) -> LaunchPlan | None:
    """The default among envelope plans: two or more blocks an SM (each block's
    reductions and stores covered by the others' loads) and at least `ENVELOPE_CHUNKS`
    chunks a thread; then rows on `ENVELOPE_ROW_THREADS` threads or more where the row
    allows (else on 96), 4 or 5 chunks a thread, the least padding (in steps of
    `ENVELOPE_PADDING_STEP`), more chunks. None: no plan keeps the SM fed.

    Side by side on an H200 (bf16, 8192 rows, rms_norm at 4097-20001): 4-5 chunks a
    thread on rows of 160-512 threads, two to four an SM, ran 0.88-0.94 of copy
    bandwidth; as many chunks on rows of 64-128 threads, eight an SM, 0.65-0.79; one or
    two chunks a thread 0.55-0.76 on as many threads; one block an SM 0.47-0.79 (its
    row's reduction and stores uncovered). Short rows (1537, 2050) ran best on 96
    threads at 3 chunks (0.76, 0.85).

    ``most_chunks`` (a 16-bit norm's aligned rows, where it was measured): on a cluster,
    among plans held to `ENVELOPE_LAYER_CLUSTER_HELD` registers, the most chunks a thread
    before the padding (an RMS norm's plans on its own estimate, two blocks of four to six
    CTAs at 79872-128512 bf16 values, keep five chunks: six ran 1.5% slower at 81112).
    Side by side on an H200 (bf16, 8192 rows, three blocks an SM, the same cluster): six
    chunks on fewer threads ran 1-2.5% faster than five on 416 (layer norms 41472 0.88 ->
    0.89, 47616 0.86 -> 0.88, 61952 0.85 -> 0.87, 64000 0.86 -> 0.89)."""
    ranked = rank_envelope(plans, most_chunks)
    return ranked[0] if ranked else None


def rank_envelope(plans: list[LaunchPlan], most_chunks: bool = False) -> list[LaunchPlan]:
    """The envelope plans `_choose_envelope` allows, best first by its order."""
    def pad(p: LaunchPlan) -> float:
        return 1 - p.row_chunks / (p.cluster * p.threads_per_row * p.batch)

    def tier(p: LaunchPlan) -> int:
        t = p.threads_per_row
        return 0 if t >= ENVELOPE_ROW_THREADS else 1 if t >= 96 else 2

    ok = [p for p in plans if p.blocks_per_sm >= 2 and p.batch >= ENVELOPE_CHUNKS]
    def chunks(p: LaunchPlan) -> tuple[int, int]:
        if p.batch > MAX_ENVELOPE_CHUNKS:  # a held row's, last and the fewest first
            return 1, p.batch
        held = p.cluster > 1 and p.register_estimate <= ENVELOPE_LAYER_CLUSTER_HELD
        return 0, -p.batch if most_chunks and held else p.batch not in (4, 5)

    ranked = sorted(ok, key=lambda p: (tier(p), chunks(p),
                                       round(pad(p) / ENVELOPE_PADDING_STEP), -p.batch))
    # one CTA a row: 4 or 5 chunks a thread before the thread tier where an SM holds as
    # many threads of them (`ENVELOPE_FEWER_THREADS`)
    if (ENVELOPE_FEWER_THREADS and ranked and ranked[0].cluster == 1
            and ranked[0].batch not in (4, 5)):
        def resident(p: LaunchPlan) -> int:
            return p.blocks_per_sm * p.block_threads
        better = [p for p in ranked if p.batch in (4, 5) and resident(p) >= resident(ranked[0])]
        if better:
            ranked.remove(better[0])
            ranked.insert(0, better[0])
    return ranked


def _envelope_rowwise(hidden: int, vector_width: int, value_bytes: int,
                      param_sizes: tuple[int, ...], wide: dict, bf16: bool = True,
                      over: bool = False):
    """The envelope plan of a plain 16-bit norm (no prologue, no epilogue tensors, 16-bit
    weight, bias and output: what its register estimate counts), or None where the other
    rules decide. Side by side on an H200 (bf16, 8192 rows), against the plans these
    rows had:

    - Rows that are not 16-byte aligned and leave the register kernels vectors under 8
      bytes: rms_norm 0.69-0.94 of copy bandwidth at 513-20001 (0.55-0.78 on the
      shared-row kernel). A layer norm from `ENVELOPE_LAYER_MIN` values: 0.78-0.79 at
      7001-16385 (0.55-0.69 on the register kernels' narrow vectors, the shared-row
      kernel past 16K). Shorter ones, after the one-pass statistics and the output pass
      instantiated for each shift: H200 3001-6001 0.73-0.89 against 0.65-0.71, H100
      0.89-0.95 against 0.75-0.79. Since the envelope's output pass lost its per-slot
      tests (H200, side by side): 2501 0.79 against 0.66 on the register kernels, 2999
      0.76 against 0.70, but 1537 0.69 against 0.75 and 513 0.62 against 0.72 (1001 0.72
      against 0.66). Rows of 4-byte vectors (2 mod 8 values): 4098 0.84 against 0.82, 5002
      0.88 against 0.80, 6002 0.90 against 0.80, 2050 0.77 against 0.78. Since a row's
      partial chunks take one value a lane (`edge_output`): 513 0.75 against 0.71, 777
      0.73 against 0.68, 1001 0.79 against 0.66, 1537 0.74 against 0.75, 2050 0.83 against
      0.78, 2501 0.84 against 0.66, 3002 0.79 either way: from 512 values
      (`ENVELOPE_LAYER_MIN`, 2- or 4-byte vectors; shorter rows have no envelope plan of
      three chunks a thread). 8-byte vectors (5140) run as fast either way (0.90
      rms_norm): they keep their plans.
    - Aligned rows `_envelope_over` takes from `_plain_rowwise` (``over``), and from
      `ENVELOPE_ALIGNED_MIN` values (a layer norm's `ENVELOPE_LAYER_ALIGNED_MIN`) rows it
      declined: the
      raw 16-bit chunks take half the registers of its fp32 values, so two blocks an SM
      still fit past 16K values (14848-20992: rms_norm 0.95-0.97 against 0.88-0.91 on
      the shared-row kernel, layer_norm 0.92-0.94 against 0.88-0.90).

    - Rows no one-block plan holds at two blocks an SM, where the GPU has clusters: split
      over the smallest cluster with a plan (`envelope_candidates`' ``cluster``) rather
      than on the shared-row family, which takes a layer norm's two statistics in two
      passes over shared memory and two block barriers a row, the cluster in one pass and
      one exchange. Side by side (default plans of each, same code generator): RMS norms
      at 25088-55808 H200 0.90-0.94 against 0.87-0.90, H100 0.95 against 0.93-0.95;
      unaligned 24575-50001 H200 0.80-0.86 against 0.79, H100 0.86-0.90 against
      0.85-0.87. (A layer norm's shared-row plans ran 0.54-0.77 on the H200 at
      20001-65536, its clusters 0.70-0.82, before the clusters' register model.)

    Layer norms take the one-pass statistics (``one_pass``: 2-14% faster than two passes
    over the registers at every width measured)."""
    layer = wide["layer_norm"]
    # plain norms: the register estimate counts the weight and bias alone, 16-bit
    plain = plain_tensors(param_sizes, layer, wide["out_bytes"])
    if not ENVELOPE_ROWWISE or wide["prologue"] or value_bytes != 2 or not plain:
        return None
    if wide["rows_aligned"]:  # ``over``: `_envelope_over` took the row from a row-wise plan
        least = ENVELOPE_LAYER_ALIGNED_MIN if layer else ENVELOPE_ALIGNED_MIN
        if not over and hidden < least:
            return None
    elif vector_width * value_bytes >= 8 or (layer and hidden < ENVELOPE_LAYER_MIN):
        return None
    plan = _choose_envelope(envelope_candidates(hidden, layer, base_aligned=wide["base_aligned"]))
    if plan is None and wide["hardware"].clusters:
        for cluster in range(2, MAX_CLUSTER + 1):  # the smallest cluster that holds the row
            plan = _choose_envelope(envelope_candidates(
                hidden, layer, cluster=cluster, bf16=bf16, base_aligned=wide["base_aligned"],
                staged=staged_columns(wide["rows_aligned"], param_sizes)),
                most_chunks=wide["rows_aligned"])
            if plan is not None:
                break
    return dataclasses.replace(plan, one_pass=True) if plan and layer else plan


def _route(hidden, vector_width, value_bytes, param_bytes, bf16, param_sizes, wide):
    """The default plan where it is the shared-row family's (None: the register
    families' heuristic decides): rows of 512+ values that only allow the register
    kernels vectors under 8 bytes (odd widths, or 2 mod 4: 0.5-0.84 of copy bandwidth
    measured with them; 8-byte vectors, 5140, ran 0.90-0.93), rows too wide for the
    register kernels, and rows where the model prefers it (`prefers_shared_row`).

    A layer norm takes the family only where the register kernels cannot plan the row:
    its two statistics cost the shared-row kernel a second pass and barrier a row, and
    measured (bf16, 8192 rows) it lost to the register kernels both on unaligned rows
    (0.41-0.59 of copy bandwidth on an H200 at 1001-30001, against 0.73-0.86 for the
    register kernels' narrow vectors on an H100) and on starved aligned ones (16896:
    0.79 against 0.88 on the H200, 0.88 against 0.94 on the H100)."""
    hardware = wide["hardware"]
    shared = shared_row_candidates(hidden, value_bytes, param_bytes, wide["rows_aligned"],
                                   hardware, wide["prologue_bytes"], wide["layer_norm"])
    if not shared:
        return None
    pick = choose_shared_row(shared, hardware)
    layer = wide["layer_norm"]
    if vector_width * value_bytes < 8 and hidden >= SHARED_ROW_MIN_HIDDEN and not layer:
        return pick
    try:
        registers = plan_launch(hidden, vector_width, value_bytes, param_bytes=param_bytes,
                                bf16=bf16, param_sizes=param_sizes, shared_row=False)
    except LoweringError:
        return pick  # wider than 1024 threads x 32 values
    if not layer and prefers_shared_row(registers, pick, hidden, value_bytes, wide["out_bytes"],
                          wide["prologue_bytes"], param_bytes, wide["passes"], hardware):
        return pick
    return registers


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
