"""The plans the autotuner times for a spec: the heuristic's pick and its near rivals.

The heuristic was fitted to plans timed one after another; timed side by side on the
device, some of a pick's twins beat it by a few percent. `tune_plans` lists the plans
worth that timing (`runtime.normalization.tune` times them and stores the winner).
"""

from __future__ import annotations

import dataclasses

from hostir.errors import LoweringError
from lowering.kernels.normalization.candidates import (
    candidate_plans, persistent_candidates, shared_row_candidates,
)
from lowering.kernels.normalization.plan import SM90, LaunchPlan
from lowering.kernels.normalization.planner import (
    CACHE_ORDER, choose_persistent, choose_shared_row, envelope_candidates, plain_tensors,
    rank_envelope, staged_columns,
)
from lowering.kernels.normalization.spec import (
    DTYPE_BYTES, PLAN_FIELDS, AddBroadcast, LayerNorm, NormalizationSpec,
)

# How many more blocks an SM than its estimate gives `tune_plans` promises a plan: the
# row-wise kernel at 4096 (t128 b4) fits 9 blocks without spills where it promises 4.
PROMISE_STEPS = 5


def tune_plans(spec: NormalizationSpec, geometries: int = 2) -> list[LaunchPlan]:
    """The plans the autotuner (`runtime.normalization.tune`) times for ``spec``, the
    heuristic's pick first, then:

    - its twins: every persistent plan of the same row geometry (threads, batch, rows a
      block) and the same home for the 1-D tensors (registers when the pick is the
      row-wise kernel), which differ in the ring of x (in registers; one or two rows
      ahead), the packed row and the bulk copy. Timed side by side these beat the pick
      by 1-3% at 1024, 1600, 2048 and 4096. Not the L2 hints on x: at 5140 the
      evict-first twin won the tuner's round by 1.1% and lost the bench's by 1.4%, in
      two runs each, a difference that follows where the buffers were allocated, not
      the plan;
    - for the next ``geometries`` row geometries in the heuristic's order, its pick
      with the tensors in each home (registers, shared memory, L2), and that pick's
      bulk-copy and packed twins: at 12288 the fastest plan side by side was t384 with
      the tensors in shared memory and x by bulk copies (0.903 of copy), where the
      heuristic takes t512 with them in registers (0.885);
    - the row-wise kernel, its heuristic's plan and every other row geometry of it
      (`candidate_plans`): with dependent launches (`runtime.normalization.
      dependent_launch`) the row-wise kernel won the tuner's rounds at 2048 and 4096
      (t128), where only its heuristic's plan was a candidate (and with vectors half as
      wide, below, too);
    - with vectors half as wide (8 bytes at least), the heuristic's pick and its twins:
      more vectors a thread, less padding (1280: none on t64 b5 against 17% on t64 b3).
      Side by side these were 2-4.6% faster than the heuristic's 16-byte plan at 1280,
      1536, 1600, 2560 and 4096.

    - the shared-row family's first plans by its model (`choose_shared_row`); where the
      pick is a shared-row plan, those, then the register families' candidates as above
      (where they cover the row).

    Never the one-pass reduction of the register kernels (1.16-2.7x its twin,
    `PlannerRules`; the envelope kernel's layer norms take theirs). Nor, with the
    tensors in registers, the leading ones staged in shared memory instead to hold one
    more block an SM (tuned side by side at 1280-5140, every such twin was slower than
    its all-registers plan; 5140, t192 b7 with two or three of the four tensors staged,
    three blocks an SM: 52.3-53.0 us against 46.2 us with two blocks).
    """
    chosen = spec.plan
    if chosen.envelope:
        # the envelope kernel's next geometries by its order, then the plans the row
        # has without it
        layer = isinstance(spec.norm, LayerNorm)
        others = [dataclasses.replace(p, one_pass=chosen.one_pass) for p in
                  rank_envelope(envelope_candidates(
                      spec.hidden, layer, cluster=chosen.cluster,
                      bf16="bfloat16" in spec.parameter_dtypes(),
                      base_aligned=spec.alignment >= 16,
                      plain=plain_tensors(spec.tensor_sizes(), layer,
                                          DTYPE_BYTES[spec.output_dtype]),
                      staged=staged_columns(spec.rows_aligned, spec.tensor_sizes())),
                      most_chunks=spec.rows_aligned)[:ENVELOPE_TUNE]]
        try:
            rest = tune_plans(dataclasses.replace(spec, envelope=False, cluster=None),
                              geometries)
        except LoweringError:
            rest = []
        return _unique([chosen, *others, *rest])
    wide = _shared_row_plans(spec)
    if chosen.shared_row:
        # and the register families' candidates where they cover the row
        try:
            registers = tune_plans(dataclasses.replace(spec, shared_row=False), geometries)
        except LoweringError:
            registers = []
        return _unique([chosen, *wide, *registers])
    dtypes = spec.parameter_dtypes()
    value_bytes = DTYPE_BYTES[spec.input_dtype]
    sizes = spec.tensor_sizes()
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
    return _unique(out + wide)


def _unique(plans: list[LaunchPlan]) -> list[LaunchPlan]:
    unique: list[LaunchPlan] = []
    for p in plans:
        if p not in unique:
            unique.append(p)
    return unique


# Shared-row plans `tune_plans` adds: the model's pick and the next ones in its order.
SHARED_ROW_TUNE = 4
# Envelope plans `tune_plans` adds where the pick is one: the first in its order.
ENVELOPE_TUNE = 4


def _shared_row_plans(spec: NormalizationSpec) -> list[LaunchPlan]:
    """The shared-row plans worth timing for ``spec``: its model's first
    `SHARED_ROW_TUNE` in `choose_shared_row`'s order (none for rows it does not take)."""
    hardware = spec.hardware or SM90
    plans = shared_row_candidates(
        spec.hidden, DTYPE_BYTES[spec.input_dtype], sum(spec.tensor_sizes()),
        spec.rows_aligned, hardware,
        sum(DTYPE_BYTES[op.dtype] for op in spec.prologue if isinstance(op, AddBroadcast)),
        isinstance(spec.norm, LayerNorm))
    out = []
    while plans and len(out) < SHARED_ROW_TUNE:
        best = choose_shared_row(plans, hardware)
        out.append(best)
        plans = [p for p in plans if p is not best]
    return out
