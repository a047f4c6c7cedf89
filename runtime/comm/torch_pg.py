"""Collectives through an existing ``torch.distributed`` process group.

For training loops that already called ``init_process_group`` (NCCL on GPUs, gloo on the
CPU). Timeouts are the group's own (torch's NCCL watchdog; ``Session`` makes groups with
HOSTIR_COMM_TIMEOUT). Collectives are posted with ``async_op=True``; for NCCL, ``Work.wait()`` makes the
current stream wait on the group's internal stream (no host block); for gloo it completes
the operation on the host.
"""

from __future__ import annotations

import torch.distributed as dist

from hostir.errors import CommTimeoutError, CommunicationError
from hostir.options import options
from runtime import flight

# torch 2.13 renamed all_gather_into_tensor (deprecated there); torch 2.11 has only the old name.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


class _TorchWork:
    def __init__(self, work, finish=None, what="collective"):
        self.work = work
        self.finish = finish
        self.what = what  # the interpreter's error adds the rank and statement

    def query(self) -> bool:
        """Finished (never blocks): the flight recorder asks when it writes its record."""
        work = self.work
        return work is None or bool(getattr(work, "is_completed", lambda: False)())

    def _failed(self, e: RuntimeError) -> None:
        """One line naming the collective, the group's own reason and the flight record."""
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        timed_out = "timed out" in reason.lower() or "timeout" in reason.lower()
        message = (f"torch {self.what} failed: {reason}"
                   + (f" (HOSTIR_COMM_TIMEOUT={options().comm_timeout_s:g} s); expected every "
                      "rank to post it: a peer rank failed, died or is stuck" if timed_out else ""))
        where = flight.dump(f"torch collective failed: {message}")
        raise (CommTimeoutError if timed_out else CommunicationError)(
            message + flight.describe(where)) from None

    def wait(self, stream=None) -> None:
        if self.work is not None:
            try:
                self.work.wait()
            except RuntimeError as e:  # gloo: a timeout; NCCL: an aborted communicator
                self._failed(e)
            self.work = None
            if self.finish is not None:
                self.finish()


class TorchCommunicator:
    name = "torch"

    def __init__(self, group=None):
        if not dist.is_available() or not dist.is_initialized():
            raise CommunicationError(
                "torch communicator: torch.distributed is not initialized; call "
                "torch.distributed.init_process_group first (or use the nccl/mpi backends)"
            )
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.backend = dist.get_backend(self.group)

    def _work(self, work, what: str, finish=None) -> _TorchWork:
        return _TorchWork(work, finish, f"{self.backend} {what}")

    def allgather(self, out, inp, stream=None):
        return self._work(_all_gather(out, inp.contiguous(), group=self.group, async_op=True),
                          "Allgather")

    def reduce_scatter(self, out, inp, op: str = "sum", stream=None):
        return self._work(_reduce_scatter(out, inp.contiguous(), op=_OPS[op], group=self.group,
                                          async_op=True), "ReduceScatter")

    def allreduce(self, out, inp, op: str = "sum", stream=None):
        if out.data_ptr() != inp.data_ptr():
            out.copy_(inp)
        return self._work(dist.all_reduce(out, op=_OPS[op], group=self.group, async_op=True),
                          "Allreduce")

    def broadcast(self, out, inp, root: int, stream=None):
        if self.rank == root and out.data_ptr() != inp.data_ptr():
            out.copy_(inp)
        return self._work(dist.broadcast(out, src=root, group=self.group, async_op=True),
                          "Broadcast")

    def sendrecv(self, out, inp, send_peer: int, recv_peer: int, stream=None):
        ops = [dist.P2POp(dist.isend, inp.contiguous(), send_peer, self.group),
               dist.P2POp(dist.irecv, out, recv_peer, self.group)]
        works = dist.batch_isend_irecv(ops)

        class _All:
            def is_completed(self_inner):
                return all(w.is_completed() for w in works)

            def wait(self_inner):
                for w in works:
                    w.wait()

        return self._work(_All(), "SendRecv")

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def agree(self, obj) -> list:
        """Every rank's ``obj`` in rank order; bounded by the group's own timeout
        (``init_torch_distributed_from_mpi`` sets it from HOSTIR_COMM_TIMEOUT)."""
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out
