"""Tensor-parallel layers on several GPUs, one rank a GPU, bf16:
`mpirun -np 2 python -m pytest --with-mpi tests/multigpu`. Skips without 2 CUDA GPUs.

Every rank builds the same global data from the same seed, runs its shard through the
layers, and compares outputs and every gradient with a float64 reference on its GPU."""

import pytest
import torch
from tests.numerics import rel_err as _err

pytestmark = [
    pytest.mark.mpi(min_size=2),
    pytest.mark.multigpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]
TOL = 2e-2  # bf16 inputs, partial sums and outputs


@pytest.fixture(scope="module", params=["torch", "nccl"])
def comm(request):
    """The caller's NCCL process group, and hostir's own NCCL communicator (CuPy)."""
    if request.param == "nccl":
        pytest.importorskip("cupy")
    return request.param


def _data(t, i, o, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(t, i, generator=g, device=device).bfloat16()
    lin = torch.nn.Linear(i, o, bias=False, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(o, i, generator=g, device=device) / i ** 0.5)
    grad = torch.randn(t, o, generator=g, device=device).bfloat16()
    return x, lin, grad


def _reference(x, lin, grad):
    x = x.double().requires_grad_()
    w = lin.weight.detach().double().requires_grad_()
    y = x @ w.t()
    y.backward(grad.double())
    return y.detach(), x.grad, w.grad


@pytest.mark.parametrize("stages,streams", [(1, 1), (2, 2), (4, 3)])
def test_column_parallel_linear_bf16(world, comm, stages, streams):
    from hostir.nn import ColumnParallelLinear, sequence_rows, shard_sequence

    rank, d, dev = world
    t, i, o = 64 * stages * d, 256, 128 * d
    x, lin, grad = _data(t, i, o, dev, seed=stages)
    layer = ColumnParallelLinear.from_linear(lin, stages=stages, streams=streams, comm=comm)
    x_local = shard_sequence(x, stages, d, rank).requires_grad_()
    side = torch.cuda.Stream()  # the caller's stream is not the default one
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = layer(x_local)
        cols = slice(rank * (o // d), (rank + 1) * (o // d))
        y.backward(grad[:, cols])
    torch.cuda.current_stream().wait_stream(side)
    ry, rdx, rdw = _reference(x, lin, grad)
    assert y.dtype == torch.bfloat16
    assert _err(y, ry[:, cols]) < TOL
    assert _err(x_local.grad, rdx[sequence_rows(t, stages, d, rank).to(dev)]) < TOL
    assert _err(layer.weight.grad, rdw[cols].t()) < TOL


@pytest.mark.parametrize("stages,streams", [(1, 1), (2, 2), (4, 3)])
def test_row_parallel_linear_bf16(world, comm, stages, streams):
    from hostir.nn import RowParallelLinear, sequence_rows

    rank, d, dev = world
    t, i, o = 64 * stages * d, 128 * d, 256
    x, lin, grad = _data(t, i, o, dev, seed=10 + stages)
    layer = RowParallelLinear.from_linear(lin, stages=stages, streams=streams, comm=comm)
    cols = slice(rank * (i // d), (rank + 1) * (i // d))
    rows = sequence_rows(t, stages, d, rank).to(dev)
    x_local = x[:, cols].contiguous().requires_grad_()
    y = layer(x_local)
    y.backward(grad[rows])
    ry, rdx, rdw = _reference(x, lin, grad)
    assert _err(y, ry[rows]) < TOL
    assert _err(x_local.grad, rdx[:, cols]) < TOL
    assert _err(layer.weight.grad, rdw[:, cols].t()) < TOL


def _check_mlp_block(y, xl, block, x, w1, w2, grad, rows, rank, d):
    """The block's output and all gradients (this rank's rows and weight slices) against
    a float64 reference of x + gelu(x W1^T) W2^T."""
    import torch.nn.functional as F

    xr = x.double().requires_grad_()
    w1r, w2r = w1.double().requires_grad_(), w2.double().requires_grad_()
    yr = xr + F.gelu(xr @ w1r.t()) @ w2r.t()
    yr.backward(grad.double())
    fl = w1.shape[0] // d
    assert _err(y, yr[rows]) < TOL
    assert _err(xl.grad, xr.grad[rows]) < TOL
    assert _err(block.up.weight.grad, w1r.grad[rank * fl:(rank + 1) * fl].t()) < TOL
    assert _err(block.down.weight.grad, w2r.grad[:, rank * fl:(rank + 1) * fl].t()) < TOL


def test_mlp_block_under_autocast(world, comm):
    """fp32 parameters, bf16 autocast: the block's output and gradients match a float64
    reference of x + gelu(x W1^T) W2^T."""
    from hostir.jobs.train_mlp import MLPBlock
    from hostir.nn import sequence_rows, shard_sequence

    rank, d, dev = world
    t, h, f, S = 128 * d, 256, 512, 2
    g = torch.Generator(device=dev).manual_seed(5)
    x = torch.randn(t, h, generator=g, device=dev)
    w1 = torch.randn(f, h, generator=g, device=dev) / h ** 0.5
    w2 = torch.randn(h, f, generator=g, device=dev) / f ** 0.5
    grad = torch.randn(t, h, generator=g, device=dev)
    block = MLPBlock.from_weights(w1, w2, torch.float32, dev, stages=S, comm=comm)
    xl = shard_sequence(x, S, d, rank).requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = block(xl)
    rows = sequence_rows(t, S, d, rank).to(dev)
    y.float().backward(grad[rows])
    _check_mlp_block(y, xl, block, x, w1, w2, grad, rows, rank, d)


@pytest.mark.parametrize("extra", [
    ["--comm=torch"],               # the layers over the caller's NCCL group, exact GELU
    ["--activation=gelu_tanh"],     # the fused MLP (GELU in the GEMM epilogues), default comm
])
def test_training_loss_matches_the_reference(world, extra):
    from hostir.jobs import train_mlp

    rank, d, dev = world
    args = train_mlp.parse([f"--hidden={64 * d}", "--ffn-mult=2", f"--tokens={128 * d}",
                            "--steps=8", "--stages=2", "--dtype=bfloat16", "--device=cuda",
                            "--lr=0.2", *extra])
    losses = train_mlp.train(args)
    ref = train_mlp.train_reference(args)  # one process, CPU, bf16, the same GELU unfused
    for step, (a, b) in enumerate(zip(losses, ref)):
        assert abs(a - b) <= 3e-2 * abs(b), (step, a, b)


# ------------------------------------------------ the ring schedules over the copy engine


def test_the_default_is_the_ring_over_the_copy_engine(world):
    """Two GPUs of one node, launched by mpirun: ``auto`` picks the copy engine and the
    ring (see hostir.nn)."""
    from hostir import nn as tp

    rank, d, dev = world
    assert tp.copy_engine_available(dev, d)
    assert tp._resolve(dev, None, "auto", "auto") == ("copy_engine", "ring")
    assert tp._resolve(dev, None, "torch", "auto") == ("torch", "pipelined")


@pytest.mark.parametrize("comm,schedule", [("copy_engine", "ring"), ("auto", "auto"),
                                           ("nccl", "ring")])
@pytest.mark.parametrize("stages", [1, 2])
def test_mlp_block_ring_bf16(world, comm, schedule, stages):
    """x + down(gelu(up(x))) with both layers' forward and backward as rings (AllGather+GEMM
    local rows first, GEMM+ReduceScatter local rows last), on a caller's stream that is
    not the default one: output and every gradient against a float64 reference."""
    from hostir.jobs.train_mlp import MLPBlock
    from hostir.nn import sequence_rows, shard_sequence

    if comm == "nccl":
        pytest.importorskip("cupy")
    rank, d, dev = world
    t, h, f = 64 * stages * d, 256, 512
    g = torch.Generator(device=dev).manual_seed(11 + stages)
    x = torch.randn(t, h, generator=g, device=dev).bfloat16()
    w1 = (torch.randn(f, h, generator=g, device=dev) / h ** 0.5).bfloat16()
    w2 = (torch.randn(h, f, generator=g, device=dev) / f ** 0.5).bfloat16()
    grad = torch.randn(t, h, generator=g, device=dev).bfloat16()
    block = MLPBlock.from_weights(w1, w2, torch.bfloat16, dev, stages=stages, comm=comm,
                                  schedule=schedule)
    from hostir import nn as tp

    xl = shard_sequence(x, stages, d, rank).requires_grad_()
    rows = sequence_rows(t, stages, d, rank).to(dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = block(xl)
        y.backward(grad[rows])
    torch.cuda.current_stream().wait_stream(side)
    plan = tp._plan("column", block.up, xl.detach())
    assert plan.schedule == "ring"
    if comm != "nccl":
        assert plan.rt.comm.name == "copy_engine"
    _check_mlp_block(y, xl, block, x, w1, w2, grad, rows, rank, d)


def test_ring_reduce_scatter_program_over_the_copy_engine(world):
    """The GEMM+ReduceScatter ring program alone, host never synchronized after the
    first call (the copy engine's barriers are device-side)."""
    from lowering.patterns import matmul_reduce_scatter, shard_columns, stage_rows
    from lowering.pipeline import lower
    from runtime.comm.copy_engine import CopyEngineCommunicator
    from runtime.comm.torch_pg import TorchCommunicator
    from runtime.device import CudaBackend
    from runtime.interpreter import Interpreter

    rank, d, dev = world
    m, k, n, S = 256 * d, 128 * d, 192, 2
    comm = CopyEngineCommunicator(TorchCommunicator())
    p = lower(matmul_reduce_scatter(m, k, n, S, d, "bfloat16"), d, 2, schedule="ring")
    run = Interpreter(p, CudaBackend(dev), comm)
    g = torch.Generator(device=dev).manual_seed(3)
    a = torch.randn(m, k, generator=g, device=dev).bfloat16()
    b = torch.randn(k, n, generator=g, device=dev).bfloat16()
    kd = k // d
    a_local = shard_columns(a, d, rank).view(p.inputs[0].local_shape)
    b_local = b[rank * kd:(rank + 1) * kd].contiguous().view(1, kd, n)
    run(a_local, b_local)  # the first call agrees on the inputs and reserves the buffer
    torch.cuda.set_sync_debug_mode("error")
    try:
        (out,) = run(a_local, b_local)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ref = (a.double() @ b.double())[stage_rows(S, m, d, rank).to(dev)]
    assert _err(out.reshape(-1, n), ref) < TOL


def test_copy_engine_sendrecv_runs_no_kernel_beside_a_gemm(world):
    """The copy-engine SendRecv's barriers are stream memory operations: no kernel (which
    a GEMM filling every SM would hold off), and every message arrives intact while GEMMs
    run on another stream, the host never waiting."""
    from torch.profiler import ProfilerActivity, profile

    from runtime.comm.copy_engine import CopyEngineCommunicator, _SignalBarrier
    from runtime.comm.torch_pg import TorchCommunicator

    rank, d, dev = world
    comm = CopyEngineCommunicator(TorchCommunicator())
    send_peer, recv_peer = (rank + 1) % d, (rank - 1) % d
    big = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    side = torch.cuda.Stream(dev)
    warm = torch.zeros(1 << 20, device=dev)
    comm.sendrecv(torch.empty_like(warm), warm, send_peer, recv_peer).wait(torch.cuda.current_stream())
    torch.cuda.synchronize()
    assert isinstance(comm._signals, _SignalBarrier)
    sent, received = [], []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(20):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    big @ big
            inp = torch.full((1 << 20,), float(i * d + rank), device=dev)
            out = torch.empty_like(inp)
            comm.sendrecv(out, inp, send_peer, recv_peer).wait(torch.cuda.current_stream())
            sent.append(inp)
            received.append(out)
        torch.cuda.synchronize()
    for i, out in enumerate(received):
        assert torch.all(out == float(i * d + recv_peer)), f"message {i}"
    names = {e.key for e in prof.key_averages() if e.device_type.name == "CUDA"}
    assert not [n for n in names if "barrier" in n.lower()], sorted(names)


@pytest.mark.parametrize("schedule", ["auto", "pipelined"])
def test_transformer_block_bf16(world, schedule):
    """ParallelTransformerBlock (Llama style, GQA) on every GPU against the unsharded
    LlamaBlock in float64 from the same bf16-rounded weights: output, input gradient and
    every parameter's gradient (this rank's shards)."""
    import copy

    from hostir.nn import LlamaBlock, parallelize, sequence_rows
    from hostir.nn.llama import shard_state_dict

    rank, d, dev = world
    torch.manual_seed(0)
    ref = LlamaBlock(512, 8 * d, 2 * d, 512 * d).bfloat16()
    with torch.no_grad():
        ref.input_layernorm.weight.uniform_(0.5, 1.5)
    block = parallelize(copy.deepcopy(ref).to(dev), schedule=schedule)
    t = 256 * d
    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(t, 512, generator=g, device=dev).bfloat16()
    dy = torch.randn(t, 512, generator=g, device=dev).bfloat16()
    rows = sequence_rows(t, block.stages, d, rank).to(dev)
    x_local = x[rows].clone().requires_grad_()
    y = block(x_local)
    y.backward(dy[rows])
    ref64 = ref.to(dev).double()
    xr = x.double().requires_grad_()
    yr = ref64(xr[None])[0]
    yr.backward(dy.double())
    assert _err(y, yr[rows]) < 3e-2
    assert _err(x_local.grad, xr.grad[rows]) < 3e-2
    want = shard_state_dict({n: p.grad for n, p in ref64.named_parameters()}, block)
    for name, p in block.named_parameters():
        assert _err(p.grad, want[name]) < 3e-2, name
