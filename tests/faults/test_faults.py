"""A fault on one rank ends every rank, non-zero, soon, with a message naming the rank and
the statement (or tensor). Each scenario is its own ``mpirun`` job, launched from a plain
pytest process (a fault must kill its job, which must not be this one):

    python -m pytest tests/faults

The jobs run ``python -m hostir.run fault_injection`` (the pipelined AllGather+GEMM on CPU
ranks, over MPI and over a torch.distributed gloo group) with HOSTIR_COMM_TIMEOUT=10.
Each job's exit code and seconds to exit go to the fault matrix (``matrix.py``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults import matrix

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
           device: str = "cpu", comm: str = "auto", fault: str = "",
           rank_env: dict | None = None) -> tuple[int, str, float]:
    """Run a job of ``np_`` ranks; its exit code, its output, and the seconds it took.
    ``fault`` names the row of the fault matrix the job is recorded under; ``rank_env``
    (rank -> variables) sets variables on single ranks (one MPMD app context a rank)."""
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
    job = [sys.executable] + (["-c", program] if program else [
        "-m", "hostir.run", "fault_injection", "--device", device, "--comm", comm, *args])
    if rank_env:
        cmd = ["mpirun"]
        for r in range(np_):
            own = [f"{k}={v}" for k, v in rank_env.get(r, {}).items()]
            cmd += ([":"] if r else []) + ["-np", "1"] + (["env", *own] if own else []) + job
    else:
        cmd = ["mpirun", "-np", str(np_), *job]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=e, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=TIMEOUT_S + 90)
    took = time.monotonic() - start
    if fault:
        backend = {"auto": "nccl" if device == "cuda" else "mpi"}.get(comm, comm)
        injected = (env or {}).get("HOSTIR_INJECT_FAULT") or " ".join(args) or "nothing"
        matrix.record(fault, backend, np_, injected, proc.returncode, took, TIMEOUT_S)
    return proc.returncode, proc.stdout.decode(errors="replace"), took


def ended_quickly(rc: int, out: str, took: float) -> None:
    assert rc != 0, out
    assert took < TIMEOUT_S + 30, (took, out)


# (ranks, comm): MPI on 2 and 4 ranks, a torch.distributed gloo group on 2.
JOBS = [(2, "mpi"), (4, "mpi"), (2, "torch")]


@pytest.fixture(params=JOBS, ids=[f"np{n}-{c}" for n, c in JOBS])
def job(request):
    return request.param


def test_a_healthy_job_passes(job):
    np_, comm = job
    rc, out, _ = mpirun(np_, comm=comm, fault="none")
    assert rc == 0, out
    assert all(f"rank {r}: ok" in out for r in range(np_)), out


def test_exception_on_one_rank_mid_program(job):
    np_, comm = job
    bad = np_ - 1
    rc, out, took = mpirun(np_, comm=comm, fault="exception mid-program",
                           env={"HOSTIR_INJECT_FAULT": f"{bad}:{MATMUL_OF_STAGE_1}:raise"})
    ended_quickly(rc, out, took)
    assert (f"[rank {bad}] hostir fault_injection: error: ExecutionError: rank {bad}: while "
            "executing `T6 = matmul(T5, T1)`") in out, out
    assert "aborting the MPI job" in out, out  # rank-local: the others must be ended


@pytest.mark.parametrize("kind", ["kill", "exit"])
def test_a_rank_that_dies(job, kind):
    np_, comm = job
    bad = np_ - 1
    rc, out, took = mpirun(np_, comm=comm, fault=f"rank {kind}ed" if kind == "kill" else
                           "rank exits", env={"HOSTIR_INJECT_FAULT":
                                              f"{bad}:{SELECT_OF_STAGE_1}:{kind}"})
    ended_quickly(rc, out, took)
    assert (f"[rank {bad}] hostir: injected fault '{kind}' before statement "
            f"{SELECT_OF_STAGE_1} `T4 = select(T0, axis=0, index=i)`") in out, out


def test_a_stuck_rank_makes_its_peers_time_out(job, tmp_path):
    np_, comm = job
    rc, out, took = mpirun(np_, comm=comm, fault="rank stuck",
                           env={"HOSTIR_INJECT_FAULT": f"1:{SELECT_OF_STAGE_1}:hang",
                                "HOSTIR_FLIGHT_DIR": str(tmp_path)})
    ended_quickly(rc, out, took)
    assert took >= TIMEOUT_S, (took, out)  # the peers waited for the timeout, not less
    assert "CommTimeoutError" in out and "while executing `Wait C0`" in out, out
    if comm == "mpi":
        assert f"did not complete within {TIMEOUT_S} s (HOSTIR_COMM_TIMEOUT)" in out, out
    else:  # gloo's own timeout, which the group got from HOSTIR_COMM_TIMEOUT
        assert f"torch gloo Allgather failed" in out, out
        assert f"(HOSTIR_COMM_TIMEOUT={TIMEOUT_S} s)" in out, out
    assert f"flight records in {tmp_path}" in out, out


def test_rank_divergent_shapes_are_refused_on_every_rank(job):
    np_, comm = job
    rc, out, took = mpirun(np_, "--fault", "divergent_shape", "--fault-rank", "1", comm=comm,
                           fault="divergent shapes")
    ended_quickly(rc, out, took)
    for r in range(np_):
        assert f"[rank {r}] hostir fault_injection: error: InputMismatchError: rank {r}: inputs " \
               "differ between ranks" in out, out
    rows = 64 // (2 * np_)  # --m 64, 2 stages; rank 1 lowered the program for --m 128
    assert f"rank 0 passed float32[2, 1, {rows}, 32]" in out, out
    assert f"rank 1 passed float32[2, 1, {2 * rows}, 32]" in out, out
    assert "MPI_ABORT" not in out, out  # every rank raised it: a normal exit


def test_a_bad_dtype_on_one_rank_is_refused_on_every_rank(job):
    np_, comm = job
    rc, out, took = mpirun(np_, "--fault", "bad_dtype", "--fault-rank", "1", comm=comm,
                           fault="bad dtype")
    ended_quickly(rc, out, took)
    for r in range(np_):
        assert (f"[rank {r}] hostir fault_injection: error: InputMismatchError: rank {r}: rank 1 "
                "refused its inputs: input T1: expected dtype float32, got torch.float64") in out, out


def test_an_error_every_rank_agrees_on_ends_without_an_abort(job):
    # Raised identically on every rank before any collective: all ranks exit with the
    # error's code (2) through a normal exit, and Open MPI prints no MPI_ABORT banner.
    np_, comm = job
    rc, out, took = mpirun(np_, "--m", "10", "--stages", "4", comm=comm,
                           fault="invalid shape (every rank)")
    ended_quickly(rc, out, took)
    assert rc == 2, out
    for r in range(np_):
        assert (f"[rank {r}] hostir fault_injection: error: LoweringError: tensor T0 (A) axis "
                "0: extent M=10 is not divisible by stages*devices") in out, out
    assert "MPI_ABORT" not in out and "aborting the MPI job" not in out, out
    assert "Traceback" not in out, out


def test_a_one_line_error_on_one_rank_only_still_ends_the_job():
    # Rank 0 alone has a malformed HOSTIR_INJECT_FAULT (two app contexts: only the first
    # gets it); rank 1 goes on into the input agreement. Rank 0 hears no error from
    # rank 1 within half of HOSTIR_COMM_TIMEOUT, so it aborts the job instead of exiting
    # alone, before rank 1's collective times out (that race once let rank 1 abort first).
    e = dict(os.environ)
    e.pop("HOSTIR_INJECT_FAULT", None)
    e.update({"PYTHONPATH": f"{ROOT}{os.pathsep}{e.get('PYTHONPATH', '')}",
              "HOSTIR_COMM_TIMEOUT": str(TIMEOUT_S), "OMPI_ALLOW_RUN_AS_ROOT": "1",
              "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
              "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
              "OMPI_MCA_rmaps_base_oversubscribe": "1"})
    job = [sys.executable, "-m", "hostir.run", "fault_injection", "--device", "cpu"]
    cmd = ["mpirun", "-np", "1", "env", "HOSTIR_INJECT_FAULT=1:x:hang", *job, ":",
           "-np", "1", *job]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=e, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=TIMEOUT_S + 90)
    took = time.monotonic() - start
    out = proc.stdout.decode(errors="replace")
    matrix.record("one-line error on one rank", "mpi", 2, "HOSTIR_INJECT_FAULT=1:x:hang on "
                  "rank 0 only", proc.returncode, took, TIMEOUT_S)
    ended_quickly(proc.returncode, out, took)
    assert ("[rank 0] hostir fault_injection: error: OptionsError: HOSTIR_INJECT_FAULT=1:x:hang: "
            "expected rank:statement:kind") in out, out
    assert "[rank 0] hostir: aborting the MPI job" in out, out
    assert "Traceback" not in out, out


@pytest.mark.parametrize("value", ["1:x:hang", "1:19:explode"])  # more in tests/unit
def test_a_malformed_fault_spec_is_a_one_line_error_on_every_rank(value):
    rc, out, took = mpirun(2, env={"HOSTIR_INJECT_FAULT": value})
    ended_quickly(rc, out, took)
    for r in range(2):
        assert (f"[rank {r}] hostir fault_injection: error: OptionsError: "
                f"HOSTIR_INJECT_FAULT={value}: expected rank:statement:kind") in out, out
    assert "Traceback" not in out and "MPI_ABORT" not in out, out


# (ids other than the bare word "mpi", which pytest-mpi takes for its own marker)
@pytest.mark.parametrize("comm", ["mpi", "torch"], ids=["comm-mpi", "comm-torch"])
def test_the_flight_report_names_the_stuck_rank(comm, tmp_path):
    # 3 ranks, rank 1 stuck before stage 1's Allgather: the peers time out, each rank
    # writes its flight record (rank 1 when the abort's SIGTERM reaches it), and the
    # report names rank 1 and what the others wait in. Over MPI, rank 2 waits longer
    # than rank 0, so that one rank aborts the job: with both timing out in the same
    # instant, two MPI_Aborts once ended rank 1 before its SIGTERM handler wrote its
    # record. Not over gloo: a rank waiting inside torch's gloo wait runs no Python
    # signal handler, so rank 2 must time out itself to leave its record.
    flight = tmp_path / "flight"
    later = {2: {"HOSTIR_COMM_TIMEOUT": str(TIMEOUT_S + 8)}} if comm == "mpi" else None
    rc, out, took = mpirun(3, "--m", "72", comm=comm, fault="rank stuck (flight report)",
                           env={"HOSTIR_INJECT_FAULT": f"1:{SELECT_OF_STAGE_1}:hang",
                                "HOSTIR_FLIGHT_DIR": str(flight)}, rank_env=later)
    ended_quickly(rc, out, took)
    # The first waiting rank to time out names the flight directory and aborts the job; the
    # other may time out too, or be ended by the abort first (then it says so): a race.
    timed_out = [r for r in (0, 2) if re.search(
        rf"\[rank {r}\] hostir fault_injection: error: CommTimeoutError: "
        rf".*flight records in {re.escape(str(flight))}", out)]
    assert timed_out, out
    for r in set((0, 2)) - set(timed_out):
        assert f"[rank {r}] hostir: ended by SIGTERM; flight record written" in out, out
    assert sorted(p.name for p in flight.iterdir()) == ["rank0.json", "rank1.json",
                                                        "rank2.json"], out
    report = subprocess.run([sys.executable, "-m", "hostir.run", "flight_report", str(flight)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    text = report.stdout.decode()
    assert report.returncode == 0, text
    assert text.splitlines()[0] == ("rank 1 stopped before Allgather #2 (i=1); ranks 0,2 "
                                    "wait in Wait C0 #2 (i=1)"), text


def test_nccl_without_its_library_is_a_one_line_error():
    from runtime.comm.nccl import nccl_module
    from hostir.errors import CommunicationError

    try:
        nccl_module()
        pytest.skip("CuPy with NCCL is installed here")
    except CommunicationError:
        pass
    rc, out, took = mpirun(2, comm="nccl", fault="--comm nccl without NCCL")
    ended_quickly(rc, out, took)
    for r in range(2):
        assert re.search(rf"\[rank {r}\] hostir fault_injection: error: CommunicationError: "
                         r"--comm nccl needs .*; pip install 'hostir\[cuda13\]'", out), out
    assert "Traceback" not in out and "MPI_ABORT" not in out, out


def test_bootstrap_names_the_rank_that_did_not_join():
    # The first exchange has every rank; in the second, rank 2 is late past the timeout.
    program = ("import time\n"
               "from mpi4py import MPI\n"
               "from runtime.bootstrap import exchange_over_mpi\n"
               "from runtime.watchdog import end_after_error\n"
               "c = MPI.COMM_WORLD\n"
               "assert exchange_over_mpi(c, lambda: 'uid-1', 'a value', 30) == 'uid-1'\n"
               "if c.Get_rank() == 2:\n"
               "    time.sleep(60)\n"
               "try:\n"
               "    exchange_over_mpi(c, lambda: 'uid-2', 'the NCCL unique id', 3)\n"
               "except Exception as e:\n"
               "    print(f'[rank {c.Get_rank()}] {type(e).__name__}: {e}', flush=True)\n"
               "    end_after_error(e, 2)\n")
    rc, out, took = mpirun(3, program=program, fault="rank absent at bootstrap")
    ended_quickly(rc, out, took)
    # 3 s to find rank 2 absent; up to 10 s more to learn that it will not report an
    # error either (so the job is aborted, since it still runs).
    assert took < 3 + 10 + 20, (took, out)
    assert "MPI_ABORT" in out, out
    for r in (0, 1):
        assert (f"[rank {r}] CommunicationError: rank {r}: bootstrap of the NCCL unique id: "
                "rank 2 of 3 did not join within 3 s (HOSTIR_COMM_TIMEOUT)") in out, out


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
