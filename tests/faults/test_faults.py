"""A fault on one rank ends every rank, non-zero, soon, with a message naming the rank and
the statement (or tensor). Each scenario is its own ``mpirun`` job, launched from a plain
pytest process (a fault must kill its job, which must not be this one):

    python -m pytest tests/faults

The jobs run ``python -m hostir.run fault_injection`` (the pipelined AllGather+GEMM on CPU
ranks over MPI) with HOSTIR_COMM_TIMEOUT=10.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 10
# The statements the rank under test executes, in order (2 stages): 0 GetCurrentStream,
# 1-2 ALLOCATE, 3 FOR k (4-7: each of the 2 workers waits on the user's stream once),
# 8 FOR i, then stage 0 at 9-17 and stage 1 at 18-26; 19 is stage 1's first select (before
# its Allgather), 24 is stage 1's matmul (after two collectives).
MATMUL_OF_STAGE_1 = 24
SELECT_OF_STAGE_1 = 19

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")


def mpirun(np_: int, *args: str, env: dict | None = None, program=None,
           device: str = "cpu") -> tuple[int, str, float]:
    """Run a job of ``np_`` ranks; its exit code, its output, and the seconds it took."""
    e = dict(os.environ)
    e.pop("HOSTIR_INJECT_FAULT", None)
    e.update({
        "PYTHONPATH": f"{ROOT}{os.pathsep}{e.get('PYTHONPATH', '')}",
        "HOSTIR_COMM_TIMEOUT": str(TIMEOUT_S),
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",  # Open MPI 5
        "OMPI_MCA_rmaps_base_oversubscribe": "1",                  # Open MPI 4
    })
    e.update(env or {})
    cmd = ["mpirun", "-np", str(np_), sys.executable]
    cmd += ["-c", program] if program else ["-m", "hostir.run", "fault_injection",
                                            "--device", device, *args]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=e, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=TIMEOUT_S + 90)
    return proc.returncode, proc.stdout.decode(errors="replace"), time.monotonic() - start


def ended_quickly(rc: int, out: str, took: float) -> None:
    assert rc != 0, out
    assert took < TIMEOUT_S + 30, (took, out)


@pytest.fixture(params=[2, 4], ids=["np2", "np4"])
def np_(request):
    return request.param


def test_a_healthy_job_passes(np_):
    rc, out, _ = mpirun(np_)
    assert rc == 0, out
    assert all(f"rank {r}: ok" in out for r in range(np_)), out


def test_exception_on_one_rank_mid_program(np_):
    bad = np_ - 1
    rc, out, took = mpirun(np_, env={"HOSTIR_INJECT_FAULT": f"{bad}:{MATMUL_OF_STAGE_1}:raise"})
    ended_quickly(rc, out, took)
    assert (f"[rank {bad}] hostir fault_injection: error: ExecutionError: rank {bad}: while "
            "executing `T6 = matmul(T5, T1)`") in out, out
    assert "aborting the MPI job" in out, out


@pytest.mark.parametrize("kind", ["kill", "exit"])
def test_a_rank_that_dies(np_, kind):
    bad = np_ - 1
    rc, out, took = mpirun(np_, env={"HOSTIR_INJECT_FAULT": f"{bad}:{SELECT_OF_STAGE_1}:{kind}"})
    ended_quickly(rc, out, took)
    assert (f"[rank {bad}] hostir: injected fault '{kind}' before statement "
            f"{SELECT_OF_STAGE_1} `T4 = select(T0, axis=0, index=i)`") in out, out


def test_a_stuck_rank_makes_its_peers_time_out(np_):
    rc, out, took = mpirun(np_, env={"HOSTIR_INJECT_FAULT": f"1:{SELECT_OF_STAGE_1}:hang"})
    ended_quickly(rc, out, took)
    assert took >= TIMEOUT_S, (took, out)  # the peers waited for the timeout, not less
    assert "CommTimeoutError" in out and "while executing `Wait C0`" in out, out
    assert f"did not complete within {TIMEOUT_S} s (HOSTIR_COMM_TIMEOUT)" in out, out


def test_rank_divergent_shapes_are_refused_on_every_rank(np_):
    rc, out, took = mpirun(np_, "--fault", "divergent_shape", "--fault-rank", "1")
    ended_quickly(rc, out, took)
    for r in range(np_):
        assert f"[rank {r}] hostir fault_injection: error: InputMismatchError: rank {r}: inputs " \
               "differ between ranks" in out, out
    rows = 64 // (2 * np_)  # --m 64, 2 stages; rank 1 lowered the program for --m 128
    assert f"rank 0 passed float32[2, 1, {rows}, 32]" in out, out
    assert f"rank 1 passed float32[2, 1, {2 * rows}, 32]" in out, out


def test_a_bad_dtype_on_one_rank_is_refused_on_every_rank(np_):
    rc, out, took = mpirun(np_, "--fault", "bad_dtype", "--fault-rank", "1")
    ended_quickly(rc, out, took)
    for r in range(np_):
        assert (f"[rank {r}] hostir fault_injection: error: InputMismatchError: rank {r}: rank 1 "
                "refused its inputs: input T1: expected dtype float32, got torch.float64") in out, out


def test_a_non_dividing_shape_is_refused(np_):
    rc, out, took = mpirun(np_, "--m", "10", "--stages", "4")
    ended_quickly(rc, out, took)
    assert "LoweringError: tensor T0 (A) axis 0: extent M=10 is not divisible by stages*devices" in out, out


def test_an_uncaught_error_outside_hostir_run_aborts_the_job():
    # The excepthook that Session installs: rank 1 raises, rank 0 is in a barrier.
    program = ("from runtime.session import Session\n"
               "s = Session('cpu', 'mpi')\n"
               "if s.rank == 1:\n"
               "    raise RuntimeError('boom on purpose')\n"
               "s.barrier()\n")
    rc, out, took = mpirun(2, program=program)
    ended_quickly(rc, out, took)
    assert took < TIMEOUT_S, (took, out)  # the abort ended rank 0, not its timeout
    assert "[rank 1] hostir: RuntimeError: boom on purpose" in out, out
