"""Ending every rank when one fails: the communication watchdog and the uncaught-error hook.

A collective that a peer never posts (it raised, died, or is stuck) would otherwise hang
its partners forever. Two mechanisms end the job instead:

- ``Watchdog``: GPU collectives never block the host, so a hung NCCL kernel shows up only
  as work that never completes. The communicator registers each collective (an event's
  ``query``); a daemon thread checks the oldest one, and once it is older than
  HOSTIR_COMM_TIMEOUT it aborts the communicator (its kernels exit), prints a
  ``CommTimeoutError`` naming the rank and the collective, raises it in the main thread,
  and, if the process is still alive a few seconds later, ends the MPI job.
  (MPI's CPU collectives time out in ``Work.wait`` itself: ``runtime.comm.mpi``.)
- ``install_excepthook``: under mpirun an uncaught error on one rank prints it, rank
  first, and calls ``MPI.COMM_WORLD.Abort`` so that peers blocked in a collective end too.
  A rank that merely exits would leave them waiting: MPI_Finalize waits for them.

  A rank that the launcher ends with SIGTERM (Open MPI does, to every rank, when one
  aborts) first writes its flight record (``runtime.flight``).
- ``end_after_error``: a one-line error that no peer can be waiting on ends the job by a
  normal exit (MPI finalizes, no abort banner): errors raised identically on every rank
  (the input agreement's ``InputMismatchError`` carries ``on_every_rank = True``), or any
  error that every rank reports within AGREE_S (``every_rank_failed``: point-to-point
  messages, so a rank still running is found out, not waited for). A rank-local or
  unknown failure aborts.

The watchdog also polls the transport's own error state (NCCL's asynchronous error, as
torch's c10d does), and on a timeout or error writes the flight record and names it.

Example::

    dog = Watchdog(rank=0, what="nccl", on_timeout=[comm.abort])
    dog.watch("Allgather of 4 MiB", event.query)      # after posting the collective
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import os
import sys
import threading
import time
import traceback

import numpy as np

from hostir.errors import CommTimeoutError, CommunicationError, HostIrError, OptionsError
from hostir.options import options
from runtime import flight
from runtime.bootstrap import mpi_world, poll_requests, process_rank, world_size

__all__ = ["Watchdog", "end_job", "end_after_error", "install_excepthook", "process_rank",
           "report", "world_size"]

# After a timeout, how long the main thread gets to raise and exit by itself.
GRACE_S = 5.0
# Seconds a rank waits a rank number before it aborts the job, at most the second.
ABORT_STAGGER_S = 0.25
MAX_ABORT_STAGGER_S = 1.0


def report(exc: BaseException, with_traceback: bool = False) -> None:
    """Print ``exc`` on stderr, rank first, once."""
    if getattr(exc, "_hostir_reported", False):
        return
    rank = process_rank()
    text = f"[rank {rank}] hostir: {type(exc).__name__}: {exc}\n"
    if with_traceback and exc.__traceback__ is not None:
        tb = "".join(traceback.format_exception(exc)).rstrip().split("\n")
        text += "".join(f"[rank {rank}] {line}\n" for line in tb)
    sys.stderr.write(text)
    sys.stderr.flush()
    try:
        exc._hostir_reported = True
    except AttributeError:  # pragma: no cover - exceptions without a __dict__
        pass


def end_job(code: int = 1) -> None:
    """Abort the MPI job (every rank ends) or, without MPI, this process. Never returns."""
    world = mpi_world()
    rank = process_rank()
    if world is not None and world.Get_size() > 1:
        # Ranks that time out together abort one after another, lowest first: the first
        # abort ends the others (each writes its flight record on the SIGTERM, in this
        # sleep), where two aborts in one instant had Open MPI kill a stuck rank before
        # its SIGTERM handler wrote its record.
        time.sleep(min(ABORT_STAGGER_S * rank, MAX_ABORT_STAGGER_S))
        sys.stderr.write(f"[rank {rank}] hostir: aborting the MPI job so that no rank waits "
                         "forever\n")
        sys.stderr.flush()
        world.Abort(code)
    sys.stderr.flush()
    os._exit(code)


# How long a rank with an error waits to hear that every other rank has one too; at most
# half of HOSTIR_COMM_TIMEOUT, so that the rank with the error aborts the job (its line
# names the cause) before a peer's collective times out (whose line only names a symptom).
AGREE_S = 10.0
# Point-to-point messages on a tag of their own: they never match a collective.
ERROR_TAG = 29_002


def every_rank_failed(code: int, timeout_s: float | None = None) -> bool:
    """True when every other rank of the MPI job also reports an error within
    ``timeout_s`` (default: AGREE_S, at most half of HOSTIR_COMM_TIMEOUT when that is set).

    Each rank on its way out sends its exit code to every other rank and waits for
    theirs. When all arrive, nobody is left waiting in a collective and the job can end
    by a normal exit (MPI_Finalize); when one does not, that rank is still running, and
    only an abort reaches it."""
    world = mpi_world()
    if world is None or world.Get_size() <= 1:
        return True
    if timeout_s is None:
        try:
            limit = options().comm_timeout_s
        except OptionsError:  # the error being reported may be that very setting
            limit = 0.0
        timeout_s = min(AGREE_S, limit / 2) if limit > 0 else AGREE_S
    rank, size = world.Get_rank(), world.Get_size()
    peers = [r for r in range(size) if r != rank]
    mine = np.array([code], dtype=np.int32)
    theirs = {r: np.zeros(1, dtype=np.int32) for r in peers}
    recvs = [world.Irecv(theirs[r], source=r, tag=ERROR_TAG) for r in peers]
    sends = [world.Isend(mine, dest=r, tag=ERROR_TAG) for r in peers]
    deadline = time.monotonic() + timeout_s  # one for both: the wait is at most timeout_s
    heard = poll_requests(recvs, deadline)
    if not all(heard):
        for req, done in zip(recvs, heard):
            if not done:  # no receive left posted into buffers that go away here
                req.Cancel()
                req.Wait()
        return False
    # Every peer posted its receive (it sent to this rank from the same code path).
    return all(poll_requests(sends, deadline))


def peers_reporting_errors() -> list[int]:
    """The other ranks whose error message (`every_rank_failed`) waits here unreceived:
    a rank that ran out of time in a collective names them, since their own lines say
    why it was left waiting. Empty without MPI, or where MPI cannot say."""
    world = mpi_world()
    if world is None or world.Get_size() <= 1:
        return []
    try:
        rank = world.Get_rank()
        return [r for r in range(world.Get_size())
                if r != rank and world.Iprobe(source=r, tag=ERROR_TAG)]
    except Exception:  # noqa: BLE001 -- only a better message is lost
        return []


def timeout_cause() -> str:
    """The end of a timed-out collective's message: the peers that reported an error of
    their own (`peers_reporting_errors`), else what may have happened to one."""
    peers = peers_reporting_errors()
    if not peers:
        return "a peer rank failed, died or is stuck"
    if len(peers) == 1:
        return f"rank {peers[0]} stopped with an error of its own, which its line names"
    return (f"ranks {', '.join(map(str, peers))} stopped with errors of their own, which "
            "their lines name")


def end_after_error(exc: BaseException, code: int) -> int:
    """The exit code for a one-line error already printed: ``code`` when no peer can be
    left waiting (one rank, an error raised on every rank by construction, or every rank
    reports an error in time: `every_rank_failed`), so the caller returns it and MPI
    finalizes with no abort banner. Otherwise (an error raised while executing a
    statement, a timed-out collective, or a peer that says nothing) the MPI job is aborted
    here."""
    if world_size() <= 1 or getattr(exc, "on_every_rank", False):
        return code
    if not _rank_local(exc) and every_rank_failed(code):
        return code
    end_job(code)
    return code  # not reached


def _rank_local(exc: BaseException) -> bool:
    """An error only this rank can have: raised while executing a statement (its peers
    are in the program, maybe in a collective), a timed-out collective, or an error that
    is not hostir's own (a bug, an interrupt)."""
    return (getattr(exc, "_hostir_where", False) or isinstance(exc, CommTimeoutError)
            or not isinstance(exc, HostIrError))


def _hook(tp, value, tb):
    if (getattr(value, "on_every_rank", False) or world_size() <= 1
            or (not _rank_local(value) and every_rank_failed(1))):
        # Every rank raises this one (or there is one rank): no peer is left waiting.
        report(value)
        _previous_hook(tp, value, tb)
        return
    report(value, with_traceback=True)
    end_job(1)


_previous_hook = sys.excepthook


def install_excepthook() -> None:
    """Make an uncaught error on one rank of a multi-rank job abort the whole job, and a
    rank that the launcher ends write its flight record (idempotent). ``hostir.run`` and
    ``Session`` install it."""
    global _previous_hook
    if sys.excepthook is not _hook:
        _previous_hook = sys.excepthook
        sys.excepthook = _hook
    if world_size() > 1:
        flight.install_sigterm_dump()


def _raise_in_main_thread(exc_type: type) -> None:
    main = threading.main_thread().ident
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(main), ctypes.py_object(exc_type))


class Watchdog:
    """Deadlines for collectives in flight, and the health of the communicator, checked by
    one daemon thread (started with the first collective).

    ``watch(what, done)`` registers a collective just posted; ``done()`` must be cheap and
    thread-safe (``torch.cuda.Event.query``). Collectives of one communicator complete in
    the order they were posted, so only the oldest is checked; finished ones are dropped.
    ``health`` callables are polled every tick too: each returns None, or the text of an
    error the transport reported by itself (NCCL's asynchronous error state), which ends
    the job at once, with that text. ``timeout_s`` <= 0 turns the deadlines off (the
    health checks stay).
    """

    def __init__(self, rank: int, what: str, on_timeout=(), timeout_s: float | None = None,
                 grace_s: float = GRACE_S, end=end_job, health=()):
        self.rank = rank
        self.what = what
        self.on_timeout = list(on_timeout)
        self.health = list(health)
        self.timeout_s = options().comm_timeout_s if timeout_s is None else timeout_s
        self.grace_s = grace_s
        self.end = end
        self.error: CommunicationError | None = None
        self._pending: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def watch(self, what: str, done) -> None:
        if self.timeout_s <= 0 and not self.health:
            return
        with self._lock:
            if self.timeout_s > 0:
                self._pending.append((time.monotonic() + self.timeout_s, what, done))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hostir-watchdog",
                                                daemon=True)
                self._thread.start()

    def in_flight(self) -> int:
        """Collectives registered and not yet seen complete (tests read it)."""
        with self._lock:
            self._drop_done()
            return len(self._pending)

    def raise_if_failed(self) -> None:
        """Refuse new work once the communicator was aborted."""
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self._stop.set()

    def _drop_done(self) -> None:
        while self._pending and self._pending[0][2]():
            self._pending.popleft()

    def _unhealthy(self) -> str | None:
        for check in self.health:
            try:
                text = check()
            except Exception as e:  # noqa: BLE001 - a check that fails is a failure
                text = f"{type(e).__name__}: {e}"
            if text:
                return text
        return None

    def _run(self) -> None:
        timeout = self.timeout_s if self.timeout_s > 0 else 20.0
        tick = min(1.0, max(timeout / 20, 0.01))
        while not self._stop.wait(tick):
            failed = self._unhealthy()
            if failed:
                self._fire(f"rank {self.rank}: the {self.what} communicator reported an "
                           f"asynchronous error: {failed}; the watchdog aborted it",
                           CommunicationError)
                return
            with self._lock:
                self._drop_done()
                expired = self._pending and self._pending[0][0] < time.monotonic()
                what = self._pending[0][1] if expired else None
            if expired:
                self._fire(f"rank {self.rank}: {what} did not complete within "
                           f"{self.timeout_s:g} s (HOSTIR_COMM_TIMEOUT); the watchdog aborted "
                           f"the {self.what} communicator. Expected every rank to post it: "
                           f"{timeout_cause()}", CommTimeoutError)
                return

    def _fire(self, message: str, kind: type = CommTimeoutError) -> None:
        where = flight.dump(f"watchdog: {message}")
        message += flight.describe(where)
        self.error = kind(message)
        report(self.error)
        # Whatever the main thread does next, this rank must not exit 0 nor wait for its
        # peers in MPI_Finalize: at exit (before mpi4py finalizes), end the job.
        atexit.register(self.end, 1)
        # The backstop first: an abort that blocks must not keep the job alive.
        backstop = threading.Timer(self.grace_s, self.end, args=(1,))
        backstop.daemon = True
        backstop.start()
        for abort in self.on_timeout:
            try:
                abort()
            except Exception as e:  # noqa: BLE001 - the job ends either way
                sys.stderr.write(f"[rank {self.rank}] hostir: aborting the communicator "
                                 f"failed: {type(e).__name__}: {e}\n")

        # The main thread gets the error at its next Python instruction (an exception type
        # is all CPython accepts here, so the message rides on a subclass).
        def init(exc, *args):
            kind.__init__(exc, *(args or (message,)))

        _raise_in_main_thread(type(kind.__name__, (kind,), {"__init__": init}))
        self._stop.wait()  # the backstop ends the job unless the process exits first
        backstop.cancel()
