"""The same kernel in several columns of one side-by-side timing: how far apart can
identical work read?

In every tuned bench run, 20480's tuned plan and the heuristic's were the same plan and
the same source (but the kernel's name) and the ``ours`` column read 1-2.8% faster than
the ``heuristic`` one (123d20d, 006e265, bfe6d1f, f930243, 66e7226 twice), where the
same-plan columns of other sizes agree within 0.2%. This times, per size, the heuristic's
spec twice (two columns, one loaded kernel), its plan pinned (``spec_with_plan``: another
name, another module, the same source) twice, beside copy_, in carryover-balanced rounds;
then the same with the column order reversed.

    python benchmarks/norm_twin_columns_probe.py --hidden 20480,16384 --out probe.json
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    from probe_common import parser, report_size, time_plans, write_results
    from lowering.kernels.normalization import NormalizationSpec, spec_with_plan

    a = parser("20480,16384", __doc__).parse_args()
    res = []
    for hidden in (int(h) for h in a.hidden.split(",")):
        base = NormalizationSpec.reference_fusion(a.rows, hidden, 1e-5)
        pinned = spec_with_plan(base, base.plan)
        specs = {"heuristic_a": base, "pinned_a": pinned, "heuristic_b": base, "pinned_b": pinned}
        for order in ("forward", "reversed"):
            ordered = dict(specs.items()) if order == "forward" else dict(reversed(specs.items()))
            info, copy_us = time_plans(a.rows, hidden, ordered, a.reps)
            row = report_size(hidden, info, copy_us, "us")
            row["order"] = order
            res.append(row)
    write_results(a.out, a.rows, a.reps, res)


if __name__ == "__main__":
    main()
