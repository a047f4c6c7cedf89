"""A careless user's mistakes with ``hostir.nn`` on CPU ranks: `mpirun -np N python -m
pytest --with-mpi`. Every rank is given the same mistake; each must raise the same
HostIrError on every rank before any collective, so that the ranks stay in step (the block
that runs afterwards would hang if one of them were left inside a collective), and what
used to run silently wrong must be refused."""

import copy

import pytest
import torch

from hostir.errors import InputMismatchError, LoweringError
from hostir.nn import (ColumnParallelLinear, LlamaBlock, ParallelMLP, RowParallelLinear,
                       fused_mlp, parallelize, sequence_rows)
from tests.numerics import rel_err as _err

pytestmark = pytest.mark.mpi(min_size=2)

HIDDEN, HEADS, KV_HEADS, FFN = 32, 8, 4, 64  # kv heads divide 2 and 4 ranks


def _reference(seed=0):
    torch.manual_seed(seed)
    return LlamaBlock(HIDDEN, HEADS, KV_HEADS, FFN)


def test_fused_mlp_refuses_layers_of_different_stages(world, comm):
    """up with 1 stage, down with 2: down's output rows came back in the 2-stage order while
    the input was in the 1-stage one, so ``x + mlp(x)`` added other tokens' rows."""
    rank, d = world
    up = ColumnParallelLinear(8, 16 * d, stages=1, comm=comm)
    down = RowParallelLinear(16 * d, 8, stages=2, comm=comm)
    x = torch.randn(8, 8)[sequence_rows(8, 1, d, rank)]
    with pytest.raises(LoweringError, match="fused_mlp: up has stages=1, down stages=2"):
        fused_mlp(x, up, down)
    down = RowParallelLinear(16 * d, 8, stages=1, comm=comm)  # the same stages: it runs
    assert fused_mlp(x, up, down).shape == x.shape


def test_refusals_leave_every_rank_in_step(world, comm):
    rank, d = world
    ref = _reference()
    biased = copy.deepcopy(ref)
    o = biased.self_attn.o_proj
    biased.self_attn.o_proj = torch.nn.Linear(o.in_features, o.out_features, bias=True)
    with pytest.raises(InputMismatchError, match="unexpected weight self_attn.o_proj.bias"):
        parallelize(biased, comm=comm)  # the bias used to be dropped
    with pytest.raises(InputMismatchError, match="heads=16, but self_attn.num_heads=8"):
        parallelize(copy.deepcopy(ref), heads=2 * HEADS, kv_heads=2 * KV_HEADS, comm=comm)
    mixed = copy.deepcopy(ref)
    mixed.mlp.to(torch.bfloat16)
    with pytest.raises(InputMismatchError, match="expected dtype torch.float32"):
        parallelize(mixed, comm=comm)  # used to become an all-float32 block
    block = parallelize(copy.deepcopy(ref), comm=comm)
    t = 4 * d
    g = torch.Generator().manual_seed(3)
    x = torch.randn(t, HIDDEN, generator=g)
    rows = sequence_rows(t, 1, d, rank)
    with pytest.raises(LoweringError, match="expected dtype torch.float32 .*got torch.float64"):
        block(x[rows].double())  # used to run, float64 out of float32 GEMMs
    with pytest.raises(LoweringError, match="expected at least one token"):
        block(x[:0])
    xl = x[rows].clone().requires_grad_()
    y = block(xl)  # every rank is here, none inside a collective
    y.sum().backward()
    assert _err(y, ref(x[None])[0][rows]) < 1e-5


def test_weights_that_differ_between_ranks_are_refused_on_every_rank(world, comm):
    """Each rank seeded apart (or one weight changed on rank 1 only): the block, the
    layers and the MLP would each have run a different model a rank, silently. Every rank
    refuses with the same weight named, and the ranks stay in step."""
    rank, d = world
    others = r"\(ranks? 1(, \d)* against rank 0\)"
    with pytest.raises(InputMismatchError, match=r"parallelize: weight \S+ differs between ranks "
                       + others):
        parallelize(_reference(seed=rank), comm=comm)
    one = _reference()
    if rank == 1:
        with torch.no_grad():
            one.mlp.down_proj.weight[0, 0] += 1.0
    with pytest.raises(InputMismatchError, match=r"weight mlp.down_proj.weight differs "
                       r"between ranks \(rank 1 against rank 0\)"):
        parallelize(one, comm=comm)
    torch.manual_seed(10 + rank)
    up, down = torch.nn.Linear(8, 16 * d, bias=False), torch.nn.Linear(16 * d, 8, bias=False)
    with pytest.raises(InputMismatchError, match="ColumnParallelLinear.from_linear: weight "
                       "weight differs between ranks " + others):
        ColumnParallelLinear.from_linear(up, comm=comm)
    with pytest.raises(InputMismatchError, match="RowParallelLinear.from_linear: weight "
                       "weight differs between ranks " + others):
        RowParallelLinear.from_linear(down, comm=comm)
    with pytest.raises(InputMismatchError, match="ParallelMLP.from_linears: weight "
                       r"down.weight differs between ranks " + others):
        ParallelMLP.from_linears(up, down, comm=comm)  # the names in order: down first
    # one rank's own mistake (a bias on rank 1 only): every rank refuses, naming it,
    # where rank 0 used to wait in the exchange, or build its layer alone
    torch.manual_seed(10)
    biased = torch.nn.Linear(16 * d, 8, bias=rank == 1)
    with pytest.raises(InputMismatchError, match="RowParallelLinear.from_linear: rank 1 "
                       "refused: LoweringError: RowParallelLinear.from_linear: the linear has "
                       "a bias"):
        RowParallelLinear.from_linear(biased, comm=comm)
    torch.manual_seed(10)  # the same on every rank: built
    up = torch.nn.Linear(8, 16 * d)
    layer = ColumnParallelLinear.from_linear(up, comm=comm)
    assert torch.equal(layer.weight, up.weight[rank * 16:(rank + 1) * 16].t())
    block = parallelize(_reference(), comm=comm)
    assert block.hidden == HIDDEN
