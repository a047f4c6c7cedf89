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


class GraphedProgram:
    def __init__(self, graph: torch.cuda.CUDAGraph, inputs, outputs, watchdog=None):
        self.graph = graph
        self.inputs = inputs
        self.outputs = outputs
        self.watchdog = watchdog

    def __call__(self):
        self.graph.replay()
        if self.watchdog is not None:
            # The collectives inside a graph were not registered when captured: watch the
            # replay as a whole, so a peer that fails during it cannot hang this rank.
            done = torch.cuda.Event()
            done.record()
            self.watchdog.watch("a CUDA-graph replay of a host program", done.query)
        return self.outputs


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
    return GraphedProgram(graph, list(args), outputs,
                          getattr(interpreter.comm, "watchdog", None))
