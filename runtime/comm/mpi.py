"""Collectives over mpi4py for CPU tensors (tests and laptops).

Collectives are posted non-blocking (``Iallgather`` ...) and completed by ``Work.wait``.
Data moves as bytes, so bf16 and fp16 travel unchanged; reductions of half types run in
float32 (MPI has no bf16 type) and are rounded once at the end.
"""

from __future__ import annotations

import numpy as np
import torch

from hostir.errors import CommunicationError

_REDUCE = {"sum": "SUM", "max": "MAX", "min": "MIN"}


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.uint8).numpy() if t.dim() else t.reshape(1).view(torch.uint8).numpy()


class _MpiWork:
    """Requests in flight and the buffers they read and write: MPI uses the memory until
    the requests complete, so the work keeps every buffer alive until then."""

    def __init__(self, requests, finish=None, buffers=()):
        self.requests = requests
        self.finish = finish
        self.buffers = buffers
        self.done = False

    def wait(self, stream=None) -> None:
        if self.done:
            return
        from mpi4py import MPI

        MPI.Request.Waitall(self.requests)
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
        return _MpiWork([req], back, (src, dst, buf))

    def broadcast(self, out, inp, root: int, stream=None):
        self._check(out, inp)
        buf, back = self._staged(out)
        if self.rank == root:
            buf.copy_(inp)
        data = _bytes(buf)
        req = self.comm.Ibcast(data, root=root)
        return _MpiWork([req], back, (data, buf))

    def sendrecv(self, out, inp, send_peer: int, recv_peer: int, stream=None):
        self._check(out, inp)
        buf, back = self._staged(out)
        src, dst = _bytes(inp.contiguous()), _bytes(buf)
        reqs = [self.comm.Isend(src, dest=send_peer, tag=7),
                self.comm.Irecv(dst, source=recv_peer, tag=7)]
        return _MpiWork(reqs, back, (src, dst, buf))

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
        return _MpiWork([req], lambda: out.copy_(dst), (src, dst, sa, da))

    def reduce_scatter(self, out, inp, op: str = "sum", stream=None):
        return self._reduce(out, inp, op, scatter=True)

    def allreduce(self, out, inp, op: str = "sum", stream=None):
        return self._reduce(out, inp, op, scatter=False)

    def barrier(self) -> None:
        self.comm.Barrier()
