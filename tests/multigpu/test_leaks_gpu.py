"""No leaks on GPUs: 1000 runs of the pipelined program over NCCL leave allocated memory,
worker streams, live events, collectives in flight and open handles flat, and the zeroed
arena zero. Run under ``mpirun -np 2 python -m pytest --with-mpi tests/multigpu``."""

import gc
import os

import pytest
import torch

pytestmark = [pytest.mark.mpi(min_size=2),
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]


def _live_events() -> int:
    return sum(isinstance(o, torch.cuda.Event) for o in gc.get_objects())


def test_a_thousand_runs_leave_gpu_memory_streams_events_and_handles_flat():
    from lowering.patterns import allgather_matmul, shard_rows
    from lowering.pipeline import lower
    from runtime.flight import recorder
    from runtime.workspace import check_all_zeroed
    from runtime.session import Session

    s = Session("cuda", "nccl", auto_graph=False)  # the eager path's streams and events
    d = s.world_size
    m, k, n, stages = 64 * 2 * d, 128, 64, 2
    run = s.interpreter(lower(allgather_matmul(m, k, n, stages, d), d, 2, s.rank))
    g = torch.Generator(device=s.device).manual_seed(0)  # the same A and B on every rank
    a = torch.randn(m, k, device=s.device, generator=g)
    b = torch.randn(k, n, device=s.device, generator=g)
    shard = shard_rows(a, stages, d, s.rank).contiguous()

    def state():
        torch.cuda.synchronize()
        gc.collect()
        # in_flight() first: it drops the finished collectives (and their events) that
        # the watchdog's thread has not looked at yet, so the count is of live ones only.
        in_flight = s.comm.watchdog.in_flight()
        return {"allocated": torch.cuda.memory_allocated(), "streams": len(s.backend._pool),
                "events": _live_events(), "in_flight": in_flight,
                "fds": len(os.listdir("/proc/self/fd"))}

    # `out` stays alive at both snapshots. The flight recorder's ring holds each entry's
    # completion check (its collective's event) until the entry is overwritten: warm up
    # until the ring has wrapped, so that it holds as many events at both snapshots.
    ring = recorder()
    for i in range(50 + ring.capacity):
        (out,) = run(shard, b)
        if i >= 50 and ring.recorded > ring.capacity + 50:
            break
    before = state()
    for _ in range(1000):
        (out,) = run(shard, b)
    after = state()
    assert torch.allclose(out.reshape(m, n), a @ b, rtol=1e-2, atol=1e-2)
    assert after == before, (before, after)
    assert after["in_flight"] == 0
    check_all_zeroed()
