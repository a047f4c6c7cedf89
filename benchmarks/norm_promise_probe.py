"""Every persistent plan of a size with a higher block promise, where it compiles without
spills, timed side by side with copy_.

The tuner's promise twins (`tune_plans`, `LaunchPlan.blocks_per_sm`) cover the
heuristic's pick and the row-wise geometries; at 5140 the pick's twins spill and the
row-wise ones lose (raw/layer_norm_tune_run1_1be8e46.log). This probe takes every
persistent candidate (`persistent_candidates`, no one-pass, no split tensors) and
promises it 1..``--steps`` more blocks an SM, keeps what ptxas compiles without spills or
local memory (`runtime.normalization.spill_report`), and times those, the plans at their own promise and the heuristic's, each
checked against float64 first.

    python benchmarks/norm_promise_probe.py --hidden 5140 --out probe.json
"""

from __future__ import annotations

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def promise_specs(base, steps: int) -> dict:
    """label -> spec: the heuristic's, every persistent candidate, and its promise twins
    (not yet checked for spills)."""
    import lowering.kernels.normalization as nm

    dtypes = base.parameter_dtypes()
    sizes = tuple(nm.DTYPE_BYTES[d] for d in dtypes[1:-1])
    out = {"heuristic " + base.plan.describe(): base}
    for p in nm.persistent_candidates(base.hidden, base.plan.vector_width,
                                      nm.DTYPE_BYTES[base.input_dtype], sum(sizes),
                                      "bfloat16" in dtypes, sizes):
        if p.one_pass or p.shared_param_bytes:
            continue
        twins = [p]
        for extra in range(1, steps + 1):
            b = p.min_blocks_per_sm + extra
            if not p.sm_holds(b):
                break
            twins.append(dataclasses.replace(p, blocks_per_sm=b))
        for q in twins:
            out.setdefault(q.describe(), nm.spec_with_plan(base, q))
    return out


def main() -> None:
    from probe_common import parser, time_sizes
    from lowering.kernels.normalization import NormalizationSpec
    from runtime import jit
    from runtime.normalization import precompile, spill_report

    ap = parser("5140", __doc__, reps=2)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    arch = jit.device_arch()

    def build(hidden):
        specs = promise_specs(NormalizationSpec.reference_fusion(a.rows, hidden, 1e-5), a.steps)
        precompile(list(specs.values()), arch)  # in parallel; the spill check reads them
        spilled = {k: spill_report(s, arch) for k, s in specs.items()}
        specs = {k: s for k, s in specs.items() if not spilled[k]}
        print(hidden, f"{len(specs)} plans without spills, {sum(map(bool, spilled.values()))} "
              "promise twins spill", flush=True)
        return specs, {k: {"blocks": s.plan.min_blocks_per_sm} for k, s in specs.items()}

    for row in time_sizes(a, build, "blocks"):
        best = min((v for v in row["plans"].values() if "us" in v), key=lambda v: v["us"])
        print(row["hidden"], "best", best, flush=True)


if __name__ == "__main__":
    main()
