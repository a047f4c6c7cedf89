"""Soak on one GPU: a thousand replays of the main job's program captured as a CUDA graph
(``pipelined_matmul --graph``) leave CUDA memory, worker streams, live events, collectives
in flight and open file descriptors flat, and the zeroed arena zero; the result is still
right afterwards. Skips without CUDA (and CuPy, which NCCL and the generated kernels need).

    python -m pytest tests/gpu/test_soak_gpu.py
"""

import gc
import os

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

REPLAYS = 1000


def _live_events() -> int:
    return sum(isinstance(o, torch.cuda.Event) for o in gc.get_objects())


@pytest.mark.parametrize("matmul", ["cublas", "codegen"])
@pytest.mark.parametrize("schedule", ["pipelined", "ring"])
def test_a_thousand_graph_replays_leave_the_gpu_flat(schedule, matmul):
    pytest.importorskip("cupy")
    from hostir.jobs import pipelined_matmul as job
    from hostir.jobs.preflight import JobParser
    from runtime.graph import capture
    from runtime.session import Session
    from runtime.workspace import check_all_zeroed

    parser = JobParser()
    job.add_arguments(parser)
    # split-K shapes (K much larger than M x N): the generated kernel takes semaphores from
    # the zeroed arena and must give every one back
    args = parser.parse_args(["--m", "256", "--n", "128", "--k", "4096", "--stages", "2",
                              "--streams", "2", "--dtype", "bfloat16", "--device", "cuda",
                              "--comm", "nccl", "--schedule", schedule, "--matmul", matmul,
                              "--graph"])
    job.resolve_schedule(args)
    session = Session(args.device, args.comm)
    run = session.interpreter(job.build(args, session.world_size, session.rank),
                              matmul=args.matmul)
    _, b, shard = job.random_inputs(args, session, seed=5)
    run.prepare(shard, b)
    graphed = capture(run, shard, b)

    def state():
        torch.cuda.synchronize()
        gc.collect()
        in_flight = session.comm.watchdog.in_flight()  # drops the finished replays first
        return {"allocated": torch.cuda.memory_allocated(), "streams": len(session.backend._pool),
                "events": _live_events(), "in_flight": in_flight,
                "fds": len(os.listdir("/proc/self/fd"))}

    for _ in range(20):
        graphed()
    before = state()
    for _ in range(REPLAYS):
        graphed()
    after = state()
    assert after == before, (before, after)
    assert after["in_flight"] == 0
    check_all_zeroed()
    # fresh data through the captured inputs: the thousandth replay still computes
    a, b_new, shard_new = job.random_inputs(args, session, seed=6)
    shard.copy_(shard_new)
    b.copy_(b_new)
    (out,) = graphed()
    assert job.relative_error(out, a, b_new) < job.TOLERANCE["bfloat16"]
    assert job.matmul_used(run, session) == matmul
    check_all_zeroed()
