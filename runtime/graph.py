"""CUDA-graph capture of a whole host program (``--graph``).

A host program issues tens of driver calls per stage (kernel launches, collectives,
event records and waits), each costing microseconds of host time. Captured once into a
CUDA graph, the same program replays with one launch. The graph binds the addresses of
its inputs and outputs: replay reads the tensors it was captured with, so callers copy
new data into them (``GraphedProgram.inputs``) or capture again.

    >>> graphed = capture(interpreter, a_shard, b)     # doctest: +SKIP
    >>> graphed.inputs[0].copy_(next_shard); graphed() # doctest: +SKIP
    >>> graphed.outputs[0]                             # doctest: +SKIP

``AutoGraphed`` (``Session(auto_graph=True)``) does this on its own for a program called
repeatedly on the same input tensors, and copies the outputs out.
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


class AutoGraphed:
    """An interpreter whose repeated calls replay a CUDA graph (``Session(auto_graph=True)``).

    The first call with a given set of inputs (their addresses, shapes, strides and dtypes)
    runs eagerly, which also does the lazy set-up and the ranks' input agreement; the
    second captures the program on those inputs; later ones replay it, one launch in place
    of the tens of host dispatches an eager call costs. A replay reads the inputs where the
    caller's tensors live now (same addresses), and writes the same output buffers each
    time, so by default each call returns copies of them (a device copy on the current
    stream, cheap next to the GEMMs) and a returned tensor is never overwritten by a later
    call. ``copy_outputs=False`` returns the graph's own buffers: for callers that consume
    the outputs before the next call.

    At most ``MAX_GRAPHS`` input sets keep a graph (each holds its inputs alive and its
    own memory pool); the oldest goes first. Other attributes are the interpreter's."""

    MAX_GRAPHS = 4

    def __init__(self, interpreter, copy_outputs: bool = True):
        if interpreter.backend.name != "cuda":
            raise ExecutionError("auto_graph needs the CUDA backend")
        self.interpreter = interpreter
        self.copy_outputs = copy_outputs
        self._graphs: dict[tuple, GraphedProgram] = {}
        self._seen: set[tuple] = set()

    def __getattr__(self, name):
        return getattr(self.interpreter, name)

    @staticmethod
    def _key(args) -> tuple | None:
        key = []
        for x in args:
            if not isinstance(x, torch.Tensor):
                return None
            key.append((x.data_ptr(), tuple(x.shape), x.stride(), x.dtype, x.device))
        return tuple(key)

    def __call__(self, *args):
        key = self._key(args)
        if key is None or torch.cuda.is_current_stream_capturing():
            return self.interpreter(*args)  # the interpreter refuses bad inputs by name
        graphed = self._graphs.get(key)
        if graphed is None:
            if key not in self._seen:
                self._seen.add(key)
                return self.interpreter(*args)
            self._seen.discard(key)
            graphed = self._capture(args)
            while len(self._graphs) >= self.MAX_GRAPHS:
                self._graphs.pop(next(iter(self._graphs)))
            self._graphs[key] = graphed
        outputs = graphed()
        return [o.clone() for o in outputs] if self.copy_outputs else list(outputs)

    def _capture(self, args) -> GraphedProgram:
        """Capture on the caller's inputs; the caller's stream waits for nothing extra
        (``capture`` synchronizes once, at capture time only)."""
        return capture(self.interpreter, *args, warmup=0)

    def prepare(self, *args) -> None:
        """The interpreter's set-up, then the graph of ``args`` captured, so that no timed
        call captures."""
        self.interpreter.prepare(*args)
        key = self._key(args)
        if key is not None and key not in self._graphs:
            self._graphs[key] = self._capture(args)
            self.interpreter.backend.synchronize()
