"""Every row geometry of a size, each with one more resident block promised, timed side by
side with copy_.

The tuner (`tune_plans`) tries the heuristic's geometry and the next two; at 5140 (8-byte
vectors: its rows are not 16-byte aligned) those are t192 b7, t224 b6 and t288 b5, and
none reaches 0.90 of copy bandwidth. This probe times, per size, every geometry of
`_row_geometries` with the 1-D tensors in registers (row slice fp32 and packed) and in
shared memory, each with the cp.async ring two rows deep, and for each the twin that
promises ptxas one more block an SM (`__launch_bounds__`; the register estimate lowered
until the count rises, `probe_common.register_estimate`). A twin that spills is compiled
and recorded but not timed. Each plan is checked against float64 first.

    python benchmarks/norm_geometry_probe.py --hidden 5140 --out probe.json
"""

from __future__ import annotations

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def geometry_specs(base) -> dict:
    """label -> spec: each geometry's plans, and their one-more-block twins."""
    import lowering.kernels.normalization as nm
    from probe_common import built, register_estimate

    width = base.plan.vector_width
    out = {"heuristic " + base.plan.describe(): base}
    for b, t, r in nm._row_geometries(base.hidden, width):
        for kw in (dict(param_cache="registers", packed=False), dict(param_cache="registers", packed=True),
                   dict(param_cache="shared", packed=None)):
            try:
                s = built(dataclasses.replace(base, threads_per_row=t, batch=b, rows_per_block=r,
                                              prefetch=True, x_staged=True, stages=2, **kw))
            except nm.LoweringError:
                continue
            p = s.plan
            out.setdefault(p.describe(), s)
            blocks = p.min_blocks_per_sm
            need = nm.REGISTERS_PER_SM // ((blocks + 1) * p.block_threads) // 8 * 8
            est = need - 8
            if est < 32 or not p.sm_holds(blocks + 1):
                continue
            # alignment 32: the same plans and code as 16 under another name, so the plan
            # cached for the twin is built under the override (see norm_occupancy_probe)
            with register_estimate(est):
                twin = built(dataclasses.replace(s, alignment=2 * max(16, s.alignment)))
                if twin.plan.min_blocks_per_sm > blocks:
                    out.setdefault(f"{p.describe()} x{twin.plan.min_blocks_per_sm}", twin)
    return out


def main() -> None:
    from probe_common import parser, time_sizes
    from lowering.kernels.normalization import NormalizationSpec
    from runtime import jit
    from runtime.normalization import precompile

    a = parser("5140", __doc__).parse_args()

    def build(hidden):
        specs = geometry_specs(NormalizationSpec.reference_fusion(a.rows, hidden, 1e-5))
        precompile(list(specs.values()), jit.device_arch())
        return specs, {k: {"blocks": s.plan.min_blocks_per_sm,
                           "estimate": s.plan.register_estimate} for k, s in specs.items()}

    time_sizes(a, build, "registers")


if __name__ == "__main__":
    main()
