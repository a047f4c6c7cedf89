"""Example training loop: a transformer MLP block with tensor and sequence parallelism.

    y = x + RowParallelLinear(gelu(ColumnParallelLinear(x)))

trained with SGD for ``--steps`` steps on synthetic data (a fixed random "teacher"), every
rank holding its tokens (sequence-sharded) and its slices of both weights. Rank 0 prints
the loss of each step (summed over all ranks' tokens).

    mpirun -np 2 python -m hostir.run train_mlp --device cpu --steps 30 --check
    torchrun --nproc-per-node 2 -m hostir.run train_mlp --comm torch
    launch_scripts/mpirun.sh 2 train_mlp --bench     # GPUs: ours vs plain collectives vs ideal

``--check`` compares every step's loss with the same loop in one process (plain
``torch.nn.Linear`` layers, CPU) and exits 1 on a mismatch. ``--tokens`` must divide by
``--stages`` x ranks and ``--hidden`` x ``--ffn-mult`` by the ranks.

``--bench`` (GPUs) times one forward+backward step (bf16; the figures in
``benchmarks/results`` are at ``--hidden 8192 --tokens 16384``): the hostir layers in
several variants (the default first: the ring schedules over the copy engine; then rings
at more stages, over NCCL, and the per-stage pipelines), the same layers written with
plain ``torch.distributed`` collectives (gather, then GEMM; GEMM, then reduce-scatter: no
overlap), and the step's six GEMMs alone (ideal). Before timing it checks the pipelined
and the ring layers against the plain ones (relative errors in the results). With
``--activation gelu_tanh`` every variant, the plain layers and the compute-only step use
the tanh GELU; the fused MLP (GELU in the GEMM epilogues, ``hostir.nn.fused_mlp``) is
listed first, as the default, and checked against the plain layers too. It prints its
results; ``--json FILE`` also writes them (``--json DIR/``:
``DIR/tp_mlp[_gelu_tanh]_<device>_x<N>.json``). On the CPU ``--bench`` is a smoke test of
the benchmark itself (over a gloo group), never written into benchmarks/results/.

    mpirun -np 2 python -m hostir.run train_mlp --bench --hidden 8192 --tokens 16384
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import time

import torch
import torch.nn.functional as F

from hostir.jobs.results import commit, results_path, write_json, write_on_rank0
from hostir.nn import ColumnParallelLinear, RowParallelLinear, fused_mlp, shard_sequence
from runtime.bootstrap import init_distributed, local_device
from runtime.device import DTYPES


def add_arguments(p) -> None:
    from hostir.jobs.preflight import (DTYPES as dtypes, at_least, device_name, positive_float,
                                       seed)

    p.add_argument("--hidden", type=at_least(1), default=256)
    p.add_argument("--ffn-mult", type=at_least(1), default=4, help="ffn width = hidden * this")
    p.add_argument("--tokens", type=at_least(1), default=512,
                   help="sequence x batch, over all ranks (a multiple of stages x ranks)")
    p.add_argument("--steps", type=at_least(1), default=30)
    p.add_argument("--lr", type=positive_float, default=0.1)
    p.add_argument("--stages", type=at_least(1), default=2, help="pipeline stages of every layer")
    p.add_argument("--streams", type=at_least(1), default=2)
    p.add_argument("--dtype", default=None, choices=dtypes,
                   help="default float32 (--bench: bfloat16, the only dtype it times)")
    p.add_argument("--device", type=device_name, default="auto",
                   help="auto (CUDA when present), cpu, cuda or cuda:N")
    p.add_argument("--comm", default="auto",
                   choices=["auto", "torch", "nccl", "mpi", "copy_engine"],
                   help="auto: the copy engine where it can run (CUDA, >= 2 ranks on one "
                        "node, torch symmetric memory), else the torch.distributed group if "
                        "initialized (torchrun), else NCCL (GPU) / MPI (CPU); torch: init a "
                        "group (from torchrun's env or MPI); copy_engine: SendRecv by peer "
                        "writes (no SMs), other collectives NCCL")
    p.add_argument("--schedule", default="auto", choices=["auto", "pipelined", "ring"],
                   help="pipelined: one collective a stage; ring: SendRecv beside the GEMMs "
                        "(AllGather+GEMM local rows first, GEMM+ReduceScatter local rows "
                        "last); auto: ring over the copy engine, else pipelined")
    p.add_argument("--activation", default="gelu", choices=["gelu", "gelu_tanh"],
                   help="gelu: exact (erf), unfused; gelu_tanh: the tanh approximation, fused "
                        "into the GEMM epilogues (hostir.nn.ParallelMLP: cuBLASLt GELU_AUX "
                        "forward, DGELU backward)")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--check", action="store_true",
                   help="compare every step's loss with the one-process reference; exit 1 "
                        "on a mismatch")
    p.add_argument("--bench", action="store_true", help="time a step: ours vs plain vs ideal")
    p.add_argument("--iters", type=at_least(1), default=10, help="with --bench: timed samples")
    p.add_argument("--warmup", type=at_least(0), default=3, help="with --bench: untimed steps")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="with --bench: write the results document to FILE (a directory: "
                        "tp_mlp[_gelu_tanh]_<device>_x<N>.json in it)")


def parse(argv) -> argparse.Namespace:
    """The job's flags, defaults filled in (for callers that skip ``hostir.run``)."""
    from hostir.jobs.preflight import JobParser

    p = JobParser()
    add_arguments(p)
    args = p.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.bench else "float32")
    return args


# Loss agreement with the one-process reference, by dtype (relative, every step).
TOLERANCE = {"float64": 1e-10, "float32": 1e-5, "bfloat16": 2e-2, "float16": 1e-2}


def estimated_bytes(args, world: int) -> int:
    """Peak bytes a rank allocates (a generous estimate): the full fp32 weights and batch
    every rank draws, its weight shards with their gradients, the gathered activations;
    with --check the one-process reference on rank 0; with --bench about ten variants'
    weights."""
    from hostir.jobs.preflight import dtype_bytes

    h, t, f, e = args.hidden, args.tokens, args.hidden * args.ffn_mult, dtype_bytes(args.dtype)
    total = 4 * (2 * h * f + 3 * t * h + h * h) + e * (4 * h * f // world + 2 * t * h
                                                        + 3 * t * f // world)
    if args.check:
        total += e * (4 * h * f + 3 * t * f + 3 * t * h)
    if args.bench:
        total += e * (16 * h * f // world + 4 * t * h + 4 * t * f // world)
    return total


def validate(args, world) -> None:
    """Refuse, before anything runs, what this job cannot do (see hostir.jobs.preflight)."""
    from hostir.jobs import preflight as pf

    device = pf.resolve_device(args.device)
    args.device = device
    if args.bench and args.dtype not in (None, "bfloat16"):
        raise pf.UsageError(f"--bench times bfloat16 only, got --dtype {args.dtype}")
    args.dtype = args.dtype or ("bfloat16" if args.bench else "float32")
    if args.bench and args.check:
        raise pf.UsageError("--check is for a training run (--bench checks itself against "
                            "the plain layers)")
    if args.json is not None and not args.bench:
        raise pf.UsageError("--json is for --bench (a training run prints its losses)")
    if args.comm in ("nccl", "copy_engine"):
        pf.need_cuda(f"--comm {args.comm}", device)
        pf.need_module("cupy", pf.cupy_install(), f"--comm {args.comm} (NCCL through CuPy)")
    if args.activation == "gelu_tanh" and device.startswith("cuda"):
        pf.need_module("cupy", pf.cupy_install(), "--activation gelu_tanh on CUDA (cuBLASLt "
                       "epilogues through CuPy)")
    d, f = world.size, args.hidden * args.ffn_mult
    stages = 1 if args.bench else args.stages  # the benchmark's own variants pick stages
    if args.tokens % stages:
        raise pf.UsageError(f"--tokens {args.tokens} is not divisible by --stages {stages}")
    if args.tokens % (stages * d):
        raise pf.WorldSizeError(f"--tokens {args.tokens} do not split into --stages {stages} x "
                                f"{d} ranks (tokens must be a multiple of stages x ranks)")
    if f % d:
        raise pf.WorldSizeError(f"the ffn width --hidden {args.hidden} x --ffn-mult "
                                f"{args.ffn_mult} = {f} does not split over {d} ranks")
    if args.json is not None:
        pf.writable_output("--json", args.json, directory_ok=True)
        pf.refuse_results_on_cpu("--json", args.json, device)
    pf.check_fits(f"--hidden {args.hidden} --ffn-mult {args.ffn_mult} --tokens {args.tokens} "
                  f"{args.dtype}", estimated_bytes(args, d), device, world)


# ----------------------------------------------------------------------------- set-up


def _setup(args):
    device = local_device(args.device)
    if args.comm == "torch" or args.bench or "TORCHELASTIC_RUN_ID" in os.environ:
        init_distributed(device)
    import torch.distributed as dist

    if dist.is_initialized() and args.comm in ("auto", "torch"):
        return dist.get_rank(), dist.get_world_size(), device
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size(), device


def _sum_over_ranks(value: float, args) -> float:
    import torch.distributed as dist

    if dist.is_initialized() and args.comm in ("auto", "torch"):
        t = torch.tensor([value], dtype=torch.float64)
        if dist.get_backend() == "nccl":
            t = t.cuda()
        dist.all_reduce(t)
        return float(t.item())
    from mpi4py import MPI

    return MPI.COMM_WORLD.allreduce(value)


# ----------------------------------------------------------------------------- the model


def initial_weights(args):
    """The full weights, torch.nn.Linear layout ([out, in]), identical on every rank."""
    g = torch.Generator().manual_seed(args.seed)
    h, f = args.hidden, args.hidden * args.ffn_mult
    w1 = torch.randn(f, h, generator=g) / h ** 0.5
    w2 = torch.randn(h, f, generator=g) / f ** 0.5
    return w1, w2


def batch(args, step: int):
    """Synthetic tokens and targets: the targets of a fixed random teacher MLP."""
    g = torch.Generator().manual_seed(args.seed + 1000 + step)
    t = torch.Generator().manual_seed(args.seed + 1)  # the teacher: the same every step
    h = args.hidden
    x = torch.randn(args.tokens, h, generator=g)
    teacher = torch.randn(h, h, generator=t) / h ** 0.5
    return x, x + 0.5 * torch.tanh(x @ teacher)


def gelu(x, activation: str = "gelu"):
    """The activation: ``gelu`` exact, ``gelu_tanh`` the tanh approximation (cuBLASLt's)."""
    return F.gelu(x, approximate="tanh" if activation == "gelu_tanh" else "none")


class MLPBlock(torch.nn.Module):
    """``x + down(gelu(up(x)))`` over sequence-sharded tokens ``[T/D, hidden]``. With
    ``fused`` (``activation="gelu_tanh"`` only) the GELU runs in the GEMM epilogues
    (``hostir.nn.fused_mlp``, the ``ParallelMLP`` computation)."""

    def __init__(self, up: ColumnParallelLinear, down: RowParallelLinear,
                 activation: str = "gelu", fused: bool = False):
        super().__init__()
        if fused and activation != "gelu_tanh":
            raise ValueError(f"MLPBlock: the fused GELU is gelu_tanh, got {activation!r}")
        self.up, self.down = up, down
        self.activation, self.fused = activation, fused

    @classmethod
    def from_weights(cls, w1, w2, dtype, device, activation="gelu", fused=False,
                     **kw) -> "MLPBlock":
        def linear(w):
            lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device=device, dtype=dtype)
            with torch.no_grad():
                lin.weight.copy_(w)
            return lin

        return cls(ColumnParallelLinear.from_linear(linear(w1), **kw),
                   RowParallelLinear.from_linear(linear(w2), **kw), activation, fused)

    def forward(self, x):
        if self.fused:
            return x + fused_mlp(x, self.up, self.down)
        return x + self.down(gelu(self.up(x), self.activation))


def _loss(y, target, args):
    """This rank's share of the mean squared error over all tokens."""
    dt = torch.promote_types(y.dtype, torch.float32)  # half types in float32, float64 kept
    return ((y.to(dt) - target.to(dt)) ** 2).sum() / (args.tokens * args.hidden)


def train(args) -> list[float]:
    """The tensor-parallel loop; returns the loss of every step (all ranks' tokens)."""
    rank, world, device = _setup(args)
    dt = DTYPES[args.dtype]
    w1, w2 = initial_weights(args)
    block = MLPBlock.from_weights(w1, w2, dt, device, args.activation,
                                  args.activation == "gelu_tanh", stages=args.stages,
                                  streams=args.streams, comm=args.comm,
                                  schedule=args.schedule)
    opt = torch.optim.SGD(block.parameters(), lr=args.lr)
    losses = []
    for step in range(args.steps):
        x, target = batch(args, step)
        x = shard_sequence(x, args.stages, world, rank).to(device, dt)
        target = shard_sequence(target, args.stages, world, rank).to(device, dt)
        loss = _loss(block(x), target, args)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(_sum_over_ranks(float(loss.detach()), args))
    return losses


def train_reference(args) -> list[float]:
    """The same loop in one process with torch.nn.Linear layers (CPU)."""
    dt = DTYPES[args.dtype]
    w1, w2 = initial_weights(args)
    up = torch.nn.Linear(args.hidden, w1.shape[0], bias=False, dtype=dt)
    down = torch.nn.Linear(w1.shape[0], args.hidden, bias=False, dtype=dt)
    with torch.no_grad():
        up.weight.copy_(w1)
        down.weight.copy_(w2)
    opt = torch.optim.SGD(list(up.parameters()) + list(down.parameters()), lr=args.lr)
    losses = []
    for step in range(args.steps):
        x, target = batch(args, step)
        x, target = x.to(dt), target.to(dt)
        loss = _loss(x + down(gelu(up(x), args.activation)), target, args)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


# ----------------------------------------------------------------------------- the benchmark


def _plain_all_gather(out, inp, group):
    import torch.distributed as dist

    # torch 2.13 renamed all_gather_into_tensor (deprecated there); 2.11 has the old name.
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, inp, group=group)


def _plain_reduce_scatter(out, inp, group):
    import torch.distributed as dist

    # the same rename: reduce_scatter_tensor → reduce_scatter_single
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, inp, group=group)


class _PlainColumn(torch.autograd.Function):
    """Column-parallel with plain collectives: gather, then GEMM (no overlap)."""

    @staticmethod
    def forward(ctx, x, w, group):
        import torch.distributed as dist

        full = torch.empty(x.shape[0] * dist.get_world_size(group), x.shape[1], dtype=x.dtype, device=x.device)
        _plain_all_gather(full, x, group)
        ctx.save_for_backward(full, w)
        ctx.group = group
        return full @ w

    @staticmethod
    def backward(ctx, dy):
        import torch.distributed as dist

        full, w = ctx.saved_tensors
        partial = dy @ w.t()
        dx = torch.empty(partial.shape[0] // dist.get_world_size(ctx.group), partial.shape[1],
                         dtype=dy.dtype, device=dy.device)
        _plain_reduce_scatter(dx, partial, ctx.group)
        return dx, full.t() @ dy, None


class _PlainRow(torch.autograd.Function):
    """Row-parallel with plain collectives: GEMM, then reduce-scatter (no overlap)."""

    @staticmethod
    def forward(ctx, x, w, group):
        import torch.distributed as dist

        partial = x @ w
        y = torch.empty(partial.shape[0] // dist.get_world_size(group), partial.shape[1],
                        dtype=x.dtype, device=x.device)
        _plain_reduce_scatter(y, partial, group)
        ctx.save_for_backward(x, w)
        ctx.group = group
        return y

    @staticmethod
    def backward(ctx, dy):
        import torch.distributed as dist

        x, w = ctx.saved_tensors
        full = torch.empty(dy.shape[0] * dist.get_world_size(ctx.group), dy.shape[1],
                           dtype=dy.dtype, device=dy.device)
        _plain_all_gather(full, dy.contiguous(), ctx.group)
        return full @ w.t(), x.t() @ full, None


def _side_by_side(steps: dict, iters: int, warmup: int) -> dict:
    """Median milliseconds of each step, samples interleaved in carryover-balanced rounds
    (`runtime.autotune.balanced_rounds`: each step right after every other equally often;
    CUDA events on the current stream, the host clock on the CPU)."""
    from runtime.timing import balanced_rounds

    for step in steps.values():
        for _ in range(warmup):
            step()
    times = {name: [] for name in steps}
    cuda = torch.cuda.is_available()
    for names in balanced_rounds(list(steps), iters):
        for name in names:
            step = steps[name]
            if cuda:
                torch.cuda.synchronize()
                start, end = (torch.cuda.Event(enable_timing=True),
                              torch.cuda.Event(enable_timing=True))
                start.record()
                step()
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                step()
                times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float(torch.linalg.norm(a - b) / torch.linalg.norm(b))


def bench(args) -> dict:
    import torch.distributed as dist

    rank, world, device = _setup(args)
    dt = torch.bfloat16
    h, f, t = args.hidden, args.hidden * args.ffn_mult, args.tokens
    fl, m = f // world, t // world
    g = torch.Generator(device=device).manual_seed(args.seed)
    w1 = (torch.randn(h, fl, generator=g, device=device) / h ** 0.5).to(dt)  # [in, out/D]
    w2 = (torch.randn(fl, h, generator=g, device=device) / f ** 0.5).to(dt)  # [in/D, out]
    x = torch.randn(m, h, generator=g, device=device).to(dt)
    dy = torch.randn(m, h, generator=g, device=device).to(dt)
    params = [torch.nn.Parameter(w1.clone()), torch.nn.Parameter(w2.clone())]

    act = args.activation

    def plain_step():
        xi = x.detach().requires_grad_()
        hid = gelu(_PlainColumn.apply(xi, params[0], None), act)
        y = xi + _PlainRow.apply(hid, params[1], None)
        y.backward(dy)
        return y, xi.grad

    def ours_block(stages, streams, comm, overlap, schedule="pipelined", fused=False):
        up = ColumnParallelLinear(h, f, stages=stages, streams=streams, comm=comm,
                                  device=device, dtype=dt, overlap_weight_grad=overlap,
                                  schedule=schedule)
        down = RowParallelLinear(f, h, stages=stages, streams=streams, comm=comm,
                                 device=device, dtype=dt, overlap_weight_grad=overlap,
                                 schedule=schedule)
        with torch.no_grad():
            up.weight.copy_(w1)
            down.weight.copy_(w2)
        return MLPBlock(up, down, act, fused)

    def ours_step(block):
        def step():
            for p in block.parameters():
                p.grad = None
            xi = x.detach().requires_grad_()
            y = block(xi)
            y.backward(dy)
            return y, xi.grad
        return step

    # Correctness first: with stages=1 ours and plain share the token layout. The
    # pipelined program over the same group, and the ring over the default transport
    # (the copy engine on GPUs; the group on the CPU).
    ring_comm = "copy_engine" if device.type == "cuda" else "torch"

    def check_against_plain(stages, streams, comm, schedule, fused=False):
        block = ours_block(stages, streams, comm, False, schedule, fused)
        y_o, dx_o = ours_step(block)()
        for p in params:
            p.grad = None
        y_p, dx_p = plain_step()
        return {"y": _rel(y_o, y_p), "dx": _rel(dx_o, dx_p),
                "dw1": _rel(block.up.weight.grad, params[0].grad),
                "dw2": _rel(block.down.weight.grad, params[1].grad)}

    check = check_against_plain(1, 1, "torch", "pipelined")
    check_ring = check_against_plain(1, 2, ring_comm, "ring")
    fuse = act == "gelu_tanh"
    check_fused = check_against_plain(1, 2, ring_comm, "ring", True) if fuse else None

    # Ideal: the step's six GEMMs alone, local shapes, back to back.
    xs = torch.randn(t, h, device=device, dtype=dt)
    hs = torch.randn(t, fl, device=device, dtype=dt)

    def gemms():
        xs @ w1; hs @ w2                   # forward: up, down (partial)
        xs @ w2.t(); hs.t() @ xs           # down backward: dx, dW
        hs @ w1.t(); xs.t() @ hs           # up backward: dx, dW

    dy_full = torch.randn(t, h, device=device, dtype=dt)

    def compute_step():
        """The step without communication: the same GEMMs, GELU (the same activation,
        unfused: torch's kernels) and residual, one rank's share of the work (what overlap
        can reach at best without fusing the GELU)."""
        for p in params:
            p.grad = None
        xi = xs.detach().requires_grad_()
        y = xi + gelu(xi @ params[0], act) @ params[1]
        y.backward(dy_full)

    # The first variant is the layers' default transport and schedule (ring over the copy
    # engine where it can run) at one stage; then the ring's alternatives; then the
    # per-stage pipelines measured before (fields: stages, streams, comm, overlap, schedule).
    # With gelu_tanh the fused MLP (GELU in the GEMM epilogues) comes first, as the
    # default, then its alternatives; the unfused variants follow (field 6: fused).
    configs = [(1, 2, "auto", True, "auto"), (2, 2, "copy_engine", True, "ring"),
               (1, 2, "copy_engine", False, "ring"), (1, 2, "nccl", True, "ring"),
               (4, 2, "torch", True, "pipelined"), (2, 2, "torch", True, "pipelined"),
               (8, 2, "torch", True, "pipelined"), (4, 2, "torch", False, "pipelined"),
               (4, 2, "nccl", True, "pipelined"), (4, 3, "nccl", True, "pipelined")]
    if device.type == "cpu":  # a smoke test of the benchmark itself, over the gloo group
        configs = [(1, 2, "auto", True, "auto"), (1, 2, "torch", True, "ring"),
                   (2, 2, "torch", False, "ring"), (4, 2, "torch", True, "pipelined")]
    configs = [c + (False,) for c in configs]
    if fuse:
        fused = [(1, 2, "auto", True, "auto", True), (2, 2, "copy_engine", True, "ring", True),
                 (1, 2, "nccl", True, "ring", True), (4, 2, "torch", True, "pipelined", True)]
        if device.type == "cpu":
            fused = [(1, 2, "auto", True, "auto", True), (2, 2, "torch", True, "ring", True)]
        configs = fused + configs
    from hostir.nn import _resolve

    # Every candidate is built and run once first (a variant that cannot run is
    # reported, not fatal), then all are timed side by side: interleaved samples, so
    # that clock and power drift over the run weigh on each alike.
    steps = {"ideal": gemms, "compute": compute_step, "plain": plain_step}
    variants, blocks = [], []
    for stages, streams, comm, overlap, schedule, fused_gelu in configs:
        dist.barrier()
        kind, resolved = _resolve(device, None, comm, schedule)
        v = {"stages": stages, "streams": streams, "comm": kind, "schedule": resolved,
             "overlap_weight_grad": overlap, "fused_gelu": fused_gelu}
        if (comm, schedule) != (kind, resolved):
            v["asked"] = f"comm={comm} schedule={schedule}"
        try:
            block = ours_block(stages, streams, comm, overlap, schedule, fused_gelu)
            step = ours_step(block)
            step()
            blocks.append(block)
            steps[f"variant{len(variants)}"] = step
        except Exception as e:  # noqa: BLE001 - a variant that cannot run is reported, not fatal
            v["error"] = f"{type(e).__name__}: {e}"
        variants.append(v)
    dist.barrier()
    times = _side_by_side(steps, args.iters, args.warmup)
    ideal, compute, plain = times["ideal"], times["compute"], times["plain"]
    for i, v in enumerate(variants):
        if f"variant{i}" in times:
            v["ms"] = times[f"variant{i}"]
    del blocks
    # Every rank reports its own figures; take the slowest rank's.
    def worst(v: float) -> float:
        tt = torch.tensor([v], device=device, dtype=torch.float64)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX)
        return float(tt.item())

    ideal, plain, compute = worst(ideal), worst(plain), worst(compute)
    for v in variants:
        if "ms" in v:
            v["ms"] = worst(v["ms"])
    timed = [v for v in variants if "ms" in v]
    best = min(timed, key=lambda v: v["ms"]) if timed else None
    default = timed[0] if timed and timed[0] is variants[0] else None
    unfused = [v for v in timed if not v["fused_gelu"]]
    return {"rank": rank, "world": world, "check": check, "check_ring": check_ring,
            "check_fused": check_fused, "activation": act,
            "best_unfused": min(unfused, key=lambda v: v["ms"]) if unfused else None,
            "ideal": ideal, "plain": plain,
            "compute": compute,
            "variants": variants, "best": best, "default": default}


def main(args) -> int:
    if args.bench:
        return _report_bench(args, bench(args))
    losses = train(args)
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else _mpi_rank()
    if rank == 0:
        for step, loss in enumerate(losses):
            print(f"step {step:3d} loss {loss:.6f}", flush=True)
    if not args.check:
        return 0
    # The one-process reference runs on rank 0 only; every rank learns the outcome.
    worst = 0.0
    if rank == 0:
        ref = train_reference(args)
        worst = max(relative_difference(a, b) for a, b in zip(losses, ref))
    worst = _sum_over_ranks(worst, args)
    ok = worst <= TOLERANCE[args.dtype]  # False for inf and NaN
    if rank == 0:
        print(f"train_mlp check {'PASS' if ok else 'FAIL'} (largest relative difference of a "
              f"step's loss from the one-process reference {worst:.2e}, tolerance "
              f"{TOLERANCE[args.dtype]:.0e})", flush=True)
    return 0 if ok else 1


def relative_difference(a: float, b: float) -> float:
    """|a - b| / |b| of two losses; inf when either is not finite (NaN or inf never passes
    a check). train_transformer's check uses it too."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(b), 1e-30)


def _report_bench(args, r: dict) -> int:
    """Rank 0 prints the results (and writes them with --json)."""
    if r["rank"] != 0:
        if args.json:
            write_on_rank0(r["rank"], None)  # rank 0's outcome
        return 0
    on_cuda = args.device.startswith("cuda") or (args.device == "auto"
                                                 and torch.cuda.is_available())
    gpu = torch.cuda.get_device_name() if on_cuda else "cpu"
    ours = r["best"]["ms"] if r["best"] else None
    result = {"hidden": args.hidden, "tokens": args.tokens, "ffn": args.hidden * args.ffn_mult,
              "world": r["world"], "dtype": "bfloat16", "activation": r["activation"],
              "matmul": "cublas" if on_cuda else "torch",
              "ours_ms": ours, "plain_ms": r["plain"], "ideal_ms": r["ideal"],
              "compute_no_comm_ms": r["compute"],
              "ours_config": r["best"], "ours_default_ms": (r["default"] or {}).get("ms"),
              "variants": r["variants"], "check_vs_plain_rel_err": r["check"],
              "check_ring_vs_plain_rel_err": r["check_ring"],
              "check_fused_vs_plain_rel_err": r["check_fused"],
              "ours_unfused_best_ms": (r["best_unfused"] or {}).get("ms")}
    doc = {"device": gpu, "world_size": r["world"],
           "date": datetime.date.today().isoformat(), "commit": commit(),
           "note": "forward+backward of x + down(gelu(up(x))) (activation: gelu exact "
                   "or gelu_tanh; plain and compute use the same one, unfused); ours_ms "
                   "is the best variant listed (fused_gelu: GELU in the GEMM epilogues; "
                   "each variant records its stages, streams, comm and schedule); "
                   "ideal_ms is the step's six GEMMs alone; medians, slowest rank",
           "results": [result]}
    print(json.dumps(doc, indent=2), flush=True)
    path = None
    if args.json:
        bench_name = "tp_mlp" + ("_gelu_tanh" if args.activation == "gelu_tanh" else "")
        path = results_path(args.json, bench_name, gpu, r["world"])
        write_on_rank0(0, lambda: write_json(path, doc))
    if ours:
        print(f"tp_mlp hidden={args.hidden} tokens={args.tokens} {args.activation} "
              f"device={gpu} world={r['world']}: ours {ours:.2f} ms "
              f"({ours / r['ideal']:.3f}x ideal), plain {r['plain']:.2f} ms "
              f"({r['plain'] / r['ideal']:.3f}x), ideal {r['ideal']:.2f} ms"
              + (f" -> {path}" if path else ""), flush=True)
    return 0


def _mpi_rank() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()
