"""Automatic CUDA-graph replay of repeated programs (runtime.graph.AutoGraphed) on one
GPU; skips without CUDA."""

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

    return Session("cuda", "nccl", auto_graph=True)


def _inputs(m, k, n, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g)
    b = torch.randn(k, n, device="cuda", generator=g)
    return a, b


def test_repeated_calls_replay_a_graph_and_return_fresh_outputs(session):
    from runtime.graph import AutoGraphed

    m, k, n, stages = 512, 256, 128, 2
    run = session.interpreter(lower(allgather_matmul(m, k, n, stages, 1, "float32"), 1, 2))
    assert isinstance(run, AutoGraphed)
    a, b = _inputs(m, k, n, 0)
    shard = shard_rows(a, stages, 1, 0)
    # eager; capture + replay; the first graph's output held: a second graph
    outs = [run(shard, b)[0] for _ in range(3)]
    assert [g.replays for g in run.graphs(shard, b)] == [1, 1] and run.eager_calls == 0
    for out in outs:
        torch.testing.assert_close(out.reshape(m, n), a @ b, rtol=1e-4, atol=1e-4)
    assert len({o.data_ptr() for o in outs}) == 3  # a later call overwrites none
    # New data in the same input tensors: the replay reads it (the shard is a view of
    # ``a`` at one rank, so ``a`` changes too: the first result is checked against a fresh
    # copy of the first inputs).
    a2, b2 = _inputs(m, k, n, 1)
    shard.copy_(shard_rows(a2, stages, 1, 0))
    b.copy_(b2)
    (out,) = run(shard, b)  # both graphs' outputs held: an eager call
    assert run.eager_calls == 1
    torch.testing.assert_close(out.reshape(m, n), a2 @ b2, rtol=1e-4, atol=1e-4)
    a0, b0 = _inputs(m, k, n, 0)
    for old in outs:
        torch.testing.assert_close(old.reshape(m, n), a0 @ b0, rtol=1e-4, atol=1e-4)
    first = outs[1].data_ptr()
    del outs, old
    (again,) = run(shard, b)  # the first graph's output is free: replayed in place
    assert again.data_ptr() == first and run.eager_calls == 1
    torch.testing.assert_close(again.reshape(m, n), a2 @ b2, rtol=1e-4, atol=1e-4)


def test_a_loop_holding_the_last_result_alternates_two_graphs_in_one_pool(session):
    m, k, n, stages = 512, 256, 256, 2
    run = session.interpreter(lower(allgather_matmul(m, k, n, stages, 1, "bfloat16"), 1, 2))
    a, b = _inputs(m, k, n, 7)
    a, b = a.bfloat16(), b.bfloat16()
    shard = shard_rows(a, stages, 1, 0)
    want = (a.double() @ b.double()).reshape(stages, 1, m // stages, n)
    results = []
    for i in range(8):
        (y,) = run(shard, b)  # the previous y is held while the call runs
        results.append(y.data_ptr())
        assert float((y.double() - want).norm() / want.norm()) < 1e-2
    graphs = run.graphs(shard, b)
    assert len(graphs) == 2 and run.eager_calls == 0
    assert all(g.inputs == [] for g in graphs)  # the inputs are read, not kept alive
    assert graphs[0].graph.pool() == graphs[1].graph.pool()
    assert results[2:] == results[2:4] * 3  # two buffers in turn


def test_other_input_tensors_get_their_own_graph_and_bad_inputs_are_refused(session):
    from hostir.errors import InputMismatchError

    m, k, n, stages = 256, 128, 64, 1
    run = session.interpreter(lower(allgather_matmul(m, k, n, stages, 1, "float32"), 1, 1))
    for seed in (2, 3):
        a, b = _inputs(m, k, n, seed)
        shard = shard_rows(a, stages, 1, 0)
        for _ in range(2):
            (out,) = run(shard, b)
            torch.testing.assert_close(out.reshape(m, n), a @ b, rtol=1e-4, atol=1e-4)
    assert len(run._graphs) == 2
    with pytest.raises(InputMismatchError, match="expected dtype float32"):
        run(shard.double(), b)


def test_alias_mode_returns_the_graphs_buffers(session):
    from runtime.graph import AutoGraphed
    from runtime.interpreter import Interpreter

    m, k, n, stages = 256, 128, 64, 2
    p = lower(allgather_matmul(m, k, n, stages, 1, "float32"), 1, 2)
    run = AutoGraphed(Interpreter(p, session.backend, session.comm), copy_outputs=False)
    a, b = _inputs(m, k, n, 4)
    shard = shard_rows(a, stages, 1, 0)
    run.prepare(shard, b)  # captures: the first timed call replays
    first, second = run(shard, b)[0], run(shard, b)[0]
    assert first.data_ptr() == second.data_ptr()
    torch.testing.assert_close(second.reshape(m, n), a @ b, rtol=1e-4, atol=1e-4)
