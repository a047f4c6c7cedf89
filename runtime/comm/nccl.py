"""Collectives through NCCL (CuPy's bindings), bootstrapped by mpi4py.

Rank 0 makes the NCCL unique id and hands it to every rank over MPI; every rank then joins
the communicator on its GPU. Both steps are bounded by HOSTIR_COMM_TIMEOUT
(``runtime.bootstrap``): a rank that never joins is named on every other rank. Collectives run on the *current* stream, so a Wait on the same
stream is free and a Wait from another stream is an event wait: the host never blocks.

Each collective records an event that a ``Watchdog`` (``runtime.watchdog``) checks: one
not complete within HOSTIR_COMM_TIMEOUT aborts the NCCL communicator and raises
``CommTimeoutError`` on its rank, so a peer that failed never leaves this one hanging.
The watchdog also polls NCCL's asynchronous error state (``ncclCommGetAsyncError``, CuPy's
``check_async_error``), as torch's c10d does: a communicator that failed (a peer's
network link, a remote abort) ends the job at once with NCCL's own text, not after the
timeout. A CuPy without that call leaves only the timeout.
"""

from __future__ import annotations

import torch

from hostir.errors import CommunicationError
from runtime.bootstrap import exchange_over_mpi, with_deadline
from runtime.comm.mpi import agree_over_mpi, wait_requests
from runtime.device import current_stream
from runtime.watchdog import Watchdog

INSTALL_HINT = "pip install 'hostir[cuda13]' (CUDA 13; 'hostir[cuda12]' for CUDA 12)"


def nccl_module():
    """CuPy's NCCL bindings, or a one-line ``CommunicationError`` with the pip install
    that provides them."""
    try:
        from cupy.cuda import nccl
    except ImportError as e:
        raise CommunicationError(
            f"--comm nccl needs CuPy with NCCL, which is not installed ({e}); {INSTALL_HINT}"
        ) from None
    if not hasattr(nccl, "NcclCommunicator"):  # CuPy found no NCCL library at import
        raise CommunicationError(
            f"--comm nccl needs the NCCL library, which CuPy did not find; {INSTALL_HINT}")
    return nccl

# ncclDataType_t and ncclRedOp_t values of nccl.h
_NCCL_DTYPE = {
    torch.int8: 0, torch.uint8: 1, torch.int32: 2, torch.int64: 4,
    torch.float16: 6, torch.float32: 7, torch.float64: 8, torch.bfloat16: 9,
}
_NCCL_OP = {"sum": 0, "max": 2, "min": 3}


class _EventWork:
    """A collective posted on ``stream``, with the event recorded after it: waiting from
    another stream is an event wait (``cudaStreamWaitEvent``)."""

    def __init__(self, stream: torch.cuda.Stream, event: torch.cuda.Event):
        self.stream = stream
        self.event = event

    def query(self) -> bool:
        """Finished on the device (never blocks)."""
        return self.event.query()

    def wait(self, stream) -> None:
        if stream is None or stream == self.stream:
            return
        stream.wait_event(self.event)


class NcclCommunicator:
    name = "nccl"

    def __init__(self, rank: int, world_size: int, unique_id, device: int):
        nccl = nccl_module()
        self.nccl = nccl
        self.rank = rank
        self.world_size = world_size
        self.device = device
        torch.cuda.set_device(device)
        import cupy

        cupy.cuda.Device(device).use()

        def init():  # on the helper thread of with_deadline: the device is per thread
            cupy.cuda.Device(device).use()
            return nccl.NcclCommunicator(world_size, unique_id, rank)

        self.comm = with_deadline(init, "NCCL communicator init", rank)
        # The communicator's own stream: see _stream.
        self.stream = torch.cuda.Stream(torch.device("cuda", device))
        self._ready = torch.cuda.Event()
        self.watchdog = Watchdog(rank, "NCCL", on_timeout=[self.abort],
                                 health=[self.async_error])

    def async_error(self) -> str | None:
        """NCCL's asynchronous error on this communicator, as text; None while healthy
        (or when this CuPy cannot ask)."""
        check = getattr(self.comm, "check_async_error", None)
        if check is None or not getattr(self, "_can_ask", True):
            return None
        try:
            check()
        except self.nccl.NcclError as e:
            return f"NCCL error: {e}"
        except RuntimeError:  # an NCCL before 2.4 cannot be asked: stop asking
            self._can_ask = False
        return None

    def _posted(self, what: str, s: torch.cuda.Stream, t: torch.Tensor) -> _EventWork:
        event = torch.cuda.Event()
        event.record(s)
        if torch.cuda.is_current_stream_capturing():
            # Recorded into a CUDA graph being captured: the event completes only at
            # replay, and querying it from the watchdog's thread now is not allowed.
            return _EventWork(s, event)
        self.watchdog.watch(f"NCCL {what} of {t.numel() * t.element_size()} bytes", event.query)
        return _EventWork(s, event)

    @classmethod
    def from_mpi(cls, mpi_comm=None) -> "NcclCommunicator":
        """One rank a GPU: the GPU is the rank's index among the ranks of its node."""
        from mpi4py import MPI

        nccl = nccl_module()
        comm = mpi_comm if mpi_comm is not None else MPI.COMM_WORLD
        ngpu = torch.cuda.device_count()
        if ngpu == 0:
            raise CommunicationError("NCCL communicator: no CUDA device is visible")
        # First the bounded exchange: once it passed, every rank is here and the
        # blocking Split_type below cannot wait for a rank that never comes.
        uid = exchange_over_mpi(comm, nccl.get_unique_id, "the NCCL unique id")
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        local_rank = local.Get_rank()
        local.Free()
        return cls(comm.Get_rank(), comm.Get_size(), uid, local_rank % ngpu)

    def _dtype(self, t: torch.Tensor) -> int:
        try:
            return _NCCL_DTYPE[t.dtype]
        except KeyError:
            raise CommunicationError(f"NCCL has no type for {t.dtype}") from None

    def _stream(self, stream) -> torch.cuda.Stream:
        """The communicator's own stream, ordered after ``stream`` (where the data was
        produced) by an event. Posting every collective of this communicator on one
        stream keeps them in the order they were posted, whichever worker stream posted
        them: NCCL matches collectives by order on every rank, and two collectives of one
        communicator must not run concurrently. ``Wait`` orders the consumer after it."""
        caller = stream if stream is not None else current_stream(self.device)
        if caller != self.stream:
            self._ready.record(caller)
            self.stream.wait_event(self._ready)
        return self.stream

    def _check(self, *ts: torch.Tensor) -> None:
        self.watchdog.raise_if_failed()
        for t in ts:
            if not t.is_cuda or not t.is_contiguous():
                raise CommunicationError(
                    f"NCCL needs contiguous CUDA tensors, got {t.device} "
                    f"contiguous={t.is_contiguous()} shape={list(t.shape)}"
                )

    def allgather(self, out, inp, stream=None):
        self._check(out, inp)
        s = self._stream(stream)
        self.comm.allGather(inp.data_ptr(), out.data_ptr(), inp.numel(), self._dtype(inp),
                            s.cuda_stream)
        return self._posted("Allgather", s, inp)

    def reduce_scatter(self, out, inp, op: str = "sum", stream=None):
        self._check(out, inp)
        s = self._stream(stream)
        self.comm.reduceScatter(inp.data_ptr(), out.data_ptr(), out.numel(), self._dtype(inp),
                                _NCCL_OP[op], s.cuda_stream)
        return self._posted("ReduceScatter", s, inp)

    def allreduce(self, out, inp, op: str = "sum", stream=None):
        self._check(out, inp)
        s = self._stream(stream)
        self.comm.allReduce(inp.data_ptr(), out.data_ptr(), inp.numel(), self._dtype(inp),
                            _NCCL_OP[op], s.cuda_stream)
        return self._posted("Allreduce", s, inp)

    def broadcast(self, out, inp, root: int, stream=None):
        self._check(out, inp)
        s = self._stream(stream)
        self.comm.broadcast(inp.data_ptr(), out.data_ptr(), inp.numel(), self._dtype(inp), root,
                            s.cuda_stream)
        return self._posted("Broadcast", s, inp)

    def sendrecv(self, out, inp, send_peer: int, recv_peer: int, stream=None):
        self._check(out, inp)
        s = self._stream(stream)
        self.nccl.groupStart()
        self.comm.send(inp.data_ptr(), inp.numel(), self._dtype(inp), send_peer, s.cuda_stream)
        self.comm.recv(out.data_ptr(), out.numel(), self._dtype(out), recv_peer, s.cuda_stream)
        self.nccl.groupEnd()
        return self._posted("SendRecv", s, inp)

    def barrier(self) -> None:
        from mpi4py import MPI

        wait_requests([MPI.COMM_WORLD.Ibarrier()], "MPI barrier", self.rank)

    def agree(self, obj) -> list:
        """Every rank's ``obj`` in rank order, over MPI (which bootstrapped this NCCL comm)."""
        from mpi4py import MPI

        return agree_over_mpi(MPI.COMM_WORLD, obj, self.rank)

    def abort(self) -> None:
        """Abort the NCCL communicator: its kernels in flight exit (used by the watchdog)."""
        self.comm.abort()
