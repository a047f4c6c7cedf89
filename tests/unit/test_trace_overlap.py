"""runtime.trace.overlap: communication hidden beside computation, from device events."""

from __future__ import annotations

import pytest

from runtime.trace import overlap


def ev(kind, start, dur, stream=0):
    return (stream, kind, float(start), float(dur), kind.lower())


def test_half_hidden_collective():
    got = overlap([ev("GEMM", 0, 100), ev("NCCL", 50, 100, 1)])
    assert got["comm_ms"] == pytest.approx(0.1) and got["hidden_ms"] == pytest.approx(0.05)
    assert got["exposed_ms"] == pytest.approx(0.05) and got["span_ms"] == pytest.approx(0.15)
    assert got["hidden_fraction"] == pytest.approx(0.5)


def test_overlapping_collectives_count_once_and_steps_divide():
    events = [ev("NCCL", 0, 100, 1), ev("copy engine", 50, 100, 2),  # comm covers 0-150
              ev("GEMM", 20, 10), ev("other", 25, 30), ev("GEMM", 140, 100),  # 20-55, 140-240
              ev("barrier", 0, 1000, 3)]  # neither side
    got = overlap(events, steps=2)
    assert got["comm_ms"] == pytest.approx(0.150 / 2)
    assert got["hidden_ms"] == pytest.approx((35 + 10) / 1e3 / 2)
    assert got["hidden_fraction"] == pytest.approx(45 / 150)


def test_no_communication():
    got = overlap([ev("GEMM", 0, 10)])
    assert got["comm_ms"] == 0 and got["hidden_fraction"] is None
    assert overlap([])["span_ms"] == 0


def test_the_transformer_bench_reads_its_own_trace_and_removes_it(tmp_path, monkeypatch):
    """`train_transformer`'s trace path, on the CPU: a step recorded, its GPU events read
    back (none here: nothing to hide, nothing busy), the trace file removed."""
    import torch

    from hostir.jobs.train_transformer import traced_events
    from runtime import trace
    from runtime.trace import breakdown

    monkeypatch.setattr(trace, "default_trace_base", lambda: str(tmp_path / "t.json"))
    calls = []
    events = traced_events(lambda: calls.append(torch.ones(4).sum()), 0, "ours", iters=2)
    assert len(calls) == 4  # two warm-up steps, two recorded
    got = overlap(events, steps=2)
    assert got["comm_ms"] == 0 and got["hidden_fraction"] is None
    assert breakdown(events, steps=2) == {"span_ms": 0.0, "busy_ms": 0.0, "idle_ms": 0.0,
                                          "top": []}
    assert list(tmp_path.iterdir()) == []


def test_breakdown_counts_overlaps_once_and_ranks_kernels_by_time():
    from runtime.trace import breakdown

    events = [(0, "GEMM", 0.0, 400.0, "gemm_a"), (1, "other", 100.0, 100.0, "norm"),
              (0, "GEMM", 600.0, 200.0, "gemm_a"), (0, "other", 900.0, 100.0, "norm" * 40),
              (0, "GEMM", 1400.0, 600.0, "gemm_b")]
    got = breakdown(events, steps=2, top=2)
    assert got["span_ms"] == pytest.approx(1.0)  # 0..2000 us over two steps
    assert got["busy_ms"] == pytest.approx((400 + 200 + 100 + 600) / 2e3)  # 100-200 once
    assert got["idle_ms"] == pytest.approx((2000 - 1300) / 2e3)
    assert got["top"] == [["gemm_a", 0.3, 1.0], ["gemm_b", 0.3, 0.5]]
    assert breakdown([]) == {"span_ms": 0.0, "busy_ms": 0.0, "idle_ms": 0.0, "top": []}
    assert max(len(n) for n, _, _ in breakdown(events)["top"]) == 96  # long names cut

