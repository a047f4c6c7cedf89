"""Does the number of 1-D tensors set the normalization kernel's speed at large hidden?

At hidden 16384 and 20480 the reference fusion's four 1-D tensors (b0, b1, weight, bias)
no longer fit in registers beside the row; its plans read them from shared memory or L2
every row and reach about 0.8 of the copy bandwidth, where 12288 (cached in registers)
reaches 0.94. This times, side by side per size, the fusion (4 tensors), layer_norm
(weight, bias) and rms_norm (weight) with their planned kernels, and the copy:

    python benchmarks/norm_params_probe.py --out probe.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", default="1600,4096,12288,16384,20480")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from hostir.jobs.layer_norm import ROTATE_BYTES, time_per_call
    from lowering.kernels.normalization import NormalizationSpec
    from runtime import normalization as rn

    rows, res = a.rows, []
    for hidden in (int(h) for h in a.hidden.split(",")):
        specs = {
            "fusion": (NormalizationSpec.reference_fusion(rows, hidden, 1e-5),
                       ("x", "b0", "b1", "weight", "bias")),
            "layer_norm": (NormalizationSpec.layer_norm(rows, hidden, 1e-5, "float16"),
                           ("x", "weight", "bias")),
            "rms_norm": (NormalizationSpec.rms_norm(rows, hidden, 1e-6, "float16"),
                         ("x", "weight")),
        }
        sets = max(2, -(-ROTATE_BYTES // (4 * rows * hidden)))
        xs = [torch.randn(rows, hidden, device="cuda", dtype=torch.float16) for _ in range(sets)]
        outs = [torch.empty_like(x) for x in xs]
        params = {n: torch.randn(hidden, device="cuda", dtype=torch.float16)
                  for n in ("b0", "b1", "weight", "bias")}
        row = {"hidden": hidden}
        copy_us = time_per_call([lambda x=x, o=o: o.copy_(x) for x, o in zip(xs, outs)], 15)
        row["copy_gbps"] = round(4 * rows * hidden / (copy_us * 1e-6) / 1e9, 1)
        for name, (spec, names) in specs.items():
            calls = [lambda x=x, o=o, s=spec, n=names: rn.normalize(
                s, {k: (x if k == "x" else params[k]) for k in n}, o) for x, o in zip(xs, outs)]
            us = time_per_call(calls, 15)
            gbps = spec.bytes_moved() / (us * 1e-6) / 1e9
            row[name] = {"plan": spec.plan.describe(), "us": round(us, 2),
                         "gbps": round(gbps, 1), "over_copy": round(gbps / row["copy_gbps"], 3),
                         "plan_fields": dataclasses.asdict(spec.plan)}
        print(hidden, {k: (v["plan"], v["over_copy"]) if isinstance(v, dict) else v
                       for k, v in row.items()}, flush=True)
        res.append(row)
    with open(a.out, "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                   "commit": os.environ.get("HOSTIR_COMMIT", "unknown"), "rows": rows,
                   "dtype": "float16", "results": res}, fh, indent=1)


if __name__ == "__main__":
    main()
