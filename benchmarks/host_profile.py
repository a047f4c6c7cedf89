"""Where the host time of one eager call goes (the GPU run's diagnostic, not a test).

    mpirun -np 2 python benchmarks/host_profile.py [--schedule ring] [--transport copy_engine]

Builds the program at a small shape (host cost does not depend on the shape; a small GEMM
keeps the device ahead of the host so that no launch blocks), prepares it, then profiles
``--calls`` eager calls on rank 0 with cProfile and prints the top functions by own time,
and the host microseconds per call with and without the profiler.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch


def main() -> None:
    from mpi4py import MPI

    from lowering.patterns import allgather_matmul, shard_rows
    from lowering.pipeline import lower
    from runtime.session import Session

    ap = argparse.ArgumentParser()
    ap.add_argument("--schedule", default="ring")
    ap.add_argument("--transport", default="copy_engine")
    ap.add_argument("--stages", type=int, default=1)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--size", type=int, default=2048)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    session = Session("cuda", args.transport)
    d, r = session.world_size, session.rank
    m = k = n = args.size
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    p = lower(allgather_matmul(m, k, n, args.stages, d, "bfloat16"), d, 2, r,
              schedule=args.schedule)
    run = session.interpreter(p)
    shard = shard_rows(a, args.stages, d, r)
    run.prepare(shard, b)

    def calls(count: int) -> float:
        torch.cuda.synchronize()
        comm.Barrier()
        spent = 0.0
        for i in range(count):
            t0 = time.perf_counter()
            run(shard, b)
            spent += time.perf_counter() - t0
            if i % 8 == 7:  # keep the launch queue short: no call waits for room in it
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        return spent * 1e6 / count

    plain = calls(args.calls)
    prof = cProfile.Profile()
    prof.enable()
    profiled = calls(args.calls)
    prof.disable()
    if r == 0:
        print(f"{args.schedule}/S{args.stages}/{args.transport} world={d}: host {plain:.1f} us "
              f"per call ({profiled:.1f} us under cProfile)")
        pstats.Stats(prof).sort_stats("tottime").print_stats(28)


if __name__ == "__main__":
    main()
