"""The protocol every communicator implements, and the choice between them.

A collective is *posted* on a stream and returns a ``Work`` at once; ``Work.wait(stream)``
makes ``stream`` wait for it (GPU backends: an event wait, the host never blocks) or
completes it (CPU backends). Ranks must post the same collectives in the same order.
Teams are the whole world, in rank order.
"""

from __future__ import annotations

from typing import Protocol

import torch

from hostir.errors import CommunicationError


class Work(Protocol):
    def wait(self, stream) -> None: ...


class Communicator(Protocol):
    rank: int
    world_size: int
    name: str

    def allgather(self, out: torch.Tensor, inp: torch.Tensor, stream) -> Work: ...
    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: str, stream) -> Work: ...
    def allreduce(self, out: torch.Tensor, inp: torch.Tensor, op: str, stream) -> Work: ...
    def broadcast(self, out: torch.Tensor, inp: torch.Tensor, root: int, stream) -> Work: ...
    def sendrecv(self, out: torch.Tensor, inp: torch.Tensor, send_peer: int, recv_peer: int,
                 stream) -> Work: ...
    def barrier(self) -> None: ...
    def agree(self, obj) -> list:
        """Every rank's small picklable ``obj``, in rank order (the input agreement)."""
        ...


class DoneWork:
    """Work that finished when it was posted."""

    def wait(self, stream) -> None:
        pass


def check_team(comm: Communicator, team) -> None:
    if tuple(team) != tuple(range(comm.world_size)):
        raise CommunicationError(
            f"team {list(team)} on a {comm.name} communicator of {comm.world_size} ranks: "
            f"only the whole world in rank order is supported; expected "
            f"{list(range(comm.world_size))}"
        )


def make_communicator(kind: str = "auto", device: str = "cpu", process_group=None):
    """``auto``: the caller's torch ProcessGroup if given, NCCL on CUDA, MPI on the CPU.

    Example::

        comm = make_communicator("auto", device="cuda")    # under mpirun, one GPU a rank
    """
    if process_group is not None or kind == "torch":
        from runtime.comm.torch_pg import TorchCommunicator

        return TorchCommunicator(process_group)
    if kind == "auto":
        kind = "nccl" if device.startswith("cuda") else "mpi"
    if kind == "nccl":
        from runtime.comm.nccl import NcclCommunicator

        return NcclCommunicator.from_mpi()
    if kind == "mpi":
        from runtime.comm.mpi import MpiCommunicator

        return MpiCommunicator()
    if kind == "copy_engine":
        from runtime.comm.copy_engine import CopyEngineCommunicator
        from runtime.comm.nccl import NcclCommunicator

        return CopyEngineCommunicator(NcclCommunicator.from_mpi())
    raise CommunicationError(
        f"unknown communicator {kind!r}: expected auto, nccl, copy_engine, torch or mpi")
