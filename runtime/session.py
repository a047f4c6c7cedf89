"""A rank's runtime: its device backend and communicator, set up once.

    >>> from runtime.session import Session
    >>> s = Session(device="auto", comm="auto")     # under mpirun   # doctest: +SKIP
    >>> out, = s.interpreter(program)(a_shard, b)                    # doctest: +SKIP
"""

from __future__ import annotations

import collections
import datetime
import os
import socket

import torch

from hostir import ir
from hostir.options import options
from runtime.comm.base import make_communicator
from runtime.device import make_backend, require_cuda
from runtime.interpreter import Interpreter


def init_torch_distributed_from_mpi(backend: str) -> None:
    """``torch.distributed.init_process_group`` for ranks started by mpirun: rank 0 picks
    an address and port and broadcasts them over MPI."""
    import torch.distributed as dist
    from mpi4py import MPI

    if dist.is_initialized():
        return
    comm = MPI.COMM_WORLD
    addr = None
    if comm.Get_rank() == 0:
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        host = os.environ.get("MASTER_ADDR") or socket.gethostbyname(socket.gethostname())
        addr = f"tcp://{host}:{port}"
    addr = comm.bcast(addr, root=0)
    # The group's collectives time out like ours (torch's own watchdog ends the rank).
    timeout = options().comm_timeout_s
    kw = {"timeout": datetime.timedelta(seconds=timeout)} if timeout > 0 else {}
    dist.init_process_group(backend, init_method=addr, rank=comm.Get_rank(),
                            world_size=comm.Get_size(), **kw)


def local_rank() -> int:
    for var in ("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


class Session:
    """Backend + communicator of this rank. ``comm``: auto (NCCL on CUDA, MPI on the CPU),
    nccl, mpi, or torch (a torch.distributed group: the caller's, or one made from MPI)."""

    def __init__(self, device: str = "auto", comm: str = "auto", process_group=None):
        from runtime.watchdog import install_excepthook

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

    # Interpreters kept for reuse: each holds its program's kernels and choices; older
    # ones are dropped so a process that lowers many programs does not keep them all.
    CACHED_INTERPRETERS = 16

    def interpreter(self, program: ir.Program, kernels=None, matmul: str = "cublas") -> Interpreter:
        """The interpreter of ``program`` on this rank (built once, then reused)."""
        key = (id(program), matmul)
        it = self._interpreters.get(key)
        if it is None or it.program is not program or kernels:
            it = Interpreter(program, self.backend, self.comm, kernels, matmul=matmul)
            self._interpreters[key] = it
        self._interpreters.move_to_end(key)
        while len(self._interpreters) > self.CACHED_INTERPRETERS:
            self._interpreters.popitem(last=False)
        return it

    def barrier(self) -> None:
        self.comm.barrier()
