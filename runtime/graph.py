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

import functools

import torch

from hostir.errors import ExecutionError
from runtime import flight
from runtime.device import current_stream
from runtime.watchdog import Watchdog


class GraphedProgram:
    """A captured program. Each replay records an event after the graph's work, which
    the communicator's watchdog polls like a collective's: a peer that fails during a
    replay ends this rank after HOSTIR_COMM_TIMEOUT (with a flight record), not never.
    The collectives inside the graph were not registered when captured (their events
    exist only in the graph), so the replay is watched as a whole."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs, outputs, watchdog=None,
                 event=torch.cuda.Event, stream=None):
        self.graph = graph
        self.inputs = inputs
        self.outputs = outputs
        self.watchdog = watchdog
        self._event = event
        self.replays = 0
        # what a replay's event is recorded on: the current stream of the device
        self._stream = stream
        self._meta = flight.statement_meta(0, -1, "CUDA-graph replay of a host program",
                                           kind="GraphReplay")

    def __call__(self):
        self.graph.replay()
        self.replays += 1
        if self.watchdog is not None:
            if self._stream is None:
                self._stream = functools.partial(current_stream, torch.cuda.current_device())
            done = self._event()
            done.record(self._stream())
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


def capture(interpreter, *args, warmup: int = 1, pool=None) -> GraphedProgram:
    """Run the program ``warmup`` times (lazy set-up: communicators, cuBLAS handles,
    workspaces) on a side stream, then capture one run into a CUDA graph; ``pool``: the
    memory pool of an earlier graph to share (`torch.cuda.graph`'s), for graphs that
    never run at the same time."""
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
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        outputs = interpreter(*args)
    return GraphedProgram(graph, list(args), outputs, graph_watchdog(interpreter.comm))


def _use_count():
    """torch's count of the references to a storage (its tensors and views), or None
    where this torch lacks it (then `AutoGraphed` copies its outputs out)."""
    return getattr(torch._C, "_storage_Use_Count", None)


class _OutputSet:
    """One graph of an input set and the outputs it writes. ``hand_out`` returns fresh
    aliases of them (`Tensor.detach`: new tensors on the same storage), so that the
    storage's use count tells whether the caller still holds any of them, or a view of
    one: ``held`` is true until every alias and view is gone."""

    def __init__(self, graphed: GraphedProgram, count):
        self.graphed = graphed
        self._count = count
        # the outputs' storages (each once), kept: their handles are asked every call, and
        # these wrappers' own references are part of the idle counts below
        storages = {st.data_ptr(): st for st in (o.untyped_storage() for o in graphed.outputs)}
        self._storages = list(storages.values())
        # (handle, count with none handed out): what the graph's own outputs hold
        self._idle = [(st._cdata, count(st._cdata)) for st in self._storages] if count else None

    def held(self) -> bool:
        count = self._count
        for handle, idle in self._idle:
            if count(handle) != idle:
                return True
        return False

    def hand_out(self) -> list[torch.Tensor]:
        return [o.detach() for o in self.graphed()]


class _InputSet:
    """The output sets of one input set, and the one handed out last."""

    __slots__ = ("sets", "last")

    def __init__(self, sets: list[_OutputSet]):
        self.sets = sets
        self.last = 0


class AutoGraphed:
    """An interpreter whose repeated calls replay a CUDA graph (what `Session` returns on
    CUDA unless ``HOSTIR_DISABLE=auto_graph``, see `Session`).

    The first call with a given set of inputs (their addresses, shapes, strides and dtypes)
    runs eagerly, which also does the lazy set-up and the ranks' input agreement; the
    second captures the program on those inputs; later ones replay it, one launch in place
    of the tens of host dispatches an eager call costs. A replay reads the inputs where the
    caller's tensors live now (same addresses) and writes the graph's own output buffers,
    so a returned tensor must never be overwritten by a later call while the caller holds
    it. Each call therefore replays a graph none of whose outputs the caller still holds
    (torch's storage use count: the returned tensors, and any views of them); when the
    caller holds them all, another graph for the input set is captured, up to
    ``OUTPUT_SETS`` sharing one memory pool (only their outputs take memory twice), and
    past that the call runs eagerly (fresh outputs). Where torch has no use counts, each
    replay's outputs are copied out instead. A loop that keeps the previous call's result
    while making the next (``y = run(x)``) alternates between two graphs and copies
    nothing. ``copy_outputs=False`` always returns the first graph's own buffers, for
    callers that consume the outputs before the next call.

    At most ``MAX_GRAPHS`` input sets keep graphs (each its own memory pool), and
    ``MAX_SEEN`` input sets met once are remembered; the oldest go first. A graph does not
    keep its inputs alive: it is replayed only on a call whose inputs are at its addresses,
    with its shapes, strides and dtypes, and reads them there. Other attributes are the
    interpreter's."""

    MAX_GRAPHS = 4
    MAX_SEEN = 64
    OUTPUT_SETS = 2

    def __init__(self, interpreter, copy_outputs: bool = True):
        if interpreter.backend.name != "cuda":
            raise ExecutionError("auto_graph needs the CUDA backend")
        self.interpreter = interpreter
        self.copy_outputs = copy_outputs
        self._graphs: dict[tuple, _InputSet] = {}
        self._seen: dict[tuple, None] = {}  # input sets met once, oldest first
        self._recent = None  # (ids of the args, key, input set) of the last replay
        self._count = _use_count()
        self.copies = 0  # replays whose outputs were copied out (no use counts)
        self.eager_calls = 0  # calls run eagerly because the caller held every set

    def __getattr__(self, name):
        return getattr(self.interpreter, name)

    @staticmethod
    def _key(args) -> tuple | None:
        key = []
        for x in args:
            if not isinstance(x, torch.Tensor):
                return None
            key.append((x.data_ptr(), x.shape, x.stride(), x.dtype, x.get_device()))
        return tuple(key)

    def __call__(self, *args):
        if torch.cuda.is_current_stream_capturing():
            return self.interpreter(*args)  # inside the caller's own capture
        entry = self._same_as_last(args)
        if entry is None:
            key = self._key(args)
            if key is None:
                return self.interpreter(*args)  # the interpreter refuses bad inputs by name
            entry = self._graphs.get(key)
            if entry is None:
                if key not in self._seen:
                    if len(self._seen) >= self.MAX_SEEN:  # calls on ever new tensors
                        self._seen.pop(next(iter(self._seen)))
                    self._seen[key] = None
                    return self.interpreter(*args)
                del self._seen[key]
                entry = self._new_input_set(key, args)
            self._recent = ([id(x) for x in args], key, entry)
        sets = entry.sets
        if not self.copy_outputs:
            return list(sets[0].graphed())
        if self._count is None:  # no use counts: copies, never an overwritten result
            self.copies += 1
            return [o.clone() for o in sets[0].graphed()]
        n = len(sets)
        for j in range(1, n + 1):  # the set after the one handed out last first
            i = (entry.last + j) % n
            if not sets[i].held():
                entry.last = i
                return sets[i].hand_out()
        if n < self.OUTPUT_SETS:
            entry.last = n
            sets.append(_OutputSet(self._capture(args, pool=sets[0].graphed.graph.pool()),
                                   self._count))
            return sets[-1].hand_out()
        self.eager_calls += 1  # a replay would overwrite a result the caller holds
        return self.interpreter(*args)

    def _same_as_last(self, args):
        """The input set of the last call that replayed, when ``args`` are the tensors of
        that call (their ids: none is kept alive), unchanged (address, shape, strides,
        dtype, device, which make the key): a few attribute reads instead of building and
        hashing a key."""
        recent = self._recent
        if recent is None or len(args) != len(recent[0]):
            return None
        for x, i, (ptr, shape, stride, dtype, device) in zip(args, *recent[:2]):
            if (id(x) != i or x.data_ptr() != ptr or x.shape != shape or x.stride() != stride
                    or x.dtype != dtype or x.get_device() != device):
                return None
        return recent[2]

    def _new_input_set(self, key, args) -> "_InputSet":
        while len(self._graphs) >= self.MAX_GRAPHS:
            del self._graphs[next(iter(self._graphs))]
            self._recent = None
        entry = self._graphs[key] = _InputSet([_OutputSet(self._capture(args), self._count)])
        return entry

    def _capture(self, args, pool=None) -> GraphedProgram:
        """Capture on the caller's inputs; the caller's stream waits for nothing extra
        (``capture`` synchronizes once, at capture time only)."""
        graphed = capture(self.interpreter, *args, warmup=0, pool=pool)
        graphed.inputs = []  # not kept alive: their memory may serve the caller's next ones
        return graphed

    def graphs(self, *args) -> list[GraphedProgram]:
        """The graphs captured for these inputs (one per output set), oldest first."""
        entry = self._graphs.get(self._key(args))
        return [] if entry is None else [s.graphed for s in entry.sets]

    def prepare(self, *args) -> None:
        """The interpreter's set-up, then the graph of ``args`` captured, so that no timed
        call captures."""
        self.interpreter.prepare(*args)
        key = self._key(args)
        if key is not None and key not in self._graphs:
            self._new_input_set(key, args)
            self.interpreter.backend.synchronize()
