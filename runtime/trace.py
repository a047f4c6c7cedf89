"""Seeing the overlap: a Chrome/Perfetto trace (torch.profiler) and a timeline picture.

    python -m hostir.run pipelined_matmul --trace run.json --timeline run.png

The picture draws one row per (rank, CUDA stream) and one bar per kernel or copy,
coloured by what it is (GEMM, NCCL, copy engine, other), so the hidden transfers show.

Files: without a path given, traces go to a private per-user directory
(`default_trace_base`: ``<cache dir>/traces``, 0700; see `runtime.store.private_dir`),
never to a fixed name in a shared temp directory, where another user could create or
symlink it first. Every file is written to a fresh temp file beside its final name
(mkstemp: O_EXCL, 0600) and renamed onto it, so a link planted at the name is replaced,
never followed; each write prints where it went.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from runtime.store import private_dir


def default_trace_base() -> str:
    """A trace path no other user can have created: ``trace-<time>-<pid>.json`` in the
    private traces directory (a job adds ``.rank<N>`` before the suffix)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return str(private_dir("traces") / f"trace-{stamp}-{os.getpid()}.json")


@contextlib.contextmanager
def _exclusive_target(path: str, what: str):
    """Yield a fresh temp path beside ``path`` (created exclusively, 0600); when the block
    ends, rename it onto ``path`` and say where ``what`` went."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    suffix = "".join(target.suffixes[-2:]) or ".tmp"   # the writers pick format by suffix
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=suffix)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    print(f"hostir: {what} written to {target}", file=sys.stderr, flush=True)


def record(step, iters: int, path: str, warmup: int = 3) -> None:
    """Run ``step`` ``warmup + iters`` times under torch.profiler and write a Chrome trace
    of the last ``iters``: starting the profiler takes each rank a different time, and the
    first collective after it waits for the slowest; the warm-up steps absorb that skew so
    the recorded window is the steady state."""
    from torch.profiler import ProfilerActivity, profile, schedule

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities,
                 schedule=schedule(wait=0, warmup=warmup, active=iters, repeat=1)) as prof:
        for _ in range(warmup + iters):
            step()
            prof.step()
        if cuda:
            torch.cuda.synchronize()
    with _exclusive_target(path, "trace") as tmp:
        prof.export_chrome_trace(tmp)


def _kind(name: str, cat: str) -> str:
    n = name.lower()
    if "nccl" in n:
        return "NCCL"
    if "barrier" in n or "signal" in n:
        return "barrier"
    if cat == "gpu_memcpy" or "memcpy" in n:
        return "copy engine"
    if "gemm" in n or "sm90" in n or "cutlass" in n or "nvjet" in n:
        return "GEMM"
    return "other"


COLORS = {"GEMM": "#4c72b0", "NCCL": "#dd8452", "copy engine": "#55a868",
          "barrier": "#c44e52", "other": "#999999"}


def device_events(trace_path: str):
    """(stream, kind, start µs, duration µs, name) of every GPU event in a trace."""
    with open(trace_path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    # Kineto writes timestamps relative to a base time; with it, ranks share one clock.
    base = float(data.get("baseTimeNanoseconds", 0)) / 1e3 if isinstance(data, dict) else 0.0
    out = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        stream = e.get("args", {}).get("stream", e.get("tid"))
        out.append((stream, _kind(e.get("name", ""), e["cat"]), base + float(e["ts"]), float(e["dur"]),
                    e.get("name", "")))
    return out


def draw(traces: dict, png: str, title: str = "") -> None:
    """``traces``: {label (e.g. "rank 0"): trace path}. Writes one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    per_rank = {label: device_events(path) for label, path in traces.items()}
    starts = [e[2] for evs in per_rank.values() for e in evs]
    t0 = min(starts) if starts else 0.0  # one time axis for every rank
    for label, evs in per_rank.items():
        for stream in sorted({e[0] for e in evs}):
            rows.append((f"{label} stream {stream}", [(k, s - t0, d) for st, k, s, d, _ in evs if st == stream]))
    fig, ax = plt.subplots(figsize=(12, 0.5 + 0.45 * max(len(rows), 1)))
    for y, (_, bars) in enumerate(rows):
        for kind, start, dur in bars:
            ax.broken_barh([(start / 1e3, dur / 1e3)], (y - 0.4, 0.8), color=COLORS[kind])
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in rows])
    ax.set_xlabel("ms")
    ax.invert_yaxis()
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, list(COLORS), loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.5 / max(len(rows), 1)),
              ncol=5, fontsize=8, frameon=False)
    ax.set_title(title)
    fig.tight_layout()
    with _exclusive_target(png, "timeline") as tmp:
        fig.savefig(tmp, dpi=110, format=Path(png).suffix[1:] or "png")
    plt.close(fig)


def _merged(intervals):
    """The union of (start, end) intervals, as sorted disjoint intervals."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _covered(intervals) -> float:
    return sum(e - s for s, e in intervals)


def _common(a, b) -> float:
    """Length covered by both of two merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _span(events) -> float:
    """First event's start to last event's end (0 without events)."""
    if not events:
        return 0.0
    return max(s + d for _, _, s, d, _ in events) - min(s for _, _, s, _, _ in events)


def overlap(events, steps: int = 1) -> dict:
    """How much of the communication ran beside computation, from `device_events`, per
    step (milliseconds): ``comm_ms`` (time some NCCL kernel or copy-engine copy ran),
    ``hidden_ms`` (of it, time some GEMM or other kernel ran too), ``exposed_ms`` (the
    rest), ``span_ms`` (first event to last) and ``hidden_fraction``.

    >>> ev = [(0, "GEMM", 0.0, 100.0, "g"), (1, "NCCL", 50.0, 100.0, "n")]
    >>> overlap(ev)["hidden_fraction"]
    0.5
    """
    comm = _merged((s, s + d) for _, kind, s, d, _ in events if kind in ("NCCL", "copy engine"))
    work = _merged((s, s + d) for _, kind, s, d, _ in events if kind in ("GEMM", "other"))
    span = _span(events)
    total, hidden = _covered(comm), _common(comm, work)
    per = 1e3 * max(1, steps)
    return {"span_ms": span / per, "comm_ms": total / per, "hidden_ms": hidden / per,
            "exposed_ms": (total - hidden) / per,
            "hidden_fraction": hidden / total if total else None}


def breakdown(events, steps: int = 1, top: int = 12) -> dict:
    """Where a step's GPU time went, from `device_events`, per step (milliseconds):
    ``busy_ms`` (time some kernel or copy ran), ``span_ms`` (first event to last),
    ``idle_ms`` (the rest of the span: the GPU waited on the host, or on nothing) and the
    ``top`` kernels by total time, ``[name (cut to 96 characters), ms, calls]``.

    >>> b = breakdown([(0, "GEMM", 0.0, 600.0, "g"), (0, "other", 800.0, 200.0, "n")])
    >>> b["busy_ms"], b["idle_ms"], b["top"][0]
    (0.8, 0.2, ['g', 0.6, 1.0])
    """
    per = 1e3 * max(1, steps)
    busy = _covered(_merged((s, s + d) for _, _, s, d, _ in events))
    span = _span(events)
    totals: dict = {}
    for _, _, _, d, name in events:
        t = totals.setdefault(name[:96], [0.0, 0])
        t[0] += d
        t[1] += 1
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
    return {"span_ms": round(span / per, 4), "busy_ms": round(busy / per, 4),
            "idle_ms": round((span - busy) / per, 4),
            "top": [[n, round(t / per, 4), round(c / max(1, steps), 2)]
                    for n, (t, c) in ranked]}
