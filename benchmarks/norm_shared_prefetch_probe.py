"""Long rows with the 1-D tensors in shared memory and the next row of x prefetched into
registers, which the register estimate keeps out of the candidates, timed beside the
heuristic's plan and copy_.

At 20480 (fp16, the reference fusion) the four tensors take 160 KiB a block: staged in
shared memory they leave no room for a ring of x (two 40 KiB buffers), so the planner
reads two of them through L2 every row (``global+s4``). Prefetching x into registers
instead needs no shared memory; the estimate (`persistent_register_estimate`: 104 with
its margin, against 96 a thread for 640 threads) refuses it, but ptxas compiles it in 95
registers without spills. This probe builds each row geometry's shared-tensor,
register-prefetch plan with the estimate overridden, keeps those ptxas compiles without
spills, checks them against float64 and times them side by side (carryover-balanced
CUDA-graph replays, input sets rotated past L2):

    python benchmarks/norm_shared_prefetch_probe.py --out probe.json
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def forced_specs(rows: int, hidden: int, estimate: int = 80):
    """The shared-tensor, register-prefetch plan of every row geometry, built with the
    register estimate set to ``estimate`` (each spec's plan is cached as built)."""
    import lowering.kernels.normalization as nm
    from probe_common import built, register_estimate

    out = []
    width = nm.NormalizationSpec.reference_fusion(rows, hidden).plan.vector_width
    with register_estimate(estimate):
        for b, t, r in nm._row_geometries(hidden, width):
            try:
                out.append(built(nm.NormalizationSpec.reference_fusion(
                    rows, hidden, 1e-5, threads_per_row=t, batch=b, rows_per_block=r,
                    param_cache="shared", prefetch=True, x_staged=False)))
            except Exception as e:  # noqa: BLE001 -- a geometry that does not fit: skipped
                print(f"{hidden} t{t} b{b}: {e}", file=sys.stderr)
    return out


def main() -> None:
    from probe_common import parser, time_sizes

    ap = parser("12288,16384,20480", __doc__)
    a = ap.parse_args()
    from lowering.kernels.normalization import NormalizationSpec

    def build(hidden):
        specs = {"heuristic": NormalizationSpec.reference_fusion(a.rows, hidden, 1e-5)}
        specs.update((s.plan.describe(), s) for s in forced_specs(a.rows, hidden))
        return specs, {k: {"shared_bytes": s.plan.dynamic_shared_bytes} for k, s in specs.items()}

    time_sizes(a, build, "registers")


if __name__ == "__main__":
    main()
