"""The host-overhead bench and the auto-graph option where there is no GPU."""

import json

import pytest

from hostir.errors import ExecutionError


def test_auto_graph_needs_cuda_and_a_cpu_session_keeps_plain_interpreters():
    from lowering.patterns import allgather_matmul
    from lowering.pipeline import lower
    from runtime.device import make_backend
    from runtime.graph import AutoGraphed
    from runtime.interpreter import Interpreter
    from runtime.session import Session

    p = lower(allgather_matmul(8, 4, 4, 1, 1, "float32"), 1, 1)
    s = Session("cpu", "mpi", auto_graph=True)
    with pytest.raises(ExecutionError, match="auto_graph needs the CUDA backend"):
        AutoGraphed(Interpreter(p, make_backend("cpu"), s.comm))
    assert not s.auto_graph
    assert type(s.interpreter(p)) is Interpreter


def test_bench_writes_rows_with_host_time(tmp_path):
    from benchmarks import host_overhead

    out = tmp_path / "h.json"
    assert host_overhead.main(["--device", "cpu", "--shapes", "64", "--rounds", "1",
                               "--no-layers", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["device"] == "cpu" and doc["commit"]
    assert [r["mode"] for r in doc["rows"]] == ["eager_walk", "eager"]  # no graphs on the CPU
    for row in doc["rows"]:
        assert row["what"].startswith("pipelined_matmul") and row["shape"] == "64x64x64"
        assert row["host_us"] > 0 and row["gpu_us"] is None and row["host_over_gpu"] is None


def _program_and_inputs(stages=3):
    import torch

    from lowering.patterns import allgather_matmul, shard_rows
    from lowering.pipeline import lower

    m, k, n = 12 * stages, 8, 5
    a, b = torch.randn(m, k), torch.randn(k, n)
    return lower(allgather_matmul(m, k, n, stages, 1, "float32"), 1, 2), a, b, shard_rows(a, stages, 1, 0)


def test_flat_steps_compute_what_the_statement_walk_does():
    import torch

    from hostir import ir
    from runtime.interpreter import Interpreter
    from runtime.session import Session

    s = Session("cpu", "mpi")
    p, a, b, shard = _program_and_inputs()
    flat, walk = (Interpreter(p, s.backend, s.comm, flat=f) for f in (True, False))
    (got,), (want,) = flat(shard, b), walk(shard, b)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got.reshape(a.shape[0], -1), a @ b, rtol=1e-5, atol=1e-5)
    assert walk._steps is None
    steps, statements = flat._steps

    def unrolled(body):
        return sum((s.stop - s.start) * unrolled(s.body) if isinstance(s, ir.ForLoop) else 1
                   for s in body)
    assert len(steps) == len(statements) == unrolled(p.body)
    assert not any(isinstance(x, ir.ForLoop) for x in statements)


def test_an_error_in_a_flat_step_names_its_statement():
    from runtime.interpreter import Interpreter
    from runtime.session import Session

    s = Session("cpu", "mpi")
    p, _, b, shard = _program_and_inputs()
    run = Interpreter(p, s.backend, s.comm)

    def out_of_memory(shape, dtype):
        raise RuntimeError("no memory left")
    run.backend = type(s.backend)()
    run.backend.allocate = out_of_memory
    with pytest.raises(ExecutionError, match=r"rank 0: while executing `T\d+ = ALLOCATE\(float32\[.*\]\)`: "
                                             r"RuntimeError: no memory left"):
        run(shard, b)
