"""ParallelMLP on 2 GPUs (GELU fused into cuBLASLt epilogues): outputs and every gradient
against a float64 reference and against the unfused layers with the same tanh GELU, over
the copy-engine ring and the caller's NCCL group (its training loop is tested in
tests/multigpu/test_tp_layers_gpu.py).
`mpirun -np 2 python -m pytest --with-mpi tests/multigpu/test_parallel_mlp_gpu.py`."""

import pytest
import torch
import torch.nn.functional as F
from tests.numerics import rel_err as _err

pytestmark = [
    pytest.mark.mpi(min_size=2),
    pytest.mark.multigpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]
TOL = 2e-2


@pytest.mark.parametrize("comm,schedule", [("copy_engine", "ring"), ("torch", "pipelined")])
@pytest.mark.parametrize("stages", [1, 2])
def test_fused_mlp_matches_reference_and_unfused(world, comm, schedule, stages):
    from hostir import ir
    from hostir import nn as tp
    from hostir.jobs.train_mlp import MLPBlock
    from hostir.nn import sequence_rows, shard_sequence

    rank, d, dev = world
    t, h, f = 256 * stages * d, 512, 1024
    g = torch.Generator(device=dev).manual_seed(21 + stages)
    x = torch.randn(t, h, generator=g, device=dev).bfloat16()
    w1 = (torch.randn(f, h, generator=g, device=dev) / h ** 0.5).bfloat16()
    w2 = (torch.randn(h, f, generator=g, device=dev) / f ** 0.5).bfloat16()
    grad = torch.randn(t, h, generator=g, device=dev).bfloat16()
    rows = sequence_rows(t, stages, d, rank).to(dev)
    results = {}
    for fused in (True, False):
        block = MLPBlock.from_weights(w1, w2, torch.bfloat16, dev, "gelu_tanh", fused,
                                      stages=stages, comm=comm, schedule=schedule)
        xl = shard_sequence(x, stages, d, rank).requires_grad_()
        y = block(xl)
        y.backward(grad[rows])
        results[fused] = (y, xl.grad, block.up.weight.grad, block.down.weight.grad)
        if fused:
            plan = tp._plan("row", block.down, xl.detach(), "dgelu", rows=t)
            assert {s.epilogue for s in ir.walk(plan.bwd.program.body)
                    if isinstance(s, ir.Matmul)} == {"dgelu"}
    xr = x.double().requires_grad_()
    w1r, w2r = w1.double().requires_grad_(), w2.double().requires_grad_()
    yr = xr + F.gelu(xr @ w1r.t(), approximate="tanh") @ w2r.t()
    yr.backward(grad.double())
    fl = f // d
    ref = (yr[rows], xr.grad[rows], w1r.grad[rank * fl:(rank + 1) * fl].t(),
           w2r.grad[:, rank * fl:(rank + 1) * fl].t())
    for name, got, unfused, want in zip(("y", "dx", "dw1", "dw2"), results[True],
                                        results[False], ref):
        assert _err(got, want) < TOL, name
        assert _err(got, unfused) < TOL, name
