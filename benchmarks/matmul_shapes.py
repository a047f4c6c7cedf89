"""The generated GEMM's default choice (heuristics, no tuning, fresh cache) against cuBLAS
on shapes drawn from a fixed seed, as a new user meets them.

    python benchmarks/matmul_shapes.py --json benchmarks/results/matmul_shapes_nvidia-h100.json

Shapes: 42 drawn over [256, 16384]^3 (a third not multiples of 64, a fifth with M <= 256,
every seventh with K <= 2048; K a multiple of 8, the kernels' 16-byte rows) plus the matmul
bench's shapes. Each is checked against float64 on fresh random data first, then ours
(`runtime.matmul.matmul`, layout TN: ``a @ b.T``) and ``torch.matmul`` are timed side by
side as CUDA-graph replays (`runtime.timing.graph_side_by_side`, about 200 us of GEMMs a
replay) on rotated input copies: the kernels' throughput, without the host's eager issue
(`benchmarks/host_overhead.py` measures that). Rows: shape (MxNxK),
ours_tflops, cublas_tflops, ratio (ours over cuBLAS throughput), choice (the spec the
heuristics picked), fallback ("cublas" where the default path runs cuBLAS because the
model predicts the pick under `runtime.matmul.CUBLAS_BELOW`, else null), predicted_ratio
(the model's), kernel_ratio (the pick itself, timed in the same rounds), first_call_ms
(compile or cache load included), tuned false, dtype (bf16 for every shape; fp16 again for
every third drawn shape and the bench's, `fp16_shapes`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
import time

BENCH_SHAPES = [(1024, 2048, 50304), (8192, 8192, 8192), (4096, 4096, 8192),
                (16384, 8192, 4096), (256, 4096, 16384), (4096, 14336, 4096)]


def shapes(seed: int = 23, count: int = 42) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        m, n, k = (rng.randint(256, 16384) for _ in range(3))
        if i % 3:  # two thirds on multiples of 64
            m, n, k = (max(64, v // 64 * 64) for v in (m, n, k))
        if i % 5 == 0:
            m = rng.randint(16, 256)
        if i % 7 == 0:
            k = rng.randint(512, 2048)
        out.append((m, n, max(8, k // 8 * 8)))
    return out + BENCH_SHAPES


def fp16_shapes() -> list[tuple[int, int, int]]:
    """The shapes timed in fp16 as well: every third drawn shape and the bench's."""
    drawn = shapes()[:-len(BENCH_SHAPES)]
    return drawn[::3] + BENCH_SHAPES


def choice(spec) -> str:
    """The picked kernel in a few words: instruction, feed, tile, split."""
    feed = ("pptma" if spec.pingpong else "ptma" if spec.persistent else
            "ctma" if spec.cluster_m > 1 else "tma" if spec.tma else
            "ws" if spec.warp_specialized else "sync")
    return (f"{spec.instr} {feed} {spec.tile_m}x{spec.tile_n}x{spec.tile_k} s{spec.stages}"
            + (f" split {spec.split_mode} {spec.split_k}" if spec.split_k > 1 else ""))


def measure(M: int, N: int, K: int, reps: int, dtype: str = "bf16") -> dict:
    import torch

    from lowering.kernels.heuristics import predicted_ratio
    from runtime.matmul import choose_spec, matmul, sm_count, uses_cublas
    from runtime.matmul_kernel import Problem
    from runtime.timing import graph_side_by_side, input_copies

    dev = torch.cuda.current_device()
    sets = input_copies((M * K + N * K + M * N) * 2, dev)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    a = [torch.randn(M, K, device="cuda", dtype=dt) for _ in range(sets)]
    b = [torch.randn(N, K, device="cuda", dtype=dt) for _ in range(sets)]
    start = time.perf_counter()
    out = matmul(a[0], b[0], layout="TN")
    torch.cuda.synchronize()
    first_ms = (time.perf_counter() - start) * 1e3
    ref = a[0].double() @ b[0].double().T
    p = Problem(M, N, K, dtype, dtype, "TN", False)
    spec = choose_spec(p, "auto", dev)
    fallback = uses_cublas(p, "auto", dev) is not None
    outs = [out] + ([matmul(a[0], b[0], layout="TN", spec=spec)] if fallback else [])
    for out in outs:  # the default path's output, and the pick's where that was cuBLAS
        err = ((out.double() - ref).norm() / ref.norm()).item()
        if not err < 1e-2:
            raise AssertionError(f"{M}x{N}x{K}: relative error {err:.2e}")
    calls = {"ours": [lambda i=i: matmul(a[i], b[i], layout="TN") for i in range(sets)],
             "cublas": [lambda i=i: torch.matmul(a[i], b[i].T) for i in range(sets)]}
    if fallback:
        calls["kernel"] = [lambda i=i: matmul(a[i], b[i], layout="TN", spec=spec)
                           for i in range(sets)]
    flop = 2.0 * M * N * K
    # CUDA-graph replays of about 200 us of GEMMs each (at ~500 TFLOP/s): the kernels'
    # throughput, not the host's eager issue (issue 23's host part is its own bench)
    launches = max(1, min(48, int(2e-4 * 5e14 / flop)))
    times = graph_side_by_side(calls, reps, launches)
    return {"shape": f"{M}x{N}x{K}", "ours_tflops": flop / times["ours"] / 1e6,
            "cublas_tflops": flop / times["cublas"] / 1e6,
            "ratio": times["cublas"] / times["ours"], "choice": choice(spec),
            "fallback": "cublas" if fallback else None,
            "predicted_ratio": predicted_ratio(spec, M, N, K, sm_count(dev)),
            "kernel_ratio": times["cublas"] / times.get("kernel", times["ours"]),
            "first_call_ms": first_ms, "rel_err": err, "tuned": False, "dtype": dtype}


def summarize(rows: list[dict]) -> dict:
    """Rows measured, the ratios' least and median, how many reach 0.90, the cuBLAS
    fallbacks; per dtype where there are several."""
    def of(part: list[dict]) -> dict:
        ok = sorted(r["ratio"] for r in part if "ratio" in r)
        return {"shapes": len(part), "measured": len(ok),
                "ratio_min": ok[0] if ok else None,
                "ratio_median": ok[len(ok) // 2] if ok else None,
                "at_least_0.90": sum(r >= 0.9 for r in ok),
                "cublas_fallbacks": sum(bool(r.get("fallback")) for r in part)}

    summary = of([r for r in rows if r.get("dtype", "bf16") == "bf16"])
    for dtype in sorted({r.get("dtype", "bf16") for r in rows} - {"bf16"}):
        summary[dtype] = of([r for r in rows if r.get("dtype") == dtype])
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, metavar="FILE")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--budget-s", type=float, default=240, help="stop drawing shapes after this")
    args = ap.parse_args(argv)
    import torch

    from hostir.jobs.results import commit

    if not torch.cuda.is_available():
        print("matmul_shapes: error: needs a CUDA GPU", file=sys.stderr)
        return 7
    rows, start = [], time.perf_counter()
    jobs = [(shape, "bf16") for shape in shapes()] + [(shape, "fp16") for shape in fp16_shapes()]
    for (M, N, K), dtype in jobs:
        if time.perf_counter() - start > args.budget_s:
            rows.append({"shape": f"{M}x{N}x{K}", "dtype": dtype, "skipped": "over --budget-s"})
            continue
        try:
            rows.append(measure(M, N, K, args.reps, dtype))
        except Exception as e:  # noqa: BLE001 -- a row that failed is evidence too
            rows.append({"shape": f"{M}x{N}x{K}", "dtype": dtype,
                         "error": f"{type(e).__name__}: {str(e)[:200]}"})
        torch.cuda.empty_cache()
        r = rows[-1]
        print(f"{r['shape']:>20} {dtype} " + (f"ratio {r['ratio']:.3f} ours {r['ours_tflops']:.0f} "
              f"cuBLAS {r['cublas_tflops']:.0f} TFLOP/s, {r['choice']} (kernel "
              f"{r['kernel_ratio']:.3f}, model {r['predicted_ratio']:.3f})"
              + (" -> cuBLAS" if r["fallback"] else "") if "ratio" in r else str(r)), flush=True)
    summary = summarize(rows)
    print(summary)
    if args.json:
        doc = {"bench": "matmul_shapes", "device": torch.cuda.get_device_name(),
               "date": datetime.date.today().isoformat(), "commit": commit(),
               "method": "bf16 (and fp16 on a third of the shapes) TN, the default path (the heuristics' pick, or cuBLAS where "
                         "the model predicts the pick loses; no tuning, fresh cache) vs "
                         "torch.matmul, side by side as CUDA-graph replays on rotated inputs, medians",
               "summary": summary, "rows": rows}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
