"""The pipelined programs on CPU ranks: run under `mpirun -np N python -m pytest --with-mpi`."""

import pytest
import torch

from hostir import ir
from hostir.errors import InputMismatchError
from lowering.patterns import allgather_matmul, shard_rows
from lowering.pipeline import lower
from runtime.interpreter import Interpreter

pytestmark = pytest.mark.mpi(min_size=2)

TOL = {"float32": 1e-5, "bfloat16": 1e-2}


@pytest.fixture(scope="module")
def mpi():
    from runtime.comm.mpi import MpiCommunicator
    from runtime.device import CpuBackend

    return CpuBackend(), MpiCommunicator()


@pytest.fixture(scope="module")
def gloo():
    from runtime.comm.torch_pg import TorchCommunicator
    from runtime.device import CpuBackend
    from runtime.session import init_torch_distributed_from_mpi

    init_torch_distributed_from_mpi("gloo")
    return CpuBackend(), TorchCommunicator()


def _inputs(m, k, n, stages, comm, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(getattr(torch, dtype))
    b = torch.randn(k, n, generator=g).to(getattr(torch, dtype))
    return a, b, shard_rows(a, stages, comm.world_size, comm.rank)


def _check(backend, comm, m, k, n, stages, streams, dtype, seed=0, schedule="pipelined"):
    p = lower(allgather_matmul(m, k, n, stages, comm.world_size, dtype), comm.world_size, streams,
              schedule=schedule)
    run = Interpreter(p, backend, comm)
    for s in range(2):  # twice: the second run must not see the first one's buffers
        a, b, shard = _inputs(m, k, n, stages, comm, dtype, seed + s)
        (out,) = run(shard, b)
        ref = a.double() @ b.double()
        err = torch.linalg.norm(out.reshape(m, n).double() - ref) / torch.linalg.norm(ref)
        assert err < TOL[dtype], (m, k, n, stages, streams, dtype, float(err))


@pytest.mark.parametrize("schedule", ["pipelined", "ring"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("stages,streams", [(1, 1), (2, 2), (4, 2), (4, 3)])
@pytest.mark.parametrize("shape", [(8, 16, 8), (24, 40, 12)])
def test_pipelined_matmul_equals_reference(mpi, shape, stages, streams, dtype, schedule):
    m, k, n = shape
    m *= stages * mpi[1].world_size
    _check(*mpi, m, k, n, stages, streams, dtype, schedule=schedule)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("stages,streams", [(1, 1), (2, 2), (4, 3)])
@pytest.mark.parametrize("schedule", ["pipelined", "ring"])
def test_pipelined_matmul_over_a_torch_process_group(gloo, stages, streams, dtype, schedule):
    _check(*gloo, 16 * stages * gloo[1].world_size, 24, 8, stages, streams, dtype, seed=7,
           schedule=schedule)


def _comm_program(kind, d, dtype="float32", **kw):
    team = tuple(range(d))
    x = ir.Tensor("T0", (d * 2, 3), dtype)
    out_shape = {"ReduceScatter": (2, 3)}.get(kind, (d * 2, 3))
    if kind == "Allgather":
        x = ir.Tensor("T0", (2, 3), dtype)
    y = ir.Tensor("T1", out_shape, dtype)
    h = ir.CommHandle("C0")
    body = (ir.Allocate(y), ir.Communication(h, ir.CommunicationType[kind], team, x, y, **kw), ir.Wait(h))
    return ir.Program((x,), (y,), body, 1)


@pytest.mark.parametrize("backend_name", ["mpi", "gloo"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_collective(request, backend_name, dtype):
    backend, comm = request.getfixturevalue(backend_name)
    d, r = comm.world_size, comm.rank
    dt = getattr(torch, dtype)
    base = lambda rank: (torch.arange(d * 2 * 3, dtype=torch.float32).reshape(d * 2, 3) + 4 * rank).to(dt)  # noqa: E731 (sums stay exact in bf16)
    total = sum(base(q).float() for q in range(d))

    (out,) = Interpreter(_comm_program("Allgather", d, dtype), backend, comm)(base(r)[:2].contiguous())
    assert torch.equal(out, torch.cat([base(q)[:2] for q in range(d)]))

    (out,) = Interpreter(_comm_program("ReduceScatter", d, dtype), backend, comm)(base(r))
    assert torch.equal(out.float(), total[2 * r:2 * r + 2].to(dt).float())

    (out,) = Interpreter(_comm_program("Allreduce", d, dtype), backend, comm)(base(r))
    assert torch.equal(out.float(), total.to(dt).float())

    (out,) = Interpreter(_comm_program("Broadcast", d, dtype, root=1), backend, comm)(base(r))
    assert torch.equal(out, base(1))

    nxt = ir.BinOp("%", ir.BinOp("+", ir.Var("rank"), ir.Const(1)), ir.Var("worldSize"))
    prv = ir.BinOp("%", ir.BinOp("-", ir.Var("rank"), ir.Const(1)), ir.Var("worldSize"))
    (out,) = Interpreter(_comm_program("SendRecv", d, dtype, send_peer=nxt, recv_peer=prv),
                         backend, comm)(base(r))
    assert torch.equal(out, base((r - 1) % d))


def test_bad_input_is_refused_before_any_collective(mpi):
    backend, comm = mpi
    d = comm.world_size
    p = lower(allgather_matmul(8 * d, 4, 4, 2, d), d, 2)
    run = Interpreter(p, backend, comm)
    shard = torch.randn(2, 1, 4, 4)
    b = torch.randn(4, 4)
    with pytest.raises(InputMismatchError, match=r"input T0 axis 2 \(Serial\): expected extent 4, got 5"):
        run(torch.randn(2, 1, 5, 4), b)
    with pytest.raises(InputMismatchError, match="input T1: expected dtype float32, got torch.float64"):
        run(shard, b.double())
    with pytest.raises(InputMismatchError, match=r"input T0 axis 1 \(DIDx\): expected extent 1"):
        run(torch.randn(2, d, 4, 4), b)
    # the ranks are still in step: a good call after the refusals works everywhere
    (out,) = run(shard, b)
    assert out.shape == (2, d, 4, 4)


def test_a_refusal_seen_by_one_rank_ends_every_rank():
    """hostir.run's agreement before the first collective: a check that fails on one rank
    only (its disk, its free memory) is every rank's refusal, with that rank's exit code."""
    from hostir.jobs import preflight as pf
    from hostir.run import EXIT_MEMORY, EXIT_OUTPUT

    world = pf.launch_world()
    assert world.size >= 2 and world.comm is not None
    assert pf.agree(None, world) is None
    mine = pf.OutputPathError("--json /x: cannot write") if world.rank == 1 else None
    got = pf.agree(mine, world)
    assert got is not None and got.code == EXIT_OUTPUT
    if world.rank == 1:
        assert got is mine
    else:
        assert str(got) == "rank 1 refused the run: --json /x: cannot write"
    # several ranks refuse for different reasons: each says its own, all exit alike
    mine = (pf.MemoryEstimateError("too big") if world.rank % 2 else
            pf.OutputPathError("unwritable") if world.rank else None)
    got = pf.agree(mine, world)
    assert got.code == EXIT_MEMORY  # rank 1's, the lowest rank that refused
    assert str(got) == ("rank 1 refused the run: too big" if mine is None else str(mine))
