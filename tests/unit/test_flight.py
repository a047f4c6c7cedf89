"""The flight recorder and its report, without MPI: a fake communicator, made-up records."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch

from hostir import run
from hostir.errors import OptionsError
from hostir.jobs.exit_codes import EXIT_USAGE
from lowering.patterns import allgather_matmul
from lowering.pipeline import lower
from runtime import flight
from runtime.comm.base import DoneWork
from runtime.device import make_backend
from runtime.interpreter import Interpreter


@pytest.fixture
def recorder(monkeypatch):
    rec = flight.FlightRecorder(100)
    monkeypatch.setattr(flight, "_RECORDER", rec)
    return rec


class _Comm:
    """Two ranks' worth of collectives on one process: an Allgather of rank 0's view."""

    name = "fake"
    rank, world_size = 0, 2

    def allgather(self, out, inp, stream):
        out.copy_(inp.expand_as(out))
        return DoneWork()


@pytest.mark.parametrize("flat", [True, False])
def test_the_interpreter_records_collectives_waits_and_synchronizes(recorder, flat):
    program = lower(allgather_matmul(16, 4, 4, 2, 2), 2, 2)
    run = Interpreter(program, make_backend("cpu"), _Comm(), flat=flat)
    shard, b = torch.randn(2, 1, 4, 4), torch.randn(4, 4)
    run(shard, b)
    run(shard, b)
    data = recorder.as_json("test")
    kinds = [e["kind"] for e in data["entries"]]
    per_call = ["Synchronize", "Synchronize"] + ["Allgather", "Wait", "Synchronize"] * 2
    assert kinds == per_call * 2
    gathers = [e for e in data["entries"] if e["kind"] == "Allgather"]
    assert [e["seq"] for e in gathers] == [1, 2, 3, 4]  # per communicator, over calls
    assert [e["loops"] for e in gathers] == [{"i": 0}, {"i": 1}] * 2
    assert gathers[0]["statement"].startswith("C0 = Communication(Allgather")
    assert gathers[0]["bytes"] == 4 * 4 * 4 and gathers[0]["comm"] == "fake"
    waits = [e for e in data["entries"] if e["kind"] == "Wait"]
    assert [e["seq"] for e in waits] == [1, 2, 3, 4] and waits[0]["statement"] == "Wait C0"
    syncs = [e for e in data["entries"] if e["kind"] == "Synchronize"]
    assert [e["loops"] for e in syncs] == [{"k": 0}, {"k": 1}, {"i": 0}, {"i": 1}] * 2
    assert {e["state"] for e in data["entries"]} == {"completed"}
    assert data["rank"] == 0 and data["world_size"] == 2
    assert data["entries"][0]["program"] == program.provenance


def test_the_ring_buffer_keeps_the_last_entries():
    rec = flight.FlightRecorder(3)
    for k in range(5):
        rec.start(flight.statement_meta(1, k, f"s{k}", (), "Allgather", "c"), seq=k + 1)
    data = rec.as_json("test")
    assert [e["seq"] for e in data["entries"]] == [3, 4, 5]
    assert data["recorded"] == 5 and data["capacity"] == 3


def test_a_started_entry_completes_when_its_event_says_so():
    rec = flight.FlightRecorder(10)
    meta = flight.statement_meta(1, 0, "C0", (), "Allgather", "c")
    done = rec.start(meta, seq=1)
    done.poll = lambda: True
    pending = rec.start(meta, seq=2)
    pending.poll = lambda: False
    captured = rec.start(meta, seq=3)
    captured.mark_captured()
    states = [e["state"] for e in rec.as_json("test")["entries"]]
    assert states == ["completed", "started", "captured"]


@pytest.mark.parametrize("raw, want", [("", 2000), ("0", 0), ("17", 17)])
def test_flight_entries_from_the_environment(raw, want):
    assert flight.capacity_from_environ({"HOSTIR_FLIGHT_ENTRIES": raw}) == want


@pytest.mark.parametrize("raw", ["-1", "many", "1e3", "99999999999"])
def test_a_malformed_flight_entries_value_is_refused(raw):
    with pytest.raises(OptionsError, match=r"HOSTIR_FLIGHT_ENTRIES=.*expected a whole number"):
        flight.capacity_from_environ({"HOSTIR_FLIGHT_ENTRIES": raw})


def test_dumps_are_private_exclusive_and_never_follow_a_symlink(tmp_path, monkeypatch):
    monkeypatch.delenv("HOSTIR_FLIGHT_DIR", raising=False)
    rec = flight.FlightRecorder(10)
    rec.bind(3, 4)
    rec.start(flight.statement_meta(1, 0, "C0", (), "Allgather", "c"), seq=1)
    where = tmp_path / "records"
    target = tmp_path / "victim"
    target.write_text("keep")
    where.mkdir(mode=0o700)
    os.symlink(target, where / "rank3.json")  # planted by someone else
    assert rec.dump("test", where) == where
    assert target.read_text() == "keep"
    written = where / "rank3.1.json"
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert json.loads(written.read_text())["rank"] == 3
    rec.dump("again", where)
    assert (where / "rank3.2.json").exists()


def test_the_default_directory_is_private_and_per_job(tmp_path, monkeypatch):
    from hostir.options import set_options

    monkeypatch.delenv("HOSTIR_FLIGHT_DIR", raising=False)
    monkeypatch.setenv("HOSTIR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PMIX_NAMESPACE", "prterun-host-1@1")
    set_options(None)
    try:
        rec = flight.FlightRecorder(10)
        rec.start(flight.statement_meta(1, 0, "C0", (), "Allgather", "c"), seq=1)
        where = rec.dump("test")
        assert where == tmp_path / "cache" / "flight" / "prterun-host-1_1"
        for d in (where, where.parent):
            assert stat.S_IMODE(d.stat().st_mode) == 0o700
        # A shared flight root that others can write is refused, with a warning.
        os.chmod(where.parent, 0o777)
        assert flight.FlightRecorder(10).dump("test") is None
    finally:
        set_options(None)


def _record(rank, world, entries):
    return {"format": flight.FORMAT, "rank": rank, "world_size": world, "entries": [
        {"n": n, "kind": kind, "statement": text, "comm": "mpi", "seq": seq, "bytes": 64,
         "state": state, "loops": {"i": seq - 1}}
        for n, (kind, text, seq, state) in enumerate(entries, 1)]}


def _write(tmp_path, records):
    for r, rec in records.items():
        (tmp_path / f"rank{r}.json").write_text(json.dumps(rec))


def _gathers(upto, last_state="completed"):
    out = []
    for k in range(1, upto + 1):
        state = last_state if k == upto else "completed"
        out += [("Allgather", "C0 = Communication(Allgather, ...)", k, state),
                ("Wait", "Wait C0", k, state)]
    return out


def _report(tmp_path, capsys) -> tuple[int, list[str]]:
    rc = run.main(["flight_report", str(tmp_path)])
    captured = capsys.readouterr()
    return rc, (captured.out or captured.err).splitlines()


def test_the_report_names_the_rank_that_stopped(tmp_path, capsys):
    _write(tmp_path, {0: _record(0, 3, _gathers(12, "started")),
                      1: _record(1, 3, _gathers(11)),
                      2: _record(2, 3, _gathers(12, "started"))})
    rc, lines = _report(tmp_path, capsys)
    assert rc == 0
    assert lines[0] == "rank 1 stopped before Allgather #12 (i=11); ranks 0,2 wait in Wait C0 #12 (i=11)"
    assert len(lines) == 2 and lines[1].startswith("last statements: rank 0 wait in Wait C0 #12")


def test_the_report_names_a_rank_without_a_record_and_different_collectives(tmp_path, capsys):
    other = _gathers(3)
    other[4] = ("Broadcast", "C1 = Communication(Broadcast, ...)", 3, "completed")
    _write(tmp_path, {0: _record(0, 3, _gathers(3)), 1: _record(1, 3, other)})
    rc, lines = _report(tmp_path, capsys)
    assert rc == 0
    assert "rank 2 left no flight record" in lines[0]
    assert lines[1] == ("mpi collective #3 differs: rank 0 posted Allgather of 64 bytes; "
                        "rank 1 posted Broadcast of 64 bytes")


def test_the_report_on_agreeing_ranks_and_on_a_collective_that_never_completed(tmp_path, capsys):
    _write(tmp_path, {0: _record(0, 2, _gathers(4)), 1: _record(1, 2, _gathers(4))})
    rc, lines = _report(tmp_path, capsys)
    assert rc == 0 and lines[0].startswith("no divergence")
    _write(tmp_path, {1: _record(1, 2, _gathers(4, "started"))})
    rc, lines = _report(tmp_path, capsys)
    assert lines[0] == ("rank 1 posted Allgather #4 (i=3) on mpi and it did not complete; "
                        "rank 0 completed it")


@pytest.mark.parametrize("content", ["{not json", "[]", '{"format": "other", "entries": []}',
                                     '{"format": "hostir-flight/1", "entries": [{"n": "x"}]}',
                                     b"\xff\xfe"])
def test_unreadable_records_are_a_one_line_error(tmp_path, capsys, content):
    path = tmp_path / "rank0.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    rc, lines = _report(tmp_path, capsys)
    assert rc == EXIT_USAGE and len(lines) == 1
    assert lines[0].startswith(f"[rank 0] hostir flight_report: error: {path}: ")


def test_a_missing_or_empty_directory_is_a_one_line_error(tmp_path, capsys):
    rc, lines = _report(tmp_path / "nowhere", capsys)
    assert rc == EXIT_USAGE and lines == [f"[rank 0] hostir flight_report: error: {tmp_path / 'nowhere'}: "
                                 "expected a directory of flight records (rank<R>.json)"]
    rc, lines = _report(tmp_path, capsys)
    assert rc == EXIT_USAGE and "no flight records" in lines[0]


def test_flight_dump_at_exit_on_request(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    program = ("from runtime import flight\n"
               "rec = flight.recorder()\n"
               "rec.start(flight.statement_meta(1, 0, 'Wait C0', (), 'Wait', 'mpi'), seq=1)\n")
    env = {**os.environ, "PYTHONPATH": str(root), "HOSTIR_FLIGHT_DUMP": "1",
           "HOSTIR_FLIGHT_DIR": str(tmp_path / "out")}
    proc = subprocess.run([sys.executable, "-c", program], env=env, cwd=root, timeout=120,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.returncode == 0, proc.stdout
    assert f"flight record written to {tmp_path / 'out'}" in proc.stdout.decode()
    data = json.loads((tmp_path / "out" / "rank0.json").read_text())
    assert data["reason"] == "at exit (HOSTIR_FLIGHT_DUMP=1)"
    assert [(e["statement"], e["state"]) for e in data["entries"]] == [("Wait C0", "started")]


@pytest.mark.parametrize("capacity", [1, 3])
def test_a_small_ring_reuses_its_entries_and_keeps_the_newest(monkeypatch, capacity):
    rec = flight.FlightRecorder(capacity)
    monkeypatch.setattr(flight, "_RECORDER", rec)
    program = lower(allgather_matmul(16, 4, 4, 2, 2), 2, 2)
    run = Interpreter(program, make_backend("cpu"), _Comm())
    shard, b = torch.randn(2, 1, 4, 4), torch.randn(4, 4)
    slots = list(rec._ring)
    run(shard, b)
    run(shard, b)
    assert rec._ring == slots  # the same objects, overwritten in turn
    entries = rec.as_json("test")["entries"]
    assert [e["n"] for e in entries] == list(range(17 - capacity, 17))  # 8 a call
    last = entries[-1]
    assert last["kind"] == "Synchronize" and last["loops"] == {"i": 1}
