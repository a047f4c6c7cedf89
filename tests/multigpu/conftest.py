"""The same rule as tests/mpi: a failure on one rank aborts the whole MPI job; and the
ranks' shared fixture."""

import pytest

from tests.mpi.conftest import pytest_runtest_makereport  # noqa: F401


@pytest.fixture(scope="module")
def world():
    """(rank, world size, device): one GPU a rank, torch.distributed over NCCL."""
    import torch
    from mpi4py import MPI

    from runtime.session import init_torch_distributed_from_mpi, local_rank

    torch.cuda.set_device(local_rank() % torch.cuda.device_count())
    init_torch_distributed_from_mpi("nccl")
    return (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size(),
            torch.device("cuda", torch.cuda.current_device()))
