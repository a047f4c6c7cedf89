"""A rank's runtime: its device backend and communicator, set up once.

    >>> from runtime.session import Session
    >>> s = Session(device="auto", comm="auto")     # under mpirun   # doctest: +SKIP
    >>> out, = s.interpreter(program)(a_shard, b)                    # doctest: +SKIP
"""

from __future__ import annotations

import collections

import torch

from hostir import ir
from hostir.options import options
from runtime.comm.base import make_communicator
from runtime.bootstrap import init_torch_distributed_from_mpi, local_rank
from runtime.device import make_backend, require_cuda
from runtime.interpreter import Interpreter
from runtime.watchdog import install_excepthook

__all__ = ["Session", "auto_graph_default", "init_torch_distributed_from_mpi", "local_rank"]


def auto_graph_default(comm) -> bool:
    """Whether a CUDA session replays repeated programs from CUDA graphs by default: where
    a rank replaying and a rank running the same program eagerly still meet in every
    collective (one rank, or NCCL, whose captured kernels are its eager ones), unless
    ``HOSTIR_DISABLE=auto_graph``."""
    return (comm.world_size == 1 or comm.name == "nccl") and not options().disable("auto_graph")


class Session:
    """Backend + communicator of this rank. ``comm``: auto (NCCL on CUDA, MPI on the CPU),
    nccl, mpi, or torch (a torch.distributed group: the caller's, or one made from MPI)."""

    def __init__(self, device: str = "auto", comm: str = "auto", process_group=None,
                 auto_graph: bool | None = None):
        """``auto_graph``: on CUDA, ``interpreter`` returns programs that replay a CUDA
        graph when called again on the same input tensors (``runtime.graph.AutoGraphed``:
        a returned tensor is never overwritten by a later call, as with eager calls).
        None (the default): on where every rank's replays and eager calls interoperate,
        that is on one rank or over NCCL (the copy engine's barriers differ under capture,
        so a rank replaying beside one running eagerly could wait forever), unless
        ``HOSTIR_DISABLE=auto_graph``; True: on with any communicator."""
        install_excepthook()  # an uncaught error on one rank ends every rank
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda"):
            require_cuda(f"--device {device}")
        if device == "cuda":
            ngpu = torch.cuda.device_count()
            device = f"cuda:{local_rank() % ngpu}"
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        self.backend = make_backend(device)
        if comm == "torch" and process_group is None:
            init_torch_distributed_from_mpi("nccl" if device.startswith("cuda") else "gloo")
        self.comm = make_communicator(comm, device, process_group)
        self.rank = self.comm.rank
        self.world_size = self.comm.world_size
        self.device = self.backend.device
        self._interpreters: collections.OrderedDict = collections.OrderedDict()
        if auto_graph is None:
            auto_graph = auto_graph_default(self.comm)
        self.auto_graph = auto_graph and self.backend.name == "cuda"

    # Interpreters kept for reuse: each holds its program's kernels and choices; older
    # ones are dropped so a process that lowers many programs does not keep them all.
    CACHED_INTERPRETERS = 16

    def interpreter(self, program: ir.Program, kernels=None, matmul: str = "cublas"):
        """The interpreter of ``program`` on this rank (built once, then reused); under
        ``auto_graph``, wrapped in ``runtime.graph.AutoGraphed``."""
        key = (id(program), matmul)
        it = self._interpreters.get(key)
        if it is None or it.program is not program or kernels:
            it = Interpreter(program, self.backend, self.comm, kernels, matmul=matmul)
            if self.auto_graph:
                from runtime.graph import AutoGraphed

                it = AutoGraphed(it)
            self._interpreters[key] = it
        self._interpreters.move_to_end(key)
        while len(self._interpreters) > self.CACHED_INTERPRETERS:
            self._interpreters.popitem(last=False)
        return it

    def barrier(self) -> None:
        self.comm.barrier()
