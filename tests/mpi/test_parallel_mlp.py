"""ParallelMLP (GELU fused into the GEMM epilogues) on CPU ranks, against a float64
single-process reference of down(gelu_tanh(up(x))): outputs and every gradient. Run under
`mpirun -np N python -m pytest --with-mpi`."""

import pytest
import torch
import torch.nn.functional as F

from hostir import ir
from hostir.nn import ColumnParallelLinear, ParallelMLP, sequence_rows, shard_sequence
from tests.numerics import rel_err as _err

pytestmark = pytest.mark.mpi(min_size=2)

TOL = {"float32": 1e-5, "bfloat16": 2e-2}


def _linears(h, f, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    up = torch.nn.Linear(h, f, bias=False)
    down = torch.nn.Linear(f, h, bias=False)
    with torch.no_grad():
        up.weight.copy_(torch.randn(f, h, generator=g) / h ** 0.5)
        down.weight.copy_(torch.randn(h, f, generator=g) / f ** 0.5)
    return up.to(getattr(torch, dtype)), down.to(getattr(torch, dtype)), g


def _reference(x, up, down, dy):
    x = x.double().requires_grad_()
    w1 = up.weight.detach().double().requires_grad_()
    w2 = down.weight.detach().double().requires_grad_()
    y = F.gelu(x @ w1.t(), approximate="tanh") @ w2.t()
    y.backward(dy.double())
    return y.detach(), x.grad, w1.grad, w2.grad


@pytest.fixture(params=[False, True], ids=["dgelu_separate", "dgelu_fused"])
def fuse_backward(request, monkeypatch):
    """Both backward forms: the GELU derivative as its own pass (the default) and in the
    down projection's backward GEMM (the dgelu epilogue)."""
    from hostir.nn import linear

    monkeypatch.setattr(linear, "FUSE_DGELU", request.param)
    return request.param


@pytest.mark.parametrize("schedule", ["pipelined", "ring"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("stages", [1, 2])
def test_parallel_mlp_matches_the_reference(world, comm, stages, dtype, schedule,
                                            fuse_backward):
    rank, d = world
    t, h, f = 4 * stages * d, 16, 8 * d
    up, down, g = _linears(h, f, dtype, seed=stages)
    x = torch.randn(t, h, generator=g).to(up.weight.dtype)
    dy = torch.randn(t, h, generator=g).to(up.weight.dtype)
    mlp = ParallelMLP.from_linears(up, down, stages=stages, streams=2, comm=comm,
                                   schedule=schedule)
    x_local = shard_sequence(x, stages, d, rank).requires_grad_()
    rows = sequence_rows(t, stages, d, rank)
    y = mlp(x_local)
    assert y.shape == (t // d, h) and y.dtype == x.dtype
    y.backward(dy[rows])
    ry, rdx, rdw1, rdw2 = _reference(x, up, down, dy)
    fl, cols = f // d, slice(rank * (f // d), (rank + 1) * (f // d))
    tol = TOL[dtype]
    assert _err(y, ry[rows]) < tol
    assert _err(x_local.grad, rdx[rows]) < tol
    assert _err(mlp.up.weight.grad, rdw1[cols].t()) < tol
    assert _err(mlp.down.weight.grad, rdw2[:, cols].t()) < tol
    assert mlp.up.weight.shape == (h, fl) and mlp.down.weight.shape == (fl, h)


def test_the_programs_carry_the_epilogues(world, comm):
    from hostir import nn as tp

    rank, d = world
    mlp = ParallelMLP(8, 4 * d, stages=2, comm=comm, schedule="ring")
    x = torch.randn(4, 8)
    mlp(x).sum().backward()
    up = tp._plan("column", mlp.up, x, "gelu_aux")
    down = tp._plan("row", mlp.down, x, "dgelu", rows=4 * d)
    epilogues = lambda run: {s.epilogue for s in ir.walk(run.program.body)  # noqa: E731
                             if isinstance(s, ir.Matmul)}
    assert epilogues(up.fwd) == {"gelu_aux"} and epilogues(up.bwd) == {None}
    assert epilogues(down.fwd) == {None} and epilogues(down.bwd) == {"dgelu"}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_column_parallel_linear_with_gelu(world, comm, dtype):
    """The forward epilogue alone: the backward takes the GELU's derivative itself."""
    rank, d = world
    t, h, f = 8 * d, 12, 4 * d
    up, _, g = _linears(h, f, dtype, seed=7)
    x = torch.randn(t, h, generator=g).to(up.weight.dtype)
    layer = ColumnParallelLinear.from_linear(up, stages=2, comm=comm, activation="gelu_tanh")
    x_local = shard_sequence(x, 2, d, rank).requires_grad_()
    y = layer(x_local)
    cols = slice(rank * (f // d), (rank + 1) * (f // d))
    grad = torch.randn(t, f, generator=g).to(x.dtype)
    y.backward(grad[:, cols])
    xr = x.double().requires_grad_()
    w = up.weight.detach().double().requires_grad_()
    yr = F.gelu(xr @ w.t(), approximate="tanh")
    yr.backward(grad.double())
    tol = TOL[dtype]
    assert _err(y, yr[:, cols]) < tol
    assert _err(x_local.grad, xr.grad[sequence_rows(t, 2, d, rank)]) < tol
    assert _err(layer.weight.grad, w.grad[cols].t()) < tol


def test_refusals(world, comm):
    d = world[1]
    with pytest.raises(ValueError, match="activation='relu'"):
        ColumnParallelLinear(8, 4 * d, comm=comm, activation="relu")
    with pytest.raises(ValueError, match="fuses 'gelu_tanh' only"):
        ParallelMLP(8, 4 * d, comm=comm, activation="gelu")


@pytest.mark.parametrize("schedule", ["pipelined", "ring"])
def test_training_with_the_fused_mlp_matches_the_reference(world, comm, schedule):
    from hostir.jobs import train_mlp

    rank, d = world
    args = train_mlp.parse([f"--hidden={8 * d}", "--ffn-mult=2", f"--tokens={8 * d}",
                            "--steps=8", "--stages=2", f"--comm={comm}", "--device=cpu",
                            "--lr=0.2", f"--schedule={schedule}", "--activation=gelu_tanh"])
    losses = train_mlp.train(args)
    ref = train_mlp.train_reference(args)
    for step, (a, b) in enumerate(zip(losses, ref)):
        assert abs(a - b) <= 1e-5 * abs(b), (step, a, b)
    assert ref[-1] < ref[0]
