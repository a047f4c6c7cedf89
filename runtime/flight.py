"""The flight recorder: each rank's last communication and synchronization statements.

When a job hangs, every rank's error says only what *it* waited for. To say which rank
stopped where, each rank keeps a ring buffer of its last N (``HOSTIR_FLIGHT_ENTRIES``,
default 2000) Communication, Wait and Synchronize statements, filled by the interpreter:

    program id and name, statement index (walk order) and text, loop indices, stream,
    communicator, collective sequence number (per communicator, counted from 1),
    bytes, state (started / completed)

A collective is completed when its request finishes (MPI, gloo: when its Wait returns)
or, on CUDA, when the event recorded after it has completed: the recorder asks the event
(``query``, which never blocks) only when it writes the record out. A Wait on CUDA is a
stream wait, so it shares its collective's event; a Synchronize on CUDA is an event wait
the host issues at once, recorded completed when issued.

The record is written as JSON, one file a rank, to ``$HOSTIR_FLIGHT_DIR`` (default: a
private directory per job under ``$HOSTIR_CACHE_DIR/flight``): by the watchdog and the
MPI waits on a timeout (their error line names the directory), by a rank that the
launcher ends (SIGTERM, as Open MPI does to every rank when one aborts), at exit with
``HOSTIR_FLIGHT_DUMP=1``, or by ``dump()``. ``python -m hostir.run flight_report DIR``
compares the ranks' records.

    >>> from runtime import flight
    >>> path = flight.dump("on request")            # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import re
import signal
import socket
import stat
import sys
import threading
import time
from pathlib import Path

from hostir.errors import OptionsError
from hostir.options import options
from runtime.bootstrap import process_rank, world_size

DEFAULT_ENTRIES = 2000
CAPTURED = -1.0  # Entry.ended of a statement captured into a CUDA graph
FORMAT = "hostir-flight/1"
# Entries a recorder keeps at most: about 420 bytes each as JSON, so that a record stays
# within what ``hostir.run flight_report`` reads (its MAX_RECORD_BYTES, 256 MiB).
MAX_ENTRIES = 500_000


def capacity_from_environ(environ=None) -> int:
    """``HOSTIR_FLIGHT_ENTRIES`` (default 2000; 0 keeps no record)."""
    environ = os.environ if environ is None else environ
    raw = environ.get("HOSTIR_FLIGHT_ENTRIES", "").strip()
    if not raw:
        return DEFAULT_ENTRIES
    # ASCII digits only: isdigit() also takes Unicode digits such as "²", which int() refuses
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_ENTRIES:
        raise OptionsError(f"HOSTIR_FLIGHT_ENTRIES={raw!r}: expected a whole number of "
                           f"entries from 0 to {MAX_ENTRIES} (default 2000)")
    return int(raw)


class Entry:
    """One statement as this rank ran it. ``meta``: what is the same every time the
    statement runs (program id, statement index and text, loop index names, kind,
    communicator), made once per statement; ``loops``: the loop indices' values now.
    ``poll``: a non-blocking completion check (a CUDA event's ``query``), asked when the
    record is written; None once known."""

    __slots__ = ("meta", "loops", "n", "seq", "nbytes", "stream", "started", "ended", "poll")

    def __init__(self):
        self.n = 0  # not used yet: the recorder's slots are made once and reused
        self.meta = self.loops = self.stream = self.ended = self.poll = None
        self.seq = self.nbytes = 0
        self.started = 0.0

    def complete(self) -> None:
        if self.ended is None:
            self.ended = time.monotonic()
            self.poll = None

    def mark_captured(self) -> None:
        """Issued into a CUDA graph being captured: it runs at replay (which the
        recorder records as an entry of its own)."""
        self.ended = CAPTURED
        self.poll = None

    @property
    def captured(self) -> bool:
        return self.ended == CAPTURED

    @property
    def state(self) -> str:
        return ("started" if self.ended is None else
                "captured" if self.ended == CAPTURED else "completed")


def statement_meta(program: int, index: int, statement: str, loops: tuple = (),
                   kind: str = "", comm: str = "") -> tuple:
    """The ``meta`` of ``Entry``: what is the same every time a statement runs."""
    return (program, index, statement, tuple(loops), kind, comm)


class FlightRecorder:
    """The ring buffer of one process (``recorder()``), and what it needs to describe
    its entries: the programs' names, this rank and the world size.

    The ring's entries are made once and overwritten in turn, so recording allocates
    nothing but the tuple of loop values, and a long run keeps the object count flat.
    An entry is recycled after ``capacity`` newer ones: a holder checks ``n``."""

    def __init__(self, capacity: int = DEFAULT_ENTRIES):
        self.capacity = capacity
        self._ring = [Entry() for _ in range(capacity)]
        self.recorded = 0
        self.rank: int | None = None
        self.world_size: int | None = None
        self.programs: dict[int, str] = {}  # program id -> its name
        self._seq: dict[int, int] = {}  # id(communicator) -> collectives posted
        self._written: Path | None = None
        self._writing = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def add_program(self, name: str) -> int:
        """A new program's id (programs are numbered in the order they are built, the
        same on every rank of an SPMD job)."""
        pid = len(self.programs) + 1
        self.programs[pid] = name
        return pid

    def bind(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def next_seq(self, comm) -> int:
        """The sequence number of the next collective posted on ``comm``."""
        key = id(comm)
        seq = self._seq[key] = self._seq.get(key, 0) + 1
        return seq

    def start(self, meta: tuple, loops: tuple = (), seq: int = 0, nbytes: int = 0,
              stream=None, completed: bool = False) -> Entry:
        """Record a statement starting now (``meta``: ``statement_meta``; ``loops``: the
        values of its loop indices); ``completed``: it also ended now (a Synchronize,
        complete when issued)."""
        n = self.recorded = self.recorded + 1
        e = self._ring[(n - 1) % self.capacity] if self.capacity else Entry()
        e.meta, e.loops, e.n, e.seq, e.nbytes, e.stream = meta, loops, n, seq, nbytes, stream
        e.started = now = time.monotonic()
        e.ended = now if completed else None
        e.poll = None
        return e

    # ------------------------------------------------------------------ writing out

    def snapshot(self) -> list[Entry]:
        """The entries in use, oldest first. Another thread may be recording meanwhile
        (the watchdog writes while the main thread runs): at worst the newest entry is
        half written."""
        return sorted((e for e in list(self._ring) if e.n > 0), key=lambda e: e.n)

    def as_json(self, reason: str) -> dict:
        now = time.monotonic()
        out = []
        for e in self.snapshot():
            poll = e.poll
            if poll is not None:
                try:
                    if poll():
                        e.complete()
                except Exception:  # noqa: BLE001 - a failed device: leave it started
                    pass
            program, index, statement, names, kind, comm = e.meta
            out.append({
                "n": e.n, "program_id": program, "program": self.programs.get(program, ""),
                "index": index, "statement": statement,
                "loops": dict(zip(names, e.loops)), "kind": kind, "comm": comm, "seq": e.seq,
                "bytes": e.nbytes, "stream": _stream_name(e.stream),
                "state": e.state, "started_s_ago": round(now - e.started, 6),
                "took_s": (round(e.ended - e.started, 6) if e.state == "completed"
                           else None),
            })
        rank = self.rank if self.rank is not None else process_rank()
        return {
            "format": FORMAT, "rank": rank,
            "world_size": self.world_size if self.world_size is not None else world_size(),
            "host": socket.gethostname(), "pid": os.getpid(), "reason": reason,
            "dumped_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "capacity": self.capacity, "recorded": self.recorded, "entries": out,
        }

    def dump(self, reason: str, directory: Path | None = None) -> Path | None:
        """Write the record; the directory it went to, or None (nothing recorded, or the
        directory refused: a warning says why; the caller's error still goes out)."""
        if not self.enabled or not self._writing.acquire(blocking=False):
            return self._written
        try:
            where = flight_dir() if directory is None else Path(directory)
            _private_dir(where, explicit=directory is not None
                         or bool(os.environ.get("HOSTIR_FLIGHT_DIR")))
            data = json.dumps(self.as_json(reason), indent=1).encode()
            rank = self.rank if self.rank is not None else process_rank()
            _write_new(where, f"rank{rank}", data)
            self._written = where
            return where
        except (OSError, OptionsError) as e:
            sys.stderr.write(f"[rank {process_rank()}] hostir: warning: flight record not "
                             f"written: {e}\n")
            return None
        finally:
            self._writing.release()


def _stream_name(stream) -> str:
    if stream is None:
        return ""
    handle = getattr(stream, "cuda_stream", None)
    return f"cuda stream {handle:#x}" if isinstance(handle, int) else str(stream)


def _write_new(directory: Path, stem: str, data: bytes) -> Path:
    """``directory/stem.json``, or ``stem.1.json`` ... when taken: created exclusively,
    never through a symlink, readable by the owner only."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    for k in range(1000):
        path = directory / (f"{stem}.json" if k == 0 else f"{stem}.{k}.json")
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return path
    raise OSError(f"{directory}: 1000 flight records of {stem} already; remove old ones")


def _private_dir(path: Path, explicit: bool) -> None:
    """Create ``path`` (and missing parents) owner-only; refuse one that is a symlink,
    not ours, or (unless the user named it) writable by others."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise OptionsError(f"{path}: expected a directory, found something else (a symlink?)")
    if st.st_uid != os.getuid():
        raise OptionsError(f"{path}: owned by uid {st.st_uid}, not by this user")
    if not explicit and st.st_mode & 0o022:
        raise OptionsError(f"{path}: writable by other users; expected a private (0700) "
                           "directory")


def job_id() -> str:
    """A name every rank of this job computes alike, without talking to the others."""
    env = os.environ
    for var in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "TORCHELASTIC_RUN_ID"):
        if env.get(var):
            raw = env[var]
            break
    else:
        if env.get("SLURM_JOB_ID"):
            raw = f"slurm-{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '0')}"
        elif world_size() > 1:
            raw = f"ppid-{os.getppid()}"  # the launcher's daemon, shared by a node's ranks
        else:
            raw = f"pid-{os.getpid()}"
    return re.sub(r"[^A-Za-z0-9._-]", "_", raw)[:120]


def flight_dir() -> Path:
    """Where this job's records go: ``$HOSTIR_FLIGHT_DIR``, else
    ``<cache dir>/flight/<job>`` (private directories)."""
    explicit = os.environ.get("HOSTIR_FLIGHT_DIR")
    if explicit:
        return Path(explicit).expanduser()
    root = options().cache_dir / "flight"
    _private_dir(root, explicit=False)
    return root / job_id()


_RECORDER: FlightRecorder | None = None


def recorder() -> FlightRecorder:
    """This process's recorder, made on first use (reads HOSTIR_FLIGHT_ENTRIES, and
    arranges the dump at exit that HOSTIR_FLIGHT_DUMP=1 asks for)."""
    global _RECORDER
    if _RECORDER is None:
        _RECORDER = FlightRecorder(capacity_from_environ())
        if os.environ.get("HOSTIR_FLIGHT_DUMP", "") not in ("", "0"):
            atexit.register(_dump_at_exit)
    return _RECORDER


def dump(reason: str = "on request", directory=None) -> Path | None:
    """Write this rank's record now; the directory it went to (None if not written)."""
    return recorder().dump(reason, None if directory is None else Path(directory))


def written() -> Path | None:
    """Where this process last wrote its record (None: not yet)."""
    return None if _RECORDER is None else _RECORDER._written


def describe(where: Path | None) -> str:
    """The clause an error line adds about the record."""
    if where is None:
        return ""
    return f"; flight records in {where} (python -m hostir.run flight_report {where})"


def _dump_at_exit() -> None:
    where = recorder().dump("at exit (HOSTIR_FLIGHT_DUMP=1)")
    if where is not None:
        sys.stderr.write(f"[rank {process_rank()}] hostir: flight record written to "
                         f"{where}\n")


_previous_sigterm = None
_sigterm_installed = False


def install_sigterm_dump() -> None:
    """On SIGTERM, write the record first (a rank the others gave up on is the one the
    report needs most), then end as SIGTERM would have. Main thread only; idempotent."""
    global _previous_sigterm, _sigterm_installed
    if threading.current_thread() is not threading.main_thread() or _sigterm_installed:
        return
    _previous_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)
    _sigterm_installed = True


def _on_sigterm(signum, frame) -> None:
    rec = _RECORDER
    if rec is not None and rec.recorded and rec._written is None:
        where = rec.dump("SIGTERM: the job was ended (another rank failed or timed out)")
        if where is not None:
            sys.stderr.write(f"[rank {process_rank()}] hostir: ended by SIGTERM; flight "
                             f"record written to {where}\n")
            sys.stderr.flush()
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
