"""Time a switch of the normalization code generator on and off, side by side.

A module flag of lowering/kernels/normalization.py (``--flag``, e.g. ``PACKED_HEAD``:
the prologue's ``half(x + b0)`` as 16-bit pair adds; ``BALANCED_GRID``: the persistent
grid balanced over the rounds of the row loop) changes the kernel or its launch but
not the plan. (Flags timed with it and then taken out: ``TREE_SUMS``, the statistics
summed as independent chains and a tree, 2bb99a1; ``L1_CARVEOUT``, c36ae8f;
``PACKED_STORE``, 29d52a9;
``ROW_BARRIERS``, 9690515; ``CENTER_IN_PLACE``, a29569c.) This runs the planner's kernel of the reference fusion with the flag off
and on, and the device-to-device copy, per hidden size, in interleaved rounds
(CUDA-graph replays, input sets rotated as in the layer_norm bench), and checks both
against the float64 reference on inputs with large-mean rows:

    python benchmarks/norm_flag_probe.py --flag PACKED_HEAD --out probe.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SIZES = "768,1024,1280,1536,1600,2048,2560,4096,5140,12288,16384,20480"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flag", required=True)
    ap.add_argument("--hidden", default=SIZES)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--plan", default="", help="overrides of the heuristic's plan, name=value,... "
                    "(e.g. param_cache=none,threads_per_row=192,batch=7,blocks_per_sm=5)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import lowering.kernels.normalization as nm
    from hostir.jobs.layer_norm import ROTATE_BYTES, make_inputs, relative_error, time_per_call
    from lowering.kernels.normalization import NormalizationSpec
    from probe_common import plan_overrides
    from runtime import normalization as rn

    if not isinstance(getattr(nm, a.flag, None), bool):
        raise SystemExit(f"{a.flag} is no boolean flag of lowering.kernels.normalization")
    default = getattr(nm, a.flag)

    def switch(value: bool) -> None:
        setattr(nm, a.flag, value)
        rn.clear_caches()  # kernels and launches are cached by spec; the flag changes them

    rows, res = a.rows, []
    for hidden in (int(h) for h in a.hidden.split(",")):
        spec = NormalizationSpec.reference_fusion(rows, hidden, 1e-5)
        if a.plan:
            spec = dataclasses.replace(spec, **plan_overrides(a.plan))
        x, b0, b1, w, b2 = make_inputs(rows, hidden)
        named = {"x": x, "b0": b0, "b1": b1, "weight": w, "bias": b2}
        ref = rn.reference(spec, named)
        errors, registers, ys = {}, {}, []
        for value in (False, True):
            switch(value)
            y = rn.normalize(spec, named, torch.full_like(x, float("nan")))
            torch.cuda.synchronize()
            errors[str(value).lower()] = relative_error(y, ref)
            registers[str(value).lower()] = rn._kernel(spec, 0).attribute("NUM_REGS")
            ys.append(y)
        same_bits = bool(torch.equal(ys[0], ys[1]))
        del x, y, ys, ref
        sets = max(2, -(-ROTATE_BYTES // (4 * rows * hidden)))
        xs = [torch.randn(rows, hidden, device="cuda", dtype=torch.float16) for _ in range(sets)]
        outs = [torch.empty_like(t) for t in xs]
        calls = [lambda t=t, o=o: rn.normalize(spec, dict(named, x=t), o)
                 for t, o in zip(xs, outs)]
        copies = [lambda t=t, o=o: o.copy_(t) for t, o in zip(xs, outs)]
        samples = {"copy": [], "false": [], "true": []}
        for _ in range(a.rounds):
            samples["copy"].append(time_per_call(copies, 5))
            for value in (False, True):
                switch(value)
                samples[str(value).lower()].append(time_per_call(calls, 5))
        switch(default)
        us = {k: statistics.median(v) for k, v in samples.items()}
        copy_gbps = 4 * rows * hidden / (us["copy"] * 1e-6) / 1e9
        row = {"hidden": hidden, "plan": spec.plan.describe(), "rel_err": errors,
               "same_bits": same_bits,
               "registers": registers, "us": {k: round(v, 2) for k, v in us.items()},
               "samples_us": {k: [round(t, 2) for t in v] for k, v in samples.items()},
               "copy_gbps": round(copy_gbps, 1)}
        for k in ("false", "true"):
            row[f"{k}_over_copy"] = round(spec.bytes_moved() / (us[k] * 1e-6) / 1e9 / copy_gbps, 3)
        row["speedup_on"] = round(us["false"] / us["true"], 3)
        print(hidden, spec.plan.describe(), row["false_over_copy"], row["true_over_copy"],
              row["speedup_on"], "same bits" if same_bits else "bits differ", errors,
              registers, flush=True)
        res.append(row)
        del xs, outs, calls, copies
        torch.cuda.empty_cache()
    with open(a.out, "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                   "commit": os.environ.get("HOSTIR_COMMIT", "unknown"), "flag": a.flag,
                   "plan_overrides": plan_overrides(a.plan),
                   "rows": rows, "dtype": "float16",
                   "method": f"CUDA-graph replays, copy / off / on interleaved {a.rounds} "
                             "rounds, median", "results": res}, fh, indent=1)


if __name__ == "__main__":
    main()
