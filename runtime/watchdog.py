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

Errors raised identically on every rank (the input agreement's ``InputMismatchError``
carries ``on_every_rank = True``) are printed without aborting: every rank exits by itself.

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

from hostir.errors import CommTimeoutError
from hostir.options import options

# After a timeout, how long the main thread gets to raise and exit by itself.
GRACE_S = 5.0


def process_rank() -> int:
    """This process's rank: MPI's when MPI is up, else the launcher's variables, else 0."""
    mpi = _mpi_world()
    if mpi is not None:
        return mpi.Get_rank()
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def _mpi_world():
    """MPI.COMM_WORLD if this process already initialized MPI (never initializes it)."""
    mod = sys.modules.get("mpi4py.MPI")
    if mod is None or not mod.Is_initialized() or mod.Is_finalized():
        return None
    return mod.COMM_WORLD


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
    world = _mpi_world()
    rank = process_rank()
    if world is not None and world.Get_size() > 1:
        sys.stderr.write(f"[rank {rank}] hostir: aborting the MPI job so that no rank waits "
                         "forever\n")
        sys.stderr.flush()
        world.Abort(code)
    sys.stderr.flush()
    os._exit(code)


def _hook(tp, value, tb):
    if getattr(value, "on_every_rank", False) or world_size() <= 1:
        # Every rank raises this one (or there is one rank): no peer is left waiting.
        report(value)
        _previous_hook(tp, value, tb)
        return
    report(value, with_traceback=True)
    end_job(1)


def world_size() -> int:
    world = _mpi_world()
    if world is not None:
        return world.Get_size()
    return int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))


_previous_hook = sys.excepthook


def install_excepthook() -> None:
    """Make an uncaught error on one rank of a multi-rank job abort the whole job
    (idempotent). ``hostir.run`` and ``Session`` install it."""
    global _previous_hook
    if sys.excepthook is not _hook:
        _previous_hook = sys.excepthook
        sys.excepthook = _hook


def _raise_in_main_thread(exc_type: type) -> None:
    main = threading.main_thread().ident
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(main), ctypes.py_object(exc_type))


class Watchdog:
    """Deadlines for collectives in flight, checked by one daemon thread (started lazily).

    ``watch(what, done)`` registers a collective just posted; ``done()`` must be cheap and
    thread-safe (``torch.cuda.Event.query``). Collectives of one communicator complete in
    the order they were posted, so only the oldest is checked; finished ones are dropped.
    ``timeout_s`` <= 0 turns the watchdog off.
    """

    def __init__(self, rank: int, what: str, on_timeout=(), timeout_s: float | None = None,
                 grace_s: float = GRACE_S, end=end_job):
        self.rank = rank
        self.what = what
        self.on_timeout = list(on_timeout)
        self.timeout_s = options().comm_timeout_s if timeout_s is None else timeout_s
        self.grace_s = grace_s
        self.end = end
        self.error: CommTimeoutError | None = None
        self._pending: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def watch(self, what: str, done) -> None:
        if self.timeout_s <= 0:
            return
        with self._lock:
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

    def _run(self) -> None:
        tick = min(1.0, max(self.timeout_s / 20, 0.01))
        while not self._stop.wait(tick):
            with self._lock:
                self._drop_done()
                expired = self._pending and self._pending[0][0] < time.monotonic()
                what = self._pending[0][1] if expired else None
            if expired:
                self._fire(what)
                return

    def _fire(self, what: str) -> None:
        message = (f"rank {self.rank}: {what} did not complete within {self.timeout_s:g} s "
                   f"(HOSTIR_COMM_TIMEOUT); the watchdog aborted the {self.what} communicator. "
                   "Expected every rank to post it: a peer rank failed, died or is stuck")
        self.error = CommTimeoutError(message)
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
            CommTimeoutError.__init__(exc, *(args or (message,)))

        _raise_in_main_thread(type("CommTimeoutError", (CommTimeoutError,), {"__init__": init}))
        self._stop.wait()  # the backstop ends the job unless the process exits first
        backstop.cancel()
