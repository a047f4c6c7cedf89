"""The matmul benchmark job: generated kernels vs cuBLAS (torch), bf16, one GPU.

    python -m hostir.run matmul --bench [--json results.json]

Shapes are MxNxK (C[M, N] = A[M, K] @ B[K, N]; with --layout TN, B is stored [N, K]).
For each shape: correctness first (relative error vs a float64 reference under 1e-2, the
output poisoned with NaN so every element must be written), kernels launched per call
(torch.profiler), then medians by CUDA events after warm-up on fresh random data,
rotating input sets when they would fit in L2; and the cold-compile vs warm-first-call
times of a fresh process. Prints a table; ``--json FILE`` also writes the results document
(``--json DIR/``: ``DIR/matmul_<device>.json``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hostir.jobs.results import commit

SHAPES = ((1024, 2048, 50304), (8192, 8192, 8192), (4096, 4096, 8192),
          (16384, 8192, 4096), (256, 4096, 16384))
L2_BYTES = 60 * 2**20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hostir.jobs.preflight import at_least, shape_list

    parser.add_argument("--bench", action="store_true", help="run the benchmark (required)")
    parser.add_argument("--shapes", type=shape_list, default=None,
                        help="comma-separated MxNxK list (default: the five benchmark shapes)")
    parser.add_argument("--layout", default="TN", choices=("TN", "NN"))
    parser.add_argument("--tune", action="store_true",
                        help="also autotune each shape (sweep all candidates) and report it")
    parser.add_argument("--reps", type=at_least(1), default=10, help="timed groups per variant")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="write the results document to FILE (a directory: "
                             "matmul_<device>.json in it); without it the job only prints")
    parser.add_argument("--no-compile-probe", action="store_true",
                        help="skip the cold/warm compile measurement in fresh processes")


def estimated_bytes(m: int, n: int, k: int) -> int:
    """Peak GPU bytes of one shape: the rotating bf16 operand sets, the output, the float64
    reference and its float64 operands."""
    sets = input_sets(m, n, k)
    return 2 * sets * (m * k + n * k) + 2 * m * n + 8 * (m * k + n * k + 2 * m * n)


def validate(args, world) -> None:
    from hostir.jobs import preflight as pf

    if not args.bench:
        raise pf.UsageError("nothing to do: pass --bench")
    if world.size != 1:
        raise pf.WorldSizeError(f"runs on one GPU in one process, launched with {world.size} "
                                "ranks: run it without mpirun")
    pf.need_cuda("matmul --bench", pf.resolve_device("auto"))
    pf.need_module("cupy", pf.cupy_install(), "matmul --bench (NVRTC through CuPy)")
    if args.json:
        pf.writable_output("--json", args.json, directory_ok=True)
    for m, n, k in args.shapes or SHAPES:
        pf.check_fits(f"shape {m}x{n}x{k}", estimated_bytes(m, n, k), "cuda", world)


def _inputs(M, N, K, layout, sets, torch):
    out = []
    for _ in range(sets):
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(*((N, K) if layout == "TN" else (K, N)), device="cuda",
                        dtype=torch.bfloat16)
        out.append((a, b))
    return out


def _time_side_by_side(fns: dict, inputs, reps, per_group=10, warmup=3) -> dict:
    """Median microseconds per call of each of `fns` (taking an input pair), timed side by
    side (`runtime.autotune.side_by_side`): a sample is a group of `per_group`
    back-to-back calls on rotating inputs, and the candidates take turns sample by
    sample, so clock and power drift over the run (the chip is power-limited: a kernel
    timed right after an idle spell runs faster) weigh on each alike."""
    from runtime.timing import side_by_side

    calls = {k: (lambda i, fn=fn: fn(*inputs[i % len(inputs)])) for k, fn in fns.items()}
    return side_by_side(calls, reps=reps, per_group=per_group, warmup=warmup)


def count_launches(fn, torch) -> dict:
    """Kernels, memsets and memcpys one call of `fn` puts on the GPU (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels, memsets, names = 0, 0, []
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        low = e.name.lower()
        if "memset" in low or "fill" in low:
            memsets += 1
        elif "memcpy" not in low:
            kernels += 1
            names.append(e.name)
    return {"kernels": kernels, "memsets": memsets, "names": names}


def check(out, ref64, torch) -> float:
    return ((out.double() - ref64).norm() / ref64.norm()).item()


def input_sets(M: int, N: int, K: int) -> int:
    """Operand pairs to rotate through: where one pair would sit in L2, enough to overflow
    it three times (at most 8); else one."""
    nbytes = 2 * (M * K + N * K)
    return max(1, min(8, -(-3 * L2_BYTES // nbytes))) if nbytes < 3 * L2_BYTES else 1


def check_variant(spec, a, b, out, ref, layout: str, torch):
    """A generated matmul checked before it is timed: the output poisoned with NaN (every
    element must be written), the relative error against the float64 reference, the
    kernels and memsets one call launches, the zeroed arena checked. Returns the call
    (taking an operand pair, writing `out`) and the row that describes it."""
    from runtime import workspace
    from runtime.matmul import matmul

    out.fill_(float("nan"))
    fn = lambda x, y: matmul(x, y, layout=layout, out=out, spec=spec)
    fn(a, b)
    torch.cuda.synchronize()
    err = check(out, ref, torch)
    launches = count_launches(lambda: fn(a, b), torch)
    workspace.check_all_zeroed()
    return fn, {"instr": spec.instr, "feed": spec.feed, "tile": spec.tile,
                "warps": spec.warps, "stages": spec.stages, "split_k": spec.split_k,
                "mode": spec.split_mode, "rel_err": err, "launches": launches["kernels"],
                "memsets": launches["memsets"]}


def _compile_probe(M, N, K) -> dict:
    """Cold compile vs warm first call, each in a fresh process sharing one cache dir.

    Each process times its phases apart: importing CuPy (the same either way, and the
    larger part of a first call), choosing the spec, getting the kernel (NVRTC when the
    cache is cold, a disk read when warm), and the first launch with its sync.
    """
    code = (
        "import time, torch;"
        "from runtime import matmul as mm, jit;"
        f"a=torch.randn({M},{K},device='cuda',dtype=torch.bfloat16);"
        f"b=torch.randn({N},{K},device='cuda',dtype=torch.bfloat16);"
        "torch.cuda.synchronize(); t0=time.perf_counter();"
        "import cupy; t1=time.perf_counter();"
        f"spec=mm.choose_spec(mm.Problem({M},{N},{K},'bf16','bf16','TN',False)); t2=time.perf_counter();"
        "mm.load(spec); t3=time.perf_counter();"
        "c=mm.matmul(a,b,spec=spec); torch.cuda.synchronize(); t4=time.perf_counter();"
        "s=jit.kernel_cache().stats;"
        "print('PROBE', t1-t0, t2-t1, t3-t2, t4-t3, s.compiles, s.disk_hits)")
    root = Path(__file__).resolve().parents[2]
    res = {}
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, HOSTIR_CACHE_DIR=d, PYTHONPATH=f"{root}:{os.environ.get('PYTHONPATH', '')}")
        for label in ("cold", "warm"):
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               env=env, cwd=root, timeout=240)
            line = [x for x in p.stdout.splitlines() if x.startswith("PROBE")]
            if not line:
                res[label] = {"error": (p.stderr or p.stdout)[-500:]}
                continue
            _, imp, choose, get, first, compiles, hits = line[0].split()
            res[label] = {"import_cupy_ms": float(imp) * 1e3, "choose_ms": float(choose) * 1e3,
                          "kernel_ms": float(get) * 1e3, "first_launch_ms": float(first) * 1e3,
                          "first_call_ms": (float(choose) + float(get) + float(first)) * 1e3,
                          "compiles": int(compiles), "disk_hits": int(hits)}
    return res


def bench(args) -> dict:
    import torch

    from lowering.kernels.heuristics import choose
    from lowering.kernels.matmul import supports_wgmma
    from runtime import autotune, jit
    from runtime.matmul import Problem, sm_count, tuning_arch

    device = torch.cuda.get_device_name()
    shapes = tuple(args.shapes) if args.shapes else SHAPES
    results = []
    for M, N, K in shapes:
        torch.manual_seed(M + N + K)
        sets = input_sets(M, N, K)
        inputs = _inputs(M, N, K, args.layout, sets, torch)
        a, b = inputs[0]
        ref = a.double() @ (b.double().t() if args.layout == "TN" else b.double())
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        flops = 2.0 * M * N * K
        bt = (lambda x, y: x @ y.t()) if args.layout == "TN" else (lambda x, y: x @ y)
        cublas_err = check(bt(a, b), ref, torch)
        arch = tuning_arch()
        variants = {"heuristic": choose(M, N, K, layout=args.layout, sm_count=sm_count(),
                                        arch=arch)}
        # cluster split-K (summed in a thread-block cluster) is generated for Hopper only
        for mode in ("none", "serial", "parallel") + (("cluster",) if supports_wgmma(arch) else ()):
            variants[mode] = choose(M, N, K, layout=args.layout, sm_count=sm_count(), mode=mode,
                                    arch=arch)
        if args.tune:
            p = Problem(M, N, K, "bf16", "bf16", args.layout, False)
            variants["tuned"] = autotune.tune(p, reps=5)
        # Correctness first (poisoned output, float64 reference, launches counted, the
        # arena checked zero), then every correct variant and cuBLAS timed side by side.
        rows, fns = {}, {"cublas": bt}
        for label, spec in variants.items():
            fn, rows[label] = check_variant(spec, a, b, out, ref, args.layout, torch)
            if rows[label]["rel_err"] < 1e-2:
                fns[label] = fn
        timed = _time_side_by_side(fns, inputs, args.reps)
        cublas_us = timed.pop("cublas")
        for label, row in rows.items():
            row["us"] = timed.get(label, float("nan"))
            row["tflops"] = flops / row["us"] / 1e6
        ok = {k: v for k, v in rows.items() if v["rel_err"] < 1e-2}
        best_label = min(ok, key=lambda k: ok[k]["us"]) if ok else "heuristic"
        best = rows[best_label]
        results.append({
            "shape": f"{M}x{N}x{K}", "ours_tflops": best["tflops"],
            "cublas_tflops": flops / cublas_us / 1e6, "split_k": best["split_k"],
            "mode": best["mode"], "instr": best["instr"], "tile": best["tile"],
            "launches": best["launches"],
            "ratio": best["tflops"] / (flops / cublas_us / 1e6), "picked_by": best_label,
            "rel_err": best["rel_err"], "cublas_rel_err": cublas_err,
            "cublas_us": cublas_us, "input_sets": sets, "variants": rows})
        print(f"{M}x{N}x{K}: cuBLAS {cublas_us:.1f} us; " + "; ".join(
            f"{k} {v['tile']} s{v['split_k']} {v['mode']} {v['us']:.1f} us err {v['rel_err']:.1e} "
            f"launches {v['launches']}" for k, v in rows.items()), flush=True)
        inputs = a = b = ref = out = None  # free this shape's tensors (the closures see None)
        torch.cuda.empty_cache()
    doc = {"device": device, "shape_convention": "MxNxK: C[M, N] = A[M, K] @ B[K, N]",
           "dtype": "bfloat16", "matmul": "generated split-K kernels vs cuBLAS", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "commit": commit(), "layout": args.layout, "sm_count": sm_count(),
           "nvrtc": ".".join(map(str, jit.nvrtc_version())), "torch": torch.__version__,
           "results": results}
    if not args.no_compile_probe:
        M, N, K = shapes[0]
        doc["compile_probe"] = _compile_probe(M, N, K)
    return doc


def _table(doc) -> str:
    lines = [f"{'shape':>18} {'ours TF/s':>10} {'cuBLAS TF/s':>12} {'ratio':>6} "
             f"{'tile':>11} {'split':>5} {'mode':>8} {'launches':>8}"]
    for r in doc["results"]:
        lines.append(f"{r['shape']:>18} {r['ours_tflops']:10.1f} {r['cublas_tflops']:12.1f} "
                     f"{r['ratio']:6.2f} {r['tile']:>11} {r['split_k']:5d} {r['mode']:>8} "
                     f"{r['launches']:8d}")
    if "compile_probe" in doc:
        lines.append(f"compile probe: {json.dumps(doc['compile_probe'])}")
    return "\n".join(lines)


def main(args) -> int:
    from hostir.jobs.results import results_path, write_json

    doc = bench(args)
    print(_table(doc))
    if args.json:
        path = results_path(args.json, "matmul", doc["device"])
        write_json(path, doc)
        print(f"wrote {path}")
    return 0
