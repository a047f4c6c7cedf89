"""Does a balanced grid speed up the persistent normalization kernel?

The persistent kernel loops over groups of rows, grid-stride. With as many blocks as are
resident, 8192 rows often leave the last round of the loop to a fraction of the blocks
(1600 at fp16: 4096 row pairs on 396 blocks, 11 rounds, 136 blocks in the last), and a
round with few blocks is latency-bound. The balanced grid (`LaunchPlan.grid`,
``balanced``) launches the fewest blocks that need no more rounds (373 there). This times,
per hidden size, the planner's kernel with both grids and the device-to-device copy, in
interleaved rounds (CUDA-graph replays, input sets rotated as in the layer_norm bench),
and checks that both grids write the same bits:

    python benchmarks/grid_balance_probe.py --out probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SIZES = "768,1024,1280,1536,1600,2048,2560,4096,5140,12288,16384,20480"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", default=SIZES)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import lowering.kernels.normalization as nm
    from hostir.jobs.layer_norm import ROTATE_BYTES, time_per_call
    from lowering.kernels.normalization import NormalizationSpec
    from runtime import normalization as rn

    def with_grid(balanced, fn):
        def call():
            saved, nm.BALANCED_GRID = nm.BALANCED_GRID, balanced
            rn.clear_caches()  # the prepared launch holds its grid
            try:
                fn()
            finally:
                nm.BALANCED_GRID = saved
                rn.clear_caches()
        return call

    rows, res = a.rows, []
    for hidden in (int(h) for h in a.hidden.split(",")):
        spec = NormalizationSpec.reference_fusion(rows, hidden, 1e-5)
        sets = max(2, -(-ROTATE_BYTES // (4 * rows * hidden)))
        xs = [torch.randn(rows, hidden, device="cuda", dtype=torch.float16) for _ in range(sets)]
        outs = [torch.empty_like(x) for x in xs]
        params = {n: torch.randn(hidden, device="cuda", dtype=torch.float16)
                  for n in ("b0", "b1", "weight", "bias")}

        def fusion(x, o):
            return lambda: rn.normalize(spec, dict(params, x=x), o)

        variants = {
            "copy": [lambda x=x, o=o: o.copy_(x) for x, o in zip(xs, outs)],
            "resident": [with_grid(False, fusion(x, o)) for x, o in zip(xs, outs)],
            "balanced": [with_grid(True, fusion(x, o)) for x, o in zip(xs, outs)],
        }
        # Same bits from both grids (rows are independent; only who computes them moves).
        ys = []
        for v in ("resident", "balanced"):
            outs[0].fill_(float("nan"))
            variants[v][0]()
            torch.cuda.synchronize()
            ys.append(outs[0].clone())
        same = bool(torch.equal(ys[0], ys[1]))
        samples = {k: [] for k in variants}
        for _ in range(a.rounds):
            for k, calls in variants.items():
                samples[k].append(time_per_call(calls, 5))
        us = {k: statistics.median(v) for k, v in samples.items()}
        kernel = rn._kernel(spec, xs[0].device.index)
        plan = spec.plan
        grids = {}
        for v in (False, True):
            saved, nm.BALANCED_GRID = nm.BALANCED_GRID, v
            try:
                grids["balanced" if v else "resident"] = rn.launch_grid(spec, kernel, xs[0].device)
            finally:
                nm.BALANCED_GRID = saved
        copy_gbps = 4 * rows * hidden / (us["copy"] * 1e-6) / 1e9
        row = {"hidden": hidden, "plan": plan.describe(), "grids": grids, "same_bits": same,
               "us": {k: round(v, 2) for k, v in us.items()},
               "samples_us": {k: [round(t, 2) for t in v] for k, v in samples.items()},
               "copy_gbps": round(copy_gbps, 1)}
        for k in ("resident", "balanced"):
            gbps = spec.bytes_moved() / (us[k] * 1e-6) / 1e9
            row[f"{k}_over_copy"] = round(gbps / copy_gbps, 3)
        row["balanced_speedup"] = round(us["resident"] / us["balanced"], 3)
        print(hidden, plan.describe(), grids, row["resident_over_copy"],
              row["balanced_over_copy"], row["balanced_speedup"], "same" if same else "DIFFER",
              flush=True)
        res.append(row)
        del xs, outs
        torch.cuda.empty_cache()
    with open(a.out, "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                   "commit": os.environ.get("HOSTIR_COMMIT", "unknown"), "rows": rows,
                   "dtype": "float16", "method": "CUDA-graph replays, variants interleaved "
                   f"{a.rounds} rounds, median", "results": res}, fh, indent=1)


if __name__ == "__main__":
    main()
