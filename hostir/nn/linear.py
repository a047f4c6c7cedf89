"""Tensor-parallel linear layers (Megatron style, with sequence parallelism) whose forward
and backward passes run host IR programs.

    import torch.distributed as dist
    from hostir.nn import ColumnParallelLinear, RowParallelLinear, shard_sequence

    dist.init_process_group("nccl")                  # torchrun, or mpirun + MASTER_ADDR
    up = ColumnParallelLinear(8192, 32768, stages=4, device="cuda", dtype=torch.bfloat16)
    down = RowParallelLinear(32768, 8192, stages=4, device="cuda", dtype=torch.bfloat16)
    x = shard_sequence(tokens, 4, world, rank)       # [T/D, 8192]: this rank's tokens
    y = x + down(torch.nn.functional.gelu(up(x)))    # [T/D, 8192], same token layout as x
    y.float().pow(2).mean().backward()

Layouts (D ranks, S stages, T tokens over all ranks):

- *sequence-sharded* activations are ``[T/D, H]``: rank r holds tokens
  ``s*T/S + r*T/(S*D) + j`` of every stage s (``lowering.patterns.stage_rows``). The
  input of ``ColumnParallelLinear`` and the output of ``RowParallelLinear`` use it, so
  layers built with the same ``stages`` chain (and a residual adds up) without copies.
- *feature-sharded* activations are ``[T, F/D]``: all tokens, in order, this rank's
  features. The output of ``ColumnParallelLinear`` and the input of ``RowParallelLinear``.
- weights are stored ``[in, out]`` (the transpose of ``torch.nn.Linear.weight``), so the
  forward GEMM reads them as they are: column-parallel ``[in, out/D]``, row-parallel
  ``[in/D, out]``. ``from_linear`` shards a full ``torch.nn.Linear``.

Programs (built once per shape, dtype, device and communicator, then cached):

- ColumnParallelLinear: forward AllGather+GEMM ``y = gather(x) @ W``; backward
  GEMM+ReduceScatter ``dx = reduce_scatter(dy @ W^T)`` and ``dW = gather(x)^T @ dy``
  from the gathered input saved by the forward (on a side CUDA stream, overlapping the
  reduce-scatters).
- RowParallelLinear: forward GEMM+ReduceScatter ``y = reduce_scatter(x @ W)``; backward
  AllGather+GEMM ``dx = gather(dy) @ W^T`` and ``dW = x^T @ gather(dy)``.

Both layers are one autograd node (``_ParallelLinearFn``) over one plan whose
``backward`` serves either side: the backward program for dx, ``dW = a^T @ b`` beside it.

The backward programs read ``W^T``: they get the view ``w.t()``, which the interpreter
accepts for an input that its program reads only as a GEMM's B (cuBLAS and the generated
kernel's TN layout read it in place); only a cuBLASLt epilogue GEMM (``dgelu``) needs a
transposed copy. With ``schedule="ring"`` the
AllGather+GEMM program never writes this rank's own rows into the gathered input (it
multiplies them from the shard), so the layer copies them there for the weight gradient.

Schedules (``schedule=``): ``pipelined`` runs one collective a stage (an Allgather
before, a ReduceScatter after, each stage's GEMM) on round-robin worker streams; ``ring``
moves the data by SendRecv beside the GEMMs: AllGather+GEMM multiplies the local rows
first while the others arrive (``collective_permute``), GEMM+ReduceScatter passes partial
sums round the ranks and multiplies this rank's rows last (``ring_reduce_scatter``). Over
the copy engine a ring takes no SMs from the GEMMs. ``stages=1`` suits the ring (whole
GEMMs, the first or last one hides the transfers); the layers' default stays 2.

Communication (``comm=``): ``copy_engine`` (SendRecv by peer writes through torch
symmetric memory, other collectives through the caller's group or hostir's NCCL),
``torch`` (the caller's ``process_group``, or the default group), ``nccl`` or ``mpi``
(bootstrapped by mpi4py). ``auto`` (the default) picks the copy engine with the ring
schedule where it can run (CUDA, 2 ranks or more, all on this node, torch's symmetric
memory importable: ``copy_engine_available``), because on 2 x H200 the ring over the copy
engine ran AllGather+GEMM at 1.03-1.09x the GEMM alone against 1.10-1.35x for per-stage
NCCL collectives; elsewhere it keeps the previous choice: the caller's group when
``torch.distributed`` is initialized (NCCL on GPUs, gloo on the CPU), else NCCL (GPU) or
MPI (CPU), with the ``pipelined`` schedule. ``schedule="auto"`` means ``ring`` over the
copy engine and ``pipelined`` otherwise.

The programs run on the caller's current CUDA stream (worker streams join back into it);
under ``torch.autocast`` the GEMMs run in the autocast dtype.

``from_linear``, ``from_linears`` (and ``hostir.nn.parallelize``) take each rank's shard of
full weights that every rank must hold alike; they check so by one exchange of
fingerprints (``agree_on_weights``) and refuse on every rank where the ranks differ.

Fused GELU: ``ParallelMLP(hidden, ffn)`` is ``down(gelu(up(x), approximate="tanh"))`` with
the GELU in the up projection's forward GEMM epilogue (cuBLASLt GELU_AUX, saving the
pre-activation) and its derivative in the down projection's backward AllGather+GEMM
epilogue (DGELU): no elementwise GELU kernel in a step. ``ColumnParallelLinear(...,
activation="gelu_tanh")`` alone fuses the forward only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import torch

from hostir import ir
from hostir.errors import InputMismatchError, LoweringError
from lowering.patterns import allgather_matmul, check_row_split, matmul_reduce_scatter, stage_rows
from lowering.pipeline import lower
from runtime import fused
from runtime.device import DTYPE_NAMES, make_backend
from runtime.interpreter import Interpreter

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "fused_mlp", "shard_sequence",
           "sequence_rows", "copy_engine_available"]

COMMS = ("auto", "torch", "nccl", "mpi", "copy_engine")
ACTIVATIONS = (None, "gelu_tanh")
SCHEDULES = ("auto", "pipelined", "ring")

# The only state: runtimes per (device, communicator choice) and plans per shape.
_RUNTIMES: dict = {}
_PLANS: dict = {}


def sequence_rows(tokens: int, stages: int, world_size: int, rank: int) -> torch.Tensor:
    """Indices of the tokens (of ``tokens`` over all ranks) that rank ``rank`` holds in the
    sequence-sharded layout, in order. ``tokens`` must be a multiple of
    ``stages * world_size`` (else LoweringError: no token is dropped silently).

    >>> sequence_rows(8, 2, 2, 1).tolist()
    [2, 3, 6, 7]
    """
    check_row_split("tokens", tokens, stages, world_size)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise LoweringError(f"sequence rows: rank={rank!r}; expected 0 <= rank < {world_size} "
                            "(the world size)")
    return stage_rows(stages, tokens, world_size, rank)


def shard_sequence(x: torch.Tensor, stages: int, world_size: int, rank: int) -> torch.Tensor:
    """This rank's tokens ``[T/D, ...]`` of the global ``x[T, ...]``, sequence-sharded;
    LoweringError when T is not a multiple of ``stages * world_size``.

    >>> shard_sequence(torch.arange(8.0).view(8, 1), 2, 2, 0).flatten().tolist()
    [0.0, 1.0, 4.0, 5.0]
    """
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        got = "a 0-d tensor" if isinstance(x, torch.Tensor) else type(x).__name__
        raise LoweringError(f"shard_sequence: expected a torch.Tensor [tokens, ...], got {got}")
    check_row_split("x", x.shape[0], stages, world_size)
    return x[sequence_rows(x.shape[0], stages, world_size, rank).to(x.device)].contiguous()


# ----------------------------------------------------------------------------- runtime


@dataclasses.dataclass
class _Runtime:
    backend: object
    comm: object
    side: object = None  # a CUDA stream for weight gradients

    def side_stream(self):
        if self.side is None:
            self.side = torch.cuda.Stream(self.backend.device)
        return self.side


def _torch_group(process_group) -> bool:
    import torch.distributed as dist

    return process_group is not None or (dist.is_available() and dist.is_initialized())


def _local_world_size() -> int | None:
    import os

    for var in ("OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS",
                "SLURM_NTASKS_PER_NODE"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def copy_engine_available(device: torch.device, world_size: int) -> bool:
    """Whether the copy-engine transport can run here: a CUDA device, 2 ranks or more, all
    of them on this node with a GPU each (peer writes go over CUDA IPC; the launcher's
    local size says so: mpirun, torchrun, srun), and torch's symmetric memory importable."""
    if device.type != "cuda" or world_size < 2 or not torch.cuda.is_available():
        return False
    local = _local_world_size()
    if local != world_size or torch.cuda.device_count() < world_size:
        return False
    import importlib.util

    try:
        return importlib.util.find_spec("torch.distributed._symmetric_memory") is not None
    except ImportError:
        return False


def _resolve(device: torch.device, process_group, comm: str, schedule: str) -> tuple[str, str]:
    """(communicator kind, schedule) with ``auto`` filled in; see the module docstring."""
    if comm not in COMMS:
        raise LoweringError(f"comm={comm!r}: expected one of {', '.join(COMMS)}")
    if schedule not in SCHEDULES:
        raise LoweringError(f"schedule={schedule!r}: expected one of {', '.join(SCHEDULES)}")
    if comm in ("nccl", "copy_engine") and device.type != "cuda":
        raise LoweringError(f"comm={comm!r}: expected a CUDA device, got {device.type} (on the "
                            "CPU: comm='mpi', 'torch' or 'auto')")
    kind = comm
    if comm == "auto":
        # The ring over the copy engine where it can run: it was the fastest AllGather+GEMM
        # measured (no SMs taken from the GEMM, first transfer hidden). Elsewhere the
        # previous default, so CPU ranks and multi-node jobs run as before.
        if device.type == "cuda" and copy_engine_available(device, _world(process_group, comm)[1]):
            kind = "copy_engine"
        elif _torch_group(process_group):
            kind = "torch"
        else:
            kind = "nccl" if device.type == "cuda" else "mpi"
    if schedule == "auto":
        schedule = "ring" if kind == "copy_engine" else "pipelined"
    return kind, schedule


def _runtime(device: torch.device, process_group, kind: str) -> _Runtime:
    key = (str(device), kind, process_group)
    rt = _RUNTIMES.get(key)
    if rt is None:
        from runtime.comm.base import make_communicator

        name = "cpu" if device.type == "cpu" else f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
        if kind == "copy_engine":
            from runtime.comm.copy_engine import CopyEngineCommunicator

            # The other collectives (and the input agreement) through the caller's group
            # when there is one, else through hostir's NCCL; SendRecv by the copy engine.
            base = (make_communicator("torch", name, process_group)
                    if _torch_group(process_group) else make_communicator("nccl", name))
            comm = CopyEngineCommunicator(base, process_group)
        else:
            comm = make_communicator(kind, name, process_group if kind == "torch" else None)
        rt = _Runtime(make_backend(name), comm)
        _RUNTIMES[key] = rt
    return rt


def _ranks_in_torch_group(process_group, comm: str) -> bool:
    """Whether the ranks are those of a torch.distributed group (else MPI's world)."""
    return comm == "torch" or (comm in ("auto", "copy_engine") and _torch_group(process_group))


def _world(process_group, comm: str) -> tuple[int, int]:
    """(rank, world size) without building a communicator."""
    import torch.distributed as dist

    if comm == "torch" and not _torch_group(process_group):
        raise LoweringError("comm='torch': expected an initialized torch.distributed group "
                            "(torch.distributed.init_process_group, or process_group=), found "
                            "none")
    if _ranks_in_torch_group(process_group, comm):
        return dist.get_rank(process_group), dist.get_world_size(process_group)
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def _fingerprint(t: torch.Tensor) -> tuple:
    """``(shape, dtype, sum x, sum x w_i, sum |x|, non-finite values)`` of ``t``, the sums
    in float64 on its device chunk by chunk, ``w_i`` the fractional part of ``i`` times the
    golden ratio (so that the same values in another order differ too), non-finite values
    counted apart (as 0 in the sums)."""
    flat = t.detach().reshape(-1)
    acc = torch.zeros(4, dtype=torch.float64, device=flat.device)
    chunk = 1 << 22
    for start in range(0, flat.numel(), chunk):
        x = flat[start:start + chunk].double()
        finite = torch.isfinite(x)
        x = torch.where(finite, x, 0.0)
        w = torch.arange(start, start + x.numel(), dtype=torch.float64, device=x.device)
        w = torch.frac(w * 0.6180339887498949)
        acc += torch.stack([x.sum(), (x * w).sum(), x.abs().sum(),
                            (~finite).sum().double()])
    return (tuple(t.shape), str(t.dtype), *acc.tolist())


def _same_fingerprint(a, b) -> bool:
    """Equal shapes, dtypes and non-finite counts, and sums equal up to the rounding of a
    float64 sum in another order (ranks whose reductions ran on other thread counts): 1e-9
    of the values' absolute sum."""
    if a is None or b is None:
        return a is b
    if a[:2] != b[:2] or a[5] != b[5]:
        return False
    tol = 1e-9 * max(a[4], b[4])
    return all(abs(x - y) <= tol for x, y in zip(a[2:5], b[2:5]))


def agree_on_weights(what: str, check, process_group, comm: str):
    """``check()``'s result on every rank, where every rank's check passed and every rank
    holds the same full weights. ``check()`` runs this rank's checks of its arguments and
    returns ``(result, tensors)``, ``tensors`` the full, unsharded weights (name -> tensor,
    or None where absent) each rank takes its shard of. One exchange of the checks'
    verdicts and the weights' fingerprints (`_fingerprint`), under the transports' timeouts
    (MPI's under HOSTIR_COMM_TIMEOUT, a torch group's its own), so that every rank raises
    alike: the error itself where every rank refused alike, else an InputMismatchError
    naming the ranks that refused, or the weight that differs and where. Ranks whose
    models were seeded apart would otherwise each train a different model, silently.
    HOSTIR_DISABLE=weight_agreement skips the exchange (the checks still run)."""
    from hostir.errors import HostIrError
    from hostir.options import options

    rank, world = _world(process_group, comm)
    if world == 1 or options().disable("weight_agreement"):
        return check()[0]
    result, refusal, error, prints = None, None, None, None
    try:
        result, tensors = check()
        prints = {name: None if t is None or t.is_meta else _fingerprint(t)  # meta: no values
                  for name, t in tensors.items()}
    except HostIrError as e:
        refusal, error = f"{type(e).__name__}: {e}", e
    if _ranks_in_torch_group(process_group, comm):  # the ranks `_world` counted
        import torch.distributed as dist

        everyone = [None] * world
        dist.all_gather_object(everyone, (refusal, prints), group=process_group)
    else:
        from mpi4py import MPI

        from runtime.comm.mpi import agree_over_mpi

        everyone = agree_over_mpi(MPI.COMM_WORLD, (refusal, prints), rank,
                                  what=f"{what}'s weight agreement")
    refused = {r: m for r, (m, _) in enumerate(everyone) if m is not None}
    if refused and error is not None and len(refused) == world and len(set(refused.values())) == 1:
        error.on_every_rank = True  # every rank raises this very error: nobody waits
        raise error
    text = None
    if refused:
        text = "; ".join(f"rank {r} refused: {m}" for r, m in refused.items())
    else:
        for name in sorted(set().union(*(p for _, p in everyone))):
            apart = [r for r in range(1, world)
                     if not _same_fingerprint(everyone[r][1].get(name), everyone[0][1].get(name))]
            if apart:
                text = (f"weight {name} differs between ranks (rank{'s' * (len(apart) > 1)} "
                        f"{', '.join(map(str, apart))} against rank 0); expected the same full "
                        "weights on every rank (seed the model alike, or load one checkpoint, "
                        "on each), of which each rank takes its shard")
                break
    if text is None:
        return result
    err = InputMismatchError(f"{what}: {text}")
    err.on_every_rank = True  # every rank raises it: nobody is left waiting
    raise err


def _expose_gathered(p: ir.Program) -> ir.Program:
    """The AllGather+GEMM program with its gathered input as a second output (the weight
    gradient needs it; gathering it again in the backward would cost a collective): the
    allocation that the first communication writes into (through its selects)."""
    selects = {s.out.name: s.input for s in ir.walk(p.body) if isinstance(s, ir.Select)}
    comm = next(s for s in ir.walk(p.body) if isinstance(s, ir.Communication))
    gathered = comm.output
    while gathered.name in selects:
        gathered = selects[gathered.name]
    return dataclasses.replace(p, outputs=p.outputs + (gathered,))


def _interpreter(rt: _Runtime, fusion, streams: int, gathered: bool,
                 schedule: str, what: str = "", then=None) -> Interpreter:
    """The program of ``fusion``, printed under ``HOSTIR_DUMP=host_ir`` (rank 0) with a
    line that says which layer pass it runs, once when the plan is built. ``then``: a
    program -> program pass applied after lowering."""
    from hostir.options import dump
    from hostir.printer import print_program

    d = rt.comm.world_size
    program = lower(fusion, d, streams, rt.comm.rank, schedule=schedule)
    if gathered:
        program = _expose_gathered(program)
    if then is not None:
        program = then(program)
        dump("lowering", f"// after pass {program.provenance.rsplit('+', 1)[-1]}\n"
                         f"{print_program(program)}", rt.comm.rank)
    dump("host_ir", f"// {what} ({rt.comm.name}, {schedule})\n{print_program(program)}",
         rt.comm.rank)
    return Interpreter(program, rt.backend, rt.comm)


def _as_input(run: Interpreter, index: int, x: torch.Tensor) -> torch.Tensor:
    """``x`` viewed as input ``index`` of the program (the ring re-types A of
    GEMM+ReduceScatter to address each owner's rows: the same memory)."""
    return x.view(run.program.inputs[index].local_shape)


def _transposed_weight(run: Interpreter, index: int, w: torch.Tensor) -> torch.Tensor:
    """``W^T`` for input ``index`` of a backward program: the view ``w.t()`` where the
    program reads that input only as a GEMM's B (cuBLAS reads it transposed in place),
    else a transposed copy (a cuBLASLt epilogue GEMM takes contiguous rows). The copy
    cost 0.84 ms a weight of [8192, 16384] bf16 on an H200 (torch's strided copy kernel,
    benchmarks/trace_tp_step.py), about 2% of the bench's step for two of them."""
    wt = w.t()
    if run.program.inputs[index].name in run._transposable:
        return wt
    return wt.contiguous()


class _Plan:
    """The two programs of one layer shape. ``m``: tokens a rank holds sequence-sharded
    (T/D); ``k``, ``n``: the local weight is [k, n]; ``kind``: column or row.
    ``epilogue``: ``gelu_aux`` on the column forward GEMMs (the output is gelu(x W), the
    pre-activation a second output), ``dgelu`` on the row backward GEMMs (dx is multiplied
    by gelu' of a pre-activation passed in)."""

    def __init__(self, kind, rt: _Runtime, m, k, n, stages, streams, dtype, overlap,
                 schedule="pipelined", epilogue=None, label=""):
        d = rt.comm.world_size
        self.kind, self.rt, self.m, self.k, self.n = kind, rt, m, k, n
        self.S, self.D, self.overlap = stages, d, overlap and rt.backend.name == "cuda"
        self.schedule, self.epilogue = schedule, epilogue
        self.streams, self.dtype = streams, dtype
        t = m * d
        if t % (stages * d):
            raise LoweringError(
                f"{kind}-parallel layer: {t} tokens over {d} ranks and {stages} stages: "
                f"expected a multiple of stages*ranks = {stages * d} tokens"
            )
        ag, rs = allgather_matmul, matmul_reduce_scatter
        fwd_epilogue = epilogue if kind == "column" else None
        bwd_epilogue = epilogue if kind == "row" else None
        if (fwd_epilogue or bwd_epilogue) != epilogue:
            raise LoweringError(f"{kind}-parallel layer: epilogue {epilogue!r} has no GEMM to "
                                "go on (gelu_aux: column forward; dgelu: row backward)")
        # ``label`` names the first user of a shared plan in the dump (e.g. "attention qkv").
        self.what = what = (f"{label + ': ' if label else ''}{kind}-parallel linear [{k}, {n}] "
                            f"a rank, {t} tokens")
        # Each program is lowered (and dumped) on its first use: a block that runs the row
        # forward with the next norm (``row_forward_norm``) never builds the plain one.
        if kind == "column":  # fwd: gather(x)[T, k] @ W[k, n]; bwd: rs(dy[T, n] @ W^T[n, k])
            self._build = {
                "fwd": lambda: _interpreter(rt, ag(t, k, n, stages, d, dtype, fwd_epilogue),
                                            streams, True, schedule,
                                            f"{what}: forward, AllGather+GEMM"),
                "bwd": lambda: _interpreter(rt, rs(t, n * d, k, stages, d, dtype), streams,
                                            False, schedule,
                                            f"{what}: backward dx, GEMM+ReduceScatter")}
        else:  # fwd: rs(x[T, k] @ W[k, n]); bwd: gather(dy)[T, n] @ W^T[n, k]
            self._build = {
                "fwd": lambda: _interpreter(rt, rs(t, k * d, n, stages, d, dtype), streams,
                                            False, schedule,
                                            f"{what}: forward, GEMM+ReduceScatter"),
                "bwd": lambda: _interpreter(rt, ag(t, n, k, stages, d, dtype, bwd_epilogue),
                                            streams, True, schedule,
                                            f"{what}: backward dx, AllGather+GEMM")}
        self._runs: dict = {}

    def _run(self, key) -> Interpreter:
        run = self._runs.get(key)
        if run is None:  # a builder that raised stays, so the next call raises the same
            run = self._runs[key] = self._build[key]()
            del self._build[key]
        return run

    @property
    def fwd(self) -> Interpreter:
        """The forward program's interpreter (lowered on first use)."""
        return self._run("fwd")

    @property
    def bwd(self) -> Interpreter:
        """The backward (dx) program's interpreter (lowered on first use)."""
        return self._run("bwd")

    def _fill_local_rows(self, gathered: torch.Tensor, mine: torch.Tensor) -> None:
        """The ring multiplies this rank's rows from its own shard and never writes them
        into the gathered buffer; the weight gradient reads them there. One local copy
        of T/D rows on the current stream (the pipelined Allgather wrote them already)."""
        if self.schedule == "ring":
            S, D, r = self.S, self.D, self.rt.comm.rank
            gathered.view(S, D, -1, gathered.shape[-1])[:, r].copy_(
                mine.view(S, -1, gathered.shape[-1]))

    def _weight_grad(self, a: torch.Tensor, b: torch.Tensor, run_program):
        """``a^T @ b`` and the program, overlapped on a side stream on CUDA."""
        if not self.overlap:
            out = run_program()
            return out, a.t() @ b
        cur = self.rt.backend.current_stream()
        side = self.rt.side_stream()
        side.wait_stream(cur)
        out = run_program()
        with torch.cuda.stream(side):
            dw = a.t() @ b
        cur.wait_stream(side)  # dw and every later use of a and b are ordered after it
        return out, dw

    # column: x [m, k] sequence-sharded -> y [T, n] (and its pre-activation with gelu_aux)
    def column_forward(self, x, w):
        if self.D == 1:  # one rank: no collective to overlap, so a plain GEMM
            self._run("fwd")  # the program is still lowered (and dumped), not run
            y = x @ w
            if self.epilogue == "gelu_aux":
                return torch.nn.functional.gelu(y, approximate="tanh"), x, y
            return y, x, None
        S, m = self.S, self.m // self.S
        y, *pre, g = self.fwd(x.view(S, 1, m, self.k), w)
        self._fill_local_rows(g, x)
        pre = pre[0].view(-1, self.n) if pre else None
        return y.view(-1, self.n), g.view(-1, self.k), pre

    # row: x [T, k] feature-sharded -> y [m, n] sequence-sharded
    def row_forward(self, x, w):
        if self.D == 1:  # one rank: no collective to overlap, so a plain GEMM
            self._run("fwd")  # the program is still lowered (and dumped), not run
            return x @ w
        (y,) = self.fwd(_as_input(self.fwd, 0, x), _as_input(self.fwd, 1, w))
        return y.view(-1, self.n)

    def row_forward_norm(self, x, w, residual, weight, bias, eps: float, kind: str):
        """The row forward followed by ``h = y + residual``, ``norm(h)`` (``kind``,
        ``weight``, ``bias``, ``eps``) in one program: each stage's residual add and norm
        launch as soon as its reduce-scatter has landed (``lowering.passes.stage_norm``),
        overlapping the next stage's GEMM. ``(norm(h), h, mean, rstd)``, the order of
        ``runtime.fused.add_norm_forward``'s result, over this rank's ``[m, n]``."""
        key = ("fwd_norm", kind, float(eps), bias is not None)
        if key not in self._runs:
            from lowering.passes.stage_norm import fuse_stage_norm

            fusion = matmul_reduce_scatter(self.m * self.D, self.k * self.D, self.n, self.S,
                                           self.D, self.dtype)
            self._build[key] = lambda: _interpreter(
                self.rt, fusion, self.streams, False, self.schedule,
                f"{self.what}: forward, GEMM+ReduceScatter, then residual add + {kind} a stage",
                lambda p: fuse_stage_norm(p, kind, eps, bias is not None))
        run = self._run(key)
        if self.D == 1:  # no collective: the GEMM, then the fused add + norm
            return fused.add_norm_forward(x @ w, residual, weight, bias, eps, kind)
        args = (_as_input(run, 0, x), _as_input(run, 1, w),
                residual.view(self.S, self.m // self.S, self.n), weight)
        _, n, h, *stats = run(*args + ((bias,) if bias is not None else ()))
        mean, rstd = stats if kind == "layer_norm" else (None, stats[0])
        return (n.view(-1, self.n), h.view(-1, self.n),
                None if mean is None else mean.view(-1), rstd.view(-1))

    def forward(self, x, w):
        """``(y, saved, pre)``: the output, what the backward reads (column: the gathered
        input; row: ``x``) and the pre-activation of a ``gelu_aux`` epilogue (or None)."""
        if self.kind == "column":
            return self.column_forward(x, w)
        return self.row_forward(x, w), x, None

    def backward(self, dy, saved, w, need_x: bool, need_w: bool, pre=None):
        """``(dx, dW)`` of either layer, written once. The backward program gives dx
        (column: GEMM+ReduceScatter ``rs(dy W^T)``; row: AllGather+GEMM ``gather(dy) W^T``,
        times ``gelu'(pre)`` with ``dgelu``, ``pre`` the ``[T, k]`` pre-activation) and
        ``dW = a^T @ b`` with ``a = saved``: for the column layer ``b = dy``, known before
        the program, so the GEMM runs on a side stream beside the reduce-scatters; for the
        row layer ``b = gather(dy)``, the program's second output (the row program always
        runs: it gathers ``b``)."""
        if self.D == 1:
            self._run("bwd")  # lowered (and dumped), not run
            dx = dy @ w.t() if need_x else None
            if dx is not None and pre is not None:
                dx = torch.ops.aten.gelu_backward(dx, pre, approximate="tanh")
            return dx, (saved.t() @ dy if need_w else None)
        run, column = self.bwd, self.kind == "column"
        first = _as_input(run, 0, dy) if column else dy.view(self.S, 1, self.m // self.S, self.n)
        args = (first, _as_input(run, 1, _transposed_weight(run, 1, w)))
        if pre is not None:
            args += (_as_input(run, 2, pre),)
        if not column:
            dx, b = run(*args)
            self._fill_local_rows(b, dy)
            return dx.view(-1, self.k), saved.t() @ b.view(-1, self.n) if need_w else None
        program = (lambda: run(*args)[0]) if need_x else (lambda: None)
        dx, dw = self._weight_grad(saved, dy, program) if need_w else (program(), None)
        return (dx.view(-1, self.k) if dx is not None else None), dw


class Memo(dict):
    """A dict of what a module remembers between calls (plans, runtimes: communicators and
    streams) that a deep copy or a pickle of the module leaves empty: the copy builds its
    own on its first call, as the original did."""

    def __deepcopy__(self, memo):
        return type(self)()

    def __reduce__(self):
        return type(self), ()


def _plan(kind, layer, x: torch.Tensor, epilogue: str | None = None,
          rows: int | None = None) -> _Plan:
    """The plan for ``layer`` on inputs like ``x`` (``rows``: the input's rows, when
    ``x`` only gives dtype and device). A layer remembers its plans by the inputs (rows,
    dtype, device), the epilogue, its settings (which a caller may change between calls)
    and whether a torch.distributed group is up, so that a steady call skips resolving
    the communicator and the runtime: host time, a few microseconds a call."""
    rows = x.shape[0] if rows is None else rows
    memo = layer.__dict__.get("_plan_memo")
    if memo is None:
        memo = layer.__dict__["_plan_memo"] = Memo()
    short = (kind, rows, x.dtype, x.device, epilogue, layer.stages, layer.streams,
             layer.overlap_weight_grad, layer.comm, layer.schedule, id(layer.process_group),
             _torch_group(layer.process_group))
    plan = memo.get(short)
    if plan is None:
        plan = memo[short] = _new_plan(kind, layer, x, epilogue, rows)
    return plan


def _new_plan(kind, layer, x: torch.Tensor, epilogue: str | None, rows: int) -> _Plan:
    comm, schedule = _resolve(x.device, layer.process_group, layer.comm, layer.schedule)
    rt = _runtime(x.device, layer.process_group, comm)
    key = (kind, rows, layer._k, layer._n, x.dtype, str(x.device), layer.stages,
           layer.streams, layer.overlap_weight_grad, schedule, id(rt), epilogue)
    plan = _PLANS.get(key)
    if plan is None:
        if kind == "row":  # all T tokens: T/D rows each, no remainder dropped
            check_row_split(f"{type(layer).__name__} input", rows, layer.stages,
                            rt.comm.world_size)
        m = rows if kind == "column" else rows // rt.comm.world_size
        plan = _Plan(kind, rt, m, layer._k, layer._n, layer.stages, layer.streams,
                     DTYPE_NAMES[x.dtype], layer.overlap_weight_grad, schedule, epilogue,
                     getattr(layer, "label", ""))
        _PLANS[key] = plan
    return plan


_NO_CONTEXT = contextlib.nullcontext()


def _no_autocast(device: torch.device):
    """Autocast off inside the programs: they write into preallocated outputs (``out=``)
    in the dtype the layer already chose. Where it is off already, no context at all
    (an autocast context costs about 5 us of host time to enter and leave)."""
    if not torch.is_autocast_enabled(device.type):
        return _NO_CONTEXT
    return torch.autocast(device.type, enabled=False)


class _ParallelLinearFn(torch.autograd.Function):
    """Either layer as one autograd node: ``plan.forward``, ``plan.backward``. With the
    column plan's ``gelu_aux`` the output is gelu_tanh(x W) and the backward first takes
    the GELU's derivative (torch's gelu_backward on the saved pre-activation);
    ``ParallelMLP`` fuses that derivative into the down projection's backward GEMM."""

    @staticmethod
    def forward(ctx, x, w, plan):
        with _no_autocast(x.device):
            y, saved, pre = plan.forward(x, w)
        ctx.plan = plan
        ctx.save_for_backward(saved, w, pre)
        return y

    @staticmethod
    def backward(ctx, dy):
        saved, w, pre = ctx.saved_tensors
        dy = dy.to(w.dtype)
        if pre is not None:
            dy = torch.ops.aten.gelu_backward(dy, pre, approximate="tanh")
        with _no_autocast(dy.device):
            dx, dw = ctx.plan.backward(dy.contiguous(), saved, w, ctx.needs_input_grad[0],
                                       ctx.needs_input_grad[1])
        return dx, dw, None


class _ParallelMLP(torch.autograd.Function):
    """``down(gelu_tanh(up(x)))`` as one autograd node, so the GELU's derivative can be the
    epilogue of the down projection's backward GEMM: forward AllGather+GEMM with
    ``gelu_aux`` (h = gelu(pre), pre saved), GEMM+ReduceScatter; backward AllGather+GEMM,
    with ``dgelu`` when ``fuse_backward`` (d_pre = (gather(dy) W2^T) * gelu'(pre)) or
    followed by torch's gelu_backward, then the up projection's GEMM+ReduceScatter on
    d_pre. Weight gradients as the layers compute them."""

    @staticmethod
    def forward(ctx, x, w1, w2, up, down, fuse_backward):
        with _no_autocast(x.device):
            h, gathered, pre = up.column_forward(x, w1)
            y = down.row_forward(h, w2)
        ctx.plans, ctx.fuse_backward = (up, down), fuse_backward
        ctx.save_for_backward(gathered, pre, h, w1, w2)
        return y

    @staticmethod
    def backward(ctx, dy):
        gathered, pre, h, w1, w2 = ctx.saved_tensors
        up, down = ctx.plans
        need_x, need_w1, need_w2 = ctx.needs_input_grad[:3]
        with _no_autocast(dy.device):
            dy = dy.to(w2.dtype).contiguous()
            if ctx.fuse_backward:
                dpre, dw2 = down.backward(dy, h, w2, True, need_w2, pre)
            else:
                dh, dw2 = down.backward(dy, h, w2, True, need_w2)
                dpre = torch.ops.aten.gelu_backward(dh, pre, approximate="tanh")
            dx, dw1 = up.backward(dpre, gathered, w1, need_x, need_w1)
        return dx, dw1, dw2, None, None, None


def check_input(what: str, x: torch.Tensor, w: torch.Tensor) -> None:
    """LoweringError unless ``x`` has tokens and the dtype and device of the weight ``w``
    (any floating dtype under ``torch.autocast``, which picks the GEMMs' dtype)."""
    if x.device != w.device:
        raise LoweringError(f"{what}: expected an input on {w.device} (the weight's device), "
                            f"got {x.device}")
    if not x.is_floating_point() or (x.dtype != w.dtype
                                     and not torch.is_autocast_enabled(x.device.type)):
        raise LoweringError(f"{what}: expected dtype {w.dtype} (the weight's; another "
                            f"floating dtype under torch.autocast), got {x.dtype}")
    if x.shape[0] == 0:
        raise LoweringError(f"{what}: expected at least one token, got {list(x.shape)}")


def _compute_dtype(x: torch.Tensor, w: torch.Tensor) -> torch.dtype:
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return w.dtype


def check_layer_args(what: str, dtype=None, **sizes) -> None:
    """LoweringError unless every one of ``sizes`` (features, stages, streams) is a positive
    int and ``dtype`` (if given) a floating-point dtype: checked when a layer is built, not
    at its first forward."""
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise LoweringError(f"{what}: {name}={value!r}; expected a positive int")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise LoweringError(f"{what}: dtype={dtype!r}; expected a floating-point dtype")


class _ParallelLinear(torch.nn.Module):
    def __init__(self, in_features, out_features, local_shape, rank, world_size, *, stages,
                 streams, process_group, comm, device, dtype, overlap_weight_grad,
                 schedule="auto"):
        super().__init__()
        if comm not in COMMS:
            raise LoweringError(f"comm={comm!r}: expected one of {', '.join(COMMS)}")
        if schedule not in SCHEDULES:
            raise LoweringError(f"schedule={schedule!r}: expected one of {', '.join(SCHEDULES)}")
        self.schedule = schedule
        self.rank, self.world_size = rank, world_size
        self.in_features, self.out_features = in_features, out_features
        self.stages, self.streams = stages, streams
        self.process_group, self.comm = process_group, comm
        self.overlap_weight_grad = overlap_weight_grad
        self._k, self._n = local_shape
        w = torch.empty(local_shape, device=device, dtype=dtype)
        bound = 1 / math.sqrt(in_features)  # torch.nn.Linear's default init
        self.weight = torch.nn.Parameter(w.uniform_(-bound, bound))

    def _inputs(self, x: torch.Tensor):
        name, w = type(self).__name__, self.weight
        if not isinstance(x, torch.Tensor):
            raise LoweringError(f"{name}: expected a torch.Tensor [tokens, {self._k}], got "
                                f"{type(x).__name__}")
        if x.dim() != 2 or x.shape[1] != self._k:
            raise LoweringError(f"{name}: expected input [tokens, {self._k}], "
                                f"got {list(x.shape)}")
        check_input(name, x, w)
        dtype = _compute_dtype(x, w)
        return x.to(dtype).contiguous(), w.to(dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"local weight [{self._k}, {self._n}], stages={self.stages}, streams={self.streams}, "
                f"schedule={self.schedule}, comm={self.comm}")


class ColumnParallelLinear(_ParallelLinear):
    """``y = x @ W (+ b)`` with W's output features sharded over the ranks.

    Input: sequence-sharded ``[T/D, in]``; output: all tokens, this rank's features
    ``[T, out/D]``. ``weight`` is ``[in, out/D]``, ``bias`` (if any) ``[out/D]``.

    >>> up = ColumnParallelLinear(1024, 4096, stages=2)      # doctest: +SKIP
    >>> up(x_local).shape                                    # doctest: +SKIP
    torch.Size([T, 4096 // D])
    """

    def __init__(self, in_features: int, out_features: int, *, bias: bool = False,
                 stages: int = 2, streams: int = 2, process_group=None, comm: str = "auto",
                 device=None, dtype=None, overlap_weight_grad: bool = True,
                 schedule: str = "auto", activation: str | None = None):
        """``activation="gelu_tanh"``: the output is ``gelu(x W, approximate="tanh")``,
        computed in the forward GEMMs' epilogue (cuBLASLt GELU_AUX on CUDA); no bias then."""
        check_layer_args("ColumnParallelLinear", dtype, in_features=in_features,
                         out_features=out_features, stages=stages, streams=streams)
        if activation not in ACTIVATIONS:
            raise LoweringError(f"activation={activation!r}: expected one of {ACTIVATIONS}")
        if activation is not None and bias:
            raise LoweringError("ColumnParallelLinear: activation with a bias is not supported")
        self.activation = activation
        rank, world = _world(process_group, comm)
        if out_features % world:
            raise LoweringError(f"ColumnParallelLinear: out_features={out_features} is not "
                                f"divisible by the {world} ranks")
        n = out_features // world
        super().__init__(in_features, out_features, (in_features, n), rank, world,
                         stages=stages, streams=streams, process_group=process_group,
                         comm=comm, device=device, dtype=dtype,
                         overlap_weight_grad=overlap_weight_grad, schedule=schedule)
        self.bias = torch.nn.Parameter(torch.zeros(n, device=device, dtype=dtype)) if bias else None

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, **kw) -> "ColumnParallelLinear":
        """This rank's shard of a full ``torch.nn.Linear`` (same values on every rank:
        `agree_on_weights`)."""
        def check():
            _check_linear(f"{cls.__name__}.from_linear", linear)
            layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                        device=linear.weight.device, dtype=linear.weight.dtype, **kw)
            return layer, {"weight": linear.weight, "bias": linear.bias}

        layer = agree_on_weights(f"{cls.__name__}.from_linear", check,
                                 kw.get("process_group"), kw.get("comm", "auto"))
        n, r = layer._n, layer.rank
        with torch.no_grad():
            layer.weight.copy_(linear.weight[r * n:(r + 1) * n].t())
            if linear.bias is not None:
                layer.bias.copy_(linear.bias[r * n:(r + 1) * n])
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, w = self._inputs(x)
        epilogue = "gelu_aux" if self.activation else None
        y = _ParallelLinearFn.apply(x, w, _plan("column", self, x, epilogue))
        return y if self.bias is None else y + self.bias.to(y.dtype)


class RowParallelLinear(_ParallelLinear):
    """``y = x @ W`` with W's input features sharded over the ranks; the partial products
    are summed by reduce-scatters into sequence-sharded tokens.

    Input: all tokens, this rank's features ``[T, in/D]``; output: sequence-sharded
    ``[T/D, out]``. ``weight`` is ``[in/D, out]``. No bias: a replicated bias under
    sequence parallelism needs its gradient all-reduced, which is the caller's to do.

    >>> down = RowParallelLinear(4096, 1024, stages=2)        # doctest: +SKIP
    >>> down(h_local).shape                                   # doctest: +SKIP
    torch.Size([T // D, 1024])
    """

    def __init__(self, in_features: int, out_features: int, *, stages: int = 2,
                 streams: int = 2, process_group=None, comm: str = "auto", device=None,
                 dtype=None, overlap_weight_grad: bool = True, schedule: str = "auto"):
        check_layer_args("RowParallelLinear", dtype, in_features=in_features,
                         out_features=out_features, stages=stages, streams=streams)
        rank, world = _world(process_group, comm)
        if in_features % world:
            raise LoweringError(f"RowParallelLinear: in_features={in_features} is not "
                                f"divisible by the {world} ranks")
        k = in_features // world
        super().__init__(in_features, out_features, (k, out_features), rank, world,
                         stages=stages, streams=streams, process_group=process_group,
                         comm=comm, device=device, dtype=dtype,
                         overlap_weight_grad=overlap_weight_grad, schedule=schedule)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, **kw) -> "RowParallelLinear":
        """This rank's shard of a full bias-free ``torch.nn.Linear`` (same values on every
        rank: `agree_on_weights`)."""
        def check():
            _check_linear(f"{cls.__name__}.from_linear", linear)
            if linear.bias is not None:
                raise LoweringError("RowParallelLinear.from_linear: the linear has a bias; "
                                    "expected none")
            layer = cls(linear.in_features, linear.out_features, device=linear.weight.device,
                        dtype=linear.weight.dtype, **kw)
            return layer, {"weight": linear.weight}

        layer = agree_on_weights(f"{cls.__name__}.from_linear", check,
                                 kw.get("process_group"), kw.get("comm", "auto"))
        k, r = layer._k, layer.rank
        with torch.no_grad():
            layer.weight.copy_(linear.weight[:, r * k:(r + 1) * k].t())
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, w = self._inputs(x)
        return _ParallelLinearFn.apply(x, w, _plan("row", self, x))


def _check_linear(what: str, linear) -> None:
    if not isinstance(linear, torch.nn.Linear):
        raise LoweringError(f"{what}: expected a torch.nn.Linear, got {type(linear).__name__}")


class ParallelMLP(torch.nn.Module):
    """``down(gelu_tanh(up(x)))``: a column-parallel up projection and a row-parallel down
    projection (Megatron-LM's ``ParallelMLP``, sequence parallel), with the GELU fused into
    GEMM epilogues: cuBLASLt GELU_AUX in the up projection's forward GEMMs and DGELU in
    the down projection's backward (AllGather+GEMM) GEMMs; on the CPU the same math in torch
    ops. Input and output are sequence-sharded ``[T/D, hidden]``; the residual is the
    caller's. ``up`` and ``down`` are the two layers (their weights, their options).

    >>> mlp = ParallelMLP(8192, 32768, stages=1, device="cuda", dtype=torch.bfloat16)  # doctest: +SKIP
    >>> y = x + mlp(x)                                                                   # doctest: +SKIP
    """

    def __init__(self, hidden: int, ffn: int, *, activation: str = "gelu_tanh",
                 stages: int = 2, streams: int = 2, process_group=None, comm: str = "auto",
                 device=None, dtype=None, overlap_weight_grad: bool = True,
                 schedule: str = "auto"):
        super().__init__()
        if activation != "gelu_tanh":
            raise LoweringError(f"activation={activation!r}: ParallelMLP fuses 'gelu_tanh' only")
        kw = dict(stages=stages, streams=streams, process_group=process_group, comm=comm,
                  device=device, dtype=dtype, overlap_weight_grad=overlap_weight_grad,
                  schedule=schedule)
        self.activation = activation
        self.up = ColumnParallelLinear(hidden, ffn, activation=activation, **kw)
        self.down = RowParallelLinear(ffn, hidden, **kw)

    @classmethod
    def from_linears(cls, up: torch.nn.Linear, down: torch.nn.Linear, **kw) -> "ParallelMLP":
        """This rank's shards of two full bias-free ``torch.nn.Linear`` (same on every rank:
        `agree_on_weights`)."""
        def check():
            _check_linear(f"{cls.__name__}.from_linears", up)
            _check_linear(f"{cls.__name__}.from_linears", down)
            if (down.in_features, down.out_features) != (up.out_features, up.in_features):
                raise LoweringError(f"{cls.__name__}.from_linears: down has "
                                    f"{down.in_features} in_features and {down.out_features} "
                                    f"out_features; expected {up.out_features} (up's "
                                    f"out_features) and {up.in_features} (up's in_features)")
            mlp = cls(up.in_features, up.out_features, device=up.weight.device,
                      dtype=up.weight.dtype, **kw)
            if up.bias is not None or down.bias is not None:
                raise LoweringError("ParallelMLP.from_linears: expected bias-free linears")
            return mlp, {"up.weight": up.weight, "down.weight": down.weight}

        mlp = agree_on_weights(f"{cls.__name__}.from_linears", check, kw.get("process_group"),
                               kw.get("comm", "auto"))
        n, k, r = mlp.up._n, mlp.down._k, mlp.up.rank
        with torch.no_grad():
            mlp.up.weight.copy_(up.weight[r * n:(r + 1) * n].t())
            mlp.down.weight.copy_(down.weight[:, r * k:(r + 1) * k].t())
        return mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_mlp(x, self.up, self.down)


# Whether the down projection's backward takes the GELU derivative in its GEMM (cuBLASLt
# DGELU) by default. Measured on the H200 at the bench's shapes (77c9b2d,
# benchmarks/results/profile_mlp_step_nvidia-h200.json): the DGELU GEMM 7.78 ms against
# 7.03 ms for the plain GEMM and torch's gelu_backward after it, so the derivative is a
# separate pass; the forward's GELU_AUX GEMM (6.73 ms vs 6.90 ms unfused) stays fused.
FUSE_DGELU = False


def fused_mlp(x: torch.Tensor, up: ColumnParallelLinear, down: RowParallelLinear,
              fuse_backward: bool | None = None) -> torch.Tensor:
    """``down(gelu_tanh(up(x)))`` with the GELU in the up projection's GEMM epilogue (see
    ``ParallelMLP``), for any pair of layers built with the same stages (``up``'s own
    activation is not applied twice: the fused GELU is the activation). ``fuse_backward``
    (default ``FUSE_DGELU``): the derivative in the down projection's backward GEMM too."""
    fuse_backward = FUSE_DGELU if fuse_backward is None else fuse_backward
    if not (isinstance(up, ColumnParallelLinear) and isinstance(down, RowParallelLinear)):
        raise LoweringError(f"fused_mlp: expected up a ColumnParallelLinear and down a "
                            f"RowParallelLinear, got {type(up).__name__} and "
                            f"{type(down).__name__}")
    if up.bias is not None:  # the fused GELU reads x W: a bias would be dropped
        raise LoweringError("fused_mlp: up has a bias; expected none (ParallelMLP's layers "
                            "have none)")
    if up.stages != down.stages:  # down's output would be in another token order than x
        raise LoweringError(f"fused_mlp: up has stages={up.stages}, down stages="
                            f"{down.stages}; expected the same (the output's token layout "
                            "is the input's)")
    x, w1 = up._inputs(x)
    w2 = down.weight.to(w1.dtype)
    if down._k != up._n:
        raise LoweringError(f"fused_mlp: up gives {up._n} features a rank, down takes {down._k}")
    up_plan = _plan("column", up, x, "gelu_aux")
    down_plan = _plan("row", down, x, "dgelu" if fuse_backward else None,
                      rows=x.shape[0] * up_plan.D)
    return _ParallelMLP.apply(x, w1, w2, up_plan, down_plan, fuse_backward)
