"""CUDA-graph capture of a whole host program (``--graph``).

A host program issues tens of driver calls per stage (kernel launches, collectives,
event records and waits), each costing microseconds of host time. Captured once into a
CUDA graph, the same program replays with one launch. The graph binds the addresses of
its inputs and outputs: replay reads the tensors it was captured with, so callers copy
new data into them (``GraphedProgram.inputs``) or capture again.

    >>> graphed = capture(interpreter, a_shard, b)     # doctest: +SKIP
    >>> graphed.inputs[0].copy_(next_shard); graphed() # doctest: +SKIP
    >>> graphed.outputs[0]                             # doctest: +SKIP
"""

from __future__ import annotations

import torch

from hostir.errors import ExecutionError
from runtime import flight
from runtime.watchdog import Watchdog


class GraphedProgram:
    """A captured program. Each replay records an event after the graph's work, which
    the communicator's watchdog polls like a collective's: a peer that fails during a
    replay ends this rank after HOSTIR_COMM_TIMEOUT (with a flight record), not never.
    The collectives inside the graph were not registered when captured (their events
    exist only in the graph), so the replay is watched as a whole."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs, outputs, watchdog=None,
                 event=torch.cuda.Event):
        self.graph = graph
        self.inputs = inputs
        self.outputs = outputs
        self.watchdog = watchdog
        self._event = event
        self.replays = 0
        self._meta = flight.statement_meta(0, -1, "CUDA-graph replay of a host program",
                                           kind="GraphReplay")

    def __call__(self):
        self.graph.replay()
        self.replays += 1
        if self.watchdog is not None:
            done = self._event()
            done.record()
            what = f"CUDA-graph replay {self.replays} of a host program"
            rec = flight.recorder()
            if rec.enabled:
                entry = rec.start(self._meta, seq=self.replays)
                entry.poll = done.query
            self.watchdog.watch(what, done.query)
        return self.outputs


def graph_watchdog(comm) -> Watchdog | None:
    """The watchdog that bounds replays: the communicator's (NCCL, the copy engine), or,
    over a communicator without one (a torch process group, whose own watchdog does not
    see collectives inside our graphs), one that ends the job on a timeout."""
    if comm is None or getattr(comm, "world_size", 1) <= 1:
        return None
    dog = getattr(comm, "watchdog", None)
    return dog if dog is not None else Watchdog(comm.rank, f"{comm.name} (CUDA graph)")


def capture(interpreter, *args, warmup: int = 1) -> GraphedProgram:
    """Run the program ``warmup`` times (lazy set-up: communicators, cuBLAS handles,
    workspaces) on a side stream, then capture one run into a CUDA graph."""
    if interpreter.backend.name != "cuda":
        raise ExecutionError("graph capture needs the CUDA backend")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            interpreter(*args)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    # thread_local: a watchdog thread may query events while this thread captures.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        outputs = interpreter(*args)
    return GraphedProgram(graph, list(args), outputs, graph_watchdog(interpreter.comm))
