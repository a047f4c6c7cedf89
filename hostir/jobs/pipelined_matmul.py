"""The main job: AllGather+GEMM lowered to a pipelined host program, on every rank.

A[M, K] is split into ``--stages`` stages whose rows are sharded over the ranks; B[K, N]
is replicated. Each rank gathers A stage by stage on round-robin worker streams and
multiplies it with B, so stage i+1's allgather overlaps stage i's GEMM.

    mpirun -np 2 python -m hostir.run pipelined_matmul --m 8192 --n 8192 --k 8192 \\
        --stages 4 --streams 2 --dtype bfloat16 --check

Rank 0 prints one line: C's shape as M N K (C[M, N] = A[M, K] @ B[K, N]), what ran
(schedule, stages, streams, matmul, comm), time per iteration (median), and the check's
result; ``--json FILE`` appends the same as one JSON line.
``HOSTIR_DUMP=host_ir`` prints the program once, on rank 0.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from hostir.options import dump
from hostir.printer import print_program
from runtime.device import DTYPES

# Relative Frobenius error vs a float64 reference, by dtype: fp32 GEMMs differ in
# summation order only; half types round their inputs and outputs.
TOLERANCE = {"float32": 1e-5, "float64": 1e-12, "bfloat16": 1e-2, "float16": 5e-3}


def add_arguments(p) -> None:
    from hostir.jobs.preflight import (DTYPES, at_least, device_name, positive_float, seed,
                                       shape_list)

    p.add_argument("--m", type=at_least(1), default=1024, help="rows of A and C, over all ranks")
    p.add_argument("--n", type=at_least(1), default=512, help="columns of B and C")
    p.add_argument("--k", type=at_least(1), default=512, help="contraction extent")
    p.add_argument("--stages", type=at_least(1), default=None,
                   help="pipeline stages (the Stream axis); --m must divide by stages x ranks; "
                        "default: the schedule heuristic or an autotuned choice")
    p.add_argument("--streams", type=at_least(1), default=None,
                   help="worker streams; default: the schedule heuristic or an autotuned "
                        "choice")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--device", type=device_name, default="auto",
                   help="auto (CUDA when present), cpu, cuda or cuda:N")
    p.add_argument("--comm", default="auto",
                   choices=["auto", "nccl", "copy_engine", "torch", "mpi"],
                   help="collectives: auto = NCCL on CUDA, MPI on the CPU; copy_engine = "
                        "SendRecv by peer copies over CUDA IPC (no SMs), the rest NCCL; "
                        "torch = a torch.distributed process group")
    p.add_argument("--schedule", default="auto", choices=["auto", "pipelined", "ring"],
                   help="pipelined: one Allgather per stage on round-robin streams; ring: "
                        "local rows first, the others by SendRecv beside the GEMMs; auto: "
                        "an autotuned choice if stored, else the heuristic of lowering/schedule.py")
    p.add_argument("--autotune", action="store_true",
                   help="with --bench: store each shape's fastest correct schedule, which "
                        "--schedule auto then uses")
    p.add_argument("--matmul", default=None, choices=["cublas", "codegen", "auto"],
                   help="what runs the GEMMs on CUDA: cuBLAS (torch, the default), the "
                        "generated split-K kernel (fp16/bf16), or per shape the faster of the "
                        "two, timed before the first iteration. On the CPU: torch")
    p.add_argument("--graph", action="store_true",
                   help="capture the program into a CUDA graph once and time its replays")
    p.add_argument("--iters", type=at_least(1), default=10, help="timed iterations")
    p.add_argument("--warmup", type=at_least(0), default=2, help="untimed iterations first")
    p.add_argument("--check", action="store_true",
                   help="compare with allgather-then-matmul in float64; exit 1 on mismatch")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--json", default=None, metavar="FILE",
                   help="append this run's result as one JSON line to FILE (rank 0); with "
                        "--bench, write the benchmark's results document to FILE (a directory: "
                        "pipelined_matmul_<device>_x<N>.json in it)")
    p.add_argument("--bench", action="store_true",
                   help="time allgather, GEMM, allgather-then-GEMM, torch async-TP and ours "
                        "side by side for the benchmark shapes (GPUs); see hostir/jobs/overlap_bench.py")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="write a Chrome/Perfetto trace of a few iterations (torch.profiler) "
                        "to FILE; each rank writes FILE with .rank<N> before the suffix")
    p.add_argument("--timeline", default=None, metavar="FILE.png",
                   help="draw every rank's streams over time into FILE.png (needs --trace "
                        "or takes a temporary one; matplotlib)")
    p.add_argument("--shapes", type=shape_list, default=None,
                   help="with --bench: comma-separated MxNxK list instead of the default shapes")
    p.add_argument("--shape-timeout", type=positive_float, default=180.0,
                   help="with --bench: seconds one shape may take before every rank dumps "
                        "its stacks and the job ends")


def estimated_bytes(args, world: int) -> int:
    """Peak bytes a rank allocates: A and B drawn in float32 and converted, the shard, the
    gathered A and C; with --check fresh inputs and the float64 reference."""
    from hostir.jobs.preflight import dtype_bytes

    m, n, k, e = args.m, args.n, args.k, dtype_bytes(args.dtype)
    total = 4 * (m * k + k * n) + e * (m * k + k * n + m * k // world + m * k + m * n)
    if args.check:
        total += e * (m * k + k * n) + 8 * (m * k + k * n + 2 * m * n)
    return total


def validate(args, world) -> None:
    """Refuse, before anything runs, what this job cannot do (see hostir.jobs.preflight)."""
    from hostir.jobs import preflight as pf

    device = pf.resolve_device(args.device)
    args.device = device
    cuda = device.startswith("cuda")
    if args.bench:
        pf.need_cuda("--bench (NCCL, the copy engine and CUDA graphs timed side by side)",
                     device)
        pf.need_module("cupy", pf.cupy_install(), "--bench (NCCL through CuPy)")
        if args.json is not None:
            pf.writable_output("--json", args.json, directory_ok=True)
        return
    for flag, on in (("--autotune", args.autotune), ("--shapes", args.shapes)):
        if on:
            raise pf.UsageError(f"{flag} is for --bench (a single run takes --m --n --k)")
    if args.graph:
        pf.need_cuda("--graph (CUDA graph capture)", device)
    if args.comm in ("nccl", "copy_engine"):
        pf.need_cuda(f"--comm {args.comm}", device)
    if cuda and args.comm in ("auto", "nccl", "copy_engine"):
        pf.need_module("cupy", pf.cupy_install(), f"--comm {args.comm} on CUDA (NCCL through CuPy)")
    if args.matmul in ("cublas", "codegen"):
        pf.need_cuda(f"--matmul {args.matmul}", device)
    if args.matmul == "codegen":
        if args.dtype not in ("float16", "bfloat16"):
            raise pf.UsageError(f"--matmul codegen runs float16/bfloat16 GEMMs, got --dtype {args.dtype}")
        pf.need_module("cupy", pf.cupy_install(), "--matmul codegen (NVRTC through CuPy)")
    if args.stages is not None and args.m % args.stages:
        raise pf.UsageError(f"--m {args.m} is not divisible by --stages {args.stages}")
    d = world.size
    if args.stages is not None and args.m % (args.stages * d):
        raise pf.WorldSizeError(f"--m {args.m} does not split into --stages {args.stages} x "
                                f"{d} ranks (M must be a multiple of stages x ranks)")
    if args.m % d:
        raise pf.WorldSizeError(f"--m {args.m} rows do not split over {d} ranks")
    if args.json is not None:
        pf.writable_output("--json", args.json)
        pf.refuse_results_on_cpu("--json", args.json, device)
    if args.trace:
        pf.writable_output("--trace", args.trace)
    if args.timeline:
        pf.need_module("matplotlib", "matplotlib", "--timeline")
        pf.writable_output("--timeline", args.timeline)
    pf.check_fits(f"M={args.m} N={args.n} K={args.k} {args.dtype}",
                  estimated_bytes(args, d), device, world)


def resolve_schedule(args) -> None:
    """Fill in what the user left to ``auto``: schedule, stages, streams, transport."""
    from mpi4py import MPI

    from runtime.schedule_tuning import choose

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        from runtime.device import require_cuda

        require_cuda(f"--device {device}")
    world = MPI.COMM_WORLD.Get_size()
    pick = choose(args.m, args.k, args.n, world, "cuda" if device.startswith("cuda") else "cpu",
                  args.dtype)
    if pick.transport == "copy_engine":
        import dataclasses

        from hostir.nn import copy_engine_available

        if not copy_engine_available(torch.device(device), world):
            # ranks on several nodes (or GPUs not all visible): peer writes cannot reach
            # them; NCCL crosses nodes, under the schedule it overlaps best
            pick = dataclasses.replace(pick, schedule="pipelined", transport="nccl")
    if args.schedule == "auto":
        args.schedule = pick.schedule
        if args.comm == "auto" and device.startswith("cuda"):
            args.comm = pick.transport
    if args.stages is None:
        args.stages = pick.stages if args.m % (pick.stages * world) == 0 else 1
    if args.streams is None:
        args.streams = pick.streams


def build(args, world_size: int, rank: int = 0):
    from lowering.patterns import allgather_matmul
    from lowering.pipeline import lower

    fd = allgather_matmul(args.m, args.k, args.n, args.stages, world_size, args.dtype)
    return lower(fd, world_size, args.streams, rank, schedule=args.schedule)


def random_inputs(args, session, seed: int):
    """Global A and B, identical on every rank (same seed), and this rank's shard of A."""
    from lowering.patterns import shard_rows

    g = torch.Generator(device=session.device).manual_seed(seed)
    dt = DTYPES[args.dtype]
    a = torch.randn(args.m, args.k, generator=g, device=session.device, dtype=torch.float32)
    b = torch.randn(args.k, args.n, generator=g, device=session.device, dtype=torch.float32)
    a, b = a.to(dt), b.to(dt)
    return a, b, shard_rows(a, args.stages, session.world_size, session.rank)


def relative_error(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    ref = a.double() @ b.double()
    got = out.reshape(ref.shape).double()
    if not torch.isfinite(got).all():
        return float("inf")
    return float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref))


def time_iterations(run, session, iters: int, warmup: int) -> list[float]:
    """Milliseconds per iteration: CUDA events on the user's stream, or the host clock."""
    for _ in range(warmup):
        run()
    times = []
    cuda = session.device.type == "cuda"
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def matmul_used(run_program, session) -> str:
    """What ran the GEMMs, as run: torch on the CPU; on CUDA cuBLAS, the generated kernel,
    or for ``auto`` what the timing picked per shape."""
    if session.device.type != "cuda":
        return "torch"
    choice = run_program.matmul
    if choice.mode != "auto":
        return choice.mode
    picked = sorted(set(choice.measured.values())) or ["cublas"]
    return "auto:" + "+".join(picked)


def main(args) -> int:
    from mpi4py import MPI

    from runtime.session import Session

    if args.bench:
        from hostir.jobs.overlap_bench import bench

        return bench(args)
    resolve_schedule(args)
    session = Session(args.device, args.comm)
    program = build(args, session.world_size, session.rank)
    dump("host_ir", print_program(program), session.rank)
    mode = args.matmul or ("cublas" if session.device.type == "cuda" else "auto")
    run_program = session.interpreter(program, matmul=mode)
    _, b, shard = random_inputs(args, session, args.seed)
    run_program.prepare(shard, b)  # lazy set-up (and --matmul auto's timing) outside the timing
    if args.graph:
        from runtime.graph import capture

        graphed = capture(run_program, shard, b)
        step = graphed
    else:
        step = lambda: run_program(shard, b)  # noqa: E731
    times = time_iterations(step, session, args.iters, args.warmup)
    if args.trace or args.timeline:
        _trace(args, session, step)
    status, ok, err = "not checked", True, None
    if args.check:
        # Fresh data, so leftovers of earlier iterations cannot pass for results.
        a, b_new, shard_new = random_inputs(args, session, args.seed + 1)
        if args.graph:  # the graph reads the tensors it was captured with
            shard.copy_(shard_new)
            b.copy_(b_new)
            (out,) = graphed()
        else:
            (out,) = run_program(shard_new, b_new)
        b = b_new
        err = relative_error(out, a, b)
        ok = err <= TOLERANCE[args.dtype]
        status = f"check {'PASS' if ok else 'FAIL'} (rel err {err:.2e}, tolerance {TOLERANCE[args.dtype]:.0e})"
    all_ok = MPI.COMM_WORLD.allreduce(int(ok), op=MPI.MIN)
    median = statistics.median(times)
    used = matmul_used(run_program, session)
    if session.rank == 0:
        print(
            f"pipelined_matmul M={args.m} N={args.n} K={args.k} dtype={args.dtype} "
            f"stages={args.stages} streams={args.streams} schedule={args.schedule} "
            f"matmul={used}"
            f"{' graph' if args.graph else ''} world={session.world_size} "
            f"device={session.device.type} comm={session.comm.name}: {median:.3f} ms/iter "
            f"(median of {len(times)}), {status}",
            flush=True,
        )
    elif not ok:
        print(f"rank {session.rank}: {status}", file=sys.stderr, flush=True)
    if args.json:
        from hostir.jobs.results import commit, write_on_rank0

        write_on_rank0(session.rank, lambda: _append_json(args.json, {
            "job": "pipelined_matmul", "shape": f"{args.m}x{args.n}x{args.k}",
            "m": args.m, "n": args.n, "k": args.k, "dtype": args.dtype,
            "schedule": args.schedule, "stages": args.stages, "streams": args.streams,
            "comm": session.comm.name, "matmul": used, "graph": args.graph,
            "world_size": session.world_size, "device": _device_name(session),
            "iters": len(times), "median_ms": median, "check": status,
            "rel_err": err, "ok": bool(all_ok), "commit": commit(),
        }))
    return 0 if all_ok else 1


def _trace(args, session, step) -> None:
    import os

    from mpi4py import MPI

    from runtime.trace import default_trace_base, draw, record

    # never a fixed name in a shared directory: a private (0700) per-user place by default
    base = args.trace or default_trace_base()
    root, ext = os.path.splitext(base)
    path = f"{root}.rank{session.rank}{ext or '.json'}"
    if session.device.type == "cuda":
        torch.cuda.synchronize()
    MPI.COMM_WORLD.Barrier()  # ranks start recording together
    record(step, 3, path)
    paths = MPI.COMM_WORLD.gather(path, root=0)
    if session.rank == 0 and args.timeline:
        draw({f"rank {r}": p for r, p in enumerate(paths)}, args.timeline,
             f"pipelined_matmul {args.m}x{args.n}x{args.k} {args.dtype} schedule={args.schedule} "
             f"stages={args.stages} comm={session.comm.name}")


def _device_name(session) -> str:
    return torch.cuda.get_device_name(session.device) if session.device.type == "cuda" else "cpu"


def _append_json(path: str, record: dict) -> None:
    """Append ``record`` to ``path`` as one JSON line, whole or not at all: one write to an
    O_APPEND descriptor, and on a failure (a full disk, a file size limit) the file is
    cut back to its old end; then an `OutputPathError` says why."""
    import json
    import os
    import stat

    from hostir.jobs.preflight import OutputPathError

    data = (json.dumps(record) + "\n").encode()
    try:
        # O_NONBLOCK: a fifo without a reader fails here instead of hanging
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
    except OSError as e:
        raise OutputPathError(f"--json {path}: cannot write: {e.strerror or e}") from None
    start = None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OutputPathError(f"--json {path}: exists and is not a regular file; "
                                  "nothing written")
        done = os.write(fd, data)
        start = os.lseek(fd, 0, os.SEEK_CUR) - done
        while done < len(data):  # a short write: the next one says why, or finishes
            done += os.write(fd, data[done:])
    except OSError as e:
        left = "nothing written"
        if start is not None:
            try:
                os.ftruncate(fd, start)  # no partial line left behind
            except OSError:
                left = f"a partial line may be left after byte {start}"
        raise OutputPathError(f"--json {path}: cannot append: {e.strerror or e}; "
                              f"{left}") from None
    finally:
        os.close(fd)
