"""The copy engine's symmetric-memory rendezvous, without a GPU: ranks that share a GPU
get one clear line."""

import sys
import types

import pytest

from hostir.errors import CommunicationError


class _Tensor:
    def get_device(self):
        return 0


def _fake_symm_mem(monkeypatch, error):
    def rendezvous(tensor, group_name):
        raise error

    mod = types.ModuleType("torch.distributed._symmetric_memory")
    mod.rendezvous = rendezvous
    monkeypatch.setitem(sys.modules, "torch.distributed._symmetric_memory", mod)


def test_ranks_sharing_a_gpu_are_told_to_set_their_device(monkeypatch):
    from runtime.comm.copy_engine import rendezvous

    _fake_symm_mem(monkeypatch, RuntimeError("CUDASymmetricMemoryAllocator::rendezvous: detected "
                                             "allocations from overlapping devices from "
                                             "different ranks."))
    with pytest.raises(CommunicationError, match=r"share a GPU \(this rank is on cuda:0\): .*"
                                                 r"torch.cuda.set_device\(local_rank\)"):
        rendezvous(_Tensor(), "0")


def test_other_rendezvous_errors_pass_through(monkeypatch):
    from runtime.comm.copy_engine import rendezvous

    _fake_symm_mem(monkeypatch, RuntimeError("something else"))
    with pytest.raises(RuntimeError, match="^something else$"):
        rendezvous(_Tensor(), "0")
