"""SendRecv straight into the peer's receive buffer (the copy engine's direct mode), with
every rank of a ring program simulated by a thread: the interpreter allocates the
gathered buffer once through the transport's ``symmetric_tensor``, finds the peer's
receive slot by evaluating the output's Selects with ``rank`` bound to the peer, and the
result equals the unsharded product."""

from __future__ import annotations

import threading

import pytest
import torch

from lowering.patterns import allgather_matmul, shard_rows
from lowering.pipeline import lower
from runtime.device import CpuBackend
from runtime.interpreter import Interpreter

from .threads import run_ranks


class _Done:
    def wait(self, stream=None):
        pass


class SymmetricWorld:
    """What torch symmetric memory gives the ranks, for threads: each rank's tensors,
    found by peers by allocation order; ``rendezvous`` and ``barrier`` are collectives."""

    def __init__(self, world: int):
        self.world = world
        self.tensors = [[] for _ in range(world)]
        self.barrier = threading.Barrier(world, timeout=30)
        self.sends = []  # (rank, peer, offset), for the test to read
        self.lock = threading.Lock()


class ThreadComm:
    name = "threads"

    def __init__(self, rank: int, shared: SymmetricWorld):
        self.rank, self.world_size, self.shared = rank, shared.world, shared
        self.staged = 0

    def symmetric_tensor(self, shape, dtype):
        t = torch.full(tuple(shape), float("nan"), dtype=dtype)  # poisoned until written
        self.shared.tensors[self.rank].append(t)
        self.shared.barrier.wait()  # a collective, like rendezvous
        return t, len(self.shared.tensors[self.rank]) - 1

    def remote_view(self, handle, peer, shape, dtype, offset):
        whole = self.shared.tensors[peer][handle]
        return whole.view(-1)[offset:offset + torch.Size(shape).numel()].view(tuple(shape))

    def sendrecv_direct(self, out, inp, send_peer, recv_peer, stream, handle, dst):
        with self.shared.lock:
            self.shared.sends.append((self.rank, send_peer, dst.data_ptr()))
        self.shared.barrier.wait()
        dst.copy_(inp)
        self.shared.barrier.wait()
        return _Done()

    def sendrecv(self, out, inp, send_peer, recv_peer, stream=None):  # staging path
        raise AssertionError("the direct path was expected")


@pytest.mark.parametrize("world,stages", [(2, 1), (2, 2), (3, 1), (4, 2)])
def test_ring_program_writes_into_the_peers_gathered_buffer(world, stages):
    m, k, n = 8 * world * stages, 16, 12
    a = torch.randn(m, k, generator=torch.Generator().manual_seed(0))
    a2 = torch.randn(m, k, generator=torch.Generator().manual_seed(2))
    b = torch.randn(k, n, generator=torch.Generator().manual_seed(1))
    shared = SymmetricWorld(world)

    def rank_main(r: int):
        p = lower(allgather_matmul(m, k, n, stages, world, "float32"), world, 2, r,
                  schedule="ring")
        it = Interpreter(p, CpuBackend(), ThreadComm(r, shared))
        assert it._direct, "the gathered buffer should be symmetric"
        # The second call reuses the symmetric buffer (and the flat steps' views of it)
        # on other inputs.
        return [it(shard_rows(x, stages, world, r), b)[0] for x in (a, a2)]

    results = run_ranks(world, shared.barrier, rank_main)
    for r in range(world):
        for got, x in zip(results[r], (a, a2)):
            torch.testing.assert_close(got.reshape(m, n), x @ b, rtol=1e-5, atol=1e-5)
    # Every send of rank r landed in the slot of rank r of its peer's buffer: one
    # allocation per rank, and (world - 1) sends per stage per call.
    assert all(len(ts) == 1 for ts in shared.tensors)
    assert len(shared.sends) == 2 * world * (world - 1) * stages


def test_direct_mode_can_be_disabled(monkeypatch):
    from hostir.options import set_options

    monkeypatch.setenv("HOSTIR_DISABLE", "direct_sendrecv")
    set_options(None)
    try:
        p = lower(allgather_matmul(16, 8, 8, 1, 2, "float32"), 2, 2, 0, schedule="ring")
        it = Interpreter(p, CpuBackend(), ThreadComm(0, SymmetricWorld(2)))
        assert it._direct == {}
    finally:
        monkeypatch.delenv("HOSTIR_DISABLE")
        set_options(None)
