"""The planner's pick against the fastest plans of a past sweep, timed side by side.

The plan sweep (``hostir.run layer_norm --bench --sweep``) times each plan after the
other, and the planner's rules (`lowering.kernels.normalization.RULES`) were fitted to
such a sweep (0344c81). Timed one after another, the same kernel read up to 7% apart
(see `runtime.autotune.graph_side_by_side`), more than the margins between the top
plans. This probe takes, per hidden size, the ``--top`` fastest plans of the sweep file,
the planner's plan and the row-wise kernel, and times them with ``copy_`` in
carryover-balanced rounds of CUDA-graph replays, as the bench times its columns; each
plan is checked against the float64 reference first.

    python benchmarks/norm_plan_probe.py --out probe.json
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SIZES = "768,1024,1280,1536,1600,2048,2560,4096,5140,12288,16384,20480"
SWEEP = "benchmarks/results/layer_norm_nvidia-h200_sweep_0344c81.json"


def main() -> None:
    from probe_common import parser, time_plans, write_results

    ap = parser(SIZES, __doc__)
    ap.add_argument("--sweep", default=SWEEP)
    ap.add_argument("--top", type=int, default=5)
    a = ap.parse_args()
    from hostir.jobs.layer_norm import sweep_specs
    from lowering.kernels.normalization import NormalizationSpec

    past = {}
    for e in json.load(open(a.sweep))["sweep"]:
        if "over_copy" in e and not e.get("error"):
            past.setdefault(e["hidden"], []).append(e)
    res = []
    for hidden in (int(h) for h in a.hidden.split(",")):
        spec = NormalizationSpec.reference_fusion(a.rows, hidden, 1e-5)
        by_name = {s.plan.describe(): s for s in sweep_specs(spec)}
        top = [e["describe"] for e in sorted(past.get(hidden, []), key=lambda e: -e["over_copy"])]
        specs = {"planner": spec,
                 "rowwise": dataclasses.replace(spec, param_cache="none")}
        for name in top:
            if len(specs) >= a.top + 2:
                break
            if name in by_name and name not in (s.plan.describe() for s in specs.values()):
                specs[name] = by_name[name]
        rows, copy_us = time_plans(a.rows, hidden, specs, a.reps)
        best = max((k for k in rows if "us" in rows[k]), key=lambda k: rows[k]["over_copy"])
        row = {"hidden": hidden, "copy_us": round(copy_us, 2), "plans": rows, "best": best,
               "planner_over_best": round(rows[best]["us"] / rows["planner"]["us"], 3)}
        print(hidden, best, rows[best]["over_copy"], "planner", rows["planner"]["over_copy"],
              flush=True)
        res.append(row)
    write_results(a.out, a.rows, a.reps, res, sweep=a.sweep, top=a.top)


if __name__ == "__main__":
    main()
