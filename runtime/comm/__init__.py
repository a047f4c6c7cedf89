"""Communicators: the collectives a host program posts, over NCCL, a torch ProcessGroup
or MPI. ``make_communicator`` picks one; every backend implements ``Communicator``."""

from runtime.comm.base import Communicator, Work, make_communicator

__all__ = ["Communicator", "Work", "make_communicator"]
