"""What may overlap in the lowered programs, checked on a model of stream ordering
(tests/unit/stream_model.py), without a GPU: a transfer must not wait for an earlier
stage's GEMM, a GEMM must wait for its own transfer, and the user's stream must end after
everything."""

import pytest
import torch

from lowering.patterns import allgather_matmul
from lowering.pipeline import lower
from runtime.interpreter import Interpreter

from .stream_model import ModelBackend, ModelComm, ModelMatmul, depends, nodes


def run_model(schedule: str, stages: int, streams: int, world: int = 2):
    p = lower(allgather_matmul(16 * stages * world, 8, 4, stages, world), world, streams,
              schedule=schedule)
    backend, comm = ModelBackend(), ModelComm(0, world)
    it = Interpreter(p, backend, comm)
    it.matmul = ModelMatmul(backend)
    it._agreed = True  # no input exchange in the model
    it(torch.zeros(p.inputs[0].local_shape), torch.zeros(p.inputs[1].local_shape))
    return backend, comm


@pytest.mark.parametrize("stages,streams", [(2, 2), (4, 2), (4, 3), (8, 4)])
def test_pipelined_stages_overlap(stages, streams):
    backend, comm = run_model("pipelined", stages, streams)
    ags = nodes(comm.stream, prefix="AG")
    mms = nodes(*backend.pool, prefix="MM")
    assert len(ags) == len(mms) == stages
    for i in range(stages):
        assert depends(mms[i], ags[i]), f"stage {i}'s GEMM must wait for its Allgather"
        # Stage i shares its worker with stage i - streams (round robin): it may wait for
        # that stage's GEMM, and must not wait for the GEMMs of the stages in between.
        for j in range(max(0, i - streams + 1), i):
            assert not depends(ags[i], mms[j]), \
                f"stage {i}'s Allgather waits for stage {j}'s GEMM: the stages are serialized"
    for i in range(1, stages):
        assert depends(ags[i], ags[i - 1]), "collectives of one communicator stay in order"


@pytest.mark.parametrize("world,stages", [(2, 1), (2, 2), (4, 1), (4, 2)])
def test_ring_transfers_overlap_the_gemms(world, stages):
    backend, comm = run_model("ring", stages, 2, world)
    srs = nodes(comm.stream, prefix="SR")
    mms = nodes(*backend.pool, prefix="MM")
    assert len(srs) == (world - 1) * stages and len(mms) == world * stages
    # per stage: the local GEMM first (no transfer), then one GEMM per received shard
    for s in range(stages):
        local = mms[s * world]
        assert not any(depends(local, sr) for sr in srs[s * (world - 1):(s + 1) * (world - 1)])
        for j in range(world - 1):
            sr, mm = srs[s * (world - 1) + j], mms[s * world + 1 + j]
            assert depends(mm, sr), "a GEMM waits for its own shard"
            assert not depends(sr, local), "a transfer must not wait for the local GEMM"


@pytest.mark.parametrize("schedule", ["pipelined", "ring"])
def test_the_user_stream_ends_after_everything(schedule):
    backend, comm = run_model(schedule, 2, 2)
    end = backend.user.last()
    for n in nodes(comm.stream, *backend.pool, prefix=""):
        assert n is end or depends(end, n), f"{n.label} is not joined into the user's stream"


@pytest.mark.parametrize("stages,streams", [(2, 2), (4, 2), (4, 3)])
def test_reduce_scatter_stages_overlap(stages, streams):
    from lowering.patterns import matmul_reduce_scatter

    world = 2
    p = lower(matmul_reduce_scatter(16 * stages * world, 8, 4, stages, world), world, streams)
    backend, comm = ModelBackend(), ModelComm(0, world)
    it = Interpreter(p, backend, comm)
    it.matmul = ModelMatmul(backend)
    it._agreed = True
    it(*(torch.zeros(t.local_shape) for t in p.inputs))
    rss = nodes(comm.stream, prefix="RS")
    mms = nodes(*backend.pool, prefix="MM")
    assert len(rss) == len(mms) == stages
    for i in range(stages):
        assert depends(rss[i], mms[i]), "a stage's ReduceScatter waits for its partial GEMM"
        for j in range(max(0, i - streams + 1), i):
            assert not depends(mms[i], rss[j]), \
                f"stage {i}'s GEMM waits for stage {j}'s ReduceScatter: serialized"


def run_ring_reduce_scatter(world: int, stages: int, monkeypatch):
    """The ring GEMM+ReduceScatter on the stream model; adds are recorded as nodes too."""
    from hostir import ir
    from lowering.patterns import matmul_reduce_scatter
    from runtime import interpreter

    p = lower(matmul_reduce_scatter(8 * stages * world, 4 * world, 4, stages, world), world, 2,
              schedule="ring")
    backend, comm = ModelBackend(), ModelComm(0, world)
    count = iter(range(1, 10**6))
    monkeypatch.setitem(interpreter._RULES, ir.Add,
                        lambda it, s, f: backend.current.add(f"ADD{next(count)}"))
    it = Interpreter(p, backend, comm)
    it.matmul = ModelMatmul(backend)
    it._agreed = True
    it(*(torch.zeros(t.local_shape) for t in p.inputs))
    return backend, comm


@pytest.mark.parametrize("world,stages", [(2, 1), (2, 2), (3, 1), (4, 2)])
def test_ring_reduce_scatter_transfers_overlap_the_gemms(world, stages, monkeypatch):
    backend, comm = run_ring_reduce_scatter(world, stages, monkeypatch)
    srs = nodes(comm.stream, prefix="SR")
    mms = nodes(*backend.pool, prefix="MM")
    adds = nodes(*backend.pool, prefix="ADD")
    steps = world - 1
    assert len(srs) == len(adds) == steps * stages and len(mms) == world * stages
    for s in range(stages):
        for j in range(steps):
            sr, add = srs[s * steps + j], adds[s * steps + j]
            sent, next_mm = mms[s * world + j], mms[s * world + j + 1]
            assert depends(sr, sent), "a transfer waits for the partial sum it sends"
            if j:
                assert depends(sr, adds[s * steps + j - 1]), \
                    "a transfer waits for the add that completed its partial sum"
            assert not depends(next_mm, sr), \
                "the next GEMM (the last one: this rank's rows) must not wait for the transfer"
            assert depends(add, sr) and depends(add, next_mm), \
                "an add waits for the received partial sum and for its own GEMM"
    end = backend.user.last()
    for n in nodes(comm.stream, *backend.pool, prefix=""):
        assert n is end or depends(end, n), f"{n.label} is not joined into the user's stream"
