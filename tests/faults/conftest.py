import os

import pytest

from tests.faults import matrix


@pytest.fixture(scope="session", autouse=True)
def fault_matrix():
    """Write the fault matrix where HOSTIR_FAULTS_JSON says, and nowhere otherwise."""
    yield
    path = os.environ.get("HOSTIR_FAULTS_JSON")
    if path and matrix.ROWS:
        matrix.write(path)
