"""Tensor-parallel layers and the GEMM+ReduceScatter program on CPU ranks:
run under `mpirun -np N python -m pytest --with-mpi`. Every rank builds the same global
data from the same seed, runs its shard, and compares with a single-process reference."""

import pytest
import torch

from hostir import ir
from hostir.nn import ColumnParallelLinear, RowParallelLinear, sequence_rows, shard_sequence
from lowering.patterns import matmul_reduce_scatter, shard_columns, stage_rows
from lowering.pipeline import lower
from runtime.interpreter import Interpreter
from tests.numerics import rel_err as _err

pytestmark = pytest.mark.mpi(min_size=2)

# Relative Frobenius error vs a float64 reference: fp32 differs in summation order; bf16
# rounds inputs, partial sums and outputs.
TOL = {"float32": 1e-5, "bfloat16": 2e-2}


# ----------------------------------------------------------------- the reduce-scatter program


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("stages,streams", [(1, 1), (2, 2), (4, 3)])
def test_reduce_scatter_program_equals_reference(world, comm, stages, streams, dtype):
    from runtime.comm.base import make_communicator
    from runtime.device import CpuBackend

    rank, d = world
    communicator = make_communicator(comm)
    m, k, n = 8 * stages * d, 12 * d, 10
    run = Interpreter(lower(matmul_reduce_scatter(m, k, n, stages, d, dtype), d, streams),
                      CpuBackend(), communicator)
    for seed in range(2):  # twice: the second run must not see the first one's buffers
        g = torch.Generator().manual_seed(seed)
        a = torch.randn(m, k, generator=g).to(getattr(torch, dtype))
        b = torch.randn(k, n, generator=g).to(getattr(torch, dtype))
        kd = k // d
        a_local = shard_columns(a, d, rank).view(stages, m // stages, 1, kd)
        b_local = b[rank * kd:(rank + 1) * kd].contiguous().view(1, kd, n)
        (out,) = run(a_local, b_local)
        assert out.shape == (stages, m // (stages * d), n)
        ref = (a.double() @ b.double())[stage_rows(stages, m, d, rank)]
        assert _err(out.reshape(-1, n), ref) < TOL[dtype], (stages, streams, dtype)


# ----------------------------------------------------------------- the layers


def _data(t, i, o, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    x = torch.randn(t, i, generator=g).to(dt)
    lin = torch.nn.Linear(i, o, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(o, i, generator=g) / i ** 0.5)
    grad = torch.randn(t, o, generator=g).to(dt)
    return x, lin.to(dt), grad


def _reference(x, lin, grad, bias=None):
    """float64 forward and backward of x @ W^T (+ bias) from the same (rounded) values."""
    x = x.double().requires_grad_()
    w = lin.weight.detach().double().requires_grad_()
    y = x @ w.t()
    b = None
    if bias is not None:
        b = bias.detach().double().requires_grad_()
        y = y + b
    y.backward(grad.double())
    return y.detach(), x.grad, w.grad, (b.grad if b is not None else None)


@pytest.mark.parametrize("schedule", ["pipelined", "ring"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("stages", [1, 2, 4])
def test_column_parallel_linear(world, comm, stages, dtype, schedule):
    rank, d = world
    t, i, o = 4 * stages * d, 24, 8 * d
    x, lin, grad = _data(t, i, o, dtype, seed=stages)
    with torch.no_grad():
        bias = torch.randn(o).to(lin.weight.dtype)
        lin.bias = torch.nn.Parameter(bias.clone())
    layer = ColumnParallelLinear.from_linear(lin, stages=stages, streams=2, comm=comm,
                                             schedule=schedule)
    assert layer.weight.shape == (i, o // d) and layer.bias.shape == (o // d,)
    x_local = shard_sequence(x, stages, d, rank).requires_grad_()
    y = layer(x_local)
    n, cols = o // d, slice(rank * (o // d), (rank + 1) * (o // d))
    assert y.shape == (t, n) and y.dtype == x.dtype
    y.backward(grad[:, cols])
    ry, rdx, rdw, rdb = _reference(x, lin, grad, bias)
    tol = TOL[dtype]
    assert _err(y, ry[:, cols]) < tol
    assert _err(x_local.grad, rdx[sequence_rows(t, stages, d, rank)]) < tol
    assert _err(layer.weight.grad, rdw[cols].t()) < tol
    assert _err(layer.bias.grad, rdb[cols]) < tol


@pytest.mark.parametrize("schedule", ["pipelined", "ring"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("stages", [1, 2, 4])
def test_row_parallel_linear(world, comm, stages, dtype, schedule):
    rank, d = world
    t, i, o = 4 * stages * d, 8 * d, 20
    x, lin, grad = _data(t, i, o, dtype, seed=10 + stages)
    layer = RowParallelLinear.from_linear(lin, stages=stages, streams=3, comm=comm,
                                          schedule=schedule)
    k, cols = i // d, slice(rank * (i // d), (rank + 1) * (i // d))
    assert layer.weight.shape == (k, o)
    x_local = x[:, cols].contiguous().requires_grad_()
    rows = sequence_rows(t, stages, d, rank)
    y = layer(x_local)
    assert y.shape == (t // d, o) and y.dtype == x.dtype
    y.backward(grad[rows])
    ry, rdx, rdw, _ = _reference(x, lin, grad)
    tol = TOL[dtype]
    assert _err(y, ry[rows]) < tol
    assert _err(x_local.grad, rdx[:, cols]) < tol
    assert _err(layer.weight.grad, rdw[:, cols].t()) < tol


def test_autocast_runs_the_gemms_in_bfloat16(world, comm):
    rank, d = world
    t, h = 4 * 2 * d, 16
    x, lin, grad = _data(t, h, 4 * d, "float32", seed=3)
    layer = ColumnParallelLinear.from_linear(lin, stages=2, comm=comm)
    x_local = shard_sequence(x, 2, d, rank).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x_local)
    assert y.dtype == torch.bfloat16
    n = 4
    y.float().backward(grad[:, rank * n:(rank + 1) * n])
    assert x_local.grad.dtype == torch.float32 and layer.weight.grad.dtype == torch.float32
    ry, rdx, rdw, _ = _reference(x, lin, grad)
    assert _err(y, ry[:, rank * n:(rank + 1) * n]) < TOL["bfloat16"]
    assert _err(layer.weight.grad, rdw[rank * n:(rank + 1) * n].t()) < TOL["bfloat16"]


def test_programs_are_built_once_per_shape(world, comm):
    from hostir import nn as tp

    rank, d = world
    layer = RowParallelLinear(4 * d, 8, stages=2, comm=comm)
    before = len(tp._PLANS)
    for _ in range(3):
        layer(torch.randn(4 * d, 4)).sum().backward()
    assert len(tp._PLANS) == before + 1
    layer(torch.randn(8 * d, 4))  # a new token count is a new plan
    assert len(tp._PLANS) == before + 2


def test_ring_layers_send_and_receive_only(world, comm):
    """With schedule=ring every program of both layers moves data by SendRecv alone, and
    the AllGather side's gathered input (saved for the weight gradient) holds every
    rank's rows, this rank's included (the ring never writes them there itself)."""
    from hostir import nn as tp

    rank, d = world
    t, h = 4 * d, 8 * d
    up = ColumnParallelLinear(h, 2 * h, stages=1, comm=comm, schedule="ring")
    down = RowParallelLinear(2 * h, h, stages=1, comm=comm, schedule="ring")
    x = torch.randn(t // d, h)
    down(up(x)).sum().backward()
    for layer, kind in ((up, "column"), (down, "row")):
        plan = tp._plan(kind, layer, x if kind == "column" else torch.empty(t, 2 * h // d))
        assert plan.schedule == "ring"
        for run in (plan.fwd, plan.bwd):
            kinds = {s.type for s in ir.walk(run.program.body) if isinstance(s, ir.Communication)}
            assert kinds == {ir.CommunicationType.SendRecv}, (kind, kinds)
    _, gathered, _ = tp._plan("column", up, x).column_forward(x, up.weight.detach())
    from mpi4py import MPI

    every = MPI.COMM_WORLD.allgather(x)
    torch.testing.assert_close(gathered.reshape(t, h), torch.cat(every), rtol=0, atol=0)


def test_unknown_schedule_or_comm_is_refused(world, comm):
    with pytest.raises(ValueError, match="schedule='circle': expected one of auto, pipelined, ring"):
        ColumnParallelLinear(8, 8 * world[1], comm=comm, schedule="circle")
    with pytest.raises(ValueError, match="comm='smoke': expected one of auto, torch, nccl, mpi, copy_engine"):
        RowParallelLinear(8 * world[1], 8, comm="smoke")


def test_auto_is_the_previous_default_on_cpu(world, comm):
    from hostir import nn as tp

    rank, d = world
    assert not tp.copy_engine_available(torch.device("cpu"), d)
    kind, schedule = tp._resolve(torch.device("cpu"), None, "auto", "auto")
    assert schedule == "pipelined" and kind in ("torch", "mpi")
    assert tp._resolve(torch.device("cpu"), None, comm, "ring") == (comm, "ring")


def test_refuses_tokens_that_do_not_divide(world, comm):
    from hostir.errors import LoweringError

    rank, d = world
    layer = ColumnParallelLinear(8, 4 * d, stages=4, comm=comm)
    with pytest.raises(LoweringError, match=r"expected a multiple of stages\*ranks"):
        layer(torch.randn(3, 8))  # 3*d tokens over 4 stages and d ranks
    with pytest.raises(ValueError, match=r"expected input \[tokens, 8\], got \[4, 9\]"):
        layer(torch.randn(4, 9))


# ----------------------------------------------------------------- the example loop


@pytest.mark.parametrize("schedule", ["pipelined", "ring"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_training_loss_matches_the_reference_at_every_step(world, comm, dtype, schedule):
    from hostir.jobs import train_mlp

    rank, d = world
    args = train_mlp.parse([f"--hidden={8 * d}", "--ffn-mult=2", f"--tokens={8 * d}",
                            "--steps=12", "--stages=2", f"--dtype={dtype}", f"--comm={comm}",
                            "--device=cpu", "--lr=0.2", f"--schedule={schedule}"])
    losses = train_mlp.train(args)
    ref = train_mlp.train_reference(args)
    assert len(losses) == len(ref) == 12
    tol = {"float32": 1e-5, "bfloat16": 2e-2}[dtype]
    for step, (a, b) in enumerate(zip(losses, ref)):
        assert abs(a - b) <= tol * abs(b), (step, a, b)
    assert ref[-1] < ref[0]  # it does train


# ----------------------------------------------------------------- the ring reduce-scatter


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("stages,streams,staged", [
    (1, 1, True), (1, 2, True), (2, 2, True), (4, 3, True), (1, 2, False)])
def test_ring_reduce_scatter_program_equals_reference(world, comm, stages, streams, dtype,
                                                      staged):
    """The ring form (partial sums round the ranks, this rank's rows last) gives the
    single-process product's rows of this rank; with no Stream axis too."""
    from lowering.fusion import DeviceMesh, Fusion, ParallelType as P
    from runtime.comm.base import make_communicator
    from runtime.device import CpuBackend

    rank, d = world
    communicator = make_communicator(comm)
    m, k, n = 8 * stages * d, 12 * d, 10
    if staged:
        fd = matmul_reduce_scatter(m, k, n, stages, d, dtype)
    else:
        fd = Fusion()
        a_, b_ = fd.define_tensor([m, k], dtype), fd.define_tensor([k, n], dtype)
        c_ = fd.matmul(a_, b_)
        mesh = DeviceMesh(tuple(range(d)))
        a_.split(1, d).set_mesh(mesh).parallelize(1, P.DIDx)
        b_.split(0, d).set_mesh(mesh).parallelize(0, P.DIDx)
        c_.split(0, d).set_mesh(mesh).parallelize(0, P.DIDx)
        fd.add_output(c_)
    p = lower(fd, d, streams, schedule="ring")
    assert p.provenance == "ring_reduce_scatter"
    kinds = {type(s).__name__ for s in ir.walk(p.body)}
    assert "Add" in kinds
    assert {s.type for s in ir.walk(p.body) if isinstance(s, ir.Communication)} == \
        {ir.CommunicationType.SendRecv}
    run = Interpreter(p, CpuBackend(), communicator)
    for seed in range(2):  # twice: the second run must not see the first one's buffers
        g = torch.Generator().manual_seed(100 + seed)
        a = torch.randn(m, k, generator=g).to(getattr(torch, dtype))
        b = torch.randn(k, n, generator=g).to(getattr(torch, dtype))
        kd = k // d
        a_local = shard_columns(a, d, rank).view(p.inputs[0].local_shape)
        b_local = b[rank * kd:(rank + 1) * kd].contiguous().view(1, kd, n)
        (out,) = run(a_local, b_local)
        assert out.shape == (stages, m // (stages * d), n)
        ref = (a.double() @ b.double())[stage_rows(stages, m, d, rank)]
        assert _err(out.reshape(-1, n), ref) < TOL[dtype], (stages, streams, dtype)
        if dtype == "float32":  # the same sum as the pipelined program, to rounding
            pipelined = Interpreter(lower(fd, d, streams), CpuBackend(), communicator)
            (want,) = pipelined(a_local.view(pipelined.program.inputs[0].local_shape), b_local)
            torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_host_ir_dump_names_each_layer_program(world, comm, capsys):
    """HOSTIR_DUMP=host_ir prints each program of a layer when its plan is built (rank 0),
    under a comment line naming the pass; the text parses back to the program run."""
    import dataclasses
    import re

    from hostir import nn as tp
    from hostir.options import options, set_options
    from hostir.parser import parse
    from hostir.printer import print_program

    rank, d = world
    saved = options()
    set_options(dataclasses.replace(saved, dumps=saved.dumps | {"host_ir"}))
    try:
        layer = ColumnParallelLinear(12, 6 * d, stages=1, comm=comm)  # a shape of its own
        layer(torch.randn(3 * d, 12)).sum().backward()
    finally:
        set_options(saved)
    out = capsys.readouterr().out
    if rank != 0:
        assert "%HostIr" not in out
        return
    texts = re.findall(r"^// [^\n]*\n%HostIr \{.*?^\} // %HostIr$", out, re.M | re.S)
    heads = [t.split("\n", 1)[0] for t in texts]
    assert [h.split(": ")[-1].split(" (")[0] for h in heads] == [
        "forward, AllGather+GEMM", "backward dx, GEMM+ReduceScatter"], heads
    plan = next(p for k, p in tp._PLANS.items() if k[0] == "column" and k[2:4] == (12, 6))
    assert print_program(parse(texts[0])) == print_program(plan.fwd.program)
    assert print_program(parse(texts[1])) == print_program(plan.bwd.program)
