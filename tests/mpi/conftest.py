"""A failure on one rank must end every rank: the others may be inside a collective that
the failing rank will never post. Print the failure, then abort the MPI job."""

import sys

import pytest


@pytest.fixture(scope="module")
def world():
    """(rank, world size) of MPI_COMM_WORLD."""
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


@pytest.fixture(scope="module", params=["mpi", "torch"])
def comm(request):
    """The layers over MPI, and over a torch.distributed (gloo) process group."""
    if request.param == "torch":
        from runtime.session import init_torch_distributed_from_mpi

        init_torch_distributed_from_mpi("gloo")
    return request.param


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when in ("setup", "call"):
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.Get_rank()
        sys.stderr.write(f"\n[rank {rank}] FAILED {item.nodeid}\n{report.longreprtext}\n"
                         f"[rank {rank}] aborting the MPI job so no rank waits forever\n")
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
