"""Compare the ranks' flight records of a job and say where they diverged.

    python -m hostir.run flight_report ~/.cache/hostir/flight/<job>

DIR holds one ``rank<R>.json`` a rank (``runtime.flight``; a rank that wrote twice has
``rank<R>.1.json`` too, and the latest is read). One line per divergence, e.g.

    rank 1 stopped before Allgather #2 (i=1); ranks 0,2 wait in Wait C0 #2 (i=1)

then a last line with each rank's last statement. Collectives are numbered per
communicator from 1, the same on every rank; a rank that is behind the others on a
communicator "stopped before" the first collective it has not posted, and the ranks
ahead are described by the statement they are stuck in (the newest one not completed).
Exit status 0 (divergences or not); 2 (usage) when DIR or a record cannot be read, with a
one-line error.

Nothing read is trusted: a record must be a regular file (a FIFO or device is refused
unread) of at most 256 MiB, and every field the report reads is type-checked; a rank
from 65536 or a world size above 65536 (the parser's largest team) is refused, so that a
bad name or value cannot make the report loop or print without bound.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

_NAME = re.compile(r"rank(\d+)(?:\.(\d+))?\.json")

MAX_RANKS = 65536  # ranks of one job, as the parser's MAX_TEAM
MAX_RECORD_BYTES = 256 << 20  # one rank's record (the default 2000 entries: under 1 MiB)
MAX_INT = 2 ** 63  # counters, sequence numbers, bytes, loop values
STATES = ("started", "completed", "captured")


class ReportError(Exception):
    """A directory or record that cannot be read."""


def add_arguments(p) -> None:
    p.add_argument("dir", help="the directory of the job's flight records (rank<R>.json)")


def load(directory: Path) -> dict[int, dict]:
    """Each rank's latest record, by rank."""
    if not directory.is_dir():
        raise ReportError(f"{directory}: expected a directory of flight records (rank<R>.json)")
    latest: dict[int, tuple[int, Path]] = {}
    try:
        paths = sorted(directory.iterdir())
    except OSError as e:
        raise ReportError(f"{directory}: cannot list it: {e.strerror or e}") from None
    for path in paths:
        m = _NAME.fullmatch(path.name)
        if m:
            rank, k = int(m.group(1)), int(m.group(2) or 0)
            if rank >= MAX_RANKS:
                raise ReportError(f"{path}: rank {m.group(1)[:30]} is beyond the largest "
                                  f"a report reads ({MAX_RANKS - 1})")
            if rank not in latest or k > latest[rank][0]:
                latest[rank] = (k, path)
    if not latest:
        raise ReportError(f"{directory}: no flight records (rank<R>.json) in it")
    records = {}
    for rank, (_, path) in sorted(latest.items()):
        try:
            data = json.loads(_read(path).decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            # RecursionError: JSON nested too deep for the decoder
            raise ReportError(f"{path}: not a readable flight record: "
                              f"{_short(str(e), 120)}") from None
        _check(path, rank, data)
        records[rank] = data
    return records


def _read(path: Path) -> bytes:
    """The bytes of a regular file of at most MAX_RECORD_BYTES, through the stores' reader
    (`runtime.store.read_regular`): a FIFO, socket or device is refused unopened, nothing
    blocks; a symbolic link is read where it points (records are only read, any owner's)."""
    from runtime import store

    try:
        blob = store.read_regular(Path(os.path.realpath(path)), MAX_RECORD_BYTES,
                                  any_owner=True)
    except store.Refused as e:
        raise ReportError(f"{e}; not read as a flight record") from None
    if blob is None:  # gone since the directory was listed
        raise ReportError(f"{path}: not a readable flight record: it is gone")
    return blob


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _int(v, lo: int = 0) -> bool:
    return type(v) is int and lo <= v < MAX_INT


def _text(v, limit: int = 256) -> bool:
    """A string the report may print: bounded, no control characters or escapes."""
    return type(v) is str and len(v) <= limit and v.isprintable()


def _loops_ok(v) -> bool:
    return (type(v) is dict and len(v) <= 64
            and all(_text(k) and _int(x, -MAX_INT) for k, x in v.items()))


# Each entry field the report reads: (required, check, what it must be).
_ENTRY = {
    "n": (True, _int, "an integer >= 0"),
    "kind": (True, _text, "a string"),
    "seq": (True, _int, "an integer >= 0"),
    "state": (True, lambda v: v in STATES, f"one of {', '.join(STATES)}"),
    "statement": (False, lambda v: _text(v, 1 << 20), "a string"),
    "comm": (False, _text, "a string"),
    "bytes": (False, _int, "an integer >= 0"),
    "loops": (False, _loops_ok, "an object of loop index names to integers"),
}


def _check(path: Path, rank: int, data) -> None:
    """Refuse a record the report cannot read: one line naming the file and the field."""
    if not (isinstance(data, dict) and isinstance(data.get("format"), str)
            and data["format"].startswith("hostir-flight/")
            and isinstance(data.get("entries"), list)):
        raise ReportError(f"{path}: not a flight record (expected format hostir-flight/1 "
                          "with a list of entries)")
    world = data.get("world_size")
    if not (_int(world, 1) and world <= MAX_RANKS):
        raise ReportError(f"{path}: expected world_size, an integer from 1 to {MAX_RANKS}, "
                          f"got {_short(repr(world))}")
    if type(data.get("rank")) is not int or data["rank"] != rank:
        raise ReportError(f"{path}: expected rank {rank} (the file's name), got "
                          f"{_short(repr(data.get('rank')))}")
    if rank >= world:
        raise ReportError(f"{path}: rank {rank} is not below its world_size {world}")
    for i, e in enumerate(data["entries"]):
        if not isinstance(e, dict):
            raise ReportError(f"{path}: entries[{i}]: expected an object, got "
                              f"{_short(repr(e))}")
        for field, (required, ok, what) in _ENTRY.items():
            v = e.get(field)
            if (required or v is not None) and not ok(v):
                raise ReportError(f"{path}: entries[{i}].{field}: expected {what}, got "
                                  f"{_short(repr(v))}")


def _ranks(ranks) -> str:
    """``rank 1``, ``ranks 0,2``; runs of three or more as ``ranks 0-7``."""
    ranks = sorted(ranks)
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts += [f"{ranks[i]}-{ranks[j]}"] if j - i >= 2 else map(str, ranks[i:j + 1])
        i = j + 1
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(parts)


def _loops(e: dict) -> str:
    loops = e.get("loops") or {}
    return f" ({', '.join(f'{k}={v}' for k, v in loops.items())})" if loops else ""


def _what(e: dict) -> str:
    """An entry as the report names it: ``Allgather #12 (i=1)``, ``Wait C0 #12 (i=1)``."""
    kind = e["kind"]
    if kind in ("Wait", "Synchronize"):
        name = e.get("statement") or kind
    else:
        name = kind
    seq = f" #{e['seq']}" if e.get("seq") else ""
    return f"{name}{seq}{_loops(e)}"


def _collectives(entries) -> dict[str, dict[int, dict]]:
    """Per communicator, the collectives posted: seq -> entry."""
    out: dict[str, dict[int, dict]] = {}
    for e in entries:
        if e.get("comm") and e["kind"] not in ("Wait", "Synchronize") and e["seq"] > 0:
            out.setdefault(e["comm"], {})[e["seq"]] = e
    return out


def _stuck(entries) -> str:
    """Where a rank is: the newest entry not completed, else its last entry."""
    for e in reversed(entries):
        if e["state"] == "started":
            return f"wait in {_what(e)}"
    if entries:
        return f"last completed {_what(entries[-1])}"
    return "recorded nothing"


def divergences(records: dict[int, dict]) -> list[str]:
    lines = []
    # load() bounds both by MAX_RANKS
    world = max([r["world_size"] for r in records.values()] + [max(records) + 1])
    missing = [r for r in range(world) if r not in records]
    if missing:
        lines.append(f"{_ranks(missing)} left no flight record (killed before writing it, "
                     "or stuck outside Python)")
    entries = {r: sorted(d["entries"], key=lambda e: e["n"]) for r, d in records.items()}
    posted = {r: _collectives(es) for r, es in entries.items()}
    stuck = {r: _stuck(es) for r, es in entries.items()}
    comms = sorted({c for p in posted.values() for c in p})
    for comm in comms:
        last = {r: max(posted[r].get(comm, {0: None})) for r in records}
        top = max(last.values())
        ahead = [r for r in records if last[r] == top]
        # The same number, another collective: ranks posted different programs.
        for seq in sorted({s for r in records for s in posted[r].get(comm, {})}):
            seen: dict[tuple, list[int]] = {}
            for r in records:
                e = posted[r].get(comm, {}).get(seq)
                if e is not None:
                    seen.setdefault((e["kind"], e.get("bytes")), []).append(r)
            if len(seen) > 1:
                lines.append(f"{comm} collective #{seq} differs: " + "; ".join(
                    f"{_ranks(rs)} posted {kind} of {nbytes} bytes"
                    for (kind, nbytes), rs in sorted(seen.items(), key=lambda kv: kv[1])))
                break  # later ones follow from the first
        for behind in sorted({last[r] for r in records} - {top}):
            ranks = [r for r in records if last[r] == behind]
            nxt = next((posted[r][comm][behind + 1] for r in ahead
                        if behind + 1 in posted[r].get(comm, {})), None)
            what = _what(nxt) if nxt is not None else f"{comm} collective #{behind + 1}"
            where: dict[str, list[int]] = {}
            for r in ahead:
                where.setdefault(stuck[r], []).append(r)
            lines.append(f"{_ranks(ranks)} stopped before {what}; " + "; ".join(
                f"{_ranks(rs)} {state}" for state, rs in where.items()))
        if len(set(last.values())) == 1:
            # Every rank posted the same collectives: did some not complete?
            open_ = {r: [e for e in posted[r].get(comm, {}).values() if e["state"] == "started"]
                     for r in records}
            waiting = [r for r in records if open_[r]]
            if waiting:
                first = min((e for r in waiting for e in open_[r]), key=lambda e: e["seq"])
                done = [r for r in records if r not in waiting]
                tail = f"; {_ranks(done)} completed it" if done else ""
                lines.append(f"{_ranks(waiting)} posted {_what(first)} on {comm} and it did "
                             f"not complete{tail}")
    return lines


def main(args) -> int:
    try:
        records = load(Path(args.dir).expanduser())
    except ReportError as e:  # one line and the usage code, as every job's refusals
        from hostir.jobs.preflight import UsageError

        raise UsageError(str(e)) from None
    lines = divergences(records)
    for line in lines or ["no divergence: every rank posted the same collectives and "
                          "completed them"]:
        print(line)
    print("last statements: " + "; ".join(
        f"rank {r} {_stuck(sorted(d['entries'], key=lambda e: e['n']))}"
        for r, d in sorted(records.items())))
    return 0
