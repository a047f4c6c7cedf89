"""Split-K on the shapes where it matters: every way of summing the slices, side by side.

For each shape (default: the issue's split-K shape 1024x2048x50304 and the skinny
256x4096x16384), the variants below are checked first (output poisoned with NaN,
relative error against a float64 reference, kernels and memsets counted by
torch.profiler), then timed side by side with cuBLAS (`hostir.jobs.matmul`'s groups of
back-to-back calls, the candidates taking turns, medians), on rotated input sets where
the operands would sit in L2:

  parallel  fp32 partials to a workspace, then a reduction kernel (two launches)
  serial    the slices take turns through a semaphore of the zeroed arena (one launch)
  cluster   the slices are one thread-block cluster and sum in distributed shared
            memory (one launch, no workspace, no semaphore)

over the TMA feed's tiles (and the persistent feed's, the autotuner's earlier winner on
the split-K shape), plus what the heuristics pick.

    python benchmarks/split_k_probe.py --out probe.json [--shapes 1024x2048x50304]

With --feeds, the same for the unsplit feeds on the large shapes (which feed a default
should be): python benchmarks/split_k_probe.py --feeds --out feeds.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostir.jobs.matmul import _inputs, _time_side_by_side, check_variant, input_sets  # noqa: E402
from hostir.jobs.results import commit  # noqa: E402
from lowering.kernels import heuristics  # noqa: E402
from runtime.matmul import sm_count, tuning_arch  # noqa: E402

SHAPES = ((1024, 2048, 50304), (256, 4096, 16384))
LARGE_SHAPES = ((8192, 8192, 8192), (4096, 4096, 8192), (16384, 8192, 4096))
TILES = ((128, 256, 64, 8, 1, 4), (256, 128, 64, 8, 1, 4), (128, 128, 64, 8, 1, 6))


def variants(M, N, K) -> dict:
    """Label -> spec: each tile of the TMA feed in every split mode at 2 and 4 slices, the
    persistent feed's parallel split, and the heuristics' picks."""
    out = {}
    for tile in TILES:
        for feed in ("tma", "ptma"):
            base = heuristics.spec_for(tile + (feed,))
            for mode in ("parallel", "serial", "cluster"):
                for split in (2, 4):  # (cluster split-K: pairs only, mode_fits)
                    if feed == "ptma" and mode != "parallel":
                        continue
                    if not heuristics.mode_fits(base, mode, split):
                        continue
                    out[f"{feed} {base.tile} {mode} s{split}"] = dataclasses.replace(
                        base, split_k=split, split_mode=mode)
    arch = tuning_arch()
    out["heuristic"] = heuristics.choose(M, N, K, sm_count=sm_count(), arch=arch)
    return out


def feed_variants(M, N, K) -> dict:
    """Label -> spec: every wgmma tile of the TMA-fed kinds unsplit (one tile a CTA;
    persistent; ping-pong persistent), and the heuristics' pick: which feed a large
    shape's default should be."""
    out = {}
    for config in heuristics.WGMMA_CONFIGS:
        if config[6] in ("tma", "ptma", "pptma"):
            spec = heuristics.spec_for(config)
            out[f"{spec.feed} {spec.tile} none"] = spec
    out["heuristic"] = heuristics.choose(M, N, K, sm_count=sm_count(), arch=tuning_arch())
    return out


def probe(M, N, K, reps, make=variants) -> dict:
    torch.manual_seed(M + N + K)
    sets = input_sets(M, N, K)
    inputs = _inputs(M, N, K, "TN", sets, torch)
    a, b = inputs[0]
    ref = a.double() @ b.double().t()
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    flops = 2.0 * M * N * K
    rows, fns = {}, {"cublas": lambda x, y: x @ y.t()}
    for label, spec in make(M, N, K).items():
        try:
            fn, rows[label] = check_variant(spec, a, b, out, ref, "TN", torch)
        except Exception as e:  # noqa: BLE001 - a variant that fails is reported, not fatal
            rows[label] = {"error": f"{type(e).__name__}: {e}"[:300]}
            continue
        if rows[label]["rel_err"] < 1e-2:
            fns[label] = fn
    timed = _time_side_by_side(fns, inputs, reps)
    cublas_us = timed.pop("cublas")
    for label, us in timed.items():
        rows[label].update(us=us, tflops=flops / us / 1e6, over_cublas=cublas_us / us)
    inputs = a = b = ref = out = None  # free this shape's tensors (the closures see None)
    torch.cuda.empty_cache()
    return {"shape": f"{M}x{N}x{K}", "cublas_us": cublas_us,
            "cublas_tflops": flops / cublas_us / 1e6, "input_sets": sets, "variants": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=None, help="comma-separated MxNxK list")
    ap.add_argument("--reps", type=int, default=15, help="timed groups per variant")
    ap.add_argument("--out", default=None, help="result JSON path")
    ap.add_argument("--feeds", action="store_true",
                    help="unsplit feeds instead of split modes (default shapes: the large three)")
    args = ap.parse_args()
    default = LARGE_SHAPES if args.feeds else SHAPES
    shapes = default if not args.shapes else tuple(
        tuple(int(x) for x in s.split("x")) for s in args.shapes.split(","))
    results = []
    for M, N, K in shapes:
        r = probe(M, N, K, args.reps, feed_variants if args.feeds else variants)
        results.append(r)
        print(f"{r['shape']}: cuBLAS {r['cublas_us']:.1f} us")
        for label, v in sorted(r["variants"].items(), key=lambda kv: kv[1].get("us", 1e9)):
            if "us" in v:
                print(f"  {label:>32}: {v['us']:8.1f} us  {v['over_cublas']:.3f}x cuBLAS  "
                      f"launches {v['launches']} memsets {v['memsets']} err {v['rel_err']:.1e}")
            else:
                print(f"  {label:>32}: {v.get('error') or 'wrong: rel err %.2e' % v['rel_err']}")
    doc = {"device": torch.cuda.get_device_name(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "commit": commit(), "sm_count": sm_count(), "torch": torch.__version__,
           "method": "side by side with cuBLAS, groups of 10 back-to-back calls, medians of "
                     f"at least {args.reps} groups (whole cycles of a carryover-balanced "
                     "order); inputs rotated where they fit in L2",
           "results": results}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
