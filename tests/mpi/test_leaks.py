"""No leaks: 1000 runs of the pipelined program on CPU ranks leave open file handles,
threads, Python objects and memory flat. (GPU memory, streams, events and the zeroed
arena: tests/multigpu/test_faults_gpu.py.)"""

import gc
import os
import threading

import pytest
import torch

from lowering.patterns import allgather_matmul, shard_rows
from lowering.pipeline import lower
from runtime.interpreter import Interpreter

pytestmark = pytest.mark.mpi(min_size=2)


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _snapshot():
    gc.collect()
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": threading.active_count(),
            "objects": len(gc.get_objects()), "rss_kib": _rss_kib()}


def test_a_thousand_runs_leave_handles_objects_and_memory_flat():
    from runtime.comm.mpi import MpiCommunicator
    from runtime.device import CpuBackend

    comm = MpiCommunicator()
    d = comm.world_size
    m, k, n, stages = 4 * 2 * d, 16, 8, 2
    run = Interpreter(lower(allgather_matmul(m, k, n, stages, d), d, 2), CpuBackend(), comm)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    shard = shard_rows(a, stages, d, comm.rank)
    for _ in range(100):  # warm-up: allocator pools, MPI's internal buffers
        run(shard, b)
    before = _snapshot()
    for _ in range(1000):
        (out,) = run(shard, b)
    after = _snapshot()
    assert torch.allclose(out.reshape(m, n), a @ b, atol=1e-4)
    assert after["fds"] == before["fds"], (before, after)
    assert after["threads"] == before["threads"], (before, after)
    assert after["objects"] - before["objects"] < 200, (before, after)  # not per run
    assert after["rss_kib"] - before["rss_kib"] < 16 * 1024, (before, after)
