"""Compare the ranks' flight records of a job and say where they diverged.

    python -m hostir.run flight_report ~/.cache/hostir/flight/<job>

DIR holds one ``rank<R>.json`` a rank (``runtime.flight``; a rank that wrote twice has
``rank<R>.1.json`` too, and the latest is read). One line per divergence, e.g.

    rank 1 stopped before Allgather #2 (i=1); ranks 0,2 wait in Wait C0 #2 (i=1)

then a last line with each rank's last statement. Collectives are numbered per
communicator from 1, the same on every rank; a rank that is behind the others on a
communicator "stopped before" the first collective it has not posted, and the ranks
ahead are described by the statement they are stuck in (the newest one not completed).
Exit status 0 (divergences or not); 1 when DIR cannot be read, with a one-line error.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

_NAME = re.compile(r"rank(\d+)(?:\.(\d+))?\.json")


class ReportError(Exception):
    """A directory or record that cannot be read."""


def add_arguments(p) -> None:
    p.add_argument("dir", help="the directory of the job's flight records (rank<R>.json)")


def load(directory: Path) -> dict[int, dict]:
    """Each rank's latest record, by rank."""
    if not directory.is_dir():
        raise ReportError(f"{directory}: expected a directory of flight records (rank<R>.json)")
    latest: dict[int, tuple[int, Path]] = {}
    for path in directory.iterdir():
        m = _NAME.fullmatch(path.name)
        if m:
            rank, k = int(m.group(1)), int(m.group(2) or 0)
            if rank not in latest or k > latest[rank][0]:
                latest[rank] = (k, path)
    if not latest:
        raise ReportError(f"{directory}: no flight records (rank<R>.json) in it")
    records = {}
    for rank, (_, path) in sorted(latest.items()):
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise ReportError(f"{path}: not a readable flight record: {e}") from None
        if not (isinstance(data, dict) and data.get("format", "").startswith("hostir-flight/")
                and isinstance(data.get("entries"), list)
                and all(isinstance(e, dict) for e in data["entries"])):
            raise ReportError(f"{path}: not a flight record (expected format hostir-flight/1 "
                              "with a list of entries)")
        for e in data["entries"]:
            for field, kind in (("kind", str), ("seq", int), ("state", str), ("n", int)):
                if not isinstance(e.get(field), kind):
                    raise ReportError(f"{path}: entry {e.get('n')}: expected {field} of type "
                                      f"{kind.__name__}, got {e.get(field)!r}")
        records[rank] = data
    return records


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


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
    world = max([r.get("world_size") or 0 for r in records.values()] + [max(records) + 1])
    missing = [r for r in range(world) if r not in records]
    if missing:
        lines.append(f"{_ranks(missing)} left no flight record (killed before writing it, "
                     "or stuck outside Python)")
    entries = {r: sorted(d["entries"], key=lambda e: e["n"]) for r, d in records.items()}
    posted = {r: _collectives(es) for r, es in entries.items()}
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
                where.setdefault(_stuck(entries[r]), []).append(r)
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
    except ReportError as e:
        print(f"hostir flight_report: error: {e}", file=sys.stderr, flush=True)
        return 1
    lines = divergences(records)
    for line in lines or ["no divergence: every rank posted the same collectives and "
                          "completed them"]:
        print(line)
    print("last statements: " + "; ".join(
        f"rank {r} {_stuck(sorted(d['entries'], key=lambda e: e['n']))}"
        for r, d in sorted(records.items())))
    return 0
