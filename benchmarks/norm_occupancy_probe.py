"""The persistent plans with one or more blocks an SM beyond what their register
estimate promises ptxas, timed side by side with themselves and copy_.

A plan's ``__launch_bounds__`` promise (`LaunchPlan.min_blocks_per_sm`) comes from its
register estimate plus a margin. The least ``-maxrregcount`` without spills is often
lower (1600, t64 b4 with the tensors in registers: estimate 130, 3 blocks of 128
threads; spill-free at 128, 4 blocks), and the row copies of copy_path_probe.py ran
faster with more blocks an SM (1600: 0.898 of copy at 8 blocks of 64, 0.954 at 16). For
each of the first ``--plans`` persistent plans of `tune_plans`, this finds that least
cap with NVRTC, builds the plan with its estimate set to it (so the promise is the
blocks it allows), keeps it if ptxas spills nothing under the promise, checks it
against float64, and times it beside the plan as the planner builds it:

    python benchmarks/norm_occupancy_probe.py --out probe.json
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def least_cap(spec, arch: str = "sm_90") -> int | None:
    """The least -maxrregcount (a multiple of 8) at which ``spec``'s kernel, without
    its __launch_bounds__, spills nothing."""
    from lowering.kernels.normalization import render_normalization
    from runtime import jit

    source = re.sub(r"__launch_bounds__\(\d+, \d+\)\n", "", render_normalization(spec))
    for cap in range(40, 256, 8):
        ck = jit.compile(source, [spec.kernel_name], arch, (f"-maxrregcount={cap}",))
        if ck.spill_bytes.get(spec.kernel_name, 0) == 0:
            return cap
    return None


def denser(spec, cap: int):
    """``spec`` (plan pinned) with its plan's register estimate set to ``cap`` - 8, so
    that it promises the blocks an SM that ``cap`` registers allow; built with its
    rows=1 twin under the override (each plan is cached as built)."""
    from probe_common import built, register_estimate

    # a spec no other of the run equals (alignment 32: the same plans and code as 16,
    # another name), so the plan cached for it under the override is its own
    with register_estimate(cap - 8):
        return built(dataclasses.replace(spec, alignment=2 * max(16, spec.alignment)))


def main() -> None:
    from probe_common import parser, time_sizes

    ap = parser("1280,1536,1600,2048,2560,4096,5140", __doc__)
    ap.add_argument("--plans", type=int, default=8)
    a = ap.parse_args()
    from lowering.kernels.normalization import NormalizationSpec, spec_with_plan, tune_plans

    def build(hidden):
        base = NormalizationSpec.reference_fusion(a.rows, hidden, 1e-5)
        specs, info = {}, {}
        for p in [p for p in tune_plans(base) if p.persistent][:a.plans]:
            s = spec_with_plan(base, p)
            label = p.describe()
            specs[label] = s
            cap = least_cap(s)
            info[label] = {"blocks": p.min_blocks_per_sm, "estimate": p.register_estimate,
                           "least_cap": cap}
            if cap is None or cap > p.register_estimate + 8:
                continue
            d = denser(s, cap)
            if d.plan.min_blocks_per_sm > p.min_blocks_per_sm:
                dl = f"{label} x{d.plan.min_blocks_per_sm}"
                specs[dl] = d
                info[dl] = {"blocks": d.plan.min_blocks_per_sm, "estimate": d.plan.register_estimate}
        return specs, info

    time_sizes(a, build, "grid")


if __name__ == "__main__":
    main()
