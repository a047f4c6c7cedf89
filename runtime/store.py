"""Everything hostir reads back from disk, read one way: private directories, regular files,
bounded sizes, checked fields; anything else is a miss.

Three stores live under the cache directory (``HOSTIR_CACHE_DIR``, default
``~/.cache/hostir``): the kernel cache (``kernels/<sha256>.cubin``, `runtime.jit`), the
tuners' winners (``autotune.json``, `runtime.autotune`) and the AllGather+GEMM schedules
(``pipelined_matmul_schedules.json``, `runtime.schedule_tuning`). A cubin read back runs
inside the process, so the trust boundary is who can write the directory, not the sha256
an entry carries (that only detects corruption: anyone who can write the directory can
write a valid digest). Hence:

* `trusted_dir`: the cache directory is created 0700; one owned by another user, or
  writable by group or others, is refused (one warning, the store is bypassed: kernels
  compile in memory, tuners fall back to their heuristics) unless
  ``HOSTIR_TRUST_CACHE_DIR=1``.
* `read_regular`: O_NOFOLLOW | O_NONBLOCK, then fstat: a symlink, directory, FIFO or
  device at an entry's path, a file over the store's size cap or owned by another user
  is refused (`Refused`), never followed, read or waited on.
* A decode or schema error is a miss (`Invalid`), warned once per store and process;
  the caller rebuilds or retunes. The field checks (`need_int`, `need_str`, ...) bound
  every value a store hands out.
* Writers: a temp file in the same directory, fsync, `os.replace` (readers see the old
  file or the whole new one); a table (`JsonTable`) is read, merged and written under an
  exclusive ``flock`` on a sibling ``.lock`` file, so concurrent writers lose no entry.

Example:
    >>> table = JsonTable("example", "example.json")
    >>> table.put("k", {"x": 1})                        # doctest: +SKIP
    >>> table.get("k", lambda raw: need_int(raw["x"], "x", 0, 9))   # doctest: +SKIP
    1
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import stat
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

from hostir.options import options

# Size caps: far above any real entry (a cubin of the largest generated kernel is under
# 1 MiB; a table of thousands of tuned problems under 2 MiB), small enough that a file
# planted or grown at an entry's path cannot exhaust memory.
MAX_ENTRY_BYTES = 64 << 20     # one kernel cache entry (header + cubin)
MAX_TABLE_BYTES = 16 << 20     # one JSON table (autotune.json, schedules)
MAX_TABLE_ENTRIES = 100_000    # keys of one JSON table
TRUST_ENV = "HOSTIR_TRUST_CACHE_DIR"


class Refused(OSError):
    """A path that is not a private regular file of a bounded size: never read."""


class Invalid(ValueError):
    """An entry that decodes but does not fit its schema or the key it was found under."""


# ----------------------------------------------------------------------------- warnings

_WARNED: set[str] = set()
_WARN_LOCK = threading.Lock()


def warn_once(store: str, message: str) -> None:
    """Print one warning line per store and process (a bad file is seen on every lookup)."""
    with _WARN_LOCK:
        if store in _WARNED:
            return
        _WARNED.add(store)
    print(f"hostir: warning: {store}: {message}", file=sys.stderr, flush=True)


def reset_warnings() -> None:
    """Forget which stores warned (tests)."""
    with _WARN_LOCK:
        _WARNED.clear()


# ----------------------------------------------------------------------------- directories

def trust_opted_in() -> bool:
    return os.environ.get(TRUST_ENV, "") not in ("", "0")


def _create_private(directory: Path) -> None:
    """Create ``directory`` and any missing parents 0700 (``os.makedirs`` gives the mode
    to the last component only)."""
    missing = []
    p = directory
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o700)


def dir_problem(directory: Path) -> str | None:
    """Why ``directory`` may not hold entries hostir will run or trust, or None."""
    try:
        st = os.stat(directory)
    except OSError as e:
        return f"cannot stat {directory} ({e.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{directory} is not a directory"
    if trust_opted_in():
        return None
    if st.st_uid != os.geteuid():
        return f"{directory} is owned by uid {st.st_uid}, not by this user ({os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"{directory} is writable by group or others "
                f"(mode {stat.S_IMODE(st.st_mode):04o})")
    return None


def dir_refusal(directory: Path, root: Path | None = None) -> str | None:
    """Why `trusted_dir` refuses ``directory`` (created first, 0700, parents too), or None:
    it cannot be created, or it or a directory from ``root`` down to it is not private."""
    directory = Path(directory)
    root = directory if root is None else Path(root)
    try:
        _create_private(directory)
    except OSError as e:
        # name the file in the way rather than "Not a directory" at the path asked for
        blocker = next((p for p in directory.parents if os.path.lexists(p)), None)
        if e.errno == errno.ENOTDIR and blocker is not None and not blocker.is_dir():
            return f"cannot create {directory}: {blocker} is not a directory"
        return f"cannot create {directory} ({e.strerror})"
    chain = [directory]
    if root != directory and root in directory.parents:
        p = directory.parent
        while p != root:
            chain.append(p)
            p = p.parent
        chain.append(root)
    for d in chain:
        problem = dir_problem(d)
        if problem is not None:
            if not d.is_dir():  # trusting it would not help
                return problem
            return (f"{problem} (set {TRUST_ENV}=1 to use it anyway, or choose a private "
                    f"HOSTIR_CACHE_DIR)")
    return None


def trusted_dir(directory: Path, root: Path | None = None, store: str = "cache") -> bool:
    """Create ``directory`` (0700, parents too) and check it and every directory from
    ``root`` (default: itself) down to it: each must be ours and writable by nobody else,
    unless HOSTIR_TRUST_CACHE_DIR=1. False after one warning: the caller bypasses the
    store (a foreign entry with a valid digest would otherwise run in this process)."""
    problem = dir_refusal(directory, root)
    if problem is not None:
        warn_once(store, f"{problem}; not using the cache")
        return False
    return True


def private_dir(name: str) -> Path:
    """A per-user directory (0700) for files a run writes by default (traces, timelines,
    flight records): ``<cache dir>/<name>`` when the cache directory is private, else
    ``$XDG_RUNTIME_DIR/hostir/<name>`` when that is, else a fresh ``mkdtemp`` (0700, a
    new random name each call). Never a fixed name in a shared directory."""
    candidates = [(options().cache_dir / name, options().cache_dir)]
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if runtime_dir:
        candidates.append((Path(runtime_dir) / "hostir" / name, Path(runtime_dir)))
    for directory, root in candidates:
        try:
            _create_private(directory)
        except OSError:
            continue
        chain = [directory] + [p for p in directory.parents if root in p.parents or p == root]
        # the user's own root may be shared-readable; only "ours, writable by nobody else"
        if all(dir_problem(d) is None for d in chain):
            return directory
    return Path(tempfile.mkdtemp(prefix=f"hostir-{name}-"))


# ----------------------------------------------------------------------------- files

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def read_regular(path: Path, limit: int, any_owner: bool = False) -> bytes | None:
    """The bytes of ``path``, None when nothing is there; `Refused` for a symlink, a
    directory, FIFO, socket or device, a file over ``limit`` bytes, one owned by another
    user (unless ``any_owner``, for data that is only read, or HOSTIR_TRUST_CACHE_DIR=1),
    or one that cannot be opened. Never blocks: the open is non-blocking, and a
    non-regular file is refused before any read."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as e:
        what = "a symbolic link" if e.errno == errno.ELOOP else e.strerror
        raise Refused(f"{path}: not opened ({what})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{path}: not a regular file")
        if st.st_size > limit:
            raise Refused(f"{path}: {st.st_size} bytes, over the cap of {limit}")
        if st.st_uid != os.geteuid() and not (any_owner or trust_opted_in()):
            raise Refused(f"{path}: owned by uid {st.st_uid}, not by this user")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:  # grew after the fstat
                raise Refused(f"{path}: over the cap of {limit} bytes")
        return b"".join(chunks)
    except OSError as e:
        if isinstance(e, Refused):
            raise
        raise Refused(f"{path}: not read ({e.strerror})") from None
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one:
    a private temp file (mkstemp: O_EXCL, 0600) in the same directory, fsync, then
    ``os.replace``, which replaces a link at ``path`` itself, never its target."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(path: Path):
    """An exclusive flock on ``<path>.lock`` (created 0600, never through a symlink) for
    a read-merge-write of ``path``; released when the block ends or the process dies."""
    lock = Path(f"{path}.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(f"{lock}: not a regular file")
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # drops the lock


# ----------------------------------------------------------------------------- field checks

def need(cond: bool, what: str) -> None:
    if not cond:
        raise Invalid(what)


def need_int(v: Any, what: str, lo: int, hi: int) -> int:
    """``v`` if it is an int (a bool is not) in [lo, hi]."""
    need(type(v) is int and lo <= v <= hi, f"{what} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def need_number(v: Any, what: str, lo: float, hi: float) -> float:
    """``v`` if it is a finite int or float in [lo, hi]."""
    need(type(v) in (int, float) and math.isfinite(v) and lo <= v <= hi,
         f"{what} must be a number in [{lo}, {hi}], got {v!r}")
    return v


def need_bool(v: Any, what: str) -> bool:
    need(type(v) is bool, f"{what} must be true or false, got {v!r}")
    return v


def need_str(v: Any, what: str, choices=None, max_len: int = 256) -> str:
    """``v`` if it is a string (of ``choices`` when given)."""
    need(type(v) is str and len(v) <= max_len, f"{what} must be a string, got {v!r}"[:200])
    if choices is not None:
        need(v in choices, f"{what} must be one of {sorted(choices)}, got {v!r}")
    return v


def need_dict(v: Any, what: str) -> dict:
    need(type(v) is dict, f"{what} must be an object, got {type(v).__name__}")
    return v


# Errors a check or a record's own constructor raises on a bad value: all mean "miss".
SCHEMA_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError,
                 UnicodeDecodeError, OverflowError, RecursionError)


# ----------------------------------------------------------------------------- JSON tables

class JsonTable:
    """A JSON object of entries (key -> object) in ``<cache dir>/<file_name>``.

    `get` hands out an entry only through a check (the store's ``default_check`` or one
    given per call) that type- and range-checks every field and compares the entry with
    the key it was found under; each entry carries its own key (``"key"``), so one
    copied under another key is a miss. `put` merges under a lock.
    """

    def __init__(self, name: str, file_name: str,
                 default_check: Callable[[str, dict], Any] | None = None):
        self.name = name
        self.file_name = file_name
        self.default_check = default_check

    def path(self) -> Path:
        return options().cache_dir / self.file_name

    def _trusted(self) -> bool:
        return trusted_dir(options().cache_dir, store=self.name)

    def _load(self) -> dict:
        """The table as stored, {} when missing; a file that is not a table is a miss."""
        path = self.path()
        try:
            blob = read_regular(path, MAX_TABLE_BYTES)
            if blob is None:
                return {}
            table = need_dict(json.loads(blob), "the table")
            need(len(table) <= MAX_TABLE_ENTRIES, f"more than {MAX_TABLE_ENTRIES} entries")
            return table
        except (Refused, *SCHEMA_ERRORS) as e:
            warn_once(self.name, f"{path} ignored ({e}); entries in it are misses")
            return {}

    def get(self, key: str, check: Callable[[dict], Any] | None = None):
        """The checked entry under ``key`` (what ``check(raw)`` returns), or None: missing,
        untrusted directory, unreadable file, or an entry that fails its check."""
        if not self._trusted():
            return None
        raw = self._load().get(key)
        if raw is None:
            return None
        try:
            need_dict(raw, f"entry {key!r}")
            need(raw.get("key") == key, f"entry under {key!r} was written for "
                                        f"{str(raw.get('key'))[:120]!r}")
            if check is not None:
                return check(raw)
            if self.default_check is not None:
                return self.default_check(key, raw)
            return raw
        except SCHEMA_ERRORS as e:
            warn_once(self.name, f"{self.path()}: entry {key!r} ignored ({e})"[:400])
            return None

    def put(self, key: str, entry: dict) -> bool:
        """Store ``entry`` under ``key``; others' entries, stored meanwhile, survive (the
        last writer of one key wins: each timed a valid winner). False when the directory
        is not trusted or the write failed (a warning; the run goes on)."""
        if not self._trusted():
            return False
        path = self.path()
        try:
            with locked(path):
                table = self._load()
                table[key] = {**entry, "key": key}
                write_atomically(path, json.dumps(table, indent=1, sort_keys=True).encode())
            return True
        except OSError as e:
            warn_once(self.name, f"{path} not written ({e})")
            return False
