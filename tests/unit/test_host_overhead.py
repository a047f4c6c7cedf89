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


@pytest.mark.parametrize("pattern,what", [("allgather", "pipelined_matmul"),
                                          ("reduce_scatter", "matmul_reduce_scatter")])
def test_bench_writes_rows_with_host_time(tmp_path, pattern, what):
    from benchmarks import host_overhead

    out = tmp_path / "h.json"
    assert host_overhead.main(["--device", "cpu", "--shapes", "64", "--rounds", "1",
                               "--pattern", pattern, "--no-layers", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["device"] == "cpu" and doc["commit"] and doc["pattern"] == pattern
    assert [r["mode"] for r in doc["rows"]] == ["eager_walk", "eager"]  # no graphs on the CPU
    for row in doc["rows"]:
        assert row["what"] == f"{what} S2 D1" and row["shape"] == "64x64x64"
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


_LOOP = """\
%HostIr {
  numberOfStreams = 2
  inputs:
    T0 : float32[3, 4, 5]
    T1 : float32[4, 3, 5]
  outputs: T2
  GetCurrentStream into Stream s0
  T2 = ALLOCATE(float32[3, 4, 5])
  FOR i in range(0, 3):
    SetCurrentStream to Stream (i % numberOfStreams)
    Synchronize Stream s0
    T3 = select(T0, axis=0, index=i)
    T4 = select(T1, axis=1, index=(2 - i))
    T5 = select(T2, axis=0, index=i)
    T5 = add(T3, T4)
    SetCurrentStream to Stream s0
    Synchronize Stream (i % numberOfStreams)
} // %HostIr
"""


@pytest.mark.parametrize("flat", [True, False])
def test_a_loops_selects_take_each_index_and_each_calls_inputs(flat):
    """The flat steps resolve each Select's index once, per loop index (axis 0 and
    others), but read the tensors of the call: a second call with other inputs (and
    another output buffer) computes from those."""
    import torch

    from hostir.parser import parse
    from runtime.device import CpuBackend
    from runtime.interpreter import Interpreter

    run = Interpreter(parse(_LOOP), CpuBackend(), flat=flat)
    firsts = []
    for seed in (0, 1):
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(3, 4, 5, generator=g), torch.randn(4, 3, 5, generator=g)
        (out,) = run(x, y)
        want = torch.stack([x[i] + y[:, 2 - i] for i in range(3)])
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        firsts.append(out)
    assert firsts[0].data_ptr() != firsts[1].data_ptr()  # each call its own output
    assert not torch.equal(firsts[0], firsts[1])


@pytest.mark.parametrize("pattern", ["allgather", "reduce_scatter"])
def test_flat_calls_with_other_inputs_compute_from_them(pattern):
    """The same flat interpreter called on new inputs (then on the first ones again)
    gives each call's product: nothing of an earlier call is reused."""
    import torch

    from lowering.patterns import allgather_matmul, matmul_reduce_scatter, shard_rows
    from lowering.pipeline import lower
    from runtime.interpreter import Interpreter
    from runtime.session import Session

    s = Session("cpu", "mpi")
    stages, m, k, n = 4, 16, 8, 6
    make = allgather_matmul if pattern == "allgather" else matmul_reduce_scatter
    p = lower(make(m, k, n, stages, 1, "float32"), 1, 2)
    run = Interpreter(p, s.backend, s.comm)
    calls = []
    for seed in (0, 1, 0):
        g = torch.Generator().manual_seed(seed)
        a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
        a_in = shard_rows(a, stages, 1, 0) if pattern == "allgather" else a
        (out,) = run(a_in.view(p.inputs[0].local_shape), b.view(p.inputs[1].local_shape))
        torch.testing.assert_close(out.reshape(m, n), a @ b, rtol=1e-5, atol=1e-5)
        calls.append(out)
    torch.testing.assert_close(calls[0], calls[2], rtol=0, atol=0)
    assert not torch.equal(calls[0], calls[1])


@pytest.mark.parametrize("shape", [(), (3,), (2, 1, 4)])
def test_the_cpu_backend_allocates_every_rank_of_shape(shape):
    import torch

    from runtime.device import CpuBackend

    x = CpuBackend().allocate(shape, "bfloat16")
    assert tuple(x.shape) == shape and x.dtype == torch.bfloat16 and x.is_contiguous()
