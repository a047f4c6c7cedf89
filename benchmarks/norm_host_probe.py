"""Host time of one eager call of the generated normalization kernels (diagnostic).

Times, per call with no sync (the queue never fills), `runtime.normalization`'s
`layer_norm_fused`, `layer_norm` and `rms_norm` and torch's `layer_norm` at one shape, and
the GPU time of the fused kernel (CUDA-graph replays) for scale:

    python benchmarks/norm_host_probe.py --out probe.json [--rows 8192 --hidden 1600]
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
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=1600)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from benchmarks.matmul_host_probe import per_call_us
    from hostir.jobs.layer_norm import make_inputs, time_per_call
    from runtime import normalization as rn

    x, b0, b1, w, b2 = make_inputs(a.rows, a.hidden)
    out = torch.empty_like(x)
    fused = lambda: rn.layer_norm_fused(x, b0, b1, w, b2, 1e-5, out=out)  # noqa: E731
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
           "commit": os.environ.get("HOSTIR_COMMIT", "unknown"), "rows": a.rows,
           "hidden": a.hidden, "method": "host microseconds a call, 200 calls without "
           "sync, median of 5; gpu_us by CUDA-graph replay",
           "fused_host_us": per_call_us(lambda i: fused()),
           "layer_norm_host_us": per_call_us(lambda i: rn.layer_norm(x, w, b2, 1e-5, out=out)),
           "rms_norm_host_us": per_call_us(lambda i: rn.rms_norm(x, w, 1e-6, out=out)),
           "torch_layer_norm_host_us": per_call_us(
               lambda i: torch.nn.functional.layer_norm(x, (a.hidden,), w, b2, 1e-5)),
           "fused_gpu_us": time_per_call([fused], 10)}
    print(json.dumps(res), flush=True)
    with open(a.out, "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
