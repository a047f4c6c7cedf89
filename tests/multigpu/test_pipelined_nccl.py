"""The pipelined program over NCCL on several GPUs, one rank a GPU:
`mpirun -np 2 python -m pytest --with-mpi tests/multigpu`. Skips without 2 CUDA GPUs."""

import pytest
import torch

from hostir import ir
from lowering.patterns import allgather_matmul, shard_rows
from lowering.pipeline import lower

pytestmark = [
    pytest.mark.mpi(min_size=2),
    pytest.mark.multigpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]
TOL = {"float32": 1e-5, "bfloat16": 1e-2}


@pytest.fixture(scope="module", params=["nccl", "copy_engine", "torch"])
def session(request):
    pytest.importorskip("cupy")
    from runtime.session import Session

    return Session("cuda", request.param)


@pytest.mark.parametrize("schedule", ["pipelined", "ring"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("stages,streams", [(1, 1), (2, 2), (4, 3)])
def test_pipelined_matmul_over_nccl(session, stages, streams, dtype, schedule):
    d, r = session.world_size, session.rank
    m, k, n = 128 * stages * d, 512, 384
    p = lower(allgather_matmul(m, k, n, stages, d, dtype), d, streams, schedule=schedule)
    run = session.interpreter(p)
    # The first call agrees on the inputs across ranks (a one-time host exchange, which
    # the torch backend does through a synchronizing all_gather_object); after it, a
    # call must never synchronize the host.
    run(torch.empty(p.inputs[0].local_shape, device="cuda", dtype=getattr(torch, dtype)),
        torch.empty(k, n, device="cuda", dtype=getattr(torch, dtype)))
    for seed in range(2):
        g = torch.Generator(device="cuda").manual_seed(seed)
        a = torch.randn(m, k, device="cuda", generator=g).to(getattr(torch, dtype))
        b = torch.randn(k, n, device="cuda", generator=g).to(getattr(torch, dtype))
        torch.cuda.set_sync_debug_mode("error")
        try:
            (out,) = run(shard_rows(a, stages, d, r), b)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        ref = a.double() @ b.double()
        err = float((out.reshape(m, n).double() - ref).norm() / ref.norm())
        assert err < TOL[dtype], err


def test_every_collective_over_nccl(session):
    from runtime.interpreter import Interpreter

    d, r = session.world_size, session.rank
    team = tuple(range(d))
    x = torch.arange(d * 8, dtype=torch.float32, device="cuda").reshape(d * 2, 4) + 10 * r
    total = sum(torch.arange(d * 8, dtype=torch.float32, device="cuda").reshape(d * 2, 4) + 10 * q
                for q in range(d))

    def run(kind, inp_shape, out_shape, arg, **kw):
        i = ir.Tensor("T0", inp_shape, "float32")
        o = ir.Tensor("T1", out_shape, "float32")
        h = ir.CommHandle("C0")
        p = ir.Program((i,), (o,), (ir.Allocate(o), ir.Communication(h, ir.CommunicationType[kind], team, i, o, **kw), ir.Wait(h)))
        return Interpreter(p, session.backend, session.comm)(arg)[0]

    assert torch.equal(run("Allgather", (2, 4), (2 * d, 4), x[:2].contiguous()),
                       torch.cat([(torch.arange(8, device="cuda", dtype=torch.float32).reshape(2, 4) + 10 * q) for q in range(d)]))
    assert torch.equal(run("ReduceScatter", (2 * d, 4), (2, 4), x), total[2 * r:2 * r + 2])
    assert torch.equal(run("Allreduce", (2 * d, 4), (2 * d, 4), x), total)
    assert torch.equal(run("Broadcast", (2 * d, 4), (2 * d, 4), x, root=1), x - 10 * r + 10)
    nxt = ir.BinOp("%", ir.BinOp("+", ir.Var("rank"), ir.Const(1)), ir.Var("worldSize"))
    prv = ir.BinOp("%", ir.BinOp("-", ir.Var("rank"), ir.Const(1)), ir.Var("worldSize"))
    got = run("SendRecv", (2 * d, 4), (2 * d, 4), x, send_peer=nxt, recv_peer=prv)
    assert torch.equal(got, x - 10 * r + 10 * ((r - 1) % d))


@pytest.mark.parametrize("schedule", ["pipelined", "ring"])
def test_graph_capture_of_a_program(session, schedule):
    from runtime.graph import capture

    d, r = session.world_size, session.rank
    m, k, n = 256 * d, 256, 128
    p = lower(allgather_matmul(m, k, n, 2, d, "bfloat16"), d, 2, schedule=schedule)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    graphed = capture(session.interpreter(p), shard_rows(a, 2, d, r), b)
    for seed in range(2):  # new data copied into the captured inputs, then replay
        g = torch.Generator(device="cuda").manual_seed(100 + seed)
        a = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        graphed.inputs[0].copy_(shard_rows(a, 2, d, r))
        (out,) = graphed()
        ref = a.double() @ b.double()
        assert float((out.reshape(m, n).double() - ref).norm() / ref.norm()) < 1e-2
