"""The watchdog and the input agreement, without MPI or a GPU: fake communicators."""

import time

import pytest
import torch

from hostir.errors import CommTimeoutError, InputMismatchError
from lowering.patterns import allgather_matmul
from lowering.pipeline import lower
from runtime.interpreter import agree_on_inputs
from runtime.watchdog import Watchdog


def test_watchdog_drops_finished_work_and_stays_quiet():
    ended = []
    dog = Watchdog(0, "fake", timeout_s=0.2, grace_s=0.1, end=ended.append)
    for _ in range(100):
        dog.watch("Allgather", lambda: True)
    assert dog.in_flight() == 0
    time.sleep(0.5)
    assert dog.error is None and ended == []
    dog.stop()


def test_watchdog_aborts_raises_in_the_main_thread_and_ends_the_job():
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
