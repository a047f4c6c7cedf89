"""Why the 2-CTA cluster matmul (feed "ctma") runs at about half the TMA feed's speed.

Four builds of one tile, timed side by side on one GPU (groups of back-to-back launches
between CUDA events, medians), each checked against cuBLAS first:

  tma         the TMA feed, no cluster
  cluster     the same kernel compiled with __cluster_dims__(2, 1, 1) and cluster
              barriers after init and before the epilogue (no cross-CTA traffic)
  coupled     + each ring slot released to both CTAs' producers (remote mbarrier
              arrives), each CTA still loading its whole B tile itself
  multicast   the ctma feed: + each CTA loads half of B and multicasts it to both
  multicast_release_cluster  the same with .release.cluster remote arrives (the first
              version: 0.62-0.65 of tma on the H200, 77c9b2d)

    python benchmarks/cluster_probe.py --out probe.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

import numpy as np
import torch

from lowering.kernels import heuristics
from lowering.kernels.matmul import MODE_CODE, launch_config, render
from runtime import jit, tma, workspace

PRODUCER_MC = """        if constexpr (CLUSTER_M > 1) {
          // This CTA's share of the B tile, to the same slot of every CTA of the cluster"""
PRODUCER_FULL = """        if constexpr (false) {
          // This CTA's share of the B tile, to the same slot of every CTA of the cluster"""
REMOTE_ARRIVE = """  if constexpr (CLUSTER_M > 1) {
    unsigned remote;"""
NO_REMOTE = """  if constexpr (false) {
    unsigned remote;"""


def builds(config):
    base = heuristics.spec_for(config[:6] + ("tma",))
    ctma = heuristics.spec_for(config[:6] + ("ctma",))
    src = render(ctma)
    coupled = src.source.replace(PRODUCER_MC, PRODUCER_FULL)
    cluster = coupled.replace(REMOTE_ARRIVE, NO_REMOTE).replace(
        "CONSUMER_WARPS * CLUSTER_M);", "CONSUMER_WARPS);")
    assert coupled != src.source and cluster != coupled
    tsrc = render(base)
    # (name, source, kernel name, spec for grid/smem, spec for the tensor maps' boxes)
    cluster_fence = src.source.replace(
        'asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\\n"',
        'asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\\n"')
    assert cluster_fence != src.source
    return [("tma", tsrc.source, tsrc.kernel_name, base, base),
            ("multicast_release_cluster", cluster_fence, src.kernel_name, ctma, ctma),
            ("cluster", cluster, src.kernel_name, ctma, base),
            ("coupled", coupled, src.kernel_name, ctma, base),
            ("multicast", src.source, src.kernel_name, ctma, ctma)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    major, minor = torch.cuda.get_device_capability(dev)
    results = []
    for (M, N, K), config, split, mode in [
            ((8192, 8192, 8192), (128, 256, 64, 8, 1, 4), 1, "none"),
            ((8192, 8192, 8192), (128, 128, 64, 8, 1, 6), 1, "none"),
            ((1024, 2048, 50304), (128, 256, 64, 8, 1, 4), 2, "serial")]:
        a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        b = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
        ref = a @ b.t()
        fns = {"cublas": lambda: a @ b.t()}
        row = {"shape": f"{M}x{N}x{K}", "tile": "x".join(map(str, config[:3])),
               "split": split, "mode": mode, "rel_err": {}}
        for name, source, kname, gspec, mspec in builds(config):
            gspec = dataclasses.replace(gspec, split_k=split, split_mode=mode)
            ck = jit.compile(source, [kname], gspec.arch(major, minor))
            kern = jit.load(ck)[kname]
            out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
            stream = torch.cuda.current_stream()
            arena = workspace.arena_for(stream)
            from lowering.kernels.matmul import tiles
            sems = arena.semaphores(tiles(gspec, M, N)) if mode == "serial" else None
            ws = arena.partials(M * N) if mode == "serial" else None
            cfg = launch_config(gspec, M, N, K, sms)
            maps = tma.tensor_maps(mspec, a, b, M, N, K)
            p = lambda t: np.uint64(0 if t is None else t.data_ptr())
            kargs = (p(a), p(b), p(out), np.uint64(0), p(ws), p(sems), np.int32(M),
                     np.int32(N), np.int32(K), np.int32(K), np.int32(K), np.int32(N),
                     np.int32(split), np.int32(MODE_CODE[mode]), np.uint64(maps))

            def fn(kern=kern, cfg=cfg, kargs=kargs):
                kern.launch(cfg.grid, cfg.block, kargs, cfg.smem_bytes)
            out.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            row["rel_err"][name] = err
            if err < 1e-2:
                fns[name] = fn
        times = {k: [] for k in fns}
        for f in fns.values():
            for _ in range(3):
                f()
        for _ in range(15):
            for k, f in fns.items():
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(5):
                    f()
                e.record()
                e.synchronize()
                times[k].append(s.elapsed_time(e) * 1e3 / 5)
        med = {k: statistics.median(v) for k, v in times.items()}
        row["us"] = med
        row["over_cublas"] = {k: med["cublas"] / v for k, v in med.items() if k != "cublas"}
        print(json.dumps(row), flush=True)
        results.append(row)
    if args.out:
        import datetime

        from hostir.jobs.results import commit
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "commit": commit(),
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                           timespec="seconds"), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
