"""Train a stack of tensor- and sequence-parallel transformer blocks (Llama style:
``hostir.nn.ParallelTransformerBlock``, made by ``hostir.nn.parallelize`` from plain
``LlamaBlock`` modules) with AdamW on synthetic data. Rank 0 prints each step's loss (mean
squared error over all tokens).

    mpirun -np 2 python -m hostir.run train_transformer --check        # CPU ranks, < 1 min
    torchrun --nproc-per-node 2 -m hostir.run train_transformer
    python -m hostir.run train_transformer --bench --hidden 4096 --heads 32 --kv-heads 8 \\
        --tokens 4096 --layers 2 --dtype bfloat16 --json benchmarks/results/transformer_layer_nvidia-h100.json

``--check`` trains the same blocks (same seed) unsharded in one process beside the parallel
ones, compares every step's loss and every parameter's gradient (this rank's shard against
the reference's), prints PASS, or FAIL and exits 1.

``--bench`` (CUDA) times a training step (forward, backward, AdamW) of ours side by side
with the same model in torch eager and under ``torch.compile`` (each rank runs the whole
model on its GPU), and with torch's own tensor parallelism (``torch.distributed.tensor.
parallel``, sequence parallel) when the world size is above 1, eager (``torch_tp``: its
collectives not overlapped) and compiled a block at a time as async-TP
(``torch_async_tp``: Inductor's ``_micro_pipeline_tp``; a variant that fails to run is
listed under ``skipped``): medians after warm-up, interleaved, the slowest rank's;
tokens/s for each; and ours' first step on the new model (timed after the eager model's
first step has paid torch's own start-up) over a steady one: run ``python -m hostir.run warmup train_transformer ...`` first to measure
it on a warm kernel cache; and, from a profiler trace, ours' and eager's GPU busy and idle
time a step and their top kernels. ``--json FILE`` writes the rows.

On one GPU the bench also times ``ours_graphed``: the same blocks with each block's
forward and backward replayed from CUDA graphs (``hostir.nn.graphs.capture_blocks``), the
optimizer and loss eager as before.

On several GPUs the row also holds ``ours_comm``: from a profiler trace of two of ours'
steps on rank 0, the milliseconds a step's collectives ran, how much of that some kernel
of computation ran beside them (hidden) and the rest (exposed).

``--graph`` (CUDA) captures our whole training step in a CUDA graph and replays it.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import math
import statistics
import time

import torch

from hostir.errors import HostIrError
from hostir.jobs.train_mlp import relative_difference
from hostir.nn import LlamaBlock, _resolve, parallelize, shard_sequence
from hostir.nn.llama import shard_state_dict
from hostir.nn.transformer import check_block_shape
from lowering.patterns import check_row_split
from runtime.bootstrap import init_distributed, local_device

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16}
# Relative errors --check accepts: fp32 differs from the reference in summation order only;
# fp64 too, but for the norms' float32 statistics and the loss's float32 sum; half
# precision rounds every intermediate.
TOLERANCE = {"float32": 1e-4, "float64": 1e-6, "bfloat16": 5e-2, "float16": 2e-2}


def add_arguments(p) -> None:
    from hostir.jobs.preflight import at_least, device_name, positive_float, seed

    p.add_argument("--steps", type=at_least(1), default=10)
    p.add_argument("--layers", type=at_least(1), default=2)
    p.add_argument("--hidden", type=at_least(1), default=256)
    p.add_argument("--heads", type=at_least(1), default=8)
    p.add_argument("--kv-heads", type=at_least(1), default=2)
    p.add_argument("--ffn", type=at_least(1), default=None,
                   help="MLP width; default Llama's 8/3 hidden rounded up to 256")
    p.add_argument("--tokens", type=at_least(1), default=128, help="one sequence, over all ranks")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--lr", type=positive_float, default=1e-3)
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--stages", type=at_least(1), default=1, help="pipeline stages of every linear")
    p.add_argument("--comm", default="auto", choices=["auto", "torch", "nccl", "mpi", "copy_engine"])
    p.add_argument("--schedule", default="auto", choices=["auto", "pipelined", "ring"])
    p.add_argument("--device", type=device_name, default="auto",
                   help="auto (CUDA when present), cpu, cuda or cuda:N")
    p.add_argument("--check", action="store_true", help="compare with an unsharded reference")
    p.add_argument("--graph", action="store_true", help="CUDA: replay the step as a CUDA graph")
    p.add_argument("--bench", action="store_true", help="CUDA: ours vs eager vs torch.compile")
    p.add_argument("--iters", type=at_least(1), default=20, help="--bench: timed steps per variant")
    p.add_argument("--warmup", type=at_least(0), default=5, help="--bench: untimed steps per variant")
    p.add_argument("--json", default=None, metavar="FILE", help="--bench: write the rows here")


def parse(argv) -> argparse.Namespace:
    """The job's flags (for callers that skip ``hostir.run``); errors are a UsageError."""
    from hostir.jobs.preflight import JobParser

    p = JobParser()
    add_arguments(p)
    return p.parse_args(argv)


def ffn_width(args) -> int:
    return args.ffn if args.ffn else -(-8 * args.hidden // 3 // 256) * 256


# ----------------------------------------------------------------------------- checks


def estimated_bytes(args, world: int) -> int:
    """Peak bytes a rank allocates (a generous estimate): the full model every rank builds
    (and one block's copy while it is sharded), this rank's shards with their gradients
    and AdamW's two moments, the activations a step keeps for its backward; with --check
    the reference's gradients, moments and activations too; with --bench the eager and the
    compiled copy, each with its own, and on several ranks torch's two parallel copies."""
    from hostir.jobs.preflight import dtype_bytes

    e, h, t, layers = dtype_bytes(args.dtype), args.hidden, args.tokens, args.layers
    qkv = (args.heads + 2 * args.kv_heads) * (h // args.heads)
    f = ffn_width(args)
    block = h * qkv + h * h + 3 * h * f + 2 * h
    full = layers * block
    # saved for the backward: gathered inputs (qkv, gate-up), their outputs, attention,
    # SwiGLU, the norms' rows and the residual stream
    acts_full = layers * t * (8 * h + qkv + h + 3 * f)
    acts = layers * t * (2 * h + (qkv + h + 3 * f + 6 * h) / world)
    total = full + block + 4 * full / world + acts
    if args.check:
        total += 3 * full + acts_full
    if args.bench:
        total += 2 * (4 * full + acts_full)
        if world > 1:  # torch's tensor parallelism, eager and async-TP: sharded like ours
            total += 2 * (4 * full / world + acts)
    return int(e * total)


def validate(args, world) -> None:
    """Every refusal before any collective, alike on every rank (see hostir.jobs.preflight).
    ``world``: the launch's `preflight.World`, or a plain world size."""
    from hostir.jobs import preflight as pf

    size = getattr(world, "size", world)
    for flag in ("steps", "layers", "tokens", "iters", "stages"):
        if getattr(args, flag) < 1:
            raise pf.UsageError(f"--{flag}={getattr(args, flag)}: expected at least 1")
    if args.warmup < 0:
        raise pf.UsageError(f"--warmup={args.warmup}: expected 0 or more")
    device = pf.resolve_device(args.device)
    for flag in ("bench", "graph"):
        if getattr(args, flag):
            pf.need_cuda(f"--{flag}", device)
    if args.json is not None and not args.bench:
        raise pf.UsageError(f"--json {args.json}: only --bench writes results; add --bench")
    if args.json is not None:
        pf.writable_output("--json", args.json)
        pf.refuse_results_on_cpu("--json", args.json, device)
    # the shape on its own first (a usage error), then its split over the ranks, then memory
    for ranks, refusal in ((1, pf.UsageError), (size, pf.WorldSizeError)):
        try:
            check_block_shape(args.hidden, args.heads, args.kv_heads, ffn_width(args), ranks)
            check_row_split("tokens", args.tokens, args.stages, ranks)
        except HostIrError as e:
            raise refusal(str(e)) from e
    pf.check_fits(f"--layers {args.layers} --hidden {args.hidden} --tokens {args.tokens} "
                  f"{args.dtype}", estimated_bytes(args, size), device,
                  world if isinstance(world, pf.World) else pf.World(size=size))


# ----------------------------------------------------------------------------- set-up


def reference_model(args, device) -> torch.nn.Sequential:
    """The unsharded model: ``--layers`` LlamaBlocks from ``--seed`` (torch's default
    initialization; the norm weights drawn too, so their gradients are not symmetric)."""
    torch.manual_seed(args.seed)
    blocks = [LlamaBlock(args.hidden, args.heads, args.kv_heads, ffn_width(args))
              for _ in range(args.layers)]
    with torch.no_grad():
        for b in blocks:
            for norm in (b.input_layernorm, b.post_attention_layernorm):
                norm.weight.uniform_(0.5, 1.5)
    return torch.nn.Sequential(*blocks).to(device, DTYPES[args.dtype])


def batch(args, step: int, device):
    """One sequence of ``--tokens`` input activations and its regression target."""
    g = torch.Generator().manual_seed(args.seed + 1000 + step)
    x = torch.randn(args.tokens, args.hidden, generator=g)
    target = torch.randn(args.tokens, args.hidden, generator=g)
    dt = DTYPES[args.dtype]
    return x.to(device, dt), target.to(device, dt)


def mse_share(y, target, tokens: int) -> torch.Tensor:
    """This rank's share of the mean squared error over all ``tokens`` tokens."""
    return ((y.float() - target.float()) ** 2).sum() / (tokens * y.shape[-1])


# ----------------------------------------------------------------------------- training


class Trainer:
    """Our parallel model, its optimizer and step; ``--graph`` replays the step captured."""

    def __init__(self, args, ref: torch.nn.Sequential, rank: int, world: int):
        self.args, self.rank, self.world = args, rank, world
        kw = dict(stages=args.stages, comm=args.comm, schedule=args.schedule)
        self.model = torch.nn.Sequential(*[parallelize(copy.deepcopy(b), **kw) for b in ref])
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr,
                                     capturable=args.graph)
        self.graph = None

    def shard(self, t):
        return shard_sequence(t, self.args.stages, self.world, self.rank)

    def _step(self, x, target):
        self.opt.zero_grad(set_to_none=False)
        loss = mse_share(self.model(x), target, self.args.tokens)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def step(self, x, target) -> torch.Tensor:
        """One training step on this rank's tokens; returns its share of the loss."""
        x, target = self.shard(x), self.shard(target)
        if not self.args.graph:
            return self._step(x, target)
        if self.graph is None:
            self._capture(x, target)
        self.static_x.copy_(x)
        self.static_target.copy_(target)
        self.graph.replay()
        return self.static_loss.clone()

    def _capture(self, x, target) -> None:
        """Warm up on a side stream (lazy set-up: plans, communicators, optimizer state),
        capture one step, then put the weights and the optimizer state back as they were
        before the warm-up (in place: the graph holds their addresses), so the first
        replay is the first step, as without ``--graph``."""
        self.static_x, self.static_target = x.clone(), target.clone()
        before = [p.detach().clone() for p in self.model.parameters()]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step(self.static_x, self.static_target)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: a watchdog thread may query events while this thread captures.
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.static_loss = self._step(self.static_x, self.static_target)
        with torch.no_grad():
            for p, saved in zip(self.model.parameters(), before):
                p.copy_(saved)
            for state in self.opt.state.values():  # AdamW's state starts at zero
                for value in state.values():
                    if torch.is_tensor(value):
                        value.zero_()


def _sum_over_ranks(t: torch.Tensor, op=None) -> float:
    import torch.distributed as dist

    t = t.detach().double().reshape(1)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return float(t.item())


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error; inf where a value is NaN or inf (it never passes a check, and a
    NaN could be dropped by max() and by a MAX reduction)."""
    a, b = a.detach().double(), b.detach().double()
    err = float(torch.linalg.norm(a - b) / torch.linalg.norm(b).clamp_min(1e-30))
    return err if math.isfinite(err) else math.inf


def gradient_errors(ours: torch.nn.Sequential, ref: torch.nn.Sequential) -> dict:
    """Relative error of each of our gradients (this rank's shards) against the
    reference's gradients sharded the same way."""
    errors = {}
    for i, (block, full) in enumerate(zip(ours, ref)):
        want = shard_state_dict({n: p.grad for n, p in full.named_parameters()}, block)
        for name, p in block.named_parameters():
            errors[f"{i}.{name}"] = _rel(p.grad, want[name])
    return errors


def train(args, check: bool = False) -> dict:
    """The parallel loop (and with ``check`` the reference beside it); every step's loss
    over all ranks, and with ``check`` the reference's losses and the worst gradient error
    over all ranks and parameters at each step."""
    rank, world, device = setup(args)
    ref = reference_model(args, device)
    trainer = Trainer(args, ref, rank, world)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=args.lr) if check else None
    out = {"losses": [], "ref_losses": [], "grad_errors": [], "worst_param": []}
    for step in range(args.steps):
        x, target = batch(args, step, device)
        out["losses"].append(_sum_over_ranks(trainer.step(x, target)))
        if not check:
            continue
        ref_opt.zero_grad(set_to_none=True)
        loss = mse_share(ref(x), target, args.tokens)
        loss.backward()
        errors = gradient_errors(trainer.model, ref)
        ref_opt.step()
        out["ref_losses"].append(float(loss.detach()))
        import torch.distributed as dist

        worst = max(errors, key=errors.get)
        out["grad_errors"].append(_sum_over_ranks(torch.tensor(errors[worst]), dist.ReduceOp.MAX))
        out["worst_param"].append(worst)
    out["world"] = world
    out["rank"] = rank
    return out


def setup(args):
    import torch.distributed as dist

    device = local_device(args.device)
    init_distributed(device)
    return dist.get_rank(), dist.get_world_size(), device


# ----------------------------------------------------------------------------- main


def main(args) -> int:
    from hostir.jobs.preflight import JobError
    from runtime.watchdog import world_size

    try:
        validate(args, world_size())  # hostir.run validated already; a direct call has not
    except (HostIrError, JobError) as e:
        e.on_every_rank = True  # every rank refuses alike: no rank waits in a collective
        raise
    if args.bench:
        return bench(args)
    out = train(args, check=args.check)
    tol = TOLERANCE[args.dtype]
    failures = []
    for step, loss in enumerate(out["losses"]):
        line = f"step {step:3d} loss {loss:.6f}"
        if args.check:
            ref, err = out["ref_losses"][step], out["grad_errors"][step]
            loss_err = relative_difference(loss, ref)
            line += f"  reference {ref:.6f}  worst gradient rel. error {err:.2e}"
            if not (loss_err <= tol and err <= tol):  # NaN fails too
                failures.append(f"step {step}: loss rel. error {loss_err:.2e}, gradient "
                                f"{err:.2e} (tolerance {tol:g})")
        if out["rank"] == 0:
            print(line, flush=True)
    if args.check:
        if out["rank"] == 0:
            print("PASS" if not failures else "FAIL: " + "; ".join(failures), flush=True)
        return 1 if failures else 0
    return 0


# ----------------------------------------------------------------------------- the benchmark


def side_by_side(steps: dict, iters: int, warmup: int) -> dict:
    """Median milliseconds of each step (CUDA events), after ``warmup`` calls each, the
    samples interleaved in carryover-balanced rounds (``runtime.autotune.balanced_rounds``)
    so that clock and power drift weigh on every step alike."""
    from runtime.autotune import balanced_rounds

    for step in steps.values():
        for _ in range(warmup):
            step()
    times = {name: [] for name in steps}
    for names in balanced_rounds(list(steps), iters):
        for name in names:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            steps[name]()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    return {name: statistics.median(ts) for name, ts in times.items()}


# Steps a bench row's profiler trace records (after two warm-up steps).
TRACED_STEPS = 2


def traced_events(step, rank: int, tag: str, iters: int = TRACED_STEPS) -> list:
    """The GPU events (`runtime.trace.device_events`) of ``iters`` steps of ``step`` on
    this rank, from a profiler trace written under ``tag`` and removed once read: one
    trace gives both a step's communication overlap (`runtime.trace.overlap`) and where
    its GPU time went (`runtime.trace.breakdown`)."""
    import os

    from runtime import trace

    path = f"{trace.default_trace_base()[:-5]}.{tag}.rank{rank}.json"
    trace.record(step, iters, path, warmup=2)
    try:
        return trace.device_events(path)
    finally:
        os.unlink(path)


def host_ms(steps: dict, calls: int = 3) -> dict:
    """Host milliseconds to issue one step of each (``calls`` steps queued back to back
    after a synchronize, divided; a few steps' kernels fit in the launch queue, so the
    host does not wait on the GPU): what a step costs the CPU, beside its GPU time."""
    out = {}
    for name, step in steps.items():
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            step()
        out[name] = (time.perf_counter() - start) * 1e3 / calls
        torch.cuda.synchronize()
    return out


def _training_step(model, opt, x, target, tokens: int):
    def step():
        opt.zero_grad(set_to_none=False)
        loss = mse_share(model(x), target, tokens)
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def bench_steps(args, rank: int, world: int, device) -> dict:
    """The training steps to time: ours, eager, torch.compile (the whole unsharded model
    on this rank's GPU) and, on several ranks, torch's tensor parallelism."""
    from hostir.nn.llama import torch_parallelize

    ref = reference_model(args, device)
    x, target = batch(args, 0, device)
    trainer = Trainer(args, ref, rank, world)
    xs, ts = trainer.shard(x), trainer.shard(target)
    steps = {"ours": (lambda: trainer.step(x, target)) if args.graph
             else (lambda: trainer._step(xs, ts))}
    if world == 1 and not args.graph:  # ours again, each block's passes from CUDA graphs
        from hostir.nn.graphs import capture_blocks

        graphed = Trainer(args, ref, rank, world)
        graphed.model = capture_blocks(graphed.model, xs)
        steps["ours_graphed"] = lambda: graphed._step(xs, ts)
    for name, model in (("eager", copy.deepcopy(ref)), ("compile", copy.deepcopy(ref))):
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        run = torch.compile(model) if name == "compile" else model
        steps[name] = _training_step(run, opt, x[None], target[None], args.tokens)
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard

        mesh = init_device_mesh("cuda", (world,))
        model = torch_parallelize(copy.deepcopy(ref), mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        local = lambda t: DTensor.from_local(t[None].chunk(world, 1)[rank], mesh, [Shard(1)])  # noqa: E731
        steps["torch_tp"] = _training_step(model, opt, local(x), local(target), args.tokens)
        # async-TP: Inductor's micro-pipeline pass rewrites the same model's all-gather +
        # matmul and matmul + reduce-scatter pairs into fused, overlapped symmetric-memory
        # ops. The flag is read when a model compiles; the unsharded "compile" model has no
        # collectives for the pass to rewrite.
        import torch._inductor.config as inductor_config

        inductor_config._micro_pipeline_tp = True
        model = torch_parallelize(copy.deepcopy(ref), mesh)
        for block in model:  # compiled a block at a time, as torchtitan does
            block.compile(dynamic=False)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        steps["torch_async_tp"] = _training_step(model, opt, local(x), local(target), args.tokens)
    return steps


def bench(args) -> int:
    """Time the steps side by side; rank 0 prints a line per variant and writes the row."""
    from hostir.jobs.results import write_on_rank0

    rank, world, device = setup(args)
    steps = bench_steps(args, rank, world, device)
    # Every step's first call is also its first warm-up call. The eager model goes first:
    # it pays torch's own first-use costs (cuBLAS and cuDNN handles, the allocator's
    # growth), so that ours' first step, timed, shows what hostir adds on a new model
    # (loading its kernels from the cache, plans, programs) over a steady step.
    first = {"eager": steps["eager"]()}
    torch.cuda.synchronize()
    start = time.perf_counter()
    first["ours"] = steps["ours"]()
    torch.cuda.synchronize()
    ours_first_ms = (time.perf_counter() - start) * 1e3
    skipped = {}
    for name in [n for n in steps if n not in first]:
        try:
            first[name] = steps[name]()
        except Exception as exc:  # torch's variants only: a comparison that cannot run
            if not name.startswith("torch_"):
                raise
            skipped[name] = failure_text(exc)
            del steps[name]
            if rank == 0:
                print(f"train_transformer bench {name}: skipped ({skipped[name]})", flush=True)
    losses = {"ours": _sum_over_ranks(first["ours"]), "eager": float(first["eager"])}
    times = side_by_side(steps, args.iters, max(args.warmup - 1, 0))
    host = host_ms(steps)
    import torch.distributed as dist

    from runtime import trace

    # one trace of each: ours' communication overlap (several ranks) and both profiles
    events = {name: traced_events(steps[name], rank, name) for name in ("ours", "eager")}
    comm = trace.overlap(events["ours"], steps=TRACED_STEPS) if world > 1 else None
    profile = {name: trace.breakdown(ev, steps=TRACED_STEPS) for name, ev in events.items()}
    times = {n: _sum_over_ranks(torch.tensor(ms), dist.ReduceOp.MAX) for n, ms in times.items()}
    config = {"layers": args.layers, "hidden": args.hidden, "heads": args.heads,
              "kv_heads": args.kv_heads, "ffn": ffn_width(args), "tokens": args.tokens,
              "dtype": args.dtype, "stages": args.stages, "graph": args.graph,
              "comm_schedule": list(_resolve(device, None, args.comm, args.schedule))}
    row = {"config": config, **{f"{n}_ms": ms for n, ms in times.items()},
           "tokens_per_s": {n: args.tokens / (ms / 1e3) for n, ms in times.items()},
           "host_ms": host,
           "gpu_profile": profile,
           **({"ours_comm": comm} if comm is not None else {}),
           **({"skipped": skipped} if skipped else {}),
           **{f"speedup_vs_{n}": times[n] / times["ours"] for n in times
              if not n.startswith("ours")},
           **({"graphed_speedup_vs_eager": times["eager"] / times["ours_graphed"],
               "graphed_speedup_vs_compile": times["compile"] / times["ours_graphed"]}
              if "ours_graphed" in times else {}),
           "ours_first_step_ms": _sum_over_ranks(torch.tensor(ours_first_ms), dist.ReduceOp.MAX),
           "first_loss_rel_err_vs_eager": abs(losses["ours"] - losses["eager"]) / losses["eager"]}
    row["first_step_over_steady"] = row["ours_first_step_ms"] / times["ours"]
    if rank == 0:
        for name, ms in times.items():
            print(f"train_transformer bench {name}: {ms:.3f} ms/step "
                  f"({row['tokens_per_s'][name]:.0f} tokens/s, host {host[name]:.2f} ms)",
                  flush=True)
    if args.json:
        write_on_rank0(rank, lambda: write_rows(args.json, [row], world))
        if rank == 0:
            print(f"-> {args.json}", flush=True)
    return 0


def failure_text(exc: BaseException) -> str:
    """One line for a bench variant that failed: the exception and, where it was raised
    from another, the first one of the chain (what torch's compile errors wrap)."""
    root = exc
    while root.__cause__ is not None or root.__context__ is not None:
        root = root.__cause__ or root.__context__
    return "; ".join(f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
                     for e in dict.fromkeys((exc, root)))


def write_rows(path: str, rows: list, world: int) -> None:
    """The bench's JSON: the rows and where they came from (whole, or an OutputPathError)."""
    from pathlib import Path

    from hostir.jobs.results import commit, write_json

    doc = {"device": torch.cuda.get_device_name(), "world_size": world,
           "date": datetime.date.today().isoformat(), "commit": commit(),
           "note": "one training step (forward, backward, AdamW); medians after warm-up, "
                   "interleaved, slowest rank; eager and compile run the unsharded model "
                   "on each GPU; tokens_per_s: the config's tokens (one sequence) a step", "rows": rows}
    write_json(Path(path).expanduser(), doc)
