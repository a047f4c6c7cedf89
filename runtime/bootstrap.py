"""Setting communicators up over MPI, with a deadline: a rank that never joins is named.

mpirun starts the ranks; MPI then carries the few small values the other transports need
before they can talk: NCCL's unique id, or the address of torch.distributed's store.
``exchange_over_mpi`` hands such a value from rank 0 to every rank with point-to-point
messages on a tag of their own (they never match a collective), so that a rank that died
or is stuck before the exchange makes every other rank raise a one-line
``CommunicationError`` naming it after HOSTIR_COMM_TIMEOUT, instead of waiting forever
in a blocking broadcast:

    every rank r > 0:  send "joined" to rank 0, then wait for rank 0's answer
    rank 0:            wait for every "joined"; then answer every rank that joined with
                       the value, or, past the deadline, with the list of absent ranks

    >>> uid = exchange_over_mpi(MPI.COMM_WORLD, make_uid, "the NCCL unique id")  # doctest: +SKIP

``with_deadline`` bounds a blocking call that has no timeout of its own (NCCL's
communicator init) by running it on a helper thread.
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import sys
import threading
import time

import numpy as np

from hostir.errors import CommunicationError
from hostir.options import options

# A tag no other message of hostir uses (MPI guarantees tags up to 32767).
BOOTSTRAP_TAG = 29_001
# Rank 0's answer: ("value", bytes) or ("absent", [ranks]); a pickled NCCL unique id or
# store address is far smaller.
_ANSWER_BYTES = 1 << 16


def mpi_world():
    """MPI.COMM_WORLD if this process already initialized MPI (never initializes it)."""
    mod = sys.modules.get("mpi4py.MPI")
    if mod is None or not mod.Is_initialized() or mod.Is_finalized():
        return None
    return mod.COMM_WORLD


def process_rank() -> int:
    """This process's rank: MPI's when MPI is up, else the launcher's variables, else 0."""
    world = mpi_world()
    if world is not None:
        return world.Get_rank()
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def world_size() -> int:
    """The job's size: MPI's when MPI is up, else the launcher's variables, else 1."""
    world = mpi_world()
    if world is not None:
        return world.Get_size()
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE", "SLURM_NTASKS"):
        if var in os.environ:
            return int(os.environ[var])
    return 1


def local_rank() -> int:
    """This rank's index among the ranks of its node, from the launcher's variables."""
    for var in ("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def local_device(name: str = "auto"):
    """The torch device a rank runs on: ``cpu``, or (``cuda`` / ``auto`` with CUDA present)
    the GPU of its node-local rank, made the current device. One process a GPU."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank() % torch.cuda.device_count()}"
    device = torch.device(name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def poll_requests(requests, deadline: float | None) -> list[bool]:
    """Which of ``requests`` completed by ``deadline`` (None: wait for all). Polls with a
    sleep that grows from 10 us to 10 ms: a blocking wait could not be given up."""
    done = [False] * len(requests)
    delay = 1e-5
    while True:
        for i, req in enumerate(requests):
            if not done[i]:
                done[i] = req.Test()
        if all(done) or (deadline is not None and time.monotonic() > deadline):
            return done
        time.sleep(delay)
        delay = min(delay * 2, 0.01)


def _ranks(ranks) -> str:
    ranks = list(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def exchange_over_mpi(comm, make_value, what: str, timeout_s: float | None = None):
    """``make_value()`` run on rank 0, returned on every rank of ``comm``.

    Raises ``CommunicationError`` on every rank that joined when some rank has not joined
    within ``timeout_s`` (default HOSTIR_COMM_TIMEOUT; 0 or less waits forever), naming
    the ranks that did not; a rank whose answer from rank 0 never comes names rank 0.
    """
    timeout_s = options().comm_timeout_s if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
    rank, world = comm.Get_rank(), comm.Get_size()
    if world == 1:
        return make_value()
    if rank == 0:
        value = make_value()
        tokens = [np.zeros(1, dtype=np.int32) for _ in range(world)]
        recvs = [comm.Irecv(tokens[r], source=r, tag=BOOTSTRAP_TAG) for r in range(1, world)]
        joined = poll_requests(recvs, deadline)
        absent = [r for r, ok in zip(range(1, world), joined) if not ok]
        for req, ok in zip(recvs, joined):
            if not ok:  # withdrawn, so that MPI finalizes without it
                req.Cancel()
                req.Wait()
        answer = pickle.dumps(("absent", absent) if absent else ("value", value))
        sends = [comm.isend(answer, dest=r, tag=BOOTSTRAP_TAG)
                 for r, ok in zip(range(1, world), joined) if ok]
        poll_requests(sends, time.monotonic() + 1.0)  # small: sent eagerly; never block on it
    else:
        token = np.ones(1, dtype=np.int32)
        joining = comm.Isend(token, dest=0, tag=BOOTSTRAP_TAG)
        recv = comm.irecv(bytearray(_ANSWER_BYTES), source=0, tag=BOOTSTRAP_TAG)
        # Rank 0 answers at its own deadline at the latest: allow for the start-up skew.
        late = None if deadline is None else deadline + max(5.0, timeout_s / 2)
        got = False
        delay = 1e-5
        while True:
            got, answer = recv.test()
            if got or (late is not None and time.monotonic() > late):
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.01)
        if not got:
            raise CommunicationError(
                f"rank {rank}: bootstrap of {what}: rank 0 did not join within "
                f"{timeout_s:g} s (HOSTIR_COMM_TIMEOUT); expected every rank to start "
                "the communicator: a rank failed, died or is stuck")
        poll_requests([joining], None)  # rank 0 received it: complete at once
        answer = pickle.loads(answer)
        absent = answer[1] if answer[0] == "absent" else []
        value = answer[1]
    if absent:
        raise CommunicationError(
            f"rank {rank}: bootstrap of {what}: {_ranks(absent)} of {world} did not join "
            f"within {timeout_s:g} s (HOSTIR_COMM_TIMEOUT); expected every rank to start "
            "the communicator: a rank failed, died or is stuck")
    return value


def with_deadline(fn, what: str, rank: int, timeout_s: float | None = None):
    """``fn()``, or ``CommunicationError`` once it has run ``timeout_s`` (default
    HOSTIR_COMM_TIMEOUT; 0 or less waits forever). ``fn`` runs on a daemon thread that is
    left behind on a timeout: the error ends the job, and the thread with it."""
    timeout_s = options().comm_timeout_s if timeout_s is None else timeout_s
    if timeout_s <= 0:
        return fn()
    result: list = []

    def run():
        try:
            result.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            result.append((False, e))

    thread = threading.Thread(target=run, name=f"hostir-{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not result:
        raise CommunicationError(
            f"rank {rank}: {what} did not complete within {timeout_s:g} s "
            "(HOSTIR_COMM_TIMEOUT); every rank had joined the bootstrap, so the transport "
            "could not connect them (NCCL_DEBUG=INFO shows why)")
    ok, value = result[0]
    if not ok:
        raise value
    return value


def init_distributed(device) -> None:
    """A torch.distributed group for ``device`` (NCCL on CUDA, gloo on the CPU): from
    torchrun's environment when it set one, else bootstrapped over MPI. Nothing if a group
    exists already."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "MASTER_ADDR" in os.environ):
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    else:
        init_torch_distributed_from_mpi(backend)


def init_torch_distributed_from_mpi(backend: str) -> None:
    """``torch.distributed.init_process_group`` for ranks started by mpirun: rank 0 picks
    an address and port and hands them to every rank (``exchange_over_mpi``)."""
    import torch.distributed as dist
    from mpi4py import MPI

    if dist.is_initialized():
        return
    comm = MPI.COMM_WORLD

    def address() -> str:
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        host = os.environ.get("MASTER_ADDR") or socket.gethostbyname(socket.gethostname())
        return f"tcp://{host}:{port}"

    addr = exchange_over_mpi(comm, address, "torch.distributed's store address")
    # The group's collectives time out like ours (torch's own watchdog ends the rank).
    timeout = options().comm_timeout_s
    kw = {"timeout": datetime.timedelta(seconds=timeout)} if timeout > 0 else {}
    dist.init_process_group(backend, init_method=addr, rank=comm.Get_rank(),
                            world_size=comm.Get_size(), **kw)
