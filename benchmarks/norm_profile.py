"""Launches to profile: the fused layer norm (and, for comparison, layer_norm, rms_norm and
the device-to-device copy the benchmark measures against) at some hidden sizes, rows 8192,
fp16, each a few times on fresh random data. Run it under Nsight Compute:

    ncu --clock-control none --kernel-name regex:'hostir|copy|elementwise' \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        --section Occupancy --section LaunchStats \\
        python benchmarks/norm_profile.py --hidden 1600,4096,20480

Each launch is preceded by a print of what it is, so that the report can be read back.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lowering.kernels.normalization import NormalizationSpec  # noqa: E402
from runtime import normalization as norm  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", default="1600,4096,20480")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--kinds", default="fused,copy",
                    help="comma-separated: fused, layer_norm, rms_norm, copy")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    for hidden in (int(h) for h in args.hidden.split(",")):
        x = torch.randn(args.rows, hidden, device="cuda", dtype=torch.float16)
        b0, b1, w, b2 = (torch.randn(hidden, device="cuda", dtype=torch.float16) for _ in range(4))
        out = torch.empty_like(x)
        calls = {"fused": lambda: norm.layer_norm_fused(x, b0, b1, w, b2, out=out),
                 "layer_norm": lambda: norm.layer_norm(x, w, b2, out=out),
                 "rms_norm": lambda: norm.rms_norm(x, w, out=out),
                 "copy": lambda: out.copy_(x)}
        plan = NormalizationSpec.reference_fusion(args.rows, hidden, 1e-5, "float16").plan
        print(f"PLAN hidden={hidden} fused: {plan.describe()} grid {plan.grid(args.rows)}",
              flush=True)
        for kind in kinds:
            calls[kind]()  # compile, warm
            torch.cuda.synchronize()
            for _ in range(args.repeat):
                print(f"PROFILE {kind} hidden={hidden}", flush=True)
                calls[kind]()
                torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
