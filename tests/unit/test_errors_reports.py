"""Errors a user can cause end in one line and an exit code, never a traceback or a hang:
malformed flight records fed to the report, a 0-d tensor given to an Allgather or a
ReduceScatter, and a fault_injection problem too large for memory."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from hostir import ir, run
from hostir.errors import ParseError, VerificationError
from hostir.jobs import fault_injection, flight_report
from hostir.jobs import preflight as pf
from hostir.jobs.exit_codes import EXIT_MEMORY, EXIT_USAGE
from hostir.parser import parse
from runtime import flight

ROOT = Path(__file__).resolve().parents[2]


def _entry(n, kind="Allgather", seq=1, state="completed", **fields):
    e = {"n": n, "kind": kind, "statement": f"C0 = Communication({kind}, ...)", "comm": "mpi",
         "seq": seq, "bytes": 64, "state": state, "loops": {"i": seq - 1}}
    e.update(fields)
    return e


def _record(rank, world=2, entries=None, **fields):
    rec = {"format": flight.FORMAT, "rank": rank, "world_size": world,
           "entries": [_entry(1), _entry(2, "Wait", statement="Wait C0")]
           if entries is None else entries}
    rec.update(fields)
    return rec


def _write(tmp_path, records):
    for r, rec in records.items():
        (tmp_path / f"rank{r}.json").write_text(rec if isinstance(rec, str) else json.dumps(rec))


def _report(tmp_path, capsys) -> tuple[int, list[str]]:
    rc = run.main(["flight_report", str(tmp_path)])
    captured = capsys.readouterr()
    return rc, (captured.out or captured.err).splitlines()


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def _cli(*argv, timeout=20, memory_limit=False) -> subprocess.CompletedProcess:
    """``python -m hostir.run ...`` in a fresh process; a hang fails the test (timeout),
    and with ``memory_limit`` a runaway allocation too (4 GiB of address space)."""
    return subprocess.run([sys.executable, "-m", "hostir.run", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL,
                          preexec_fn=_limit_memory if memory_limit else None)


# ----------------------------------------------------------------------- flight_report


def _deep() -> str:
    return json.dumps(_record(0))[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}"


@pytest.mark.parametrize("rank0, field", [
    (_record(0, format=5), "format"),
    (_record(0, world_size="2"), "world_size"),
    (_record(0, world_size=True), "world_size"),
    (_record(0, entries=[_entry(1, loops="i=0")]), "entries[0].loops"),
    (_record(0, entries=[_entry(1, loops={"i": [0]})]), "entries[0].loops"),
    (_record(0, entries=[_entry(1, comm=["mpi"])]), "entries[0].comm"),
    (_record(0, entries=[_entry(1, bytes=[1])]), "entries[0].bytes"),
    (_record(0, entries=[_entry(1, state="lost")]), "entries[0].state"),
    (_record(0, entries=[_entry(1, seq=-1)]), "entries[0].seq"),
    (_record(0, entries=[_entry(1), _entry(2, "Wait", statement=7)]), "entries[1].statement"),
    # printed as is: no terminal escapes or line breaks
    (_record(0, entries=[_entry(1, "Wait", statement="Wait C0\x1b[2J")]), "entries[0].statement"),
    (_record(0, entries=[_entry(1, kind="All\ngather")]), "entries[0].kind"),
    (_record(0, entries=[3]), "entries[0]"),
    (_record(1), "rank"),  # a record copied under another rank's name
    (_deep(), "not a readable flight record"),
])
def test_a_malformed_record_is_one_line_naming_the_file_and_the_field(tmp_path, capsys,
                                                                       rank0, field):
    _write(tmp_path, {0: rank0, 1: _record(1)})
    rc, lines = _report(tmp_path, capsys)
    assert rc == EXIT_USAGE and len(lines) == 1, lines
    assert lines[0].startswith(f"[rank 0] hostir flight_report: error: {tmp_path / 'rank0.json'}: ")
    assert field in lines[0]


def test_bytes_of_another_type_on_one_rank_of_two_is_refused(tmp_path, capsys):
    # a list is unhashable where the report groups the ranks' collectives
    _write(tmp_path, {0: _record(0), 1: _record(1, entries=[_entry(1, bytes=[1])])})
    rc, lines = _report(tmp_path, capsys)
    assert rc == EXIT_USAGE and lines == [f"[rank 0] hostir flight_report: error: {tmp_path / 'rank1.json'}: "
                                 "entries[0].bytes: expected an integer >= 0, got [1]"]


def test_a_rank_beyond_its_world_size_is_refused(tmp_path, capsys):
    _write(tmp_path, {0: _record(0), 3: _record(3, world=2)})
    rc, lines = _report(tmp_path, capsys)
    assert rc == EXIT_USAGE and "rank 3 is not below its world_size 2" in lines[0]


@pytest.mark.parametrize("name", ["rank99999999999999999999.json", "rank100000000.json",
                                  "rank65536.json"])
def test_a_rank_too_large_is_refused_at_once(tmp_path, name):
    # before: a loop over range(rank + 1), and a line naming every rank in it
    _write(tmp_path, {0: _record(0)})
    (tmp_path / name).write_text(json.dumps(_record(0)))
    done = _cli("flight_report", str(tmp_path), timeout=10, memory_limit=True)
    assert done.returncode == EXIT_USAGE and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"[rank 0] hostir flight_report: error: {tmp_path / name}: rank {name[4:-5][:30]} is beyond "
        f"the largest a report reads ({flight_report.MAX_RANKS - 1})"]


def test_a_world_size_too_large_is_refused_at_once(tmp_path):
    _write(tmp_path, {0: _record(0, world=10 ** 15)})
    done = _cli("flight_report", str(tmp_path), timeout=10, memory_limit=True)
    assert done.returncode == EXIT_USAGE and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"[rank 0] hostir flight_report: error: {tmp_path / 'rank0.json'}: expected world_size, an "
        f"integer from 1 to {flight_report.MAX_RANKS}, got {10 ** 15}"]


def test_a_fifo_is_refused_unread(tmp_path):
    os.mkfifo(tmp_path / "rank0.json")  # nobody writes it: a read would block for ever
    done = _cli("flight_report", str(tmp_path), timeout=10)
    assert done.returncode == EXIT_USAGE and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [f"[rank 0] hostir flight_report: error: {tmp_path / 'rank0.json'}: "
                                        "not a regular file; not read as a flight record"]


def test_a_record_over_the_size_cap_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(flight_report, "MAX_RECORD_BYTES", 1 << 10)
    _write(tmp_path, {0: _record(0, entries=[_entry(n) for n in range(1, 40)])})
    rc, lines = _report(tmp_path, capsys)
    assert rc == EXIT_USAGE and len(lines) == 1
    assert lines[0].startswith(f"[rank 0] hostir flight_report: error: {tmp_path / 'rank0.json'}: ")
    assert lines[0].endswith("bytes, over the cap of 1024; not read as a flight record")


def test_missing_ranks_are_named_as_ranges(tmp_path, capsys):
    _write(tmp_path, {0: _record(0, world=flight_report.MAX_RANKS),
                      5: _record(5, world=flight_report.MAX_RANKS)})
    rc, lines = _report(tmp_path, capsys)
    assert rc == 0
    assert lines[0].startswith(f"ranks 1-4,6-{flight_report.MAX_RANKS - 1} left no flight record")
    assert flight_report._ranks([0, 2]) == "ranks 0,2"
    assert flight_report._ranks([0, 1, 3, 4, 5, 9]) == "ranks 0,1,3-5,9"


def test_records_the_recorder_writes_pass_the_checks(tmp_path, capsys):
    # a guard: the checks take what runtime.flight writes (not a malformed case)
    for rank in (0, 1):
        rec = flight.FlightRecorder(10)
        rec.bind(rank, 2)
        pid = rec.add_program("test")
        meta = flight.statement_meta(pid, 0, "C0 = Communication(Allgather, ...)", ("i",),
                                     "Allgather", "mpi")
        for i in range(3):
            rec.start(meta, (i,), seq=rec.next_seq("mpi"), nbytes=64, completed=True)
        rec.start(flight.statement_meta(pid, 1, "Synchronize Stream 0", (), "Synchronize"),
                  completed=True)
        assert rec.dump("test", tmp_path) == tmp_path
    rc, lines = _report(tmp_path, capsys)
    assert rc == 0 and lines[0].startswith("no divergence"), lines


# ----------------------------------------------------------------------- ir: 0-d collectives


_ZERO_D = """%HostIr {{
  numberOfStreams = 1
  inputs:
    T0 : float32[Stream(2)] mesh=[0]
  outputs: T1
  T1 = ALLOCATE(float32[2])
  FOR i in range(0, 2):
    T4 = select(T0, axis=0, index=i)
    T5 = select(T1, axis=0, index=i)
    C0 = Communication({collective}, team=[0], in=T4, out=T5{op})
    Wait C0
}} // %HostIr
"""


@pytest.mark.parametrize("collective, op", [("Allgather", ""), ("ReduceScatter", ", op=sum")])
def test_a_collective_along_axis_0_of_a_0d_tensor_is_a_parse_error(collective, op):
    with pytest.raises(ParseError, match=f"line 10, column 5: Communication C0: {collective} "
                                         r"of T4: expected in of rank >= 1 .*0-d tensor"):
        parse(_ZERO_D.format(collective=collective, op=op))
    scalar = ir.Tensor("T4", (), "float32")
    with pytest.raises(VerificationError, match="0-d tensor"):
        ir.Communication(ir.CommHandle("C0"), ir.CommunicationType[collective], (0, 1),
                         scalar, ir.Tensor("T5", (2,), "float32"))


# ----------------------------------------------------------------------- fault_injection


def _fault_args(*flags):
    p = pf.JobParser()
    fault_injection.add_arguments(p)
    return p.parse_args(["--device", "cpu", *flags])


def test_fault_injection_refuses_a_problem_too_large_for_memory():
    small = _fault_args()
    fault_injection.validate(small, pf.World())  # the default problem fits anywhere
    huge = _fault_args("--m", "100000000", "--n", "100000", "--k", "100000")
    with pytest.raises(pf.MemoryEstimateError, match="--m 100000000 --n 100000 --k 100000 "
                                                     "float32 needs about") as e:
        fault_injection.validate(huge, pf.World())
    assert e.value.code == EXIT_MEMORY
    # the culprit of divergent_shape has twice the rows
    fault = _fault_args("--fault", "divergent_shape", "--fault-rank", "1")
    assert (fault_injection.estimated_bytes(fault, pf.World(rank=1, size=2))
            > fault_injection.estimated_bytes(fault, pf.World(rank=0, size=2)))


def test_fault_injection_too_large_is_one_line_and_the_memory_exit_code():
    done = _cli("fault_injection", "--device", "cpu", "--m", "100000000", "--n", "100000",
                "--k", "100000", timeout=60)
    assert done.returncode == EXIT_MEMORY, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[rank 0] hostir fault_injection: error: "
                                                   "--m 100000000 --n 100000 --k 100000")
