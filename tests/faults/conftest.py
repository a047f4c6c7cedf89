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


@pytest.fixture(scope="session", autouse=True)
def flight_records(tmp_path_factory):
    """The jobs' flight records (ranks ended by a fault write theirs) go to a temporary
    directory, not the user's cache; a test that reads them sets its own."""
    before = os.environ.get("HOSTIR_FLIGHT_DIR")
    os.environ["HOSTIR_FLIGHT_DIR"] = str(tmp_path_factory.mktemp("flight"))
    yield
    if before is None:
        os.environ.pop("HOSTIR_FLIGHT_DIR", None)
    else:
        os.environ["HOSTIR_FLIGHT_DIR"] = before
