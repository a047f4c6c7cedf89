"""A SendRecv transport that takes no SMs: peer writes by the copy engine over CUDA IPC.

NCCL moves data with kernels, which take SMs from a GEMM running beside them. Here each
rank owns a buffer in torch's symmetric memory (mapped into every peer over CUDA IPC); a
SendRecv, on the current stream:

    barrier                                  # every peer has copied out its last message
    peer_buffer[send_peer] <- in             # cudaMemcpyAsync peer write: the copy engine
    barrier                                  # my receive buffer is filled
    out <- my buffer                         # local copy, copy engine too

The barriers are the symmetric memory's device-side barrier (one tiny kernel each); the
host never blocks. Every other collective goes to the wrapped communicator: hostir's NCCL
one, or a ``TorchCommunicator`` over the caller's NCCL process group (``hostir.nn`` does
that when ``torch.distributed`` is initialized). The symmetric memory is rendezvoused over
``group`` (default: the world group of ``torch.distributed``, initialized with NCCL from
MPI when it is not), whose ranks must be the wrapped communicator's.

When the receive buffer itself lives in symmetric memory (the interpreter allocates a
program's gathered buffer there, see ``Interpreter._direct_sendrecv_roots``), the sender
writes straight into the peer's receive buffer and the local copy-out disappears:

    barrier                                  # the peer is done with its last use of it
    peer's out <- in                         # the copy engine, over the peer mapping
    barrier                                  # my out is filled
"""

from __future__ import annotations

import torch

from hostir.errors import CommunicationError
from hostir.options import options


class CopyEngineCommunicator:
    name = "copy_engine"

    def __init__(self, base, group=None):
        import torch.distributed as dist

        from runtime.session import init_torch_distributed_from_mpi

        if group is None:
            init_torch_distributed_from_mpi("nccl")
            group = dist.group.WORLD
        self.base = base
        self.rank, self.world_size = base.rank, base.world_size
        if dist.get_rank(group) != self.rank or dist.get_world_size(group) != self.world_size:
            raise CommunicationError(
                f"copy-engine transport: the torch.distributed group's rank "
                f"{dist.get_rank(group)} of {dist.get_world_size(group)} differs from the "
                f"wrapped {base.name} communicator's rank {self.rank} of {self.world_size}")
        self.group_name = group.group_name
        self._buffer = None
        self._handle = None
        self._retired: list = []
        self._views: dict = {}  # (rank, shape, dtype) -> view of a symmetric buffer

    def __getattr__(self, name):  # allgather, reduce_scatter, ... go to the wrapped NCCL
        return getattr(self.base, name)

    def reserve(self, nbytes: int) -> None:
        """Grow the symmetric buffer to ``nbytes`` (a collective: every rank calls it with
        the same size, in the same order; the interpreter's prepare step does)."""
        import torch.distributed._symmetric_memory as symm_mem

        if self._buffer is not None and self._buffer.numel() >= nbytes:
            return
        # At least double, so growth happens a few times at most; and keep the buffers
        # it replaces: SendRecvs already issued (their copy-out, a peer's write) may still
        # be queued on the device and must not find their memory freed or reused.
        old = 0 if self._buffer is None else self._buffer.numel()
        size = max(nbytes, 2 * old, 1 << 20)
        if self._buffer is not None:
            self._retired.append((self._buffer, self._handle))
        self._buffer = symm_mem.empty(size, dtype=torch.uint8, device=torch.cuda.current_device())
        self._handle = symm_mem.rendezvous(self._buffer, self.group_name)
        self._views.clear()

    def _view(self, rank: int, shape: tuple, dtype) -> torch.Tensor:
        """The start of ``rank``'s symmetric buffer as a tensor; made once per (rank,
        shape, dtype) and buffer, since making one costs host time every SendRecv."""
        key = (rank, shape, dtype)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = self._handle.get_buffer(rank, shape, dtype, 0)
        return view

    def symmetric_tensor(self, shape: tuple, dtype: torch.dtype):
        """A tensor in symmetric memory (a host collective: every rank calls it with the
        same shape, in the same order) and its handle, for ``sendrecv_direct``."""
        import torch.distributed._symmetric_memory as symm_mem

        tensor = symm_mem.empty(tuple(shape), dtype=dtype, device=torch.cuda.current_device())
        return tensor, symm_mem.rendezvous(tensor, self.group_name)

    @staticmethod
    def remote_view(handle, peer: int, shape: tuple, dtype: torch.dtype, offset: int):
        """``peer``'s copy of the symmetric tensor of ``handle``, from element ``offset``,
        as a tensor this rank can write (the caller keeps it: making one costs host time)."""
        return handle.get_buffer(peer, tuple(shape), dtype, offset)

    def sendrecv_direct(self, out, inp, send_peer: int, recv_peer: int, stream, handle, dst):
        """SendRecv into symmetric memory: ``inp`` goes to ``dst`` (``remote_view`` of
        ``send_peer``'s receive buffer); ``out``, a view of this rank's copy of the same
        symmetric tensor, is filled by ``recv_peer`` meanwhile."""
        _check_pair(out, inp)
        s = stream if stream is not None else torch.cuda.current_stream()
        timeout_ms = int(options().comm_timeout_s * 1000)
        with torch.cuda.stream(s):
            handle.barrier(channel=0, timeout_ms=timeout_ms)
            (out if send_peer == self.rank else dst).copy_(inp)
            handle.barrier(channel=0, timeout_ms=timeout_ms)
        return self._posted(s, inp)

    def sendrecv(self, out, inp, send_peer: int, recv_peer: int, stream=None):
        _check_pair(out, inp)
        self.reserve(inp.numel() * inp.element_size())
        s = stream if stream is not None else torch.cuda.current_stream()
        h = self._handle
        # A device barrier that waits past HOSTIR_COMM_TIMEOUT traps (a device error the
        # process cannot survive) instead of spinning forever on a peer that is gone.
        timeout_ms = int(options().comm_timeout_s * 1000)
        with torch.cuda.stream(s):
            h.barrier(channel=0, timeout_ms=timeout_ms)
            if send_peer == self.rank:
                out.copy_(inp)
            else:
                self._view(send_peer, tuple(inp.shape), inp.dtype).copy_(inp)
            h.barrier(channel=0, timeout_ms=timeout_ms)
            if send_peer != self.rank:
                out.copy_(self._view(self.rank, tuple(out.shape), out.dtype))
        return self._posted(s, inp)

    def _posted(self, s, inp):
        """The SendRecv's completion: NCCL's posted work (an event its watchdog checks),
        or a plain event over another wrapped communicator."""
        posted = getattr(self.base, "_posted", None)
        if posted is not None:
            return posted("copy-engine SendRecv", s, inp)
        from runtime.comm.nccl import _EventWork  # no cupy needed for this

        event = torch.cuda.Event()
        event.record(s)
        return _EventWork(s, event)


def _check_pair(out: torch.Tensor, inp: torch.Tensor) -> None:
    if not (inp.is_contiguous() and out.is_contiguous()):
        raise CommunicationError("copy-engine SendRecv needs contiguous tensors")
    if inp.numel() != out.numel() or inp.dtype != out.dtype:
        raise CommunicationError(
            f"copy-engine SendRecv sends as much as it receives: in {list(inp.shape)} "
            f"{inp.dtype}, out {list(out.shape)} {out.dtype}")
