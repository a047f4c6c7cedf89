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
    (row,) = doc["rows"]
    assert row["what"].startswith("pipelined_matmul") and row["shape"] == "64x64x64"
    assert row["mode"] == "eager" and row["host_us"] > 0 and row["gpu_us"] is None
