"""The pipelined AllGather+GEMM with a fault on purpose: what the fault tests run.

    mpirun -np 2 python -m hostir.run fault_injection --fault divergent_shape --fault-rank 1
    HOSTIR_INJECT_FAULT=1:6:raise mpirun -np 2 python -m hostir.run fault_injection

``--fault`` picks a fault in the inputs (``divergent_shape``: the rank lowers the program
for twice as many rows as the others; ``bad_dtype``: it passes B in float64); faults inside
the program come from ``HOSTIR_INJECT_FAULT=rank:statement:kind`` (``runtime.fault_injection``).
A non-dividing shape needs no flag: ``--m 10 --stages 4``. Every rank prints
``rank R: ok`` when all iterations ran; a fault must instead end every rank non-zero.
"""

from __future__ import annotations

import torch

FAULTS = ("none", "divergent_shape", "bad_dtype")


def add_arguments(p) -> None:
    from hostir.jobs.preflight import DTYPES, at_least, device_name

    p.add_argument("--fault", default="none", choices=FAULTS)
    p.add_argument("--fault-rank", type=at_least(0), default=1, help="the rank that misbehaves")
    p.add_argument("--m", type=at_least(1), default=64)
    p.add_argument("--n", type=at_least(1), default=16)
    p.add_argument("--k", type=at_least(1), default=32)
    p.add_argument("--stages", type=at_least(1), default=2)
    p.add_argument("--streams", type=at_least(1), default=2)
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--device", type=device_name, default="auto")
    p.add_argument("--comm", default="auto",
                   choices=["auto", "nccl", "torch", "mpi", "copy_engine"])
    p.add_argument("--schedule", default="pipelined", choices=["pipelined", "ring"],
                   help="ring: SendRecv beside the GEMMs (with --comm copy_engine: peer "
                        "writes and stream-memory barriers, which only the watchdog bounds)")
    p.add_argument("--iters", type=at_least(1), default=3)


def estimated_bytes(args, world) -> int:
    """Peak bytes this rank allocates: A and B drawn in float32 and converted, the shard,
    the gathered A and C, then the float64 reference (A, B, C and the difference). The
    culprit of divergent_shape has twice the rows; that of bad_dtype a float64 B too."""
    from hostir.jobs.preflight import dtype_bytes

    culprit = args.fault != "none" and world.rank == args.fault_rank
    m = args.m * 2 if args.fault == "divergent_shape" and culprit else args.m
    n, k, e = args.n, args.k, dtype_bytes(args.dtype)
    total = 4 * (m * k + k * n) + e * (m * k + k * n + m * k // world.size + m * k + m * n)
    total += 8 * (m * k + k * n + 3 * m * n)
    if args.fault == "bad_dtype" and culprit:
        total += 8 * k * n
    return total


def validate(args, world) -> None:
    """The flags and whether the problem fits in memory: shapes that do not divide are
    left to the lowering on purpose (the fault tests check its refusal)."""
    from hostir.jobs import preflight as pf

    args.device = pf.resolve_device(args.device)
    if args.fault != "none" and args.fault_rank >= world.size:
        raise pf.WorldSizeError(f"--fault-rank {args.fault_rank}: the job has {world.size} "
                                "ranks")
    pf.check_fits(f"--m {args.m} --n {args.n} --k {args.k} {args.dtype}",
                  estimated_bytes(args, world), args.device, world)


def main(args) -> int:
    from lowering.patterns import allgather_matmul, shard_rows
    from lowering.pipeline import lower
    from runtime.device import DTYPES
    from runtime.session import Session

    session = Session(args.device, args.comm, auto_graph=False)  # faults act on statements
    rank, world = session.rank, session.world_size
    culprit = rank == args.fault_rank
    m = args.m * 2 if args.fault == "divergent_shape" and culprit else args.m
    program = lower(allgather_matmul(m, args.k, args.n, args.stages, world, args.dtype),
                    world, args.streams, rank, schedule=args.schedule)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, args.k, generator=g).to(DTYPES[args.dtype])
    b = torch.randn(args.k, args.n, generator=g).to(DTYPES[args.dtype])
    shard = shard_rows(a, args.stages, world, rank).to(session.device)
    b = (b.double() if args.fault == "bad_dtype" and culprit else b).to(session.device)
    run = session.interpreter(program)
    for _ in range(args.iters):
        (out,) = run(shard, b)
    if session.device.type == "cuda":
        torch.cuda.synchronize()
    watchdog = getattr(session.comm, "watchdog", None)
    if watchdog is not None:
        watchdog.raise_if_failed()  # results of an aborted communicator are garbage
    ref = (a.double() @ b.cpu().double()).reshape(out.shape)
    err = float(torch.linalg.norm(out.cpu().double() - ref) / torch.linalg.norm(ref))
    print(f"rank {rank}: ok (rel err {err:.1e})", flush=True)
    return 0
