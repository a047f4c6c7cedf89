"""Collectives over mpi4py for CPU tensors (tests and laptops).

Collectives are posted non-blocking (``Iallgather`` ...) and completed by ``Work.wait``.
Data moves as bytes, so bf16 and fp16 travel unchanged; reductions of half types run in
float32 (MPI has no bf16 type) and are rounded once at the end.

No wait blocks forever: ``Work.wait`` polls ``Test`` with a growing sleep until
HOSTIR_COMM_TIMEOUT passes, then raises ``CommTimeoutError`` (a peer that died or never
posted the collective), after writing this rank's flight record (``runtime.flight``),
whose directory the error names; the uncaught-error hook then aborts the MPI job.
"""

from __future__ import annotations

import pickle
import time

import numpy as np
import torch

from hostir.errors import CommTimeoutError, CommunicationError
from hostir.options import options
from runtime import flight

_REDUCE = {"sum": "SUM", "max": "MAX", "min": "MIN"}


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.uint8).numpy() if t.dim() else t.reshape(1).view(torch.uint8).numpy()


def wait_requests(requests, what: str, rank: int | None, timeout_s: float | None = None) -> None:
    """Complete MPI ``requests`` or raise ``CommTimeoutError`` after ``timeout_s``
    (default HOSTIR_COMM_TIMEOUT; 0 or less waits forever); the message names ``rank``
    unless it is None (the interpreter names it). Polls ``Testall`` (which also
    drives MPI's progress) with a sleep that grows from 10 us to 10 ms."""
    from mpi4py import MPI

    if MPI.Request.Testall(requests):
        return
    timeout_s = options().comm_timeout_s if timeout_s is None else timeout_s
    if timeout_s <= 0:
        MPI.Request.Waitall(requests)
        return
    start = time.monotonic()
    delay = 1e-5
    while not MPI.Request.Testall(requests):
        waited = time.monotonic() - start
        if waited > timeout_s:
            from runtime.watchdog import timeout_cause  # the error path only

            who = "" if rank is None else f"rank {rank}: "
            message = (f"{who}{what} did not complete within {timeout_s:g} s "
                       "(HOSTIR_COMM_TIMEOUT); expected every rank to post it, found it still "
                       f"pending: {timeout_cause()}")
            where = flight.dump(f"timeout: {message}")
            raise CommTimeoutError(message + flight.describe(where))
        time.sleep(delay)
        delay = min(delay * 2, 0.01)


def agree_over_mpi(comm, obj, rank: int, timeout_s: float | None = None,
                   what: str = "the input agreement") -> list:
    """Every rank's ``obj`` (small and picklable), in rank order; never blocks past the
    timeout (a timeout names ``what``). Two non-blocking steps: the sizes, then the
    bytes."""
    from mpi4py import MPI

    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    sizes = np.zeros(comm.Get_size(), dtype=np.int64)
    wait_requests([comm.Iallgather(np.array([data.size], dtype=np.int64), sizes)],
                  f"{what} (sizes)", rank, timeout_s)
    out = np.empty(int(sizes.sum()), dtype=np.uint8)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    wait_requests([comm.Iallgatherv(data, [out, sizes, offsets, MPI.BYTE])],
                  what, rank, timeout_s)
    return [pickle.loads(out[o:o + n].tobytes()) for o, n in zip(offsets, sizes)]


class _MpiWork:
    """Requests in flight and the buffers they read and write: MPI uses the memory until
    the requests complete, so the work keeps every buffer alive until then (and for good
    after a timeout: MPI may still write into them)."""

    def __init__(self, requests, finish=None, buffers=(), what="collective"):
        self.requests = requests
        self.finish = finish
        self.buffers = buffers
        self.done = False
        self.what = what

    def wait(self, stream=None) -> None:
        if self.done:
            return
        wait_requests(self.requests, f"MPI {self.what}", None)
        if self.finish is not None:
            self.finish()
        self.buffers = ()
        self.done = True


class MpiCommunicator:
    name = "mpi"

    def __init__(self, comm=None):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.world_size = self.comm.Get_size()

    def _check(self, *tensors: torch.Tensor) -> None:
        for t in tensors:
            if t.device.type != "cpu":
                raise CommunicationError(f"MPI communicator needs CPU tensors, got {t.device}")

    @staticmethod
    def _staged(out: torch.Tensor):
        """A contiguous buffer to receive into and the copy back into ``out``, if needed."""
        if out.is_contiguous():
            return out, None
        buf = torch.empty_like(out, memory_format=torch.contiguous_format)
        return buf, lambda: out.copy_(buf)

    def allgather(self, out, inp, stream=None):
        self._check(out, inp)
        buf, back = self._staged(out)
        src = _bytes(inp.contiguous())
        dst = _bytes(buf)
        req = self.comm.Iallgather(src, dst)
        return _MpiWork([req], back, (src, dst, buf), "Allgather")

    def broadcast(self, out, inp, root: int, stream=None):
        self._check(out, inp)
        buf, back = self._staged(out)
        if self.rank == root:
            buf.copy_(inp)
        data = _bytes(buf)
        req = self.comm.Ibcast(data, root=root)
        return _MpiWork([req], back, (data, buf), "Broadcast")

    def sendrecv(self, out, inp, send_peer: int, recv_peer: int, stream=None):
        self._check(out, inp)
        buf, back = self._staged(out)
        src, dst = _bytes(inp.contiguous()), _bytes(buf)
        reqs = [self.comm.Isend(src, dest=send_peer, tag=7),
                self.comm.Irecv(dst, source=recv_peer, tag=7)]
        return _MpiWork(reqs, back, (src, dst, buf), "SendRecv")

    def _reduce(self, out, inp, op: str, scatter: bool):
        self._check(out, inp)
        wide = inp.dtype in (torch.float16, torch.bfloat16)
        src = inp.float().contiguous() if wide else inp.contiguous()
        dst = torch.empty(out.shape, dtype=src.dtype)
        mop = getattr(self.MPI, _REDUCE[op])
        sa, da = src.numpy(), dst.numpy()
        if scatter:
            req = self.comm.Ireduce_scatter_block(sa, da, op=mop)
        else:
            req = self.comm.Iallreduce(sa, da, op=mop)
        return _MpiWork([req], lambda: out.copy_(dst), (src, dst, sa, da),
                        "ReduceScatter" if scatter else "Allreduce")

    def reduce_scatter(self, out, inp, op: str = "sum", stream=None):
        return self._reduce(out, inp, op, scatter=True)

    def allreduce(self, out, inp, op: str = "sum", stream=None):
        return self._reduce(out, inp, op, scatter=False)

    def barrier(self) -> None:
        wait_requests([self.comm.Ibarrier()], "MPI barrier", self.rank)

    def agree(self, obj) -> list:
        """Every rank's ``obj`` in rank order (a small picklable value)."""
        return agree_over_mpi(self.comm, obj, self.rank)
