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
    micro = _micro(session, run, shard, b) if args.transport == "copy_engine" else {}
    prof = cProfile.Profile()
    prof.enable()
    profiled = calls(args.calls)
    prof.disable()
    if r == 0:
        print(f"{args.schedule}/S{args.stages}/{args.transport} world={d}: host {plain:.1f} us "
              f"per call ({profiled:.1f} us under cProfile)")
        for what, us in micro.items():
            print(f"  host us per call of {what}: {us:.1f}")
        pstats.Stats(prof).sort_stats("tottime").print_stats(28)


def _micro(session, run, shard, b) -> dict:
    """Host microseconds of the pieces of one copy-engine SendRecv, each alone."""
    comm = session.comm
    entry = next(iter(run._symmetric.values()), None)
    if entry is None:
        return {}
    tensor, handle, views = entry
    dst = next(iter(views.values()))
    src = shard.reshape(-1)[:dst.numel()].view(dst.shape)
    s = torch.cuda.current_stream()
    pieces = {
        "symmetric-memory barrier": lambda: handle.barrier(channel=0, timeout_ms=60000),
        "peer copy_": lambda: dst.copy_(src),
        "torch.cuda.stream(s) enter+exit": lambda: torch.cuda.stream(s).__enter__() or
        torch.cuda.stream(s).__exit__(None, None, None),
        "event record": lambda: torch.cuda.Event().record(s),
        "posted (event + watchdog)": lambda: comm._posted(s, src),
        "whole sendrecv_direct": lambda: comm.sendrecv_direct(dst, src, comm.rank, comm.rank, s,
                                                              handle, dst),
    }
    out = {}
    for what, fn in pieces.items():
        torch.cuda.synchronize()
        session.comm.barrier() if hasattr(session.comm, "barrier") else None
        t0 = time.perf_counter()
        for i in range(100):
            fn()
        out[what] = (time.perf_counter() - t0) * 1e4
        torch.cuda.synchronize()
    return out


if __name__ == "__main__":
    main()
