"""The watchdog and the input agreement, without MPI or a GPU: fake communicators."""

import time

import pytest
import torch

from hostir.errors import CommTimeoutError, InputMismatchError
from lowering.patterns import allgather_matmul
from lowering.pipeline import lower
from runtime.interpreter import agree_on_inputs
from runtime.watchdog import Watchdog


@pytest.fixture(autouse=True)
def flight_dir(tmp_path, monkeypatch):
    """A timeout writes the flight record: here, not into the user's cache."""
    monkeypatch.setenv("HOSTIR_FLIGHT_DIR", str(tmp_path / "flight"))
    return tmp_path / "flight"


def test_watchdog_drops_finished_work_and_stays_quiet():
    ended = []
    dog = Watchdog(0, "fake", timeout_s=0.2, grace_s=0.1, end=ended.append)
    for _ in range(100):
        dog.watch("Allgather", lambda: True)
    assert dog.in_flight() == 0
    time.sleep(0.5)
    assert dog.error is None and ended == []
    dog.stop()


def test_watchdog_aborts_raises_in_the_main_thread_and_ends_the_job(flight_dir):
    aborted, ended = [], []
    dog = Watchdog(3, "fake", on_timeout=[lambda: aborted.append(True)], timeout_s=0.3,
                   grace_s=0.5, end=ended.append)
    dog.watch("NCCL Allgather of 64 bytes", lambda: False)
    start = time.monotonic()
    with pytest.raises(CommTimeoutError, match=r"rank 3: NCCL Allgather of 64 bytes did not "
                                               r"complete within 0.3 s \(HOSTIR_COMM_TIMEOUT\)"):
        while time.monotonic() - start < 5:  # "blocked" in Python: the error lands here
            time.sleep(0.01)
    assert 0.3 <= time.monotonic() - start < 2
    assert aborted == [True]
    assert f"flight records in {flight_dir}" in str(dog.error)
    with pytest.raises(CommTimeoutError):
        dog.raise_if_failed()  # no new work on an aborted communicator
    deadline = time.monotonic() + 3
    while not ended and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ended == [1]  # still alive after the grace period: the job is ended


def test_watchdog_off_with_a_zero_timeout():
    dog = Watchdog(0, "fake", timeout_s=0)
    dog.watch("x", lambda: False)
    assert dog._thread is None


class _FakeComm:
    """Ranks answer through `others`: what the other ranks passed to `agree`."""

    def __init__(self, rank, others):
        self.rank, self.world_size, self.others = rank, len(others) + 1, others

    def agree(self, obj):
        out = list(self.others)
        out.insert(self.rank, obj)
        return out


def _program():
    return lower(allgather_matmul(16, 4, 4, 2, 2), 2, 2)


def test_agreement_names_the_rank_with_other_shapes():
    p = _program()
    shard, b = torch.randn(2, 1, 4, 4), torch.randn(4, 4)
    agree_on_inputs(p, (shard, b), torch.device("cpu"), _FakeComm(0, [(None, "float32[2, 1, 4, 4], float32[4, 4]")]))
    with pytest.raises(InputMismatchError, match=r"rank 0: inputs differ between ranks.*rank 0 "
                       r"passed float32\[2, 1, 4, 4\], float32\[4, 4\]; rank 1 passed "
                       r"float32\[2, 1, 8, 4\]") as e:
        agree_on_inputs(p, (shard, b), torch.device("cpu"),
                        _FakeComm(0, [(None, "float32[2, 1, 8, 4], float32[4, 4]")]))
    assert e.value.on_every_rank


def test_agreement_carries_a_peer_refusal_to_every_rank():
    p = _program()
    shard, b = torch.randn(2, 1, 4, 4), torch.randn(4, 4)
    peer = ("input T1: expected dtype float32, got torch.float64", "float32[2, 1, 4, 4], float64[4, 4]")
    with pytest.raises(InputMismatchError, match="rank 0: rank 1 refused its inputs: input T1: "
                                                 "expected dtype float32, got torch.float64"):
        agree_on_inputs(p, (shard, b), torch.device("cpu"), _FakeComm(0, [peer]))


def _raised_within(seconds: float, exc_type, match: str):
    start = time.monotonic()
    with pytest.raises(exc_type, match=match):
        while time.monotonic() - start < seconds:  # "blocked" in Python: the error lands here
            time.sleep(0.01)
    return time.monotonic() - start


def test_an_asynchronous_transport_error_ends_the_job_at_once_with_its_text():
    from hostir.errors import CommunicationError

    aborted, ended = [], []
    errors = [None, None, "NCCL error: unhandled system error (run with NCCL_DEBUG=INFO)"]
    dog = Watchdog(2, "NCCL", on_timeout=[lambda: aborted.append(True)], timeout_s=60,
                   grace_s=0.3, end=ended.append, health=[lambda: errors.pop(0) if
                                                          len(errors) > 1 else errors[0]])
    dog.watch("NCCL Allgather of 64 bytes", lambda: False)
    took = _raised_within(5, CommunicationError,
                          r"rank 2: the NCCL communicator reported an asynchronous error: NCCL "
                          r"error: unhandled system error \(run with NCCL_DEBUG=INFO\)")
    assert took < 10  # far before the 60 s timeout
    assert aborted == [True] and isinstance(dog.error, CommunicationError)
    deadline = time.monotonic() + 3
    while not ended and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ended == [1]


def test_the_nccl_communicator_reads_cupys_async_error_state():
    import types

    from runtime.comm.nccl import NcclCommunicator

    class NcclError(Exception):
        pass

    class Healthy:
        def check_async_error(self):
            pass

    class Failed:
        def check_async_error(self):
            raise NcclError("NCCL_ERROR_REMOTE_ERROR: remote process exited or there was a "
                            "network error")

    comm = object.__new__(NcclCommunicator)
    comm.nccl = types.SimpleNamespace(NcclError=NcclError)
    comm.comm = Healthy()
    assert comm.async_error() is None
    comm.comm = Failed()
    assert comm.async_error() == ("NCCL error: NCCL_ERROR_REMOTE_ERROR: remote process exited "
                                  "or there was a network error")
    comm.comm = object()  # a CuPy without check_async_error: only the timeout is left
    assert comm.async_error() is None

    class OldNccl:
        calls = 0

        def check_async_error(self):
            OldNccl.calls += 1
            raise RuntimeError("ncclCommGetAsyncError is not available in this version")

    comm.comm = OldNccl()
    assert comm.async_error() is None and comm.async_error() is None
    assert OldNccl.calls == 1  # asked once, then left to the timeout


def test_a_graph_replay_that_never_finishes_is_bounded_by_the_watchdog(monkeypatch):
    from runtime import flight
    from runtime.graph import GraphedProgram

    rec = flight.FlightRecorder(10)
    monkeypatch.setattr(flight, "_RECORDER", rec)

    class Graph:
        replays = 0

        def replay(self):
            Graph.replays += 1

    class StuckEvent:  # the graph's last work never completes (a peer left)
        def record(self, stream):
            assert stream == "the current stream"

        def query(self):
            return False

    ended = []
    dog = Watchdog(1, "NCCL", timeout_s=0.3, grace_s=0.3, end=ended.append)
    graphed = GraphedProgram(Graph(), [], ["out"], dog, event=StuckEvent,
                             stream=lambda: "the current stream")
    assert graphed() == ["out"] and Graph.replays == 1
    _raised_within(5, CommTimeoutError, r"rank 1: CUDA-graph replay 1 of a host program did "
                                        r"not complete within 0.3 s")
    entries = rec.as_json("test")["entries"]
    assert [(e["kind"], e["seq"], e["state"]) for e in entries] == [("GraphReplay", 1, "started")]


@pytest.mark.parametrize("text", ["1:x:hang", "1:19", "1:19:explode", "-1:3:raise", "1:-2:kill",
                                  "a:b:c:d", ""])
def test_a_malformed_fault_spec_is_an_options_error(text):
    from hostir.errors import OptionsError
    from runtime.fault_injection import Fault

    with pytest.raises(OptionsError, match=rf"^HOSTIR_INJECT_FAULT={text}: expected "
                                           r"rank:statement:kind \(rank and statement whole "
                                           r"numbers >= 0, kind one of raise, exit, kill, hang\)"):
        Fault.parse(text)


def test_a_fault_spec_parses():
    from runtime.fault_injection import Fault

    assert Fault.parse("1:19:hang") == Fault(1, 19, "hang")


def test_one_rank_errors_end_by_returning_their_code():
    from hostir.errors import LoweringError
    from runtime.watchdog import end_after_error

    assert end_after_error(LoweringError("bad"), 2) == 2  # no MPI here: one rank


class _SilentPeer:
    """A two-rank MPI world whose peer never sends: its requests never complete."""

    class _Request:
        def Test(self):
            return False

        def Cancel(self):
            pass

        def Wait(self):
            pass

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 2

    def Irecv(self, *args, **kwargs):
        return self._Request()

    Isend = Irecv


@pytest.mark.parametrize("limit, waited", [(0.4, 0.2), (100.0, 10.0), (0.0, 10.0)])
def test_a_rank_with_an_error_waits_at_most_half_the_collective_timeout(monkeypatch, limit,
                                                                       waited):
    # so that it, not a peer whose collective times out, aborts the job and names the cause
    import dataclasses

    from hostir.options import options, set_options
    from runtime import watchdog

    set_options(dataclasses.replace(options(), comm_timeout_s=limit))
    waits = []
    monkeypatch.setattr(watchdog, "mpi_world", lambda: _SilentPeer())
    monkeypatch.setattr(watchdog, "poll_requests",
                        lambda reqs, deadline: (waits.append(deadline - time.monotonic()),
                                                [r.Test() for r in reqs])[1])
    try:
        assert not watchdog.every_rank_failed(3)
    finally:
        set_options(None)
    assert waits and waits[0] == pytest.approx(waited, abs=0.05)


class _PeersWithErrors(_SilentPeer):
    """A four-rank world (this is rank 1) where ranks 0 and 3 sent their error message."""

    def Get_rank(self):
        return 1

    def Get_size(self):
        return 4

    def Iprobe(self, source, tag):
        from runtime.watchdog import ERROR_TAG

        return tag == ERROR_TAG and source in (0, 3)


def test_a_timed_out_collective_names_the_peers_that_stopped_with_an_error(monkeypatch):
    from runtime import watchdog

    monkeypatch.setattr(watchdog, "mpi_world", lambda: _PeersWithErrors())
    assert watchdog.peers_reporting_errors() == [0, 3]
    assert watchdog.timeout_cause() == ("ranks 0, 3 stopped with errors of their own, which "
                                        "their lines name")
    monkeypatch.setattr(watchdog, "mpi_world", lambda: _SilentPeer())  # no Iprobe: MPI can't say
    assert watchdog.timeout_cause() == "a peer rank failed, died or is stuck"
    monkeypatch.setattr(watchdog, "mpi_world", lambda: None)
    assert watchdog.peers_reporting_errors() == []
