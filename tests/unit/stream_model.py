"""A model of CUDA stream ordering for running host programs without a GPU.

Streams are lists of nodes; a node depends on the node before it on its stream and on
what it waited for (event record + wait captures the waited stream's last node at that
moment). The communicator models the NCCL one: collectives run on the communicator's own
stream after an event wait on the poster, and ``Wait`` makes the consumer wait on the
collective's node. ``depends(a, b)`` answers whether node a can start only after b.
"""

from __future__ import annotations

import torch


class Node:
    def __init__(self, label: str, deps):
        self.label = label
        self.deps = [d for d in deps if d is not None]


class Stream:
    def __init__(self, name: str):
        self.name = name
        self.nodes: list[Node] = []

    def add(self, label: str, extra=()) -> Node:
        node = Node(label, [*extra, self.last()])
        self.nodes.append(node)
        return node

    def last(self):
        return self.nodes[-1] if self.nodes else None


class ModelBackend:
    name = "model"
    device = torch.device("cpu")

    def __init__(self):
        self.user = Stream("user")
        self.current = self.user
        self.pool: list[Stream] = []

    def current_stream(self):
        return self.current

    def set_current_stream(self, stream) -> None:
        self.current = stream

    def worker(self, index: int, count: int):
        while len(self.pool) < count:
            self.pool.append(Stream(f"worker{len(self.pool)}"))
        return self.pool[index % count]

    def wait_stream(self, waiter, waited) -> None:
        if waiter is not waited:
            waiter.add(f"wait {waited.name}", [waited.last()])

    def join_all(self, user, others=()) -> None:
        for s in [*self.pool, *others]:
            self.wait_stream(user, s)

    def allocate(self, shape, dtype: str):
        return torch.zeros(tuple(shape))

    def synchronize(self) -> None:
        pass


class _Work:
    def __init__(self, stream, node):
        self.stream, self.node = stream, node

    def wait(self, stream) -> None:
        if stream is not self.stream:
            stream.add(f"wait {self.node.label}", [self.node])


class ModelComm:
    """Records collectives on its own stream, in posting order (like runtime.comm.nccl)."""

    name = "model"

    def __init__(self, rank: int = 0, world_size: int = 2):
        self.rank, self.world_size = rank, world_size
        self.stream = Stream("comm")
        self.count = 0

    def _post(self, what: str, poster):
        self.count += 1
        node = self.stream.add(f"{what}{self.count}", [poster.last()])
        return _Work(self.stream, node)

    def allgather(self, out, inp, stream):
        return self._post("AG", stream)

    def sendrecv(self, out, inp, send_peer, recv_peer, stream):
        return self._post("SR", stream)

    def reduce_scatter(self, out, inp, op, stream):
        return self._post("RS", stream)


class ModelMatmul:
    """Stands in for Interpreter.matmul: records a GEMM node on the current stream."""

    def __init__(self, backend: ModelBackend):
        self.backend = backend
        self.count = 0

    def run(self, a, b, out) -> None:
        self.count += 1
        self.backend.current.add(f"MM{self.count}")


def depends(a: Node, b: Node) -> bool:
    """True when ``a`` can start only after ``b`` finished."""
    seen, stack = set(), list(a.deps)
    while stack:
        n = stack.pop()
        if n is b:
            return True
        if id(n) not in seen:
            seen.add(id(n))
            stack.extend(n.deps)
    return False


def nodes(*streams, prefix: str):
    """The nodes whose label starts with ``prefix``; numbered ones (MM3, AG2) in the order
    they were issued, which is program order."""
    found = [n for s in streams for n in s.nodes if n.label.startswith(prefix)]
    number = lambda n: int(n.label[len(prefix):]) if n.label[len(prefix):].isdigit() else 0  # noqa: E731
    return sorted(found, key=number)
