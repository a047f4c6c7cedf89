"""Narrower vectors where they remove the padding: the plans of 8-byte vectors beside
the heuristic's 16-byte ones, timed side by side with copy_.

The widest vector a row allows is the planner's choice (`vector_width_for`): 16 bytes
at every bench size but 5140. Some sizes pad it: 1600 (200 vectors of 8 on 256 slots,
t64 b4: 22% of the lanes idle), 1280 (160 on 192, 17%). With 8-byte vectors the same
rows fit with less padding (1280: 320 vectors on t64 b5 or t160 b2, none), at twice the
load instructions. A spec with ``alignment=8`` plans with 8-byte vectors (any 16-byte
aligned tensor is 8-byte aligned too); this probe times the first ``--plans`` of its
`tune_plans` beside the heuristic's plan at 16 bytes and copy_, each checked against
float64 first:

    python benchmarks/norm_vector_probe.py --out probe.json
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    from probe_common import parser, time_sizes

    ap = parser("1280,1536,1600,2560,4096", __doc__)
    ap.add_argument("--plans", type=int, default=14)
    a = ap.parse_args()
    from lowering.kernels.normalization import NormalizationSpec, padding, spec_with_plan, tune_plans

    def build(hidden):
        base = NormalizationSpec.reference_fusion(a.rows, hidden, 1e-5)
        narrow = NormalizationSpec.reference_fusion(a.rows, hidden, 1e-5, alignment=8)
        specs = {"heuristic v%d" % base.plan.vector_width: base}
        for p in tune_plans(narrow)[:a.plans]:
            specs[p.describe()] = spec_with_plan(narrow, p)
        return specs, {k: {"padding": round(padding(s.plan, hidden), 3)} for k, s in specs.items()}

    time_sizes(a, build, "padding")


if __name__ == "__main__":
    main()
