"""The interpreter on one GPU (a world of one rank, NCCL through CuPy); skips without CUDA."""

import pytest
import torch

from lowering.patterns import allgather_matmul, shard_rows
from lowering.pipeline import lower

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def session():
    pytest.importorskip("cupy")
    from runtime.session import Session

    return Session("cuda", "nccl", auto_graph=False)  # the eager interpreter


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 1e-2)])
@pytest.mark.parametrize("stages,streams", [(1, 1), (2, 2), (4, 3)])
def test_program_on_one_gpu_never_blocks_the_host(session, stages, streams, dtype, tol):
    m, k, n = 256 * stages, 384, 192
    p = lower(allgather_matmul(m, k, n, stages, 1, dtype), 1, streams)
    run = session.interpreter(p)
    g = torch.Generator(device="cuda").manual_seed(stages)
    a = torch.randn(m, k, device="cuda", generator=g).to(getattr(torch, dtype))
    b = torch.randn(k, n, device="cuda", generator=g).to(getattr(torch, dtype))
    user = torch.cuda.Stream()
    with torch.cuda.stream(user):
        shard = shard_rows(a, stages, 1, 0)
        torch.cuda.set_sync_debug_mode("error")  # any host synchronization raises
        try:
            (out,) = run(shard, b)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert torch.cuda.current_stream() == user  # the program ended on the user's stream
        got = out.reshape(m, n).double().cpu()      # ordered after every worker stream
    ref = (a.double() @ b.double()).cpu()
    assert float((got - ref).norm() / ref.norm()) < tol


def test_worker_streams_are_reused(session):
    p = lower(allgather_matmul(512, 64, 64, 4, 1), 1, 2)
    run = session.interpreter(p)
    a, b = torch.randn(512, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    run(shard_rows(a, 4, 1, 0), b)
    pool = list(session.backend._pool)
    run(shard_rows(a, 4, 1, 0), b)
    assert session.backend._pool == pool and len(pool) >= 2  # the fixture is shared
