"""A failure on one rank must end every rank: the others may be inside a collective that
the failing rank will never post. Print the failure, then abort the MPI job."""

import sys

import pytest


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
