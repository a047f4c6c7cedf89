"""Compare the normalization planner with a measured plan sweep (no GPU needed).

    PYTHONPATH=. python benchmarks/sweep_rules.py [benchmarks/results/layer_norm_nvidia-h200.json] [--all]

For each hidden size of the results file: the plan `plan_launch` picks for the spec the
sweep measured (the reference fusion at the file's dtype and rows), its time over the
best measured time, and the fastest plans with what ptxas reported for them (registers),
the blocks an SM holds at those registers (by the register file alone), and the padding.
The rules in lowering/kernels/normalization.py cite this table; tests/unit/
test_normalization_sweep.py holds the planner to it.
"""

from __future__ import annotations

import collections
import json
import sys

from lowering.kernels.normalization import NormalizationSpec

DEFAULT = "benchmarks/results/layer_norm_nvidia-h200.json"


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


def main(argv):
    path = next((a for a in argv if not a.startswith("--")), DEFAULT)
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
