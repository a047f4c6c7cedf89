"""The candidate plans of a row, and what each costs the hardware: a model of Hopper.

Every plan that covers a row with warp-multiple threads and fits one block's registers
and shared memory, with the register and bytes-in-flight estimates the planner ranks
them by. The estimates are fits to what ptxas reports (sm_80, sm_90); the unit tests
compile the candidates and hold the estimates to ptxas.
"""

from __future__ import annotations

import dataclasses
import itertools

from lowering.kernels.normalization.plan import (
    MAX_BLOCKS_PER_SM, MAX_THREADS_PER_BLOCK, MAX_VALUES_PER_THREAD, MIN_THREADS_PER_BLOCK,
    SHARED_PER_BLOCK, SM90, WARP, Hardware, LaunchPlan, register_budget, round_up,
)

# the depths `persistent_candidates` offers: two rows ahead already doubles the bytes in
# flight of a one-block-per-SM plan (see LaunchPlan.stages); 3 stays a manual override
CANDIDATE_STAGES = (1, 2)
# Registers of the persistent kernel beyond the row slice, the tensors and the prefetch:
# indices, the reduction and the conversions (`persistent_register_estimate`).
PERSISTENT_OVERHEAD = 30


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
        t = round_up(-(-vectors // b), WARP)
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
        if estimate <= register_budget(t * rows_per_block):
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
    # 16, 40-48 at 8. A term of 3v/2 there would keep 20480's t640 b4 plan (95
    # registers as compiled) out of the candidates, and it is the fastest plan at that
    # size. One-warp rows still need it: 96 at 24 values (768), 120 at 32 (1024).
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


def persistent_candidates(hidden: int, vector_width: int, value_bytes: int,
                          param_bytes: int, bf16: bool = False,
                          param_sizes: tuple[int, ...] = ()) -> list[LaunchPlan]:
    """Every persistent plan that covers a row with warp-multiple threads, keeps every
    batch slot used by some thread, and fits: registers within what one block may use,
    shared memory within a block's 227 KiB. Short rows share a block as in
    `candidate_plans`. For each row geometry:

    - ``param_cache`` shared: no prefetch, the prefetch in registers, and the prefetch
      through shared memory (``x_staged``) `CANDIDATE_STAGES` rows ahead;
    - ``param_cache`` registers: the same but without prefetch (without it, in plan
      sweeps, never within 3% of the best at any size, behind the shared variant);
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
                        # memory 0.75-0.99x the unpacked twin's speed at every size
                        # swept; from L2 slower still (more latency a pass)
                        continue
                    est = persistent_register_estimate(
                        b * vector_width, vector_width, value_bytes,
                        param_bytes if cache == "registers" else 0, prefetch, cache != "registers",
                        x_staged, bf16, one_pass, packed, t == WARP)
                    plan = LaunchPlan(vector_width, t, b, r, est, cache, prefetch, param_bytes,
                                      x_staged, value_bytes, stages, one_pass, "", packed)
                    if est + 8 > register_budget(t * r):  # the margin of min_blocks_per_sm
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


# The shared-row family (`LaunchPlan.shared_row`): 16-byte chunks a thread may hold for one
# row (its passes are unrolled over them: more would only grow the code; a row of 131072
# 16-bit values is 16 chunks on 1024 threads).
MAX_SHARED_ROW_SLOTS = 18
# Registers of the shared-row kernel (an rms norm) besides its register-held chunks (4
# each), a layer norm's second statistic (8) and the prologue's 1-D tensors (8 a byte of
# a column: eight values of each, for two chunks: ptxas issues their loads a chunk ahead),
# fitted to ptxas (sm_90) over the default plans of 1..131072: 40-64 as compiled under
# the promise this makes (`LaunchPlan.min_blocks_per_sm` rounds the estimate plus a
# margin of 8 up to 8: 56 for an rms norm, 64 for a layer norm; a layer norm held to 56
# spilled 24 bytes at 34990, unaligned). The unit tests compile the default plans of a sweep of
# widths and check that none spills. ptxas is not monotonic in its cap for this kernel
# (a plain fp16 layer norm at 20480 spills 20 bytes at 56 registers, none at 48 or 64),
# so what is held to ptxas is the kernel as launched, not the estimate as a cap.
SHARED_ROW_REGISTERS = 44


def row_chunks(hidden: int, value_bytes: int, rows_aligned: bool) -> int:
    """16-byte chunks one row of x may span: its bytes / 16 when every row starts on 16
    bytes, else up to one more granule on each side."""
    if rows_aligned:
        return -(-hidden * value_bytes // 16)
    return -(-(hidden * value_bytes + 2 * (16 - value_bytes)) // 16)


def shared_row_register_estimate(register_slots: int, prologue_bytes: int = 0,
                                 layer_norm: bool = True) -> int:
    return (SHARED_ROW_REGISTERS + 8 * layer_norm + 4 * register_slots + 8 * prologue_bytes)


def shared_row_candidates(hidden: int, value_bytes: int, param_bytes: int, rows_aligned: bool,
                          hardware: Hardware = SM90, prologue_bytes: int = 0,
                          layer_norm: bool = True) -> list[LaunchPlan]:
    """Every shared-row plan of a row: a warp-multiple block of T threads, each with the
    same number of chunks (slots; none empty for every thread), as many of them in
    shared memory as a block may have (``hardware.shared_per_block`` less the partials),
    the rest in registers within the block's register budget."""
    chunks = row_chunks(hidden, value_bytes, rows_aligned)
    plans = []
    # blocks of one warp up: short rows (513: 66 chunks) need many blocks an SM, one row
    # each, to keep enough bytes requested
    for t in range(WARP, MAX_THREADS_PER_BLOCK + 1, WARP):
        slots = -(-chunks // t)
        if slots > MAX_SHARED_ROW_SLOTS or (slots - 1) * t >= chunks:
            continue
        fit = (hardware.shared_per_block - 2 * 32 * 4 * 3) // (t * 16)  # less the partials
        shared = min(slots, fit)
        est = shared_row_register_estimate(slots - shared, prologue_bytes, layer_norm)
        # the estimate within the budget; its margin of 8 goes into the block promise
        # (`LaunchPlan.min_blocks_per_sm`): at 1024 threads (one block, 64 registers) the
        # widest rows hold up to three chunks in registers, compiled without spills (a
        # fusion with prologue tensors, 84-96 estimated, spilled 16-72 bytes there)
        if shared < 1 or est > register_budget(t):
            continue
        plan = LaunchPlan(16 // value_bytes, t, shared, 1, est, "global", True, param_bytes,
                          True, value_bytes, shared_row=True, row_chunks=chunks)
        # a layer norm on one block an SM: nothing covers a second pass over the row and
        # its barrier, so its mean and M2 come in one (Chan's merge of each chunk's)
        one = layer_norm and shared_row_blocks(plan, hardware) == 1
        plans.append(dataclasses.replace(plan, one_pass=True) if one else plan)
    return plans


def shared_row_blocks(plan: LaunchPlan, hardware: Hardware = SM90) -> int:
    """Blocks of a shared-row plan one SM holds: by threads, registers (the estimate and
    the margin of `LaunchPlan.min_blocks_per_sm`) and shared memory (1 KiB a block
    reserved)."""
    need = round_up(plan.register_estimate + 8, 8)
    smem = plan.dynamic_shared_bytes + plan.shared_bytes + 1024
    return max(1, min(hardware.threads_per_sm // plan.block_threads,
                      hardware.registers_per_sm // (plan.block_threads * need),
                      hardware.shared_per_sm // smem, MAX_BLOCKS_PER_SM))
