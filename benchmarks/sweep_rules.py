"""Compare the normalization planner with a measured plan sweep (no GPU needed).

    PYTHONPATH=. python benchmarks/sweep_rules.py [benchmarks/results/layer_norm_nvidia-h200_sweep_0344c81.json] [--all]
    PYTHONPATH=. python benchmarks/sweep_rules.py RESULTS.json --fit

``--fit``: every combination of `RULE_GRID` (the switches of `PlannerRules`: deeper x
ring, one-pass reduction, tensors through L2, the L2 hint on x) is scored against the sweep: for each size
the plan the planner would pick under it, its time over the best measured time. The
combinations are ranked by the worst size, then the mean (one that picks an unmeasured
plan is out); the first is what `RULES` in lowering/kernels/normalization.py should be.

For each hidden size of the results file: the plan `plan_launch` picks for the spec the
sweep measured (the reference fusion at the file's dtype and rows), its time over the
best measured time, and the fastest plans with what ptxas reported for them (registers),
the blocks an SM holds at those registers (by the register file alone), and the padding.
The rules in lowering/kernels/normalization.py cite this table; tests/unit/
test_normalization_sweep.py holds the planner to it.
"""

from __future__ import annotations

import collections
import itertools
import json
import sys

import lowering.kernels.normalization as normalization
from lowering.kernels.normalization import NormalizationSpec

DEFAULT = "benchmarks/results/layer_norm_nvidia-h200_sweep_0344c81.json"


def load(path: str = DEFAULT):
    data = json.load(open(path))
    by_size = collections.defaultdict(dict)
    for entry in data["sweep"]:
        if "us" in entry and not entry.get("error"):
            by_size[entry["hidden"]][entry["describe"]] = entry
    return data, by_size


def chosen_plan(data, hidden: int):
    return NormalizationSpec.reference_fusion(data["rows"], hidden, dtype=data["dtype"]).plan


def resident_blocks(entry) -> int:
    """Blocks of the entry's plan an SM holds by registers and threads alone (allocation
    by warp, 256 registers a unit)."""
    block = entry["threads_per_row"] * entry["rows_per_block"]
    per_warp = -(-entry["registers"] * 32 // 256) * 256
    return max(0, min(65536 // (per_warp * (block // 32)), 2048 // block, 32))


def score(data, by_size, rules) -> tuple[float, float, dict]:
    """(worst ratio, mean ratio, {hidden: (describe, ratio)}) of the planner under ``rules``."""
    saved = normalization.RULES
    normalization.RULES = rules
    normalization._plan_of.cache_clear()
    try:
        picks = {}
        for hidden, entries in by_size.items():
            best = min(e["us"] for e in entries.values())
            d = chosen_plan(data, hidden).describe()
            picks[hidden] = (d, entries[d]["us"] / best if d in entries else float("inf"))
    finally:
        normalization.RULES = saved
        normalization._plan_of.cache_clear()
    ratios = [r for _, r in picks.values()]
    return max(ratios), sum(ratios) / len(ratios), picks


def fit(data, by_size, top: int = 5) -> list:
    grid = normalization.RULE_GRID
    scored = []
    for values in itertools.product(*grid.values()):
        rules = normalization.PlannerRules(**dict(zip(grid, values)))
        worst, mean, picks = score(data, by_size, rules)
        scored.append((worst, mean, rules, picks))
    scored.sort(key=lambda s: (s[0], s[1]))
    print(f"current RULES = {normalization.RULES}: worst {score(data, by_size, normalization.RULES)[0]:.3f}x")
    for worst, mean, rules, picks in scored[:top]:
        print(f"{rules}: worst {worst:.3f}x, mean {mean:.3f}x")
        for hidden in sorted(picks):
            print(f"   {hidden:6d} {picks[hidden][1]:.3f}x {picks[hidden][0]}")
    return scored


def main(argv):
    path = next((a for a in argv if not a.startswith("--")), DEFAULT)
    if "--fit" in argv:
        data, by_size = load(path)
        fit(data, by_size)
        return
    top = 10**6 if "--all" in argv else 8
    data, by_size = load(path)
    print(f"{path}: {data['device']}, commit {data['commit']}, {data['rows']} rows, {data['dtype']}")
    for hidden in sorted(by_size):
        entries = by_size[hidden]
        best = min(e["us"] for e in entries.values())
        plan = chosen_plan(data, hidden)
        mine = entries.get(plan.describe())
        ratio = f"{mine['us'] / best:.3f}x, {mine['over_copy']:.3f} of copy" if mine else "NOT MEASURED"
        print(f"== {hidden}: planner {plan.describe()} ({ratio})")
        for e in sorted(entries.values(), key=lambda e: e["us"])[:top]:
            pad = 1 - hidden / (e["threads_per_row"] * e["batch"] * e["vector_width"])
            print(f"  {e['us'] / best:6.3f}x {e['over_copy']:.3f} {e['describe']:48s} "
                  f"regs {e['registers']:3d} (est {e['register_estimate']:3d}) "
                  f"blocks/SM {resident_blocks(e):2d} pad {pad:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
