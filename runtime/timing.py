"""Timing GPU work fairly: CUDA-event medians, side by side in carryover-balanced rounds,
and CUDA graphs for kernels too short for a host loop to keep fed.

The harness every tuner and benchmark shares (`runtime.autotune`, `runtime.normalization`,
`runtime.kernels`, the jobs' ``--bench``): a candidate's samples are interleaved with the
others' so that the chip's clock and power drift weigh on each alike.

Example:
    >>> side_by_side({"a": lambda i: f(), "b": lambda i: g()})   # doctest: +SKIP
    {'a': 12.1, 'b': 11.7}
"""

from __future__ import annotations

import functools
import statistics
import sys

import torch


def time_us(fn, warmup: int = 3, reps: int = 10, per_group: int = 8) -> float:
    """Median microseconds of `fn()` on the current stream, by CUDA events.

    Each sample times `per_group` back-to-back calls: with one call between two events
    the GPU idles while the host enqueues it, and a kernel of tens of microseconds would
    be timed as host overhead (two launches would lose to one for the wrong reason).
    """
    return side_by_side({0: lambda i: fn()}, reps=reps, per_group=per_group, warmup=warmup)[0]


def side_by_side(fns: dict, reps: int = 15, per_group: int = 8, warmup: int = 2) -> dict:
    """Median microseconds per call of each of `fns` (callables taking the call's index in
    its group), timed side by side: one sample of each in turn, `reps` rounds, so that
    clock and power drift over the run weigh on each alike. The rounds follow a
    carryover-balanced order (`balanced_rounds`; `reps` rounds up to whole cycles of it),
    so that each candidate comes right after every other equally often: a kernel run
    right after a power-hungry one inherits its lowered clock (in one fixed order the
    same kernel, timed twice, came out 3.7% apart at 8192^3 and 7% at 16384x8192x4096;
    feed_probe_nvidia-h200_134d458.json)."""
    for fn in fns.values():
        for i in range(warmup):
            fn(i)
    times = {k: [] for k in fns}
    for labels in balanced_rounds(list(fns), reps):
        for label in labels:
            fn = fns[label]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for i in range(per_group):
                fn(i)
            end.record()
            end.synchronize()
            times[label].append(start.elapsed_time(end) * 1e3 / per_group)
    return {k: statistics.median(v) for k, v in times.items()}


# Launches a timing graph holds (`graph_of`): enough that one replay of the shortest
# normalization kernel (~8 us) spans hundreds of microseconds, so the events' own cost
# and the host's replay call vanish from the per-call time.
GRAPH_LAUNCHES = 48


def graph_of(calls, launches: int = GRAPH_LAUNCHES):
    """(replay, calls a replay): a CUDA graph cycling through ``calls`` (one callable
    per input set, so that consecutive calls read different memory), about ``launches``
    calls long, warmed outside the graph first (compiles, allocator pools); back-to-back
    launches if capture is refused. For kernels of a few microseconds, which a host
    timing loop of plain launches cannot keep fed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    rounds = max(1, launches // len(calls))
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(rounds):
                for call in calls:
                    call()
        replay = graph.replay
    except RuntimeError as e:
        print(f"graph capture failed ({e}); timing back-to-back launches", file=sys.stderr)
        torch.cuda.synchronize()

        def replay():
            for _ in range(rounds):
                for call in calls:
                    call()
    replay()
    torch.cuda.synchronize()
    return replay, rounds * len(calls)


def time_replay(replay, n: int) -> float:
    """Microseconds a call of one replay of a `graph_of` graph of ``n`` calls."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / n


def graph_side_by_side(candidates: dict, reps: int, launches: int = GRAPH_LAUNCHES) -> dict:
    """Median microseconds a call of each candidate (label -> one call per input set),
    timed side by side: one `graph_of` replay of each a round, ``reps`` rounds rounded
    up to whole cycles of a carryover-balanced order (`balanced_rounds`), so that clock
    and power drift weigh on each alike and none always follows the same neighbour."""
    graphs = {k: graph_of(v, launches) for k, v in candidates.items()}
    samples = {k: [] for k in candidates}
    for labels in balanced_rounds(list(candidates), reps):
        for k in labels:
            samples[k].append(time_replay(*graphs[k]))
    return {k: statistics.median(v) for k, v in samples.items()}


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of n candidates, one a round, in which each candidate directly follows every
    other exactly once over the rounds (a Williams design, as crossover trials use against
    carryover): n rounds for even n; for odd n the mirrored rounds too, each pair twice.

    Example:
        >>> balanced_orders(4)
        [[0, 1, 3, 2], [1, 2, 0, 3], [2, 3, 1, 0], [3, 0, 2, 1]]
    """
    first, lo, hi = [0], 1, n - 1
    for j in range(1, n):
        if j % 2:
            first.append(lo)
            lo += 1
        else:
            first.append(hi)
            hi -= 1
    rows = [[(x + r) % n for x in first] for r in range(n)]
    return rows + [row[::-1] for row in rows] if n % 2 else rows


def balanced_rounds(labels: list, reps: int) -> list[list]:
    """The order of `labels` in each round of a side-by-side timing: `balanced_orders`,
    `reps` rounded up to whole cycles of it, so that the balance holds. The same on every
    rank (a multi-rank benchmark's collectives must match)."""
    orders = balanced_orders(len(labels))
    rounds = -(-reps // len(orders)) * len(orders)
    return [[labels[j] for j in orders[r % len(orders)]] for r in range(rounds)]


def input_copies(nbytes: int, dev, limit: int = 8) -> int:
    """Copies of a problem's operands (`nbytes` together) that overflow L2 three times
    over, at most `limit` and at most a quarter of the free memory: a call whose
    operands sit in L2 from the previous call is not the call a model makes."""
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 50 << 20) or (50 << 20)
    free, _ = torch.cuda.mem_get_info(dev)
    want = -(-3 * l2 // max(1, nbytes))
    return max(1, min(limit, want, free // 4 // max(1, nbytes)))


# The copy-time model's two copies, MiB each (both ran on the fast path on the H100 and
# the H200). A device-to-device copy of some byte counts takes a path about two thirds
# as fast (an H200: 512 MiB and 167,798,784 bytes at 2.7 TB/s, 256 MiB and 167,825,408 at
# 4.2, whatever the buffers' placement), so a copy of the same bytes alone is no
# reference (docs/EXPERIMENTS.md, "the copy reference").
COPY_MODEL_MIB = (16, 256)


@functools.lru_cache(maxsize=16)
def copy_model(dev: int) -> tuple[float, float]:
    """``(fixed_us, bytes_per_us)`` of the device's copies: the line through the times of
    copies of `COPY_MODEL_MIB` (bytes read and written together), each over rotated
    buffers, timed by CUDA-graph replay."""
    times = []
    with torch.cuda.device(dev):
        for mib in COPY_MODEL_MIB:
            n = mib << 20
            sets = input_copies(2 * n, dev, limit=4)
            src = [torch.empty(n, dtype=torch.uint8, device=dev) for _ in range(sets)]
            dst = [torch.empty_like(t) for t in src]
            times.append(graph_side_by_side({"copy": [(lambda s=s, d=d: d.copy_(s))
                                                      for s, d in zip(src, dst)]}, 5)["copy"])
            del src, dst
    (n0, n1), (t0, t1) = ((2 * m << 20 for m in COPY_MODEL_MIB), times)
    rate = (n1 - n0) / (t1 - t0)
    return max(0.0, t0 - n0 / rate), rate


def copy_model_summary(dev: int) -> dict:
    """`copy_model` as a results file records it."""
    fixed_us, rate = copy_model(dev)
    return {"fixed_us": round(fixed_us, 3), "tbps": round(rate / 1e6, 3)}


def copy_reference_us(nbytes: int, measured_us: float, dev: int) -> float:
    """Microseconds a copy moving `nbytes` (read and written together) takes: the faster
    of that copy as timed (`measured_us`) and `copy_model`'s time for the bytes, so that
    a byte count the GPU copies on a slow path does not flatter what is measured
    against it."""
    fixed_us, rate = copy_model(dev)
    return min(measured_us, fixed_us + nbytes / rate)
