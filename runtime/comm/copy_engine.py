"""A SendRecv transport that takes no SMs: peer writes by the copy engine over CUDA IPC.

NCCL moves data with kernels, which take SMs from a GEMM running beside them. Here each
rank owns a buffer in torch's symmetric memory (mapped into every peer over CUDA IPC); a
SendRecv, on the current stream:

    barrier                                  # every peer has copied out its last message
    peer_buffer[send_peer] <- in             # cudaMemcpyAsync peer write: the copy engine
    barrier                                  # my receive buffer is filled
    out <- my buffer                         # local copy, copy engine too

The barriers take no SMs either: stream memory operations (``cuStreamWriteValue32`` of an
epoch into every peer's signal slot, then ``cuStreamWaitValue32`` on this rank's slots),
which the GPU's front end executes between a stream's kernels. A barrier kernel would
need an SM, and a GEMM on another stream that fills every SM holds it off until the
GEMM's last wave: measured on 2 x H200 (benchmarks/trace_tp_step.py), transfers of the
MLP step then started at the end of the GEMM they were meant to hide behind. Where stream
memory operations are unavailable, and under CUDA graph capture (a replay would reuse the
captured epochs), torch's symmetric-memory barrier kernel is used
(``HOSTIR_DISABLE=stream_memops`` forces it). The host never blocks. Every other collective goes to the wrapped communicator: hostir's NCCL
one, or a ``TorchCommunicator`` over the caller's NCCL process group (``hostir.nn`` does
that when ``torch.distributed`` is initialized). The symmetric memory is rendezvoused over
``group`` (default: the world group of ``torch.distributed``, initialized with NCCL from
MPI when it is not), whose ranks must be the wrapped communicator's. ``rendezvous`` takes
the group by name and finds its store itself (torch >= 2.11), so no per-group set-up call
precedes it (torch 2.11 deprecated ``enable_symm_mem_for_group`` as needless).

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
from runtime.bootstrap import init_torch_distributed_from_mpi
from runtime.comm.nccl import _EventWork
from runtime.watchdog import Watchdog


_CU = None
CU_STREAM_WAIT_VALUE_GEQ = 0x0
CU_STREAM_WRITE_VALUE_DEFAULT = 0x0  # a memory fence before the write


def rendezvous(tensor, group_name: str):
    """torch's symmetric-memory rendezvous of ``tensor`` over the group, with the error of
    ranks that share a GPU said in one line: what ``device="cuda"`` gives every rank of a
    node whose script did not call ``torch.cuda.set_device`` first."""
    import torch.distributed._symmetric_memory as symm_mem

    try:
        return symm_mem.rendezvous(tensor, group_name)
    except RuntimeError as e:
        if "overlapping devices" not in str(e):
            raise
        raise CommunicationError(
            f"the copy engine's ranks share a GPU (this rank is on cuda:{tensor.get_device()}): "
            "give each rank of a node its own, with torch.cuda.set_device(local_rank) before "
            "making its tensors and layers, or a device='cuda:N' of its own") from None


def _driver():
    """The CUDA driver's (cuStreamWriteValue32, cuStreamWaitValue32), or None where absent."""
    global _CU
    if _CU is None:
        import ctypes

        _CU = False
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return None
        fns = []
        for name in ("cuStreamWriteValue32", "cuStreamWaitValue32"):
            fn = getattr(lib, name + "_v2", None) or getattr(lib, name, None)
            if fn is None:
                return None
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            fns.append(fn)
        _CU = tuple(fns)
    return _CU or None


class _SignalBarrier:
    """A barrier of all ranks on a stream, by stream memory operations: no kernel, no SM.

    Every rank owns ``world_size`` 32-bit slots in symmetric memory. Barrier number ``e``
    (counted on the host; every rank calls the barriers in the same order, as with any
    collective) writes ``e`` into its own slot of every peer (fenced after the stream's
    earlier work, the copies included), then waits until each peer's slot of its own
    memory reaches ``e``. The epochs only grow, so no slot is ever reset."""

    def __init__(self, comm: "CopyEngineCommunicator"):
        self.rank, self.world = comm.rank, comm.world_size
        self.slots, handle = comm.symmetric_tensor((self.world,), torch.int32)
        self.slots.zero_()
        torch.cuda.current_stream().synchronize()
        handle.barrier(channel=0)  # every rank's slots are zero before the first use
        torch.cuda.current_stream().synchronize()
        self._handle = handle  # keeps the peers' mappings alive
        self.peer_slot = {p: comm.remote_view(handle, p, (self.world,), torch.int32, 0)
                          .data_ptr() + 4 * self.rank for p in range(self.world) if p != self.rank}
        self.mine = self.slots.data_ptr()
        self.epoch = 0

    def __call__(self, stream) -> None:
        write, wait = _driver()
        self.epoch += 1
        if self.epoch >= 0x7FFFFFFF:  # far off: 2^31 barriers
            raise CommunicationError("copy-engine barrier: epoch counter exhausted")
        s, e = stream.cuda_stream, self.epoch
        for addr in self.peer_slot.values():
            _check(write(s, addr, e, CU_STREAM_WRITE_VALUE_DEFAULT), "cuStreamWriteValue32")
        for p in self.peer_slot:
            _check(wait(s, self.mine + 4 * p, e, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise CommunicationError(f"copy-engine barrier: {what} failed with CUDA driver error {rc}")


class CopyEngineCommunicator:
    name = "copy_engine"

    def __init__(self, base, group=None):
        import torch.distributed as dist

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
        self._signals = None  # the SM-free barrier, made at the first SendRecv
        self._watchdog = None  # when the wrapped communicator has none (the torch group)

    def __getattr__(self, name):  # allgather, reduce_scatter, ... go to the wrapped NCCL
        return getattr(self.base, name)

    @property
    def watchdog(self) -> Watchdog:
        """The wrapped NCCL communicator's watchdog, or one of this transport's own over a
        torch group (whose collectives torch watches, but not these peer writes)."""
        dog = getattr(self.base, "watchdog", None)
        if dog is None:
            if self._watchdog is None:
                self._watchdog = Watchdog(self.rank, "copy engine")
            dog = self._watchdog
        return dog

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
        self._handle = rendezvous(self._buffer, self.group_name)
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
        return tensor, rendezvous(tensor, self.group_name)

    @staticmethod
    def remote_view(handle, peer: int, shape: tuple, dtype: torch.dtype, offset: int):
        """``peer``'s copy of the symmetric tensor of ``handle``, from element ``offset``,
        as a tensor this rank can write (the caller keeps it: making one costs host time)."""
        return handle.get_buffer(peer, tuple(shape), dtype, offset)

    def _barrier(self, handle, timeout_ms: int) -> None:
        """A barrier of all ranks on the current stream (see the module docstring)."""
        if self._signals is None:
            use = _driver() is not None and not options().disable("stream_memops")
            self._signals = _SignalBarrier(self) if use else False
        # Under CUDA graph capture the epochs would be baked into the graph and a replay
        # would pass its waits at once: captured SendRecvs keep torch's barrier kernel.
        if self._signals and not torch.cuda.is_current_stream_capturing():
            self._signals(torch.cuda.current_stream())
        else:
            handle.barrier(channel=0, timeout_ms=timeout_ms)

    def sendrecv_direct(self, out, inp, send_peer: int, recv_peer: int, stream, handle, dst):
        """SendRecv into symmetric memory: ``inp`` goes to ``dst`` (``remote_view`` of
        ``send_peer``'s receive buffer); ``out``, a view of this rank's copy of the same
        symmetric tensor, is filled by ``recv_peer`` meanwhile."""
        _check_pair(out, inp)
        s = stream if stream is not None else torch.cuda.current_stream()
        timeout_ms = int(options().comm_timeout_s * 1000)
        with torch.cuda.stream(s):
            self._barrier(handle, timeout_ms)
            (out if send_peer == self.rank else dst).copy_(inp)
            self._barrier(handle, timeout_ms)
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
            self._barrier(h, timeout_ms)
            if send_peer == self.rank:
                out.copy_(inp)
            else:
                self._view(send_peer, tuple(inp.shape), inp.dtype).copy_(inp)
            self._barrier(h, timeout_ms)
            if send_peer != self.rank:
                out.copy_(self._view(self.rank, tuple(out.shape), out.dtype))
        return self._posted(s, inp)

    def _posted(self, s, inp):
        """The SendRecv's completion: NCCL's posted work (an event its watchdog checks),
        or a plain event over another wrapped communicator."""
        posted = getattr(self.base, "_posted", None)
        if posted is not None:
            return posted("copy-engine SendRecv", s, inp)
        event = torch.cuda.Event()
        event.record(s)
        if torch.cuda.is_current_stream_capturing():
            return _EventWork(s, event)
        # A stream-memory wait has no timeout of its own: a peer that is gone would leave
        # it waiting forever, so a watchdog ends the job after HOSTIR_COMM_TIMEOUT.
        self.watchdog.watch(f"copy-engine SendRecv of {inp.numel() * inp.element_size()} "
                             "bytes", event.query)
        return _EventWork(s, event)


def _check_pair(out: torch.Tensor, inp: torch.Tensor) -> None:
    if not (inp.is_contiguous() and out.is_contiguous()):
        raise CommunicationError("copy-engine SendRecv needs contiguous tensors")
    if inp.numel() != out.numel() or inp.dtype != out.dtype:
        raise CommunicationError(
            f"copy-engine SendRecv sends as much as it receives: in {list(inp.shape)} "
            f"{inp.dtype}, out {list(out.shape)} {out.dtype}")
