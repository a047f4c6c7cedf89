"""The GEMM+ReduceScatter program that runs the next residual add + norm stage by stage
(``lowering.passes.stage_norm``): its printed form, its round trip, its refusals, its
results against the unsharded reference with every rank a thread (both schedules), and
its stream structure (a stage's norm waits for that stage's rows only)."""

from __future__ import annotations

import threading

import pytest
import torch

from hostir import ir
from hostir.errors import LoweringError
from hostir.parser import parse
from hostir.printer import print_program
from hostir.verify import verify
from lowering.passes.stage_norm import fuse_stage_norm
from lowering.patterns import allgather_matmul, matmul_reduce_scatter, shard_columns, stage_rows
from lowering.pipeline import lower
from runtime import fused
from runtime.device import CpuBackend
from runtime.interpreter import Interpreter

from .threads import run_ranks


def _program(m=32, k=16, n=8, stages=2, world=2, schedule="pipelined", kind="rms_norm",
             bias=False, rank=0):
    p = lower(matmul_reduce_scatter(m, k, n, stages, world, "float32"), world, 2, rank,
              schedule=schedule)
    return fuse_stage_norm(p, kind, 1e-5, bias)


@pytest.mark.parametrize("schedule", ["pipelined", "ring"])
@pytest.mark.parametrize("kind,bias", [("rms_norm", False), ("layer_norm", True)])
def test_program_verifies_and_round_trips(schedule, kind, bias):
    p = _program(schedule=schedule, kind=kind, bias=bias)
    verify(p)
    text = print_program(p)
    assert print_program(parse(text)) == text
    launches = [s for s in ir.walk(p.body) if isinstance(s, ir.LaunchKernel)]
    assert len(launches) == 1 and launches[0].scalars == (32 // (2 * 2),)
    assert [k.generator for k in p.kernels] == ["add_norm"]
    # inputs: A, B, residual, weight (+ bias); outputs: C, n, h, (mean,) rstd
    assert len(p.inputs) == 4 + bias
    assert len(p.outputs) == 4 + (kind == "layer_norm")
    assert [t.dtype for t in p.outputs[3:]] == ["float32"] * (1 + (kind == "layer_norm"))


def test_the_norm_follows_the_stage_s_last_write():
    """Pipelined: right after the Wait of the stage's reduce-scatter, on the stage's
    stream; ring: after the add of the last partial sum, moved to the transfer stream
    (stream 1) behind a Synchronize on the compute stream, then back to stream 0."""
    for schedule in ("pipelined", "ring"):
        p = _program(schedule=schedule)
        loop = next(s for s in p.body if isinstance(s, ir.ForLoop)
                    and any(isinstance(t, ir.LaunchKernel) for t in s.body))
        pos = next(i for i, s in enumerate(loop.body) if isinstance(s, ir.LaunchKernel))
        before = [s for s in loop.body[:pos] if not isinstance(s, ir.Select)]
        stage_slice = next(s.out for s in loop.body if isinstance(s, ir.Select)
                           and s.input == p.outputs[0])
        assert loop.body[pos].args[0] == stage_slice
        if schedule == "pipelined":
            assert isinstance(before[-1], ir.Wait)
            continue
        add, switch, sync = before[-3:]
        assert isinstance(add, ir.Add) and add.out == stage_slice
        assert switch == ir.SetCurrentStream(ir.PoolStream(1))
        assert sync == ir.Synchronize(ir.PoolStream(0))
        assert loop.body[pos + 1] == ir.SetCurrentStream(ir.PoolStream(0))


def test_refusals():
    p = lower(allgather_matmul(32, 16, 8, 2, 2, "float32"), 2, 2, 0)
    with pytest.raises(LoweringError, match="expected a local"):
        fuse_stage_norm(p, "rms_norm", 1e-5)
    rs = lower(matmul_reduce_scatter(32, 16, 8, 2, 2, "float32"), 2, 2, 0)
    with pytest.raises(LoweringError, match="kind"):
        fuse_stage_norm(rs, "batch_norm", 1e-5)
    with pytest.raises(LoweringError, match="bias belongs to layer_norm"):
        fuse_stage_norm(rs, "rms_norm", 1e-5, bias=True)
    for eps in (0.0, -1e-5, float("nan")):
        with pytest.raises(LoweringError, match="eps"):
            fuse_stage_norm(rs, "rms_norm", eps)
    with pytest.raises(LoweringError, match="already runs a stage norm"):
        fuse_stage_norm(fuse_stage_norm(rs, "rms_norm", 1e-5), "rms_norm", 1e-5)


class _World:
    """Collectives between threads: every rank posts, all meet at a barrier, each reads."""

    def __init__(self, world: int):
        self.world = world
        self.barrier = threading.Barrier(world, timeout=30)
        self.slots: dict = {}


class _Done:
    def wait(self, stream=None):
        pass


class _ThreadComm:
    name = "threads"

    def __init__(self, rank: int, shared: _World):
        self.rank, self.world_size, self.shared = rank, shared.world, shared

    def _exchange(self, key, value):
        self.shared.slots[(key, self.rank)] = value
        self.shared.barrier.wait()
        got = [self.shared.slots[(key, r)] for r in range(self.world_size)]
        self.shared.barrier.wait()
        return got

    def agree(self, obj):
        return self._exchange("agree", obj)

    def barrier(self):
        self.shared.barrier.wait()

    def reduce_scatter(self, out, inp, op, stream):
        parts = self._exchange("rs", inp.clone())
        out.copy_(sum(p.chunk(self.world_size, 0)[self.rank] for p in parts))
        return _Done()

    def sendrecv(self, out, inp, send_peer, recv_peer, stream):
        self.shared.slots[("sr", self.rank, send_peer)] = inp.clone()
        self.shared.barrier.wait()
        out.copy_(self.shared.slots[("sr", recv_peer, self.rank)])
        self.shared.barrier.wait()
        return _Done()


@pytest.mark.parametrize("schedule,world,stages", [("pipelined", 2, 2), ("pipelined", 3, 1),
                                                   ("ring", 2, 2), ("ring", 4, 1)])
@pytest.mark.parametrize("kind", ["rms_norm", "layer_norm"])
def test_results_equal_the_unsharded_reference(schedule, world, stages, kind):
    m, k, n = 8 * world * stages, 6 * world, 24
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    residual = torch.randn(m, n, generator=g)
    weight, bias = torch.randn(n, generator=g), torch.randn(n, generator=g)
    bias = bias if kind == "layer_norm" else None
    want = fused.add_norm_forward_reference(a @ b, residual, weight, bias, 1e-5, kind)
    shared = _World(world)

    def rank_main(r: int):
        p = lower(matmul_reduce_scatter(m, k, n, stages, world, "float32"), world, 2, r,
                  schedule=schedule)
        it = Interpreter(fuse_stage_norm(p, kind, 1e-5, bias is not None), CpuBackend(),
                         _ThreadComm(r, shared))
        rows = stage_rows(stages, m, world, r)
        args = [shard_columns(a, world, r).view(it.program.inputs[0].local_shape),
                b[r * (k // world):(r + 1) * (k // world)].view(it.program.inputs[1].local_shape),
                residual[rows].view(stages, -1, n), weight]
        return rows, it(*args + ([bias] if bias is not None else []))

    results = run_ranks(world, shared.barrier, rank_main)
    y, h, mean, rstd = want
    for rows, (c, out_n, out_h, *stats) in results:
        torch.testing.assert_close(out_n.reshape(-1, n), y[rows], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out_h.reshape(-1, n), h[rows], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(stats[-1].reshape(-1), rstd[rows], rtol=1e-4, atol=1e-5)
        if kind == "layer_norm":
            torch.testing.assert_close(stats[0].reshape(-1), mean[rows], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("schedule", ["pipelined", "ring"])
def test_a_stage_s_norm_does_not_wait_for_the_next_stage(schedule):
    """On the stream model: stage 0's norm follows its own reduction, and stage 1's GEMMs
    do not wait for stage 0's norm (they can overlap on two streams)."""
    from .stream_model import ModelBackend, ModelComm, ModelMatmul, depends, nodes

    p = _program(stages=2, schedule=schedule)
    backend = ModelBackend()
    it = Interpreter(p, backend, ModelComm(0, 2))
    it.matmul = ModelMatmul(backend)
    norms = []

    def launch(tensors, grid, block, smem, scalars, stream):
        norms.append(stream.add(f"NORM{len(norms) + 1}"))

    it.kernels[p.kernels[0].name] = launch
    it._agreed = True
    it(*[torch.zeros(t.local_shape) for t in p.inputs])
    mm = nodes(*backend.pool, prefix="MM")
    comms = nodes(it.comm.stream, prefix="RS" if schedule == "pipelined" else "SR")
    per_stage = len(mm) // 2  # the ring: one GEMM a rank's rows
    assert len(norms) == 2 and len(mm) == 2 * per_stage
    first, second = mm[:per_stage], mm[per_stage:]
    assert all(depends(norms[0], m) for m in first)
    assert depends(norms[0], comms[len(comms) // 2 - 1])
    assert not any(depends(norms[0], m) for m in second)
    assert not any(depends(m, norms[0]) for m in second)
    assert all(depends(norms[1], m) for m in second)


@pytest.mark.parametrize("schedule", ["pipelined", "ring"])
def test_new_outputs_are_allocated_on_the_user_s_stream(schedule):
    """Beside the output's own allocation, before any switch to a worker stream: the
    caching allocator ties a block to the stream it is allocated on."""
    p = _program(schedule=schedule)
    current = "user"
    where = {}
    for s in p.body:
        if isinstance(s, ir.SetCurrentStream):
            current = "worker"
        elif isinstance(s, ir.ForLoop) and any(isinstance(t, ir.SetCurrentStream)
                                               for t in ir.walk(s.body)):
            current = "worker"
        elif isinstance(s, ir.Allocate):
            where[s.out.name] = current
    for t in p.outputs:
        assert where[t.name] == "user", (t.name, print_program(p))


def test_add_norm_generator_refuses_bad_definitions_and_arguments():
    from hostir.errors import ExecutionError
    from runtime.kernels import launcher

    bad = ir.KernelDef("k", "add_norm", (("kind", "batch_norm"), ("hidden", 8),
                                         ("bias", False), ("eps", 1e-5)))
    with pytest.raises(ExecutionError, match="add_norm needs kind"):
        launcher(bad, torch.device("cpu"))
    good = ir.KernelDef("k", "add_norm", (("kind", "rms_norm"), ("hidden", 8),
                                          ("bias", False), ("eps", 1e-5)))
    launch = launcher(good, torch.device("cpu"))
    x = torch.randn(4, 8)
    with pytest.raises(ExecutionError, match="expected 6 tensors"):
        launch([x, x, torch.ones(8)], (1, 1, 1), (32, 1, 1), 0, (4,), "cpu:0")
    y, h, rstd = torch.empty(4, 8), torch.empty(4, 8), torch.empty(4)
    launch([x, x, torch.ones(8), y, h, rstd], (1, 1, 1), (32, 1, 1), 0, (4,), "cpu:0")
    want = fused.add_norm_forward_reference(x, x, torch.ones(8), None, 1e-5, "rms_norm")
    torch.testing.assert_close(y, want[0])
    torch.testing.assert_close(h, 2 * x)
    torch.testing.assert_close(rstd, want[3])
