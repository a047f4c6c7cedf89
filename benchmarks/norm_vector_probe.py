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

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", default="1280,1536,1600,2560,4096")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--plans", type=int, default=14)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from hostir.jobs.layer_norm import (ROTATE_BYTES, TOLERANCE, make_inputs, relative_error,
                                        time_side_by_side)
    from lowering.kernels.normalization import NormalizationSpec, padding, spec_with_plan, tune_plans
    from runtime import normalization as rn

    res = []
    for hidden in (int(h) for h in a.hidden.split(",")):
        base = NormalizationSpec.reference_fusion(a.rows, hidden, 1e-5)
        narrow = NormalizationSpec.reference_fusion(a.rows, hidden, 1e-5, alignment=8)
        specs = {"heuristic v%d" % base.plan.vector_width: base}
        for p in tune_plans(narrow)[:a.plans]:
            specs[p.describe()] = spec_with_plan(narrow, p)
        sets = max(2, -(-ROTATE_BYTES // base.bytes_moved()))
        ins = [make_inputs(a.rows, hidden) for _ in range(sets)]
        outs = [torch.empty_like(i[0]) for i in ins]
        named = lambda i: {"x": i[0], "b0": i[1], "b1": i[2], "weight": i[3], "bias": i[4]}  # noqa: E731
        ref = rn.reference(base, named(ins[0]))
        cands, info = {"copy": [lambda i=i, o=o: o.copy_(i[0]) for i, o in zip(ins, outs)]}, {}
        for label, s in specs.items():
            ck = rn.compiled_kernel(s)
            info[label] = {"describe": s.plan.describe(), "padding": round(padding(s.plan, hidden), 3),
                           "registers": ck.registers[s.kernel_name],
                           "spill_bytes": ck.spill_bytes.get(s.kernel_name, 0)}
            if info[label]["spill_bytes"]:
                continue
            y = rn.normalize(s, named(ins[0]), torch.full_like(outs[0], float("nan")))
            err = relative_error(y, ref)
            if not err < TOLERANCE:
                raise AssertionError(f"{label} at {hidden}: relative error {err:.2e}")
            info[label]["rel_err"] = err
            info[label]["grid"] = rn.launch_grid(s, rn._kernel(s, 0), ins[0][0].device)
            cands[label] = [lambda i=i, o=o, s=s: rn.normalize(s, named(i), o)
                            for i, o in zip(ins, outs)]
        del ref, y
        us = time_side_by_side(cands, a.reps)
        copy_gbps = 4 * a.rows * hidden / (us["copy"] * 1e-6) / 1e9
        for label in info:
            if label in us:
                info[label]["us"] = round(us[label], 2)
                info[label]["over_copy"] = round(
                    base.bytes_moved() / (us[label] * 1e-6) / 1e9 / copy_gbps, 3)
        print(hidden, json.dumps({k: (v.get("over_copy"), v["padding"]) for k, v in info.items()}),
              flush=True)
        res.append({"hidden": hidden, "copy_us": round(us["copy"], 2), "plans": info})
        del cands, ins, outs
        torch.cuda.empty_cache()
    with open(a.out, "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                   "commit": os.environ.get("HOSTIR_COMMIT", "unknown"), "rows": a.rows,
                   "method": "CUDA-graph replays (48 launches, input sets rotated past L2), "
                             f"{a.reps}+ carryover-balanced rounds with copy_, median",
                   "results": res}, fh, indent=1)


if __name__ == "__main__":
    main()
