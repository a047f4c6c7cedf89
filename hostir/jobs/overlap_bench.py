"""The overlap yardstick: AllGather+GEMM timed side by side, in one run, on every rank.

    mpirun -np 2 python -m hostir.run pipelined_matmul --bench

For each shape (MxNxK: C[M, N] = A[M, K] @ B[K, N], M over all ranks; bf16): allgather alone, the unchunked cuBLAS GEMM
alone, allgather then GEMM, torch's async-TP (``fused_all_gather_matmul``), and our host
programs over a grid of schedules (stages x streams x transports). Correctness of every
schedule is checked first against a float64 reference on sampled rows. Each figure is the
median over iterations of the slowest rank, each iteration started after a device
synchronize and a barrier, timed with CUDA events on the user's stream.
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from hostir.jobs.results import commit, write_on_rank0
from runtime.timing import balanced_rounds

# (M, K, N) here, as the lowering takes them; printed and recorded as MxNxK like every job.
SHAPES = [(8192, 8192, 8192), (16384, 8192, 8192), (32768, 8192, 4096),
          (4096, 8192, 28672), (32768, 32768, 8192)]


# The staged copy-engine path (the reference the direct path is compared with) hung at
# 32768x32768x8192 in five of eight runs, in a device barrier or the call after it, with
# 1 GiB and 512 MiB messages (benchmarks/results/raw/pipelined_matmul_*32768x32768*.log,
# ..._repeat_342d088.log); the direct path, the default, never did. Until that is
# understood, the reference skips messages above this size.
STAGED_MAX_BYTES = 256 << 20


class Timer:
    """Per-iteration time of the slowest rank, for several candidates measured side by side.

    A sample runs ``reps`` back-to-back iterations of one candidate between two CUDA
    events, after a device synchronize and a barrier. Samples are interleaved: round r
    takes one sample of every candidate in turn, in a carryover-balanced order
    (`runtime.autotune.balanced_rounds`: each right after every other equally often; the
    results before 56daeb5 took a fixed order), so that clocks, temperature and power,
    which drift over seconds of sustained GEMMs on these parts, weigh on every candidate
    alike (timing candidates one after another favoured the first ones: the GEMM alone,
    the yardstick, ran on a cooler chip than the programs compared with it)."""

    def __init__(self, session, samples: int, warmup: int, reps: int = 5):
        from mpi4py import MPI

        self.mpi = MPI.COMM_WORLD
        self.session = session
        self.samples, self.warmup, self.reps = samples, warmup, reps

    def sample(self, fn) -> tuple[float, float]:
        torch.cuda.synchronize()
        self.mpi.Barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        for _ in range(self.reps):
            fn()
        host = (time.perf_counter() - t0) * 1e6 / self.reps
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / self.reps, host

    def side_by_side(self, fns: dict) -> dict:
        """{name: (median GPU µs per iteration of the slowest rank, median host µs)}."""
        for fn in fns.values():
            for _ in range(self.warmup):
                fn()
        torch.cuda.synchronize()
        gpu = {name: [] for name in fns}
        host = {name: [] for name in fns}
        # carryover-balanced order: each candidate right after every other equally often
        for names in balanced_rounds(list(fns), self.samples):
            for name in names:
                g, h = self.sample(fns[name])
                gpu[name].append(g)
                host[name].append(h)
        return {name: (self.mpi.allreduce(statistics.median(gpu[name]), op=_max()),
                       statistics.median(host[name])) for name in fns}

    def __call__(self, fn) -> tuple[float, float]:
        """One candidate alone: (median GPU µs, slowest rank; median host µs)."""
        return self.side_by_side({"_": fn})["_"]


def _name(v: dict) -> str:
    return (f"{v['schedule']}/S{v['stages']}/streams{v['streams']}/{v['transport']}"
            + ("/graph" if v["graph"] else "") + ("/staged" if v.get("staged") else ""))


def _staged_interpreter(sess, program):
    """An interpreter whose SendRecvs go through the transport's staging buffer."""
    import dataclasses

    from hostir.options import options, set_options
    from runtime.interpreter import Interpreter

    saved = options()
    set_options(dataclasses.replace(saved, disabled=saved.disabled | {"direct_sendrecv"}))
    try:
        return Interpreter(program, sess.backend, sess.comm)
    finally:
        set_options(saved)


def progress(message: str) -> None:
    """Where the bench is, on stderr (rank 0), so that a cut-off run shows its last step."""
    from mpi4py import MPI

    if MPI.COMM_WORLD.rank == 0:
        print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _max():
    from mpi4py import MPI

    return MPI.MAX


def _async_tp(session, shard_rows_contig, b):
    """torch's fused AllGather+GEMM over symmetric memory, or None with the reason.

    The set-up may fail (an older torch); then every rank skips it, by agreement: one
    rank running a collective the others skip would hang them. A failure while it runs
    is not caught: the job's excepthook aborts every rank instead."""
    from mpi4py import MPI

    run, reason = None, None
    try:
        import torch.distributed as dist
        import torch.distributed._symmetric_memory  # noqa: F401 - registers the fused ops

        from runtime.session import init_torch_distributed_from_mpi

        init_torch_distributed_from_mpi("nccl")
        # The op finds the group's symmetric memory by name (torch >= 2.11 needs no
        # enable_symm_mem_for_group, which it deprecates).
        name = dist.group.WORLD.group_name
        op = torch.ops.symm_mem.fused_all_gather_matmul

        def run():
            op(shard_rows_contig, [b], gather_dim=0, group_name=name)
    except Exception as e:  # noqa: BLE001 - reported in the results, not fatal
        run, reason = None, f"{type(e).__name__}: {e}"
    if not MPI.COMM_WORLD.allreduce(int(run is not None), op=MPI.MIN):
        return None, reason or "skipped: async-TP could not be set up on another rank"
    run()
    torch.cuda.synchronize()
    return run, None


def _variants():
    """The schedules timed per shape: the per-stage Allgather pipeline (the naive form),
    and the local-first ring over NCCL and over the copy engine, eager and as a CUDA
    graph."""
    V = lambda sched, s, t, g=False, staged=False: dict(  # noqa: E731
        schedule=sched, stages=s, streams=2, transport=t, graph=g, staged=staged)
    out = [V("pipelined", 1, "nccl"), V("pipelined", 4, "nccl"), V("ring", 1, "nccl"),
           V("ring", 1, "copy_engine"), V("ring", 2, "copy_engine"), V("ring", 4, "copy_engine"),
           V("ring", 8, "copy_engine"),
           V("ring", 1, "copy_engine", True), V("ring", 2, "copy_engine", True),
           # the copy engine through a staging buffer and a local copy-out (the way
           # before SendRecvs wrote into the peer's gathered buffer): what direct saves
           V("ring", 2, "copy_engine", staged=True)]
    only = os.environ.get("HOSTIR_BENCH_ONLY")  # e.g. "ring" to time one schedule
    return [v for v in out if not only or v["schedule"] == only]


_CE = []


def _copy_engine_session():
    from runtime.session import Session

    if not _CE:
        _CE.append(Session("cuda", "copy_engine"))
    return _CE[0]


def _first_iteration(session, args) -> dict:
    """What lazy set-up costs: building + preparing a fresh program (prepare() runs it
    once), then its first call against the steady state, on the copy-engine ring."""
    from mpi4py import MPI

    from lowering.patterns import allgather_matmul, shard_rows
    from lowering.pipeline import lower

    m, k, n = 8192, 8192, 8192
    d, r = session.world_size, session.rank
    sess = _copy_engine_session()
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    p = lower(allgather_matmul(m, k, n, 1, d, "bfloat16"), d, 2, r, schedule="ring")
    shard = shard_rows(a, 1, d, r)

    def timed(fn) -> float:
        torch.cuda.synchronize()
        MPI.COMM_WORLD.Barrier()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e6

    holder = {}
    prepare_us = timed(lambda: holder.setdefault("run", sess.interpreter(p)).prepare(shard, b))
    run = holder["run"]
    calls = [timed(lambda: run(shard, b)) for _ in range(6)]
    return {"shape": f"{m}x{n}x{k}", "schedule": "ring/S1/copy_engine",
            "prepare_us": prepare_us, "first_call_after_prepare_us": calls[0],
            "steady_us": statistics.median(calls[1:]),
            "note": "host wall time per call including a device synchronize"}


def bench(args) -> int:
    from mpi4py import MPI

    from lowering.patterns import allgather_matmul, shard_rows
    from lowering.pipeline import lower
    from lowering.schedule import choose_schedule
    from runtime.graph import capture
    from runtime.session import Session

    session = Session("cuda", "nccl")
    d, r = session.world_size, session.rank
    timer = Timer(session, args.iters, args.warmup)
    faulthandler.dump_traceback_later(args.shape_timeout, exit=True)
    first_call = _first_iteration(session, args)
    shapes = SHAPES if not args.shapes else [(m, k, n) for m, n, k in args.shapes]
    device = torch.cuda.get_device_name(session.device)
    results = []
    for m, k, n in shapes:
        t_shape = time.perf_counter()
        # A shape that hangs (a run once produced nothing for one in 200 s) must say
        # where: past the limit, every thread's stack goes to stderr and the rank exits,
        # which ends the MPI job.
        faulthandler.dump_traceback_later(args.shape_timeout, exit=True)
        g = torch.Generator(device="cuda").manual_seed(1234)
        a = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", generator=g, dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        mine = a[r * (m // d):(r + 1) * (m // d)].contiguous()   # contiguous row shard
        gathered = torch.empty_like(a)
        rows = torch.randperm(m, generator=torch.Generator().manual_seed(5))[:256].cuda()
        ref = a[rows].double() @ b.double()

        def allgather():
            stream = torch.cuda.current_stream()
            session.comm.allgather(gathered, mine, stream).wait(stream)  # ordered before the GEMM

        def gemm():
            torch.mm(a, b, out=c)

        def sequential():
            allgather()
            torch.mm(gathered, b, out=c)

        def gemm_chunks():  # the unchunked GEMM's work as the ring's D row blocks
            for blk in range(d):
                rows_ = slice(blk * (m // d), (blk + 1) * (m // d))
                torch.mm(a[rows_], b, out=c[rows_])

        # A first estimate of the GEMM sets the repeats (long iterations need fewer); then
        # every candidate is built and checked, and all are timed side by side.
        label = f"{m}x{n}x{k}"
        progress(f"{label}: gemm estimate")
        timer.reps = 5
        timer.reps = 5 if timer(gemm)[0] < 5000 else 2
        progress(f"{label}: async-TP set-up")
        atp_run, atp_err = _async_tp(session, mine, b)
        fns = {"allgather": allgather, "gemm": gemm, "sequential": sequential,
               "gemm_chunks": gemm_chunks}
        if atp_run:
            fns["async_tp"] = atp_run
        variants, keep = [], []
        for v in _variants():
            if m % (v["stages"] * d) or (v["stages"] == 8 and m // (8 * d) < 2048):
                continue  # 8 stages only where each keeps 2048 rows a rank
            if v["staged"] and (m // (v["stages"] * d)) * k * 2 > STAGED_MAX_BYTES:
                continue
            progress(f"{label}: build and check {_name(v)}")
            sess = session if v["transport"] == "nccl" else _copy_engine_session()
            p = lower(allgather_matmul(m, k, n, v["stages"], d, "bfloat16"), d, v["streams"], r,
                      schedule=v["schedule"])
            run = _staged_interpreter(sess, p) if v["staged"] else sess.interpreter(p)
            shard = shard_rows(a, v["stages"], d, r)
            if v["graph"]:
                graphed = capture(run, shard, b)
                step = graphed
                out = graphed()[0]
            else:
                step = lambda run=run, shard=shard: run(shard, b)  # noqa: E731
                (out,) = run(shard, b)
            err = float((out.reshape(m, n)[rows].double() - ref).norm() / ref.norm())
            ok = MPI.COMM_WORLD.allreduce(int(err < 1e-2), op=MPI.MIN)
            variants.append({**v, "rel_err": err, "ok": bool(ok)})
            keep.append(step)
            fns[_name(v)] = step
            del out
        progress(f"{label}: timing {len(fns)} candidates side by side")
        times = timer.side_by_side(fns)
        del keep, fns
        ag_us, gemm_us, seq_us = (times[x][0] for x in ("allgather", "gemm", "sequential"))
        atp_us = times["async_tp"][0] if atp_run else None
        chunks_us = times["gemm_chunks"][0]
        for v in variants:
            v["us"], v["host_us"] = times[_name(v)]
        good = [v for v in variants if v["ok"] and not v["staged"]]  # staged: a reference
        best = min(good, key=lambda v: v["us"]) if good else None
        h = choose_schedule(m, k, n, d, "cuda")
        heur = [v for v in good if not v["graph"] and (v["schedule"], v["stages"], v["transport"])
                == (h.schedule, h.stages, h.transport)]
        if best and getattr(args, "autotune", False) and r == 0:
            from lowering.schedule import Schedule
            from runtime.schedule_tuning import store

            store(m, k, n, d, "cuda", "bfloat16",
                  Schedule(best["schedule"], best["stages"], best["streams"], best["transport"]),
                  best["us"])
        ideal = max(ag_us, gemm_us)
        row = {
            "shape": label, "m": m, "n": n, "k": k, "allgather_us": ag_us, "gemm_us": gemm_us,
            "ideal_us": ideal, "sequential_us": seq_us, "async_tp_us": atp_us,
            "gemm_in_world_size_row_blocks_us": chunks_us,
            "async_tp_error": atp_err,
            **{name: best[key] if best else None for name, key in (
                ("ours_us", "us"), ("stages", "stages"), ("streams", "streams"),
                ("transport", "transport"), ("schedule", "schedule"), ("graph", "graph"),
                ("ours_host_us", "host_us"))},
            "heuristic": h.key(), "heuristic_us": heur[0]["us"] if heur else None,
            "variants": variants,
        }
        row["bench_seconds"] = time.perf_counter() - t_shape
        results.append(row)
        if r == 0:
            print(json.dumps({k_: v for k_, v in row.items() if k_ != "variants"}), flush=True)
        if args.json:  # after every shape: a cut-off run keeps what it measured
            write_on_rank0(r, lambda: _write(args, device, d, first_call, results))
    faulthandler.cancel_dump_traceback_later()
    if r == 0:
        _table(results)
    if args.json:
        path = write_on_rank0(r, lambda: _write(args, device, d, first_call, results))
        if r == 0:
            print(f"wrote {path}")
    return 0


def _write(args, device, world, first_call, results) -> Path:
    from hostir.jobs.results import results_path, write_json

    path = results_path(args.json, "pipelined_matmul", device, world)
    record = {"device": device, "date": datetime.date.today().isoformat(), "commit": commit(),
              "world_size": world, "first_iteration": first_call,
              "method": "median over samples of the slowest rank; each sample times "
                        "back-to-back iterations (5, or 2 when the GEMM takes over 5 ms) "
                        "between CUDA events after a synchronize and a barrier; samples "
                        "of all candidates of a shape interleaved (round robin); host_us "
                        "is the host time to issue one iteration",
              "shape_convention": "MxNxK: C[M, N] = A[M, K] @ B[K, N], M over all ranks",
              "dtype": "bfloat16", "matmul": "cublas", "results": results}
    write_json(path, record)
    return path


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
