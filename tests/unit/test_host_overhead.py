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


class _FakeGraph:
    """A captured program as `runtime.graph.GraphedProgram` is to `AutoGraphed`: output
    buffers of its own, rewritten by each replay from the inputs it was captured on."""

    def __init__(self, fn, args, pool):
        import types

        self.fn, self.args, self.pool, self.replays = fn, args, pool, 0
        self.outputs = [o.clone() for o in fn(*args)]
        self.graph = types.SimpleNamespace(pool=lambda: ("pool of", id(self)))

    def __call__(self):
        self.replays += 1
        for o, v in zip(self.outputs, self.fn(*self.args)):
            o.copy_(v)
        return self.outputs


def _fake_auto_graphed(monkeypatch, copy_outputs=True):
    import types

    import torch

    from runtime.graph import AutoGraphed

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)

    def program(x):
        return [x * 2, (x + 1)[:2]]

    interpreter = types.SimpleNamespace(backend=types.SimpleNamespace(name="cuda"))
    run = AutoGraphed(interpreter, copy_outputs=copy_outputs)
    run.interpreter = program  # eager calls
    captured = []

    def capture(args, pool=None):
        captured.append(pool)
        return _FakeGraph(program, args, pool)
    monkeypatch.setattr(run, "_capture", capture)
    return run, captured


def test_auto_graph_never_overwrites_a_result_the_caller_holds(monkeypatch):
    """Calls replay a graph none of whose outputs the caller holds (a view counts); while
    the caller holds the first graph's, a second is captured in its memory pool; while
    it holds both, the outputs are copied out. Each result keeps its own call's values."""
    import torch

    run, captured = _fake_auto_graphed(monkeypatch)
    x = torch.arange(4.0)
    first = run(x)  # eager
    assert captured == [] and run.copies == 0
    x.fill_(1)
    a = run(x)  # captures the input set's first graph
    assert captured == [None]
    x.fill_(2)
    b = run(x)  # `a` is held: a second graph, sharing the first one's pool
    assert len(captured) == 2 and captured[1][0] == "pool of"
    assert a[0].data_ptr() != b[0].data_ptr()
    torch.testing.assert_close(first[0], torch.arange(4.0) * 2)
    torch.testing.assert_close(a[0], torch.full((4,), 2.0))
    torch.testing.assert_close(b[0], torch.full((4,), 4.0))
    ptr_a = a[0].data_ptr()
    del a
    x.fill_(3)
    c = run(x)  # the first graph's outputs are free again: replayed, nothing copied
    assert c[0].data_ptr() == ptr_a and run.copies == 0 and len(captured) == 2
    view = c[1][1:]  # a view of an output holds its graph's outputs
    del c
    x.fill_(4)
    d = run(x)  # `b` and the view hold both graphs: an eager call
    assert run.eager_calls == 1 and run.copies == 0 and len(captured) == 2
    assert d[0].data_ptr() not in (ptr_a, b[0].data_ptr())
    torch.testing.assert_close(view, torch.full((1,), 4.0))  # still call c's value
    torch.testing.assert_close(b[0], torch.full((4,), 4.0))  # still call b's
    torch.testing.assert_close(d[0], torch.full((4,), 8.0))
    del view, b, d
    e = run(x)  # both free: the set after the one handed out last
    assert run.eager_calls == 1 and e[0].data_ptr() == run.graphs(x)[1].outputs[0].data_ptr()
    assert [g.replays for g in run.graphs(x)] == [2, 2]  # a, c; b, e (d ran eagerly)


def test_auto_graph_alias_mode_and_a_torch_without_use_counts_copy_nothing_or_all(monkeypatch):
    import torch

    from runtime import graph

    run, captured = _fake_auto_graphed(monkeypatch, copy_outputs=False)
    x = torch.ones(4)
    run(x)
    a, b = run(x), run(x)
    assert a[0].data_ptr() == b[0].data_ptr() and len(captured) == 1  # the graph's own
    assert a[0].data_ptr() == run.graphs(x)[0].outputs[0].data_ptr()
    monkeypatch.setattr(graph, "_use_count", lambda: None)
    run, captured = _fake_auto_graphed(monkeypatch)
    run(x)
    a, b = run(x), run(x)
    del a
    c = run(x)
    assert len(captured) == 1 and run.copies == 3 and run.eager_calls == 0
    assert len({t[0].data_ptr() for t in (b, c)} | {run.graphs(x)[0].outputs[0].data_ptr()}) == 3


def test_sessions_replay_by_default_only_where_ranks_can_mix_replays_and_eager_calls():
    import types

    from hostir.options import Options, set_options
    from runtime.session import auto_graph_default

    def comm(name, world):
        return types.SimpleNamespace(name=name, world_size=world)
    try:
        set_options(Options())
        assert auto_graph_default(comm("nccl", 8)) and auto_graph_default(comm("copy_engine", 1))
        assert not auto_graph_default(comm("copy_engine", 2))
        assert not auto_graph_default(comm("torch", 2))
        set_options(Options.from_environ({"HOSTIR_DISABLE": "auto_graph"}))
        assert not auto_graph_default(comm("nccl", 8))
    finally:
        set_options(None)


def test_auto_graph_forgets_input_sets_met_once_and_its_fast_path_keeps_no_tensor(monkeypatch):
    import weakref

    import torch

    from runtime.graph import AutoGraphed

    run, _ = _fake_auto_graphed(monkeypatch)
    keep = [torch.ones(4) for _ in range(3 * AutoGraphed.MAX_SEEN)]
    for t in keep:
        run(t)  # other tensors every call: eager, never captured
    assert len(run._seen) == AutoGraphed.MAX_SEEN and run.graphs(keep[0]) == []
    x = torch.ones(4)
    for _ in range(3):
        run(x)  # eager, captured, replayed (its result dropped each time)
    assert len(run.graphs(x)) == 1 and run._recent is not None
    y = torch.ones(4)  # another tensor: not the last call's, whatever its id
    assert run._same_as_last((y,)) is None
    x_ref = weakref.ref(x)
    run.graphs(x)[0].args = ()  # the fake graph's own reference (a real one keeps none)
    del x
    assert x_ref() is None
