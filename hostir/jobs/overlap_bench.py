"""The overlap yardstick: AllGather+GEMM timed side by side, in one run, on every rank.

    mpirun -np 2 python -m hostir.run pipelined_matmul --bench

For each shape (M total rows x K x N, bf16): allgather alone, the unchunked cuBLAS GEMM
alone, allgather then GEMM, torch's async-TP (``fused_all_gather_matmul``), and our host
programs over a grid of schedules (stages x streams x transports). Correctness of every
schedule is checked first against a float64 reference on sampled rows. Each figure is the
median over iterations of the slowest rank, each iteration started after a device
synchronize and a barrier, timed with CUDA events on the user's stream.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import time

import torch

SHAPES = [(8192, 8192, 8192), (16384, 8192, 8192), (32768, 8192, 4096),
          (4096, 8192, 28672), (32768, 32768, 8192)]


def _commit() -> str:
    if os.environ.get("HOSTIR_COMMIT"):
        return os.environ["HOSTIR_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


class Timer:
    """Median of the slowest rank, per-iteration CUDA events after a barrier."""

    def __init__(self, session, iters: int, warmup: int):
        from mpi4py import MPI

        self.mpi = MPI.COMM_WORLD
        self.session = session
        self.iters, self.warmup = iters, warmup

    def __call__(self, fn) -> tuple[float, float]:
        """(median GPU µs of the slowest rank, median host µs to enqueue)."""
        for _ in range(self.warmup):
            fn()
        torch.cuda.synchronize()
        gpu, host = [], []
        for _ in range(self.iters):
            torch.cuda.synchronize()
            self.mpi.Barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1e6)
            end.record()
            end.synchronize()
            gpu.append(start.elapsed_time(end) * 1e3)
        return self.mpi.allreduce(statistics.median(gpu), op=_max()), statistics.median(host)


def _max():
    from mpi4py import MPI

    return MPI.MAX


def _async_tp(session, shard_rows_contig, b):
    """torch's fused AllGather+GEMM over symmetric memory, or None with the reason."""
    try:
        import torch.distributed as dist
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        from runtime.session import init_torch_distributed_from_mpi

        init_torch_distributed_from_mpi("nccl")
        name = dist.group.WORLD.group_name
        enable_symm_mem_for_group(name)
        op = torch.ops.symm_mem.fused_all_gather_matmul

        def run():
            op(shard_rows_contig, [b], gather_dim=0, group_name=name)

        run()
        torch.cuda.synchronize()
        return run, None
    except Exception as e:  # noqa: BLE001 - reported in the results, not fatal
        return None, f"{type(e).__name__}: {e}"


def _schedules(args):
    stages = [int(s) for s in os.environ.get("HOSTIR_BENCH_STAGES", "1,2,4,8").split(",")]
    streams = [int(s) for s in os.environ.get("HOSTIR_BENCH_STREAMS", "1,2,3").split(",")]
    return [(s, n) for s in stages for n in streams if n <= max(s, 1) or n == 1]


def bench(args) -> int:
    from mpi4py import MPI

    from lowering.patterns import allgather_matmul, shard_rows
    from lowering.pipeline import lower
    from runtime.session import Session

    session = Session("cuda", "nccl")
    d, r = session.world_size, session.rank
    timer = Timer(session, args.iters, args.warmup)
    shapes = SHAPES if not args.shapes else [tuple(int(x) for x in s.split("x"))
                                               for s in args.shapes.split(",")]
    device = torch.cuda.get_device_name(session.device)
    results = []
    for m, k, n in shapes:
        g = torch.Generator(device="cuda").manual_seed(1234)
        a = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", generator=g, dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        mine = a[r * (m // d):(r + 1) * (m // d)].contiguous()   # contiguous row shard
        gathered = torch.empty_like(a)
        rows = torch.randperm(m, generator=torch.Generator().manual_seed(5))[:256].cuda()
        ref = a[rows].double() @ b.double()

        def allgather():
            session.comm.allgather(gathered, mine, torch.cuda.current_stream())

        def gemm():
            torch.mm(a, b, out=c)

        def sequential():
            allgather()
            torch.mm(gathered, b, out=c)

        ag_us, _ = timer(allgather)
        gemm_us, _ = timer(gemm)
        seq_us, _ = timer(sequential)
        atp_run, atp_err = _async_tp(session, mine, b)
        atp_us = timer(atp_run)[0] if atp_run else None
        variants = []
        for stages, streams in _schedules(args):
            if m % (stages * d):
                continue
            p = lower(allgather_matmul(m, k, n, stages, d, "bfloat16"), d, streams, r)
            run = session.interpreter(p)
            shard = shard_rows(a, stages, d, r)
            (out,) = run(shard, b)
            err = float((out.reshape(m, n)[rows].double() - ref).norm() / ref.norm())
            ok = MPI.COMM_WORLD.allreduce(int(err < 1e-2), op=MPI.MIN)
            us, host_us = timer(lambda: run(shard, b))
            variants.append({"stages": stages, "streams": streams, "transport": "nccl",
                             "us": us, "host_us": host_us, "rel_err": err, "ok": bool(ok)})
            del out
        good = [v for v in variants if v["ok"]]
        best = min(good, key=lambda v: v["us"]) if good else None
        ideal = max(ag_us, gemm_us)
        row = {
            "shape": f"{m}x{k}x{n}", "allgather_us": ag_us, "gemm_us": gemm_us,
            "ideal_us": ideal, "sequential_us": seq_us, "async_tp_us": atp_us,
            "async_tp_error": atp_err,
            "ours_us": best["us"] if best else None,
            "stages": best["stages"] if best else None,
            "streams": best["streams"] if best else None,
            "transport": best["transport"] if best else None,
            "ours_host_us": best["host_us"] if best else None,
            "variants": variants,
        }
        results.append(row)
        if r == 0:
            print(json.dumps({k_: v for k_, v in row.items() if k_ != "variants"}), flush=True)
        del a, b, c, gathered, mine
        torch.cuda.empty_cache()
    if r == 0:
        _table(results)
        path = args.out or os.path.join(
            "benchmarks", "results", f"pipelined_matmul_{device.replace(' ', '_')}.json")
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump({"device": device, "date": datetime.date.today().isoformat(),
                       "commit": _commit(), "world_size": d, "results": results}, f, indent=1)
        print(f"wrote {path}")
    return 0


def _table(results) -> None:
    print(f"{'shape':>20} {'AG':>7} {'GEMM':>7} {'ideal':>7} {'seq':>7} {'asyncTP':>8} "
          f"{'ours':>7} {'S/str':>6} {'ours/ideal':>10} {'ours/aTP':>9}")
    for r in results:
        atp = r["async_tp_us"]
        ours = r["ours_us"]
        print(f"{r['shape']:>20} {r['allgather_us']:7.0f} {r['gemm_us']:7.0f} {r['ideal_us']:7.0f} "
              f"{r['sequential_us']:7.0f} {atp if atp else float('nan'):8.0f} "
              f"{ours if ours else float('nan'):7.0f} {r['stages']}/{r['streams']:<4} "
              f"{(ours / r['ideal_us']) if ours else float('nan'):10.3f} "
              f"{(ours / atp) if (ours and atp) else float('nan'):9.3f}")
