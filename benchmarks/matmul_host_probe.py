"""Where the host time of one generated-matmul call goes (diagnostic, not a test).

benchmarks/skinny_probe.py found ~55-110 us of host time a call for a generated matmul
against ~19 us for torch's cuBLAS call, more than the 60 us kernel of 256x4096x16384: the
GPU waits on the host. This times, per call with no sync (the queue never fills), the
layers of the launch path one by one: cuBLAS through torch, `runtime.matmul.matmul`,
`runtime.matmul.launch`, `jit.Kernel.launch` with ready arguments, CuPy's function call
alone, and a one-element torch kernel; then cProfile of `matmul` by own time:

    python benchmarks/matmul_host_probe.py --out probe.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def per_call_us(fn, n: int = 200, rounds: int = 5) -> float:
    samples = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(n):
            fn(i)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        samples.append((t1 - t0) / n * 1e6)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="256x1024x1024")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from lowering.kernels import heuristics
    from lowering.kernels.matmul import MODE_CODE, launch_config
    from runtime import jit, matmul as rm, tma
    from runtime.matmul import launch, load, matmul, tuning_arch

    M, N, K = (int(x) for x in a.shape.split("x"))
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    one = torch.zeros(1, device="cuda")
    stream = torch.cuda.current_stream()
    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
           "commit": os.environ.get("HOSTIR_COMMIT", "unknown"), "shape": a.shape,
           "method": "host microseconds a call, 200 calls without sync, median of 5",
           "torch_linear_us": per_call_us(lambda i: torch.nn.functional.linear(x, w, out=out)),
           "torch_one_element_kernel_us": per_call_us(lambda i: one.add_(1)),
           "specs": []}
    picks = {}
    for s in heuristics.candidates(M, N, K, arch=tuning_arch()):
        if s.instr == "wgmma" and s.split_k in (1, 2) and s.feed in ("tma", "ptma", "ctma"):
            picks.setdefault((s.feed, s.split_mode), s)
    for spec in picks.values():
        loaded = load(spec)
        matmul(x, w, out=out, spec=spec)
        cfg = launch_config(spec, M, N, K, rm.sm_count())
        arena = rm.workspace.arena_for(stream)
        ws = arena.partials(spec.split_k * M * N)
        sems = arena.semaphores(1024)
        i32 = np.int32
        args = (np.uint64(x.data_ptr()), np.uint64(w.data_ptr()), np.uint64(out.data_ptr()),
                np.uint64(0), np.uint64(ws.data_ptr()), np.uint64(sems.data_ptr()), i32(M),
                i32(N), i32(K), i32(K), i32(K), i32(N), i32(spec.split_k),
                i32(MODE_CODE[spec.split_mode]))
        if spec.tma:
            args += (np.uint64(tma.tensor_maps(spec, x, w, M, N, K)),)
        ext = jit._external_stream(stream.cuda_stream)
        fn = loaded.main.function
        row = {"spec": f"{spec.feed} {spec.tile} s{spec.split_k} {spec.split_mode}",
               "matmul_us": per_call_us(lambda i: matmul(x, w, out=out, spec=spec)),
               "launch_us": per_call_us(lambda i: launch(spec, x, w, out, None, M, N, K)),
               "kernel_launch_us": per_call_us(
                   lambda i: loaded.main.launch(cfg.grid, cfg.block, args, cfg.smem_bytes,
                                                stream)),
               "cupy_call_us": per_call_us(
                   lambda i: fn(cfg.grid, cfg.block, args, shared_mem=cfg.smem_bytes,
                                stream=ext))}
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        prof.enable()
        for _ in range(200):
            matmul(x, w, out=out, spec=spec)
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
        row["profile"] = text.getvalue().splitlines()[-24:]
        print(json.dumps({k: v for k, v in row.items() if k != "profile"}), flush=True)
        print("\n".join(row["profile"]), flush=True)
        res["specs"].append(row)
    print("torch linear", res["torch_linear_us"], "one-element kernel",
          res["torch_one_element_kernel_us"])
    with open(a.out, "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
