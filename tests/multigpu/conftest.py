"""The same rule as tests/mpi: a failure on one rank aborts the whole MPI job."""

from tests.mpi.conftest import pytest_runtest_makereport  # noqa: F401
