"""Why is the generated matmul at 256x4096x16384 fast on repeated inputs and slow on
rotated ones?

The wgmma check (one input pair, called again and again) timed the best generated
kernels at 1.0 of cuBLAS on this shape; the matmul bench (two input pairs taking turns, as
a model's weights would) timed them at 0.65-0.72. This times every wgmma candidate of the
shape with split factors up to 4, and cuBLAS, under three conditions side by side: the
same pair every call, two pairs taking turns, and the same pair after a 256 MiB write
that evicts L2; and the host time to enqueue a call (no sync), against its GPU time:

    python benchmarks/skinny_probe.py --out probe.json
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="256x4096x16384")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from lowering.kernels import heuristics
    from runtime.autotune import side_by_side
    from runtime.matmul import matmul, tuning_arch

    M, N, K = (int(x) for x in a.shape.split("x"))
    pairs = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
              torch.randn(N, K, device="cuda", dtype=torch.bfloat16)) for _ in range(2)]
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    flush = torch.empty(256 << 20, device="cuda", dtype=torch.uint8)
    ref = pairs[0][0].double() @ pairs[0][1].double().t()
    specs = [s for s in heuristics.candidates(M, N, K, arch=tuning_arch())
             if s.instr == "wgmma" and s.split_k <= 4 and s.feed in ("tma", "ptma", "ctma", "pptma")]

    def fns(call):
        return {
            "same": lambda i: call(*pairs[0]),
            "rotated": lambda i: call(*pairs[i % 2]),
            "same_flushed": lambda i: (flush.fill_(i & 255), call(*pairs[0])),
        }

    def host_us(call, n=50):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(n):
            call(*pairs[i % 2])
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / n * 1e6

    cublas = lambda x, y: torch.nn.functional.linear(x, y, out=out)  # noqa: E731
    flush_us = side_by_side({"flush": lambda i: flush.fill_(i & 255)}, reps=a.reps)["flush"]
    rows = []
    for label, call in [("cublas", cublas)] + [
            (f"{s.feed} {s.tile} s{s.split_k} {s.split_mode}",
             lambda x, y, s=s: matmul(x, y, out=out, spec=s)) for s in specs]:
        out.fill_(float("nan"))
        call(*pairs[0])
        torch.cuda.synchronize()
        err = ((out.double() - ref).norm() / ref.norm()).item()
        t = side_by_side(fns(call), reps=a.reps)
        t["same_flushed"] -= flush_us
        row = {"label": label, "rel_err": err, "host_us": host_us(call),
               **{k: round(v, 2) for k, v in t.items()}}
        print(row, flush=True)
        rows.append(row)
    with open(a.out, "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                   "commit": os.environ.get("HOSTIR_COMMIT", "unknown"), "shape": a.shape,
                   "flush_us": flush_us, "method": "side by side (runtime.autotune."
                   "side_by_side), 8 calls a sample, median; same_flushed minus the flush",
                   "results": rows}, fh, indent=1)
    best = {k: min(rows[1:], key=lambda r: r[k]) for k in ("same", "rotated", "same_flushed")}
    for k, r in best.items():
        print(f"best {k}: {r['label']} {r[k]} us vs cuBLAS {rows[0][k]} us "
              f"({rows[0][k] / r[k]:.3f} of cuBLAS)")
    print("median host us a call (ours):", statistics.median(r["host_us"] for r in rows[1:]),
          "cuBLAS:", rows[0]["host_us"])


if __name__ == "__main__":
    main()
